"""The text EnvRunner: plays the rollout engine with the latest policy weights, locally or as a Ray actor.

The driver decides what to play (initial-state seeds, group size, sampling, sampling seed) and the runner
returns token-exact trajectories. Weights arrive through RLlib's ``set_state``: the runner loads them into its
inference-only module and into its backend. With vLLM the algorithm loads new weights into the shared engines
itself, once for all runners, and skips the runners' weight broadcast.
"""

from __future__ import annotations

import copy
import logging
from collections import Counter
from typing import Sequence

import ray
import torch
from ray.rllib.core import COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.env import INPUT_ENV_SPACES
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.utils.annotations import override
from ray.rllib.utils.checkpoints import Checkpointable
from ray.rllib.utils.framework import get_device
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

from .. import metrics as M
from ..envs import register_carried
from ..rollout.backends import HFBackend, SamplingParams
from ..rollout.engine import RolloutEngine
from ..rollout.models import cast_weights
from ..envs.games import make_game
from ..rollout.seats import DEFAULT_POLICY, play_games
from ..rollout.trajectory import Start, Trajectory, rollout_metrics
from ..envs.seat import seat_for_seed
from .inference_engines import make_backend
from .league import League, learner_seat
from .llm_rl_module import PLACEHOLDER_SPACE
from .weight_sync import share_or_copy

logger = logging.getLogger(__name__)
SUMMED_TIMES = (M.TIME_ROLLOUT, M.TIME_GENERATE)  # the policies' engine calls run one after another


class TextEnvRunner(EnvRunner, Checkpointable):
    def __init__(self, *, config, **kwargs):
        register_carried(config.text_env_registrations)  # the user's environments, in this worker process
        super().__init__(config=config, **kwargs)
        if self.worker_index:  # a Ray actor: one torch thread per CPU it was given (more threads thrash)
            torch.set_num_threads(max(1, int(self.config.num_cpus_per_env_runner)))
        spec = self.config.get_rl_module_spec(
            spaces={DEFAULT_MODULE_ID: (PLACEHOLDER_SPACE, PLACEHOLDER_SPACE)}, inference_only=True
        )
        # One sampler per policy (one without separate policies: starpo/policies.py), each its own copy of the model.
        # ``module``, ``backend`` and ``engine`` are the first trained policy's: they play the single-agent rollouts.
        self.modules = {policy: spec.build().to(self._rollout_device()) for policy in self.config.policy_ids()}
        if self.config.rollout_dtype is not None:  # the sampler's copy only: the learner keeps the model's dtype
            for module in self.modules.values():
                cast_weights(module.policy, getattr(torch, self.config.rollout_dtype))
        self.module = self.modules[self.module_policy]
        self.tokenizer = self.module.tokenizer
        self.backends = {
            policy: make_backend(self.config.inference_backend, module.policy, self.tokenizer, self.config)
            for policy, module in self.modules.items()
        }
        self.engines = {
            policy: RolloutEngine(self.config.rollout_config(), backend, self.tokenizer)
            for policy, backend in self.backends.items()
        }
        self.backend, self.engine = self.backends[self.module_policy], self.engines[self.module_policy]
        self._check_first_prompts_fit()
        self._weights_seq_no = 0
        self._metrics: dict[str, float] = {}
        self._snapshots: dict = {}  # a league snapshot's name -> its sampler (_snapshot_backends)

    def _rollout_device(self) -> torch.device:
        """Where the Hugging Face backend generates: the GPU RLlib gave this runner (``num_gpus_per_env_runner``),
        else the CPU. The driver's runner takes one only when it is the only runner (``num_env_runners=0``): with
        remote runners it never samples, and the head node of a cluster may have no GPU."""
        samples_here = self.worker_index > 0 or self.config.num_env_runners == 0
        if self.config.num_gpus_per_env_runner > 0 and samples_here:
            if not torch.cuda.is_available():
                raise RuntimeError(
                    f"num_gpus_per_env_runner={self.config.num_gpus_per_env_runner} but this "
                    "process sees no CUDA device: set it to 0 to sample on the CPU."
                )
            return get_device(self.config, self.config.num_gpus_per_env_runner)
        return torch.device("cpu")

    def _check_first_prompts_fit(self, num_probes: int = 4) -> None:
        """Fail at build, not at the first ``train()``, when no first prompt of an environment leaves room for a
        reply.

        Probes each training and validation environment's first validation states; if some fit, the rollout drops
        (and counts) any that do not. A probe whose reset fails is skipped, as a rollout isolates it (logged here,
        counted when a rollout plays that seed); only an environment none of whose probes reset fails the build.
        """
        config = self.config
        seeds = range(config.validation_seed_start, config.validation_seed_start + num_probes)
        names = dict.fromkeys(e.name for e in config.training_environments() + config.validation_environments())
        for name in names:
            lengths, errors = [], []
            for seed in seeds:
                try:
                    lengths.append(self.engine.first_prompt_length((name, seed) if config.is_mixture else seed))
                except Exception as error:  # the environment's fault, isolated like a rollout's
                    logger.warning("start-up check: %s failed to reset on validation seed %s: %r", name, seed, error)
                    errors.append(error)
            if not lengths:
                raise RuntimeError(
                    f"{name} failed to reset on every probed validation seed ({seeds.start}-"
                    f"{seeds.stop - 1}); the last error: {errors[-1]!r}"
                ) from errors[-1]
            if min(lengths) + self.engine.reply_reserve >= config.max_context_tokens:
                raise ValueError(
                    f"max_context_tokens={config.max_context_tokens} leaves no room for a reply: the first prompts "
                    f"of {name} take {min(lengths)}-{max(lengths)} tokens (validation seeds {seeds.start}-"
                    f"{seeds.stop - 1}). Raise max_context_tokens, or shorten the observation or system prompt."
                )

    # ---- EnvRunner API ---------------------------------------------------------------------------------------------
    @override(EnvRunner)
    def assert_healthy(self):
        assert self.engine is not None and self.module is not None, "TextEnvRunner was not set up."

    @property
    def module_policy(self) -> str:
        """The policy id of :attr:`module`."""
        return self.config.trained_policy_ids()[0]

    @override(EnvRunner)
    def get_spaces(self):
        spaces = {policy: (PLACEHOLDER_SPACE, PLACEHOLDER_SPACE) for policy in self.modules}
        return {INPUT_ENV_SPACES: (PLACEHOLDER_SPACE, PLACEHOLDER_SPACE), **spaces}

    @override(EnvRunner)
    def sample(
        self,
        *,
        seeds: Sequence[Start],
        group_size: int,
        sampling: SamplingParams,
        sample_seed: int | None = None,
        env_config: dict | None = None,
        every_seat: bool = False,
        opponents: Sequence[str | None] | None = None,
        league: dict[str, dict[str, torch.Tensor]] | None = None,
        **kwargs,
    ) -> list[Trajectory]:
        """Play ``len(seeds)`` groups of ``group_size`` episodes (``env_config``: a curriculum stage's arguments
        for ``config.env``; ``every_seat``: games of ``config.env`` with the policy in every seat, self-play;
        ``opponents``: each group's league snapshot, a name in ``league`` (its policy tensors), or None for
        self-play); metrics go to :meth:`get_metrics`."""
        if every_seat:
            trajectories, self._metrics = self._play_every_seat(
                seeds, group_size, sampling, sample_seed, env_config, opponents, league or {}
            )
        elif self.config.separate_policies:
            trajectories, self._metrics = self._play_each_seat_by_its_policy(
                seeds, group_size, sampling, sample_seed, env_config
            )
        else:
            trajectories, self._metrics = self.engine.rollout(seeds, group_size, sampling, sample_seed, env_config)
        self._metrics[M.WEIGHTS_SEQ_NO] = float(self._weights_seq_no)
        return trajectories

    def _play_every_seat(self, seeds, group_size, sampling, sample_seed, env_config, opponents, league):
        """Self-play: every seat of ``config.env``'s games by the policy (the scheduler then groups them per seat),
        or in a group with a league opponent, the learner's seat by the policy and the other by that snapshot."""
        game_config = (env_config if env_config is not None else self.config.env_config).get("game_config")
        # With validation_envs set, starts name their environment ((name, seed)); training plays config.env alone.
        seeds = [seed[1] if isinstance(seed, tuple) else seed for seed in seeds]
        policies, policy_of = None, None
        if self.config.separate_policies:
            policies, policy_of = self.backends, lambda seat, index: self.config.seat_policy(seat)
        elif opponents is not None and any(opponents):
            policies = {DEFAULT_POLICY: self.backend, **self._snapshot_backends(league)}
            seats = make_game(self.config.env, config=dict(game_config or {})).possible_agents

            def policy_of(seat, index):
                group = index // group_size
                opponent = opponents[group]
                return DEFAULT_POLICY if opponent is None or seat == learner_seat(seats, seeds[group]) else opponent

        return play_games(
            self.engine,
            self.config.env,
            seeds,
            group_size,
            sampling,
            sample_seed=sample_seed,
            game_config=game_config,
            policies=policies,
            policy_of=policy_of,
        )

    def _play_each_seat_by_its_policy(self, starts, group_size, sampling, sample_seed, env_config):
        """Separate policies on the seat environments (validation, a single-agent rollout of the game): each start
        played by the policy of the seat it puts the agent in (the seat environment's rule), one engine call per
        policy; the groups keep their numbers (their starts' places)."""
        by_policy: dict[str, list[int]] = {}
        for index, start in enumerate(starts):
            by_policy.setdefault(self.config.seat_policy(self._seat_of(start, env_config)), []).append(index)
        trajectories, metrics, counted = [], {}, Counter()
        for policy, indices in sorted(by_policy.items()):
            part, part_metrics = self.engines[policy].rollout(
                [starts[i] for i in indices], group_size, sampling, sample_seed, env_config
            )
            for t in part:
                t.group, t.policy_id = indices[t.group], policy
            trajectories += part
            counted.update({k: v for k, v in part_metrics.items() if k in M.ROLLOUT_COUNTERS + SUMMED_TIMES})
            if M.FIRST_ENV_ERROR in part_metrics:
                metrics.setdefault(M.FIRST_ENV_ERROR, part_metrics[M.FIRST_ENV_ERROR])
        trajectories.sort(key=lambda t: t.group)
        metrics.update(rollout_metrics(trajectories, group_size))
        metrics.update({k: float(v) for k, v in counted.items()})
        return trajectories, metrics

    def _seat_of(self, start: Start, env_config: dict | None) -> str:
        """The seat a seat environment plays from ``start`` (``SeatEnv.reset``'s rule)."""
        if isinstance(start, tuple):  # a validation environment's (name, seed)
            name, seed = start
            settings = next(e.env_config for e in self.config.validation_environments() if e.name == name)
        else:
            seed, settings = start, env_config if env_config is not None else self.config.env_config
        seats = make_game(self.config.env, config=dict(settings.get("game_config") or {})).possible_agents
        return seat_for_seed(seats, seed, settings.get("seat"))

    def _snapshot_backends(self, league: dict[str, dict[str, torch.Tensor]]) -> dict:
        """A sampler for each of ``league``'s snapshots (those drawn this rollout): a copy of this runner's policy
        holding the snapshot's weights. Snapshots never change, so each is built once and kept while it may still be
        drawn: the newest ``league_size`` this runner has seen, the league's own rule (one not drawn this rollout is
        not rebuilt when drawn again)."""
        for name in league:
            if name not in self._snapshots:
                frozen = copy.deepcopy(self.module.policy).requires_grad_(False)
                share_or_copy(league[name], frozen, share=False)
                self._snapshots[name] = make_backend("hf", frozen, self.tokenizer, self.config)
        newest = sorted(self._snapshots, key=League.iteration)[-self.config.league_size :]
        self._snapshots = {name: self._snapshots[name] for name in newest}
        return {name: self._snapshots[name] for name in league}

    @override(EnvRunner)
    def get_metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    @override(EnvRunner)
    def stop(self) -> None:
        self.engine = None

    @property
    def weights_seq_no(self) -> int:
        """The version of the weights this runner plays (the learner's update count when they were sent)."""
        return self._weights_seq_no

    def attach_inference_engines(self, engines) -> None:
        """Route this runner's generation to the algorithm's vLLM engines (``RemoteEngine`` clients)."""
        self.backend.attach(engines)

    # ---- weights and checkpoints -----------------------------------------------------------------------------------
    @override(Checkpointable)
    def get_state(self, components=None, *, not_components=None, **kwargs):
        state = {WEIGHTS_SEQ_NO: self._weights_seq_no}
        if self._check_component(COMPONENT_RL_MODULE, components, not_components):
            state[COMPONENT_RL_MODULE] = (
                {policy: module.get_state() for policy, module in self.modules.items()}
                if self.config.separate_policies
                else self.module.get_state()
            )
        return state

    @override(Checkpointable)
    def set_state(self, state) -> None:
        if COMPONENT_RL_MODULE not in state:
            return
        seq_no = state.get(WEIGHTS_SEQ_NO, 0)
        if seq_no and seq_no <= self._weights_seq_no:
            return  # these weights are not newer than ours
        self.load_policy(state)

    def load_policy(self, state) -> None:
        """Play ``state[COMPONENT_RL_MODULE]`` from now on, whatever its version: unlike :meth:`set_state`, this
        also goes back to older weights (a checkpoint restored into a running algorithm)."""
        seq_no = state.get(WEIGHTS_SEQ_NO, 0)
        module_state = state[COMPONENT_RL_MODULE]
        if isinstance(module_state, ray.ObjectRef):  # RLlib puts large states into the object store
            module_state = ray.get(module_state)
        if not self.config.separate_policies:
            module_state = {DEFAULT_MODULE_ID: module_state.get(DEFAULT_MODULE_ID, module_state)}
        for policy, state_of_policy in module_state.items():  # a learner's MultiRLModule: every policy's
            self.modules[policy].set_state(state_of_policy)
            self._backend_takes_module_weights(policy)
        self._weights_seq_no = seq_no

    def _backend_takes_module_weights(self, policy: str) -> None:
        """After policy ``policy``'s module changed: the HF backend samples from the module's own policy and only
        drops its KV cache; any other backend loads the policy's weights."""
        backend, module = self.backends[policy], self.modules[policy]
        if isinstance(backend, HFBackend) and backend.model is module.policy:
            backend.weights_changed()
        else:
            backend.load_weights(module.policy.state_dict())

    def play_in_process(self, policy_states: dict[str, dict[str, torch.Tensor]], seq_no: int, *, share: bool) -> int:
        """Play the policies of a learner in this same process: ``policy_states`` maps each policy id to its tensors
        under the policy's own names (``CausalLMRLModule.policy_tensors``). With ``share`` this runner's policy
        becomes those very tensors where device and dtype allow (every later optimizer step is played at once; the
        next sync only drops the KV cache), else each tensor is copied device to device. Returns the bytes copied
        (0 when shared)."""
        copied = 0
        for policy, tensors in policy_states.items():
            copied += share_or_copy(tensors, self.modules[policy].policy, share=share)
            self._backend_takes_module_weights(policy)
        self._weights_seq_no = seq_no
        return copied

    @override(Checkpointable)
    def get_ctor_args_and_kwargs(self):
        return (), {"config": self.config}

    @override(Checkpointable)
    def get_checkpointable_components(self):
        return []
