"""Checkpoint directories that a kill or a full disk cannot corrupt, and the check that a checkpoint fits.

RLlib's ``save_to_path`` writes file by file into the target directory, so a process killed halfway through
leaves the old checkpoint destroyed or, worse, a loadable mix of new weights with the old iteration and optimizer
state. :func:`write_atomically` has the writer fill a sibling ``.{name}.partial`` directory and only then moves it
into place; until that moment the old checkpoint is untouched.

Moving a directory over a non-empty one is two renames (old aside to ``.{name}.previous``, new in). A kill between
them leaves no ``name`` but a complete ``.{name}.previous``: :func:`recover_interrupted_save`, called before every
load and save, puts it back. A checkpoint Tune copies into a trial folder (``StarPO.save``) whose copy failed is
removed (:func:`remove_failed_copy`); :func:`check_checkpoint_fits` refuses one an algorithm cannot hold.
"""

from __future__ import annotations

import logging
import os
import pathlib
import pickle
import shutil
from typing import Callable

logger = logging.getLogger(__name__)

# Files RLlib writes at the top of every checkpoint: a directory holding one of them may be replaced.
_CHECKPOINT_MARKERS = ("metadata.json", "class_and_ctor_args.pkl", "rllib_checkpoint.json")


def _siblings(path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    return path.with_name(f".{path.name}.partial"), path.with_name(f".{path.name}.previous")


def recover_interrupted_save(path) -> None:
    """Undo what a kill during :func:`write_atomically` left at ``path``: restore the previous checkpoint if the new
    one never arrived, drop a leftover copy of it if it did."""
    path = pathlib.Path(path)
    _, previous = _siblings(path)
    if previous.exists():
        if path.exists():
            shutil.rmtree(previous)  # the swap finished; only the clean-up was cut short
        else:
            os.rename(previous, path)


def write_atomically(path, write: Callable[[str], object]) -> str:
    """Run ``write(directory)`` into a sibling of ``path``, then swap it in for whatever ``path`` held.

    Raises:
        FileExistsError: ``path`` is a file, or a non-empty directory that is not a checkpoint (its files would be
            lost in the swap).
    """
    path = pathlib.Path(path)
    recover_interrupted_save(path)
    if path.exists() and (
        not path.is_dir() or (any(path.iterdir()) and not any((path / m).exists() for m in _CHECKPOINT_MARKERS))
    ):
        raise FileExistsError(
            f"cannot save a checkpoint to {path}: it holds other files, which replacing it would "
            "delete. Save to a new or empty directory, or to an existing checkpoint."
        )
    partial, previous = _siblings(path)
    shutil.rmtree(partial, ignore_errors=True)  # a save killed earlier
    path.parent.mkdir(parents=True, exist_ok=True)
    write(str(partial))
    if path.exists():
        os.rename(path, previous)
    os.rename(partial, path)
    shutil.rmtree(previous, ignore_errors=True)
    return str(path)


def check_checkpoint_fits(config, path) -> None:
    """Refuse a checkpoint whose module an algorithm built from ``config`` cannot hold, naming the fields that differ.

    The model, its dtype, the critic's type and whether the estimator builds a critic decide the module's weights
    and optimizer groups; restoring across them fails deep inside torch (an empty AssertionError or an optimizer
    group-size mismatch) or loads wrong weights. ``StarPO.from_checkpoint(path)`` always fits.
    """
    from ray.rllib.utils.checkpoints import Checkpointable

    from ..objectives import ADVANTAGE_ESTIMATORS
    from ..rollout.lora import lora_settings
    from .llm_rl_module import DEFAULT_MODEL_CONFIG

    saved_file = pathlib.Path(str(path)) / Checkpointable.CLASS_AND_CTOR_ARGS_FILE_NAME
    if "://" in str(path) or not saved_file.is_file():
        return  # a remote filesystem or a component checkpoint: nothing to compare here
    with open(saved_file, "rb") as f:
        saved = pickle.load(f)["ctor_args_and_kwargs"][0][0]  # the config state the checkpoint was built with
    saved_model = {**DEFAULT_MODEL_CONFIG, **saved.get("_model_config", {})}
    ours = config.model_config
    differing = {
        f"model_config[{key!r}]": (saved_model.get(key), ours.get(key))
        for key in ("model", "dtype", "critic")
        if saved_model.get(key) != ours.get(key)
    }
    if lora_settings(saved_model.get("lora")) != lora_settings(ours.get("lora")):  # adapters' shapes and layers
        differing["model_config['lora']"] = (saved_model.get("lora"), ours.get("lora"))
    estimator = saved.get("advantage_estimator", "gae")
    if (
        ADVANTAGE_ESTIMATORS.get(estimator, ADVANTAGE_ESTIMATORS["gae"]).needs_critic
        != ADVANTAGE_ESTIMATORS[config.advantage_estimator].needs_critic
    ):
        differing["advantage_estimator"] = (estimator, config.advantage_estimator)
    if differing:
        listed = "; ".join(f"{name}: checkpoint {a!r}, this algorithm {b!r}" for name, (a, b) in differing.items())
        raise ValueError(
            f"the checkpoint at {path} does not fit this algorithm ({listed}). Build the algorithm "
            "with the checkpoint's settings, or use StarPO.from_checkpoint(path)."
        )


def remove_failed_copy(storage) -> None:
    """Remove the ``checkpoint_<n>/`` that Tune's copy into the trial folder (``storage``: the trial's
    ``StorageContext``, its index already moved on to this checkpoint) left part-written: Tune never recorded it."""
    import pyarrow.fs

    folder = storage.checkpoint_fs_path
    if storage.storage_filesystem.get_file_info(folder).type == pyarrow.fs.FileType.Directory:
        storage.storage_filesystem.delete_dir(folder)
        logger.error("checkpoint %s could not be written whole and was removed", folder)
