"""One GRPO iteration with TRL's GRPOTrainer and with StarPO, side by side, on the single-turn bandit.

Both get the same tiny model and tokenizer (saved to a folder TRL loads), the same 8 first-turn bandit prompts
(StarPO's own, as token-exact text), 8 completions per prompt, the same max new tokens and temperature, GRPO
advantages, no KL term, token-mean loss, one optimizer step per iteration, AdamW at the same lr, and the same
number of torch threads; each runs on the CPU in this process, one after the other. The reward is the bandit's
own, scored on each completion by the same environment code.

Printed per side (median over the timed iterations after a warm-up one): seconds per iteration, generated tokens
per second (generation time from a timer around each side's generate call), update tokens per second (prompt and
completion tokens over the rest of the iteration), and the ratios StarPO / TRL.

    pip install "rllib_ragen[peer]"      # TRL and datasets: a benchmark extra, never the base install
    python benchmarks/peer_trl.py [--iterations 4] [--groups 8] [--group-size 8] [--max-new-tokens 32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import gymnasium as gym  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402

from rllib_ragen import StarPOConfig  # noqa: E402
from rllib_ragen.rollout.models import load_policy  # noqa: E402
from rllib_ragen.rollout.protocol import execute_turn, parse_reply  # noqa: E402

ENV = "rllib_ragen/Bandit-v0"


def bandit_reward(texts: list[str], seed: int) -> list[float]:
    """The bandit's reward for each reply, through the same protocol and environment code StarPO's rollout uses
    (format penalty included)."""
    env = gym.make(ENV)
    rewards = []
    for i, text in enumerate(texts):
        env.reset(seed=seed * len(texts) + i)
        reply = parse_reply(text, max_actions_per_turn=1)
        rewards.append(execute_turn(env, reply, actions_left=1).reward)
    return rewards


def starpo_side(args, model_dir: str) -> tuple[dict, list[str]]:
    config = (
        StarPOConfig()
        .environment(ENV)
        .rl_module(model_config={"model": model_dir})
        .training(
            advantage_estimator="grpo",
            num_groups=args.groups,
            group_size=args.group_size,
            max_turns=1,
            max_new_tokens_per_turn=args.max_new_tokens,
            temperature=1.0,
            rollout_filter="none",
            kl_coeff=0.0,
            entropy_coeff=0.0,
            lr=1e-5,
            loss_aggregation="token-mean",
            clip_ratio_low=0.2,
            clip_ratio_high=0.28,
            dual_clip=None,
            validation_interval=0,
            collapse_diagnostics_interval=0,
        )
        .debugging(seed=0)
    )
    algo = config.build_algo()
    rows = []
    try:
        for _ in range(args.iterations + 1):
            t0 = time.perf_counter()
            result = algo.train()
            total = time.perf_counter() - t0
            generated = sum(sum(t.response_mask) for t in algo.last_rollout)
            tokens = sum(len(t.token_ids) for t in algo.last_rollout)
            rows.append(
                {
                    "seconds": total,
                    "generate_s": result["env_runners"]["time/generate_s"],
                    "generated": generated,
                    "tokens": tokens,
                    "update_s": result["time/update_s"],
                }
            )
        prompts = [
            algo.tokenizer.decode(t.token_ids[: t.turn_spans[0][0]]) for t in algo.last_rollout if t.group < args.groups
        ][:: args.group_size]
    finally:
        algo.stop()
    return summarise(rows[1:]), prompts


def trl_side(args, model_dir: str, prompts: list[str]) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    generate, generation_s = model.generate, []

    def timed_generate(*a, **k):
        t0 = time.perf_counter()
        out = generate(*a, **k)
        generation_s.append(time.perf_counter() - t0)
        return out

    model.generate = timed_generate
    steps = args.iterations + 1
    batch = args.groups * args.group_size
    dataset = Dataset.from_list([{"prompt": p} for p in prompts] * steps)  # raw text: already chat-formatted
    rows, clock, lengths = [], {}, []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            clock["t0"], clock["generate"] = time.perf_counter(), len(generation_s)

        def on_step_end(self, *a, **k):
            rows.append(
                {"seconds": time.perf_counter() - clock["t0"], "generate_s": sum(generation_s[clock["generate"] :])}
            )

    def reward(completions, **kwargs):
        lengths.append([len(tokenizer(c, add_special_tokens=False).input_ids) for c in completions])
        return bandit_reward(completions, seed=len(lengths))

    with tempfile.TemporaryDirectory() as out:
        grpo = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=batch,
            gradient_accumulation_steps=1,
            num_generations=args.group_size,
            max_completion_length=args.max_new_tokens,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            beta=0.0,
            loss_type="dapo",
            epsilon=0.2,
            epsilon_high=0.28,
            learning_rate=1e-5,
            max_steps=steps,
            use_cpu=True,
            bf16=False,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            disable_dropout=True,
            num_iterations=1,
            shuffle_dataset=False,
            seed=0,
            dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=grpo,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[Timer()],
        )
        trainer.train()
    prompt_tokens = sum(len(tokenizer(p, add_special_tokens=False).input_ids) for p in prompts) * args.group_size
    for row, step_lengths in zip(rows, lengths):
        row["generated"] = sum(step_lengths)
        row["tokens"] = prompt_tokens + sum(step_lengths)
        row["update_s"] = row["seconds"] - row["generate_s"]
    return summarise(rows[1:])


def summarise(rows: list[dict]) -> dict:
    median = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    return {
        "seconds": median("seconds"),
        "generate_s": median("generate_s"),
        "update_s": median("update_s"),
        "generated": median("generated"),
        "tokens": median("tokens"),
        "generated_per_s": statistics.median(r["generated"] / r["generate_s"] for r in rows),
        "update_tokens_per_s": statistics.median(r["tokens"] / r["update_s"] for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=4, help="timed iterations per side, after one warm-up")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as model_dir:
        policy, tokenizer = load_policy("tiny")
        policy.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        starpo, prompts = starpo_side(args, model_dir)
        ray.shutdown()
        trl = trl_side(args, model_dir, prompts)
    import trl as trl_package

    print(
        f"one GRPO iteration: {args.groups} bandit prompts x {args.group_size} completions, up to "
        f"{args.max_new_tokens} new tokens, T = 1.0, tiny model, {args.threads} threads, median of "
        f"{args.iterations} after a warm-up; TRL {trl_package.__version__}"
    )
    print(f"{'':28s} {'StarPO':>10s} {'TRL GRPOTrainer':>16s} {'StarPO / TRL':>13s}")
    rows = [
        ("seconds per iteration", "seconds", "{:.2f}", True),
        ("generation seconds", "generate_s", "{:.2f}", True),
        ("update seconds", "update_s", "{:.2f}", True),
        ("generated tokens", "generated", "{:.0f}", False),
        ("tokens per update", "tokens", "{:.0f}", False),
        ("generated tokens/s", "generated_per_s", "{:,.0f}", False),
        ("update tokens/s", "update_tokens_per_s", "{:,.0f}", False),
    ]
    for label, key, fmt, _ in rows:
        print(f"{label:28s} {fmt.format(starpo[key]):>10s} {fmt.format(trl[key]):>16s} {starpo[key] / trl[key]:>13.2f}")
    print(f"TRL / StarPO seconds per iteration: {trl['seconds'] / starpo['seconds']:.2f}x")


if __name__ == "__main__":
    main()
