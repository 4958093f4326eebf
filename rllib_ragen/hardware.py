"""What this machine offers the package: whether the CPU computes bfloat16 natively, this process's peak memory,
and handing freed heap memory back to the operating system. No Ray, no transformers: every layer may ask.

glibc keeps the memory of freed tensors in its heap for reuse, so a process that once needed gigabytes (a warm start's
activations and optimizer moments) keeps them resident after every tensor is gone. ``malloc_trim`` returns those
pages; elsewhere than glibc it is not there and nothing happens.

oneDNN, torch's CPU kernels, keeps the compiled kernels of its last 1,024 matrix-product shapes. A language model on the
CPU meets a new shape at every new sequence length, so that cache only grows (measured on the Benchmarks page).
Importing this module bounds it at ``ONEDNN_KERNELS_KEPT`` unless ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` is already set
(oneDNN reads it at its first product; Ray's workers inherit it from the driver). The bound trades memory for speed:
too few kernels and an update of one-row micro-batches, a new shape at every row length, compiles them again and again
(the Benchmarks page has the measured trade).

Torch keeps a second cache in front of oneDNN's: ideep's, per thread, of the last 1,024 bfloat16 matrix products it
set up, with their buffers (``LRU_CACHE_CAPACITY``; pytorch/pytorch#27971, intel/ideep#14). It grew a SmolLM2 warm
start's memory by 20-40 MB a step; bounded at ``IDEEP_PRODUCTS_KEPT`` it stays flat at the same speed, since a product
it drops is set up again from oneDNN's kernel cache.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
import resource
import sys

import torch

ONEDNN_KERNELS_KEPT = 256
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_KERNELS_KEPT))
IDEEP_PRODUCTS_KEPT = 16
os.environ.setdefault("LRU_CACHE_CAPACITY", str(IDEEP_PRODUCTS_KEPT))


def cpu_computes_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices natively (AVX512-BF16 or AMX, torch's own checks); elsewhere
    torch emulates them, several times slower than float32 (the Benchmarks page)."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def peak_rss_gib() -> float:
    """This process's peak resident set size so far, in GiB (``getrusage``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**30 if sys.platform == "darwin" else 2**20)


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): no malloc_trim
        return None


def release_freed_memory() -> bool:
    """Collect garbage, then hand the heap's free pages back to the OS (:func:`trim_heap`); returns whether the C
    library could. For the end of a large step (a warm start); on a loop's every pass use :func:`trim_heap`: tensors
    are freed by reference counting, and a garbage collection took about 60 ms here, a tenth of a tiny model's
    iteration."""
    gc.collect()
    return trim_heap()


def trim_heap() -> bool:
    """Hand the heap's free pages back to the OS (glibc's ``malloc_trim(0)``, well under a millisecond); returns
    whether the C library could."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
