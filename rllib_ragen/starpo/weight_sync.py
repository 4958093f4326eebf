"""Weight sync inside one process: the sampler plays the learner's own tensors, or a device copy of them.

In the default layout (``num_env_runners=0``, ``num_learners=0``) the env runner and the learner live in the
driver. Sending the learner's state through ``get_state`` (a CPU clone), the object store and ``load_state_dict``
costs time in proportion to the model's bytes, for weights that are already in the same process (measured on the
Benchmarks page). Here the sampler's parameters are made *the same tensors* as the learner's
(no bytes move; an optimizer step changes what the sampler plays at once), or, where the two cannot be the same
tensors (another device or dtype, or LoRA, whose sampler plays merged weights), each is copied device to device.
Weights for remote env runners still go through the object store. :class:`RunnerWeights` is StarPO's side: which of
the two a sync takes.
"""

from __future__ import annotations

import ray
import torch
from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

from .. import metrics as M


def share_or_copy(source: dict[str, torch.Tensor], target: torch.nn.Module, *, share: bool) -> int:
    """Make ``target``'s parameters and buffers hold ``source``'s values; returns the bytes copied.

    Args:
        source: the learner's policy tensors under ``target``'s own ``state_dict`` names (tied weights once or
            twice, as ``state_dict`` lists them).
        target: the sampler's policy module.
        share: where a tensor has the target's device, dtype and shape, the target parameter becomes a view of it
            (0 bytes). False copies every tensor (two versions: the sampler keeps playing its own until the next
            sync).

    Raises:
        ValueError: ``source`` lacks a tensor of ``target`` or has one of another shape (another model).
    """
    own = target.state_dict(keep_vars=True)
    missing = sorted(set(own) - set(source))
    if missing:
        raise ValueError(
            f"the learner's policy lacks {len(missing)} of the sampler's tensors ({missing[:3]}...): "
            "is it the same model?"
        )
    copied, seen = 0, set()
    with torch.no_grad():
        for name, tensor in own.items():
            if id(tensor) in seen:  # a tied weight (lm_head = embed_tokens): one tensor, listed twice
                continue
            seen.add(id(tensor))
            value = source[name].detach()
            if value.shape != tensor.shape:
                raise ValueError(
                    f"the learner's {name} is {tuple(value.shape)} and the sampler's "
                    f"{tuple(tensor.shape)}: is it the same model?"
                )
            if share and value.device == tensor.device and value.dtype == tensor.dtype:
                if tensor.data_ptr() != value.data_ptr():
                    tensor.data = value
                continue
            if tensor.data_ptr() == value.data_ptr():  # shared before (a layout that changed): keep a copy of its own
                tensor.data = value.clone()
                copied += value.numel() * value.element_size()
                continue
            tensor.copy_(value, non_blocking=True)
            copied += value.numel() * value.element_size()
    if copied and any(t.is_cuda for t in own.values()):
        torch.cuda.synchronize()  # a non-blocking copy must land before the first sample reads it
    return copied


def shares_storage(source: dict[str, torch.Tensor], target: torch.nn.Module) -> bool:
    """Whether every tensor of ``target`` is the very tensor of ``source`` under its name (the shared layout)."""
    return all(
        name in source and tensor.data_ptr() == source[name].data_ptr()
        for name, tensor in target.state_dict(keep_vars=True).items()
    )


def state_bytes(state) -> int:
    """Bytes of the tensors in a (nested) state dict: what a sync through the object store moves."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(value) for value in state.values())
    return 0


class RunnerWeights:
    """How the learner's policy reaches StarPO's env runners (a part of :class:`~rllib_ragen.starpo.starpo.StarPO`):
    in place in this process where it can, else through the object store."""

    def _send_policy_to_env_runners(self) -> None:
        """The learner's policy to the env runners: shared or copied in place when the learner and the only env runner
        live in this process (``weight_sync.py``), else through the object store. Logs the bytes moved."""
        moved = self._play_learner_in_process(share=not self.config.max_policy_lag)
        if moved is None:
            moved = self._push_weights_to_env_runners()
        self._log({M.SYNC_BYTES: float(moved)})

    def _play_learner_in_process(self, *, share: bool) -> int | None:
        """Where the learner and the only env runner live in this process: the runner takes the learner's policy
        tensor by tensor (``EnvRunner.play_in_process``) and the bytes copied are returned; elsewhere None."""
        if not (
            self.learner_group.is_local
            and self.env_runner is not None
            and not self.env_runner_group.num_remote_env_runners()
        ):
            return None
        learner = self.learner_group._learner  # private: see _on_first_learner
        states = {policy: learner.module[policy].unwrapped().policy_tensors() for policy in self.env_runner.modules}
        return self.env_runner.play_in_process(states, learner._weights_seq_no, share=share)

    def _push_weights_to_env_runners(self) -> int:
        """Load the learner's policy into every healthy env runner, waiting until each has it.

        Not RLlib's ``sync_weights``: it sends through an async request queue that drops a call, without a word,
        while ``max_requests_in_flight_per_env_runner`` (1 by default) earlier ``set_state`` calls to that runner
        are still in flight (a slow or loaded runner right after a restore), and a runner refuses weights older
        than its own (a checkpoint restored into a running algorithm, as Tune's PBT does). Either way the runner
        went on playing other weights than the learner's.
        """
        state = self.learner_group.get_state(
            components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}", inference_only=True
        )[COMPONENT_LEARNER]
        wanted = state[WEIGHTS_SEQ_NO]
        state_ref = ray.put({COMPONENT_RL_MODULE: state[COMPONENT_RL_MODULE], WEIGHTS_SEQ_NO: wanted})

        def load(runner):
            runner.load_policy(ray.get(state_ref))
            return runner.worker_index, runner.weights_seq_no

        loaded = self.env_runner_group.foreach_env_runner(load, local_env_runner=self.env_runner is not None)
        behind = {index: seq_no for index, seq_no in loaded if seq_no != wanted}
        if behind:
            raise RuntimeError(
                f"env runners {behind} (index: weights version) did not take the learner's weights "
                f"(version {wanted}); a rollout on them would play another policy."
            )
        return state_bytes(state[COMPONENT_RL_MODULE])
