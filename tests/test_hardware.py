"""rllib_ragen.hardware: the bounds it puts on torch's CPU kernel caches, and that a user's own setting wins."""

import os
import subprocess
import sys

from rllib_ragen.hardware import IDEEP_PRODUCTS_KEPT, ONEDNN_KERNELS_KEPT

CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def _variables_after_import(preset: dict[str, str]) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARIABLES} | preset
    code = "import os, rllib_ragen.hardware; print(*(os.environ[v] for v in %r))" % (CACHE_VARIABLES,)
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()


def test_import_bounds_both_kernel_caches():
    assert _variables_after_import({}) == [str(ONEDNN_KERNELS_KEPT), str(IDEEP_PRODUCTS_KEPT)]


def test_a_users_own_bound_is_kept():
    assert _variables_after_import({"LRU_CACHE_CAPACITY": "1024"}) == [str(ONEDNN_KERNELS_KEPT), "1024"]
    assert _variables_after_import({"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "8"}) == ["8", str(IDEEP_PRODUCTS_KEPT)]
