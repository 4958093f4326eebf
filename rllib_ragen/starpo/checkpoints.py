"""Checkpoint directories that a kill or a full disk cannot corrupt, and the check that a checkpoint fits.

RLlib's ``save_to_path`` writes file by file into the target directory, so a process killed halfway through
leaves the old checkpoint destroyed or, worse, a loadable mix of new weights with the old iteration and optimizer
state. :func:`write_atomically` has the writer fill a sibling ``.{name}.partial`` directory and only then moves it
into place; until that moment the old checkpoint is untouched.

Moving a directory over a non-empty one is two renames (old aside to ``.{name}.previous``, new in). A kill between
them leaves no ``name`` but a complete ``.{name}.previous``: :func:`recover_interrupted_save`, called before every
load and save, puts it back. A checkpoint Tune copies into a trial folder (``StarPO.save``) whose copy failed is
removed (:func:`remove_failed_copy`); :func:`check_checkpoint_fits` refuses one an algorithm cannot hold.
:class:`CheckpointsAndExport` is StarPO's side of all this, and its export of the policy.
"""

from __future__ import annotations

import logging
import os
import pathlib
import pickle
import shutil
import tempfile
from typing import Callable

import torch
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.core import COMPONENT_LEARNER_GROUP, DEFAULT_MODULE_ID
from ray.rllib.utils.annotations import override

from .inference_engines import load_policy_into_engines
from .llm_rl_module import PLACEHOLDER_SPACE, CausalLMRLModule
from .weight_sync import share_or_copy

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


class CheckpointsAndExport:
    """StarPO's checkpoints and export (a part of :class:`~rllib_ragen.starpo.starpo.StarPO`): RLlib's saves made
    whole-or-absent, its restores recovering an interrupted save and checking the checkpoint fits the config, the
    rollout scheduler's and the sentinel's state in the algorithm's, and the policy exported for plain
    transformers."""

    # RLlib hands a path string to pyarrow, which refuses relative ones ("URI has empty scheme"); resolve them.
    @override(Algorithm)
    def save_to_path(self, path=None, **kwargs) -> str:
        """RLlib's save, made atomic for local directories: a kill at any moment leaves either the old checkpoint
        or the new one at ``path``, never a mix (see :mod:`rllib_ragen.starpo.checkpoints`)."""
        path = _absolute(path)
        if path is None or "://" in str(path) or kwargs.get("filesystem") is not None:
            return super().save_to_path(path, **kwargs)
        return write_atomically(
            path, lambda directory: super(CheckpointsAndExport, self).save_to_path(directory, **kwargs)
        )

    def save(self, checkpoint_dir: str | None = None):
        """Tune's checkpoint (``Trainable.save``: written to a temporary folder, then copied into the trial's
        ``checkpoint_<n>/``), whole or absent: a ``checkpoint_<n>/`` whose copy failed (a full disk) is removed
        before the error goes on, since Tune only records it as a checkpoint once the copy finished. The temporary
        folder goes either way (Tune's own removal is skipped when the copy raises)."""
        storage = getattr(self, "_storage", None)
        if storage is None or checkpoint_dir is not None:
            return super().save(checkpoint_dir)
        index, directory = storage.current_checkpoint_index, tempfile.mkdtemp(prefix="starpo_checkpoint_")
        try:
            return super().save(directory)
        except BaseException:
            if storage.current_checkpoint_index != index:  # the failed copy's folder, never an earlier checkpoint
                remove_failed_copy(storage)
            raise
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    @override(Algorithm)
    def restore_from_path(self, path, **kwargs) -> None:
        path = _absolute(path)
        if "://" not in str(path):
            recover_interrupted_save(path)
        check_checkpoint_fits(self.config, path)
        super().restore_from_path(path, **kwargs)
        if self.engine_actors is None:  # (engines: set_state loaded them) RLlib's own sync here can be dropped or
            self.sync_rollout_weights()  # refused by the runners: see _push_weights_to_env_runners

    @classmethod
    def from_checkpoint(cls, path, filesystem=None, **kwargs) -> Algorithm:
        path = _absolute(path)
        if isinstance(path, (str, os.PathLike)) and "://" not in str(path):
            recover_interrupted_save(path)
        return super().from_checkpoint(path, filesystem, **kwargs)

    @override(Algorithm)
    def get_state(self, *args, **kwargs):
        rollouts = self.rollouts.get_state()  # first: it waits for the rollout in flight
        state = super().get_state(*args, **kwargs)
        state["starpo"] = {**rollouts, "sentinel": self.sentinel.get_state()}
        if self.role_baselines is not None:
            state["starpo"]["role_baselines"] = self.role_baselines.get_state()
        return state

    @override(Algorithm)
    def set_state(self, state) -> None:
        super().set_state(state)
        if "starpo" in state:
            self.rollouts.set_state(state["starpo"])
            if self.role_baselines is not None and "role_baselines" in state["starpo"]:
                self.role_baselines.set_state(state["starpo"]["role_baselines"])
            if "sentinel" in state["starpo"]:
                self.sentinel.set_state(state["starpo"]["sentinel"])
                if self.sentinel.lr_factor != 1.0:
                    self.sentinel_actions.apply_lr_factor()
        if getattr(self, "engine_actors", None) is not None:
            load_policy_into_engines(self)  # restored weights must reach the engines before the next rollout
        elif COMPONENT_LEARNER_GROUP in state:
            self._send_policy_to_env_runners()  # RLlib's sync in set_state can be dropped (see the method)

    def _learner_module_state(self, policy: str = DEFAULT_MODULE_ID) -> dict[str, torch.Tensor]:
        """The learner's current module state of ``policy``, critic left out."""
        return self.learner_group.get_state(components="learner/rl_module/" + policy, inference_only=True)["learner"][
            "rl_module"
        ][policy]

    def policy_weights(self, policy: str = DEFAULT_MODULE_ID) -> dict[str, torch.Tensor]:
        """The learner's current weights of ``policy`` (separate policies: any of them), with the Hugging Face
        model's own parameter names."""
        return CausalLMRLModule.policy_state(self._learner_module_state(policy))

    def export_pretrained(self, path) -> None:
        """Save the current policy and tokenizer with ``save_pretrained``:
        ``AutoModelForCausalLM.from_pretrained(path)`` loads it with plain transformers. Separate policies: each
        into ``path/<policy id>``, the frozen ones as they started."""
        path = pathlib.Path(path)
        if path.exists() and not path.is_dir():  # save_pretrained would only log an error and write nothing
            raise NotADirectoryError(f"cannot export the policy to {path}: it is a file.")
        if self.config.separate_policies:
            module = self._inference_module()
            for policy in self.config.policy_ids():
                module.set_state(self._learner_module_state(policy))
                _saved(module, path / policy)
            return
        # A runner that plays the learner's own tensors takes them in place, one merged LoRA layer at a time; else a
        # module loads the whole merged state (SmolLM2: a float32 copy of every weight, 0.54 GB at once).
        if self.config.max_policy_lag or self._play_learner_in_process(share=True) is None:
            module = self.env_runner.module if self.env_runner is not None else self._inference_module()
            module.set_state(self._learner_module_state())
        else:
            module = self.env_runner.module
        _saved(module, path)

    def export_league(self, path) -> list[pathlib.Path]:
        """Save each snapshot the league holds now as ``path/<name>`` (``snapshot_<iteration>``), a model folder as
        :meth:`export_pretrained` writes: what :func:`rllib_ragen.jobs.matches.league_ratings` plays. Returns the
        folders, oldest first; none without a league."""
        league = self.rollouts.league
        if league is None or not league.snapshots:
            return []
        module = self._inference_module()  # a module of its own: the runner's keeps playing the learner's weights
        folders = []
        for name, tensors in league.snapshots.items():
            share_or_copy(tensors, module.policy, share=False)  # as a runner loads a snapshot it plays
            folders.append(_saved(module, pathlib.Path(path) / name))
        return folders

    def _inference_module(self):
        return self.config.get_rl_module_spec(
            spaces={DEFAULT_MODULE_ID: (PLACEHOLDER_SPACE, PLACEHOLDER_SPACE)}, inference_only=True
        ).build()


def _saved(module, path: pathlib.Path) -> pathlib.Path:
    """``module``'s policy and tokenizer saved to ``path``, which must then hold a model's ``config.json``."""
    module.save_pretrained(path)
    if not (path / "config.json").is_file():
        raise OSError(f"exporting the policy to {path} wrote no config.json; see the errors above.")
    return path


def _absolute(path):
    """A local path made absolute; None, URIs (``s3://...``) and Tune checkpoints pass through."""
    if path is None or not isinstance(path, (str, os.PathLike)) or "://" in str(path):
        return path
    return os.path.abspath(os.path.expanduser(path))
