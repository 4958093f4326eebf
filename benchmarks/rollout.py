"""Rollout throughput: the engine against a naive multi-turn loop, same model, seeds and token budget.

The naive baseline does what RAGEN does: each turn it re-renders every conversation with the chat
template and re-tokenizes the whole history, generates with Hugging Face ``model.generate`` (the whole history
prefilled again), then steps the environments one by one. Besides
being slower it is not token-exact (earlier replies are re-encoded). The engine appends sampled ids and
observation tokens only.

A second comparison plays the engine twice on the same seeds: with the HF backend's KV cache, which grows in
place, and with Hugging Face's ``DynamicCache``, which copies the whole cache at every decode step. Both sample
the same tokens with the same log-probs (checked here, and in the tests).

    python benchmarks/rollout.py [--model tiny] [--groups 8] [--group-size 4] [--max-new-tokens 48] [--device cuda]
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import torch

import rllib_ragen  # noqa: F401
from rllib_ragen.rollout.backends import Generation, HFBackend, SamplingParams, ScriptedBackend
from rllib_ragen.rollout.context import DEFAULT_SYSTEM_PROMPT, turn_message
from rllib_ragen.rollout.rollout_config import RolloutConfig
from rllib_ragen.rollout.engine import RolloutEngine
from rllib_ragen.rollout.models import load_policy
from rllib_ragen.rollout.protocol import execute_turn, parse_reply
from rllib_ragen import demonstrators


class GenerateBackend:
    """The baseline's generator: Hugging Face ``model.generate`` on left-padded prompts, no cache across turns."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer

    @torch.no_grad()
    def generate(self, prompts, params, seed=None):
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad)
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :], mask[row, width - len(prompt) :] = torch.tensor(prompt), 1
        ids, mask = ids.to(self.model.device), mask.to(self.model.device)
        torch.manual_seed(seed or 0)
        out = self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=params.temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=params.max_new_tokens,
            pad_token_id=pad,
            eos_token_id=eos,
            stop_strings=list(params.stop_strings),
            tokenizer=self.tokenizer,
        )
        replies = []
        for row in out[:, width:].tolist():
            end = next((j + 1 for j, t in enumerate(row) if t == eos), len(row))
            while end > 1 and row[end - 1] == pad:
                end -= 1
            replies.append(Generation(row[:end], [0.0] * end))
        return replies


def naive_rollout(config: RolloutConfig, backend, tokenizer, seeds, group_size, params, sample_seed):
    """Re-render and re-tokenize each conversation every turn; step environments one at a time."""
    envs, chats, budgets, done = [], [], [], []
    for seed in seeds:
        for _ in range(group_size):
            env = gym.make(config.env, **config.env_config)
            obs, _ = env.reset(seed=seed)
            first = (
                env.unwrapped.describe() + "\n" + turn_message(obs, turn=1, actions_left=config.max_actions_per_episode)
            )
            envs.append(env)
            chats.append([{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}, {"role": "user", "content": first}])
            budgets.append(config.max_actions_per_episode)
            done.append(False)
    generated_tokens, t_generate, env_steps = 0, 0.0, 0
    for turn in range(1, config.max_turns + 1):
        active = [i for i in range(len(envs)) if not done[i]]
        if not active:
            break
        prompts = [tokenizer.apply_chat_template(chats[i], tokenize=True, add_generation_prompt=True) for i in active]
        prompts = [p["input_ids"] if isinstance(p, dict) or hasattr(p, "keys") else p for p in prompts]
        t0 = time.perf_counter()
        generations = backend.generate(prompts, params, sample_seed * 1000 + turn)
        t_generate += time.perf_counter() - t0
        for i, generation in zip(active, generations):
            generated_tokens += len(generation.token_ids)
            reply = tokenizer.decode(generation.token_ids, skip_special_tokens=True)
            result = execute_turn(
                envs[i],
                parse_reply(reply, max_actions_per_turn=config.max_actions_per_turn),
                actions_left=budgets[i],
                format_penalty=config.format_penalty,
                ineffective_action_penalty=config.ineffective_action_penalty,
            )
            env_steps += len(result.executed)
            budgets[i] -= len(result.executed)
            done[i] = result.terminated or result.truncated or budgets[i] <= 0 or turn >= config.max_turns
            chats[i] += [
                {"role": "assistant", "content": reply},
                {
                    "role": "user",
                    "content": turn_message(
                        result.observation, turn=turn + 1, actions_left=budgets[i], reward=result.reward
                    ),
                },
            ]
    return generated_tokens, env_steps, t_generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny, smollm2-135m, or a Hugging Face id/path")
    parser.add_argument("--env", default="rllib_ragen/Sokoban-v0")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs of each; the best is reported")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="where the model samples: cpu, cuda, cuda:1, ...")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=128,
        help="rows the engine decodes at once (StarPOConfig.inference_batch_size); more are split",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model, tokenizer = load_policy(args.model)
    model.to(args.device)
    config = RolloutConfig(env=args.env, max_turns=args.max_turns)
    params = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens)
    seeds = list(range(args.groups))
    print(
        f"model={args.model} on {args.device}, env={args.env} {args.groups}x{args.group_size} envs, "
        f"{args.max_turns} turns, {args.max_new_tokens} new tokens/turn, best of {args.repeats}"
    )
    # The engine keeps the KV cache across turns; the naive loop re-reads the whole history every turn with
    # Hugging Face's own generate.
    compare(
        "sampling from the model",
        config,
        params,
        seeds,
        args,
        engine_backend=HFBackend(model, tokenizer, max_batch_size=args.batch_size),
        naive_backend=GenerateBackend(model, tokenizer),
        tokenizer=tokenizer,
    )
    compare_caches(model, tokenizer, config, params, seeds, args)
    # No model: what is left is each loop's own cost (contexts, parsing, env stepping).
    player, name = scripted_player(args.env, config)
    played = ScriptedBackend(player, tokenizer)
    compare(
        f"scripted {name}, no model",
        config,
        params,
        seeds,
        args,
        engine_backend=played,
        naive_backend=played,
        tokenizer=tokenizer,
    )


def scripted_player(env_id: str, config: RolloutConfig):
    """A scripted player of ``env_id`` and its name: the package's solver where it has one that reads this
    environment's text, else moves drawn at random from the environment's action names."""
    env = gym.make(env_id, **config.env_config).unwrapped
    name = env_id.split("/")[-1]
    thinking = config.enable_thinking
    if name in ("Sokoban-v0", "Sokoban8x8TwoBoxes-v0"):
        return demonstrators.sokoban_solver_policy(config.max_actions_per_turn, thinking), "Sokoban solver"
    if name.startswith("FrozenLake"):
        return demonstrators.frozen_lake_optimal_policy(thinking, env.is_slippery), "FrozenLake optimal policy"
    if name.startswith("Bandit"):
        return demonstrators.random_arm_policy(enable_thinking=thinking), "random arm"
    if name == "Countdown-v0":
        return demonstrators.countdown_solver_policy(thinking), "Countdown solver"
    if name == "Sudoku4x4-v0":
        return demonstrators.sudoku_solver_policy(config.max_actions_per_turn, thinking), "Sudoku solver"
    if name == "FactLookup-v0":
        return demonstrators.fact_lookup_solver_policy(), "FactLookup solver"
    return demonstrators.random_moves_policy(env.action_names, enable_thinking=thinking), "random moves"


def compare(title, config, params, seeds, args, engine_backend, naive_backend, tokenizer) -> None:
    engine = RolloutEngine(config, engine_backend, tokenizer)
    best = {"engine": None, "naive": None}
    for repeat in range(args.repeats):
        start = time.perf_counter()
        trajectories, metrics = engine.rollout(seeds, args.group_size, params, sample_seed=repeat)
        wall = time.perf_counter() - start
        tokens = sum(sum(t.response_mask) for t in trajectories)
        steps = sum(t.num_actions for t in trajectories)
        run = (tokens / wall, steps / wall, 1 - metrics["time/generate_s"] / wall, wall)
        best["engine"] = max(best["engine"] or run, run)

        start = time.perf_counter()
        tokens, steps, t_generate = naive_rollout(
            config, naive_backend, tokenizer, seeds, args.group_size, params, repeat
        )
        wall = time.perf_counter() - start
        run = (tokens / wall, steps / wall, 1 - t_generate / wall, wall)
        best["naive"] = max(best["naive"] or run, run)

    print(f"\n{title}")
    print(f"{'':8s} {'gen tok/s':>10s} {'env steps/s':>12s} {'time outside generate':>22s} {'wall s':>8s}")
    for name, (tok_s, step_s, outside, wall) in best.items():
        print(f"{name:8s} {tok_s:10.1f} {step_s:12.1f} {outside:21.1%} {wall:8.3f}")
    print(
        f"engine / naive: {best['engine'][0] / best['naive'][0]:.2f}x tokens/s, "
        f"{best['engine'][1] / max(best['naive'][1], 1e-9):.2f}x env steps/s"
    )


def compare_caches(model, tokenizer, config, params, seeds, args) -> None:
    """The engine with the backend's growing KV cache against Hugging Face's ``DynamicCache``, same rollouts."""
    from transformers import DynamicCache

    import rllib_ragen.rollout.backends as backends

    growing = backends.new_cache
    best, played = {}, {}
    for repeat in range(args.repeats):
        for name, new_cache in (("growing", growing), ("dynamic", lambda m, *_: DynamicCache(config=m.config))):
            backends.new_cache = new_cache
            engine = RolloutEngine(config, HFBackend(model, tokenizer, max_batch_size=args.batch_size), tokenizer)
            start = time.perf_counter()
            trajectories, _ = engine.rollout(seeds, args.group_size, params, sample_seed=repeat)
            wall = time.perf_counter() - start
            best[name] = min(best.get(name, wall), wall)
            played[name] = [(t.token_ids, t.behaviour_logprobs) for t in trajectories]
        backends.new_cache = growing
        if played["growing"] != played["dynamic"]:
            raise AssertionError("the two caches sampled different tokens or log-probs")
    tokens = sum(len(ids) for ids, _ in played["growing"]) / len(played["growing"])
    print(f"\nKV cache across a rollout (the same tokens and log-probs; {tokens:.0f} tokens per episode at the end)")
    for name in ("growing", "dynamic"):
        print(f"{name:8s} {best[name]:8.3f} s")
    print(f"growing / dynamic: {best['dynamic'] / best['growing']:.2f}x faster")


if __name__ == "__main__":
    main()
