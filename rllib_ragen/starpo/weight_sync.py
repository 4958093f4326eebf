"""Weight sync inside one process: the sampler plays the learner's own tensors, or a device copy of them.

In the default layout (``num_env_runners=0``, ``num_learners=0``) the env runner and the learner live in the
driver. Sending the learner's state through ``get_state`` (a CPU clone), the object store and ``load_state_dict``
costs time in proportion to the model's bytes, for weights that are already in the same process (measured on the
Benchmarks page). Here the sampler's parameters are made *the same tensors* as the learner's
(no bytes move; an optimizer step changes what the sampler plays at once), or, where the two cannot be the same
tensors (another device or dtype, or LoRA, whose sampler plays merged weights), each is copied device to device.
Weights for remote env runners still go through the object store (``StarPO._push_weights_to_env_runners``).
"""

from __future__ import annotations

import torch


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
