"""Where StarPO's rollouts are generated: the inference-backend table, and vLLM engines as Ray actors.

``INFERENCE_BACKENDS`` maps each ``inference_backend`` name to the factory an env runner builds its backend with:
``factory(model, tokenizer, config) -> InferenceBackend``. ``"hf"`` samples with the env runner's own copy of the
policy; ``"vllm"`` starts empty and is attached to the algorithm's shared engines after they start. Add your own
with :func:`register_inference_backend`, or pass the factory itself as ``inference_backend``.

:func:`launch_engines` starts :class:`~rllib_ragen.rollout.vllm_backend.VLLMEngine` actors, one per bundle of a
``PACK`` placement group; :class:`EngineActors` holds them, hands env runners :class:`RemoteEngine` clients, and
syncs weights with one object-store copy for all engines. :func:`start_engines_for` and
:func:`load_policy_into_engines` are an algorithm's engine lifecycle (``inference_backend="vllm"``).
"""

from __future__ import annotations

import tempfile
import time
from concurrent.futures import Future
from typing import Any, Callable, Sequence

import ray
import torch
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ..rollout.backends import HFBackend, InferenceBackend, SamplingParams
from ..rollout.lora import adapter_files, lora_settings
from ..rollout.models import BUILT_IN_MODELS
from ..rollout.vllm_backend import VLLM_MISSING, VLLMBackend, VLLMEngine, vllm_available

BackendFactory = Callable[[Any, Any, Any], InferenceBackend]

INFERENCE_BACKENDS: dict[str, BackendFactory] = {
    # Batched KV-cached sampling with the env runner's own policy copy (CPU or GPU).
    "hf": lambda model, tokenizer, config: HFBackend(model, tokenizer, max_batch_size=config.inference_batch_size),
    # A client of the algorithm's vLLM engines; StarPO attaches them once they serve.
    "vllm": lambda model, tokenizer, config: VLLMBackend(),
}


def register_inference_backend(name: str, factory: BackendFactory) -> None:
    """Make ``inference_backend=name`` build env runners' backends with ``factory(model, tokenizer, config)``.

    Register in a module every env-runner process imports (remote runners rebuild the table by importing it).
    """
    if name in ("hf", "vllm"):
        raise ValueError(f"inference backend {name!r} is built in; register yours under another name.")
    INFERENCE_BACKENDS[name] = factory


def make_backend(kind: str | BackendFactory, model, tokenizer, config) -> InferenceBackend:
    """The backend ``inference_backend`` names (``StarPOConfig.validate`` has checked the name)."""
    factory = kind if callable(kind) else INFERENCE_BACKENDS[kind]
    return factory(model, tokenizer, config)


class RemoteEngine:
    """A :class:`VLLMEngine` Ray actor, seen through the engine interface :class:`VLLMBackend` calls."""

    def __init__(self, actor):
        self.actor = actor

    def submit(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seed: int | None = None,
        max_new_tokens: Sequence[int] | None = None,
    ) -> Future:
        return self.actor.generate.remote(prompts, params, seed, max_new_tokens).future()

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int | None = None) -> float:
        return ray.get(self.actor.load_weights.remote(state_dict, version))

    def load_adapter(
        self, config: dict[str, Any], tensors: dict[str, torch.Tensor], version: int | None = None
    ) -> float:
        return ray.get(self.actor.load_adapter.remote(config, tensors, version))

    def get_stats(self) -> dict[str, Any]:
        return ray.get(self.actor.get_stats.remote())

    def sequence_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        return ray.get(self.actor.sequence_logprobs.remote(token_ids))


class EngineActors:
    """vLLM engine actors and the placement group that reserves their devices."""

    def __init__(self, actors: list, group):
        self.actors, self.placement_group = actors, group
        self.clients = [RemoteEngine(actor) for actor in actors]

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int | None = None) -> float:
        """Load the policy's weights into every engine from one object-store copy; returns the seconds."""
        t0 = time.perf_counter()
        ref = ray.put({k: v.detach().cpu().contiguous() for k, v in state_dict.items()})
        ray.get([actor.load_weights.remote(ref, version) for actor in self.actors])
        return time.perf_counter() - t0

    def load_adapter(
        self, config: dict[str, Any], tensors: dict[str, torch.Tensor], version: int | None = None
    ) -> float:
        """Serve a new LoRA adapter on every engine from one object-store copy; returns the seconds."""
        t0 = time.perf_counter()
        ref = ray.put(tensors)
        ray.get([actor.load_adapter.remote(config, ref, version) for actor in self.actors])
        return time.perf_counter() - t0

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        remove_placement_group(self.placement_group)
        self.actors, self.clients = [], []


def launch_engines(
    model: str, num_engines: int = 1, *, num_gpus_per_engine: float | None = None, **engine_kwargs
) -> EngineActors:
    """Start ``num_engines`` :class:`VLLMEngine` Ray actors in one placement group (a bundle per engine).

    Each bundle asks for ``tensor_parallel_size`` GPUs (``num_gpus_per_engine`` overrides; 0 on a CPU build)
    and one CPU; ``PACK`` keeps an engine's devices together. Returns once every engine is serving.
    """
    if not vllm_available():
        raise ImportError(VLLM_MISSING)
    tp = int(engine_kwargs.get("tensor_parallel_size", 1))
    gpus = float(tp if num_gpus_per_engine is None else num_gpus_per_engine)
    if not torch.cuda.is_available() and num_gpus_per_engine is None:
        gpus = 0.0  # vLLM's CPU build: engines are plain CPU actors
    bundle = {"CPU": 1.0, **({"GPU": gpus} if gpus else {})}
    group = placement_group([dict(bundle) for _ in range(num_engines)], strategy="PACK")
    ray.get(group.ready(), timeout=600)
    actor_class = ray.remote(VLLMEngine)
    actors = [
        actor_class.options(
            num_cpus=1,
            num_gpus=gpus,
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=i),
        ).remote(model, **engine_kwargs)
        for i in range(num_engines)
    ]
    ray.get([actor.get_stats.remote() for actor in actors])  # wait until every engine has loaded its model
    return EngineActors(actors, group)


# ---- an algorithm's engines: started with it, loaded with each new policy ------------------------------------------
def start_engines_for(algo) -> EngineActors:
    """Launch the vLLM engine actors on ``algo``'s current policy and attach them to every env runner."""
    config = algo.config
    model = config.model_config["model"]
    if model in BUILT_IN_MODELS:  # built in-process: vLLM needs them as a directory
        model = tempfile.mkdtemp(prefix="rllib_ragen_vllm_")
        algo.export_pretrained(model)
    options = {"max_model_len": config.max_context_tokens, **config.vllm_engine_config}
    lora = lora_settings(config.model_config.get("lora"))
    if lora:  # the engines serve the base weights and receive only the adapter
        options["max_lora_rank"] = lora["r"]
    gpus = options.pop("num_gpus_per_engine", None)
    actors = launch_engines(
        model,
        config.num_inference_engines,
        num_gpus_per_engine=gpus,
        dtype=config.sampling_dtype,
        seed=config.seed or 0,
        **options,
    )
    clients = actors.clients
    algo.env_runner_group.foreach_env_runner(
        lambda runner: runner.attach_inference_engines(clients), local_env_runner=True
    )
    return actors


def load_policy_into_engines(algo) -> float:
    """Load ``algo``'s current policy into every engine (with LoRA, its adapter); returns the seconds."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    lora = lora_settings(algo.config.model_config.get("lora"))
    if lora:  # from one learner (they hold the same weights), adapters only: the critic stays there
        adapter = algo._on_first_learner(lambda learner: learner.module[DEFAULT_MODULE_ID].unwrapped().adapter_state())
        adapter_config, tensors = adapter_files(adapter, lora, str(algo.config.model_config["model"]))
        return algo.engine_actors.load_adapter(adapter_config, tensors, version=algo.iteration + 1)
    return algo.engine_actors.load_weights(algo.policy_weights(), version=algo.iteration + 1)
