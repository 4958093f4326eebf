"""The StarPO learner's optimizers (a part of :class:`~rllib_ragen.starpo.starpo_learner.StarPOTorchLearner`): AdamW
for the actor and the critic, each with its own learning rate and gradient clipping, a sentinel rollback's rate
factor, and the optimizer state as torch tensors in checkpoints."""

from __future__ import annotations

import numpy as np
import torch
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.annotations import override

from .. import metrics as M


class LearnerOptimizers:
    """The learner's optimizers; its ``build`` sets ``_lr_factor`` (1.0)."""

    # ---- optimizers: AdamW for the actor and the critic, each with its own learning rate --------------------------
    @override(TorchLearner)
    def configure_optimizers_for_module(self, module_id, config=None) -> None:
        module = self._module[module_id]
        actor = [p for p in module.policy.parameters() if p.requires_grad]  # with LoRA: the adapters alone
        self.register_optimizer(
            module_id=module_id,
            optimizer_name="actor",
            params=actor,
            optimizer=self._adamw(actor, config),
            lr_or_lr_schedule=config.lr,
        )
        critic = [p for name, p in module.named_parameters() if name.startswith(("critic.", "value_head."))]
        if critic:
            self.register_optimizer(
                module_id=module_id,
                optimizer_name="critic",
                params=critic,
                optimizer=self._adamw(critic, config),
                lr_or_lr_schedule=config.critic_lr,
            )

    @staticmethod
    def _adamw(params: list, config) -> torch.optim.AdamW:
        """AdamW; on a GPU its fused kernel (one launch for every tensor, the same update up to rounding), on the CPU
        torch's default implementation, as before."""
        fused = bool(params) and all(p.is_cuda for p in params)
        return torch.optim.AdamW(
            params, betas=config.adam_betas, weight_decay=config.weight_decay, **({"fused": True} if fused else {})
        )

    def set_lr_factor(self, factor: float) -> None:
        """Multiply every optimizer's configured learning rate by ``factor`` from now on (a sentinel rollback)."""
        self._lr_factor = float(factor)
        self._apply_lr_factor()

    def _apply_lr_factor(self) -> None:
        for optimizer, schedule in self._optimizer_lr_schedules.items():
            self._set_optimizer_lr(optimizer, lr=float(schedule.get_current_value()) * self._lr_factor)

    @override(TorchLearner)
    def _set_optimizer_state(self, state) -> None:
        super()._set_optimizer_state(state)
        # The checkpoint's param groups hold the rate it trained with. A fixed rate configured now (a resume with
        # other settings, which the job reports) must drive the very next update, not only the ones after it. A
        # schedule keeps the checkpoint's value, which RLlib moves along the schedule after that update.
        for optimizer, schedule in self._optimizer_lr_schedules.items():
            if not schedule.use_schedule:
                self._set_optimizer_lr(optimizer, lr=float(schedule.get_current_value()) * self._lr_factor)

    @override(TorchLearner)
    def after_gradient_based_update(self, *, timesteps) -> None:
        super().after_gradient_based_update(timesteps=timesteps)  # RLlib resets each lr to its schedule's value
        if self._lr_factor != 1.0:
            self._apply_lr_factor()

    @override(TorchLearner)
    def postprocess_gradients_for_module(self, *, module_id, config=None, module_gradients_dict):
        """Clip the actor's and the critic's gradients separately by global norm; log both norms."""
        for name, optimizer in self.get_optimizers_for_module(module_id):
            grads = self.filter_param_dict_for_optimizer(module_gradients_dict, optimizer)
            if not grads:
                continue
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads.values()]))
            if config.grad_clip is not None and torch.isfinite(norm):
                scale = min(1.0, config.grad_clip / (norm.item() + 1e-6))
                for g in grads.values():
                    g.mul_(scale)
            self.metrics.log_value((module_id, M.GRAD_NORM.format(optimizer=name)), norm.item(), window=1000)
        return module_gradients_dict

    # ---- optimizer state as torch tensors (numpy has no bfloat16) --------------------------------------------------
    @override(TorchLearner)
    def _get_optimizer_state(self):
        return {
            name: {"module_id": self._optimizer_name_to_module[name], "state": _cpu_clone(optim.state_dict())}
            for name, optim in self._named_optimizers.items()
        }


def _cpu_clone(state):
    if isinstance(state, torch.Tensor):
        return state.detach().cpu().clone()
    if isinstance(state, dict):
        return {k: _cpu_clone(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_cpu_clone(v) for v in state)
    return state if not isinstance(state, np.ndarray) else state.copy()
