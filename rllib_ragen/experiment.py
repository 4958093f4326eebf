"""The main-job driver behind ``tuned_examples/``: warm start, StarPO training with progress, and outputs.

Plain calls, no trainer framework: parse the arguments, warm-start the policy on demonstrations, build the
StarPO algorithm, train it while printing progress, then write what a user needs to judge the run.

Outputs in ``output_dir``: ``metrics.csv`` (one row per iteration, every scalar result), ``learning_curve.png``
(success, reward std, entropy, grad norm per iteration; needs matplotlib), ``validation_rollouts.parquet`` (the
last validation's episodes, with their text), ``policy/`` (the trained model, loadable by plain transformers),
``summary.json`` (before/after validation metrics, throughput, wall time) and ``warm_start/`` (the SFT model).

Example::

    args = parse_args(ExperimentArgs(env="rllib_ragen/Bandit-v0", output_dir="outputs/bandit"))
    run_experiment(args, demonstration_policy=random_arm_policy(seed=0))
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import logging
import math
import os
import pathlib
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .rollout.engine import RolloutConfig, Trajectory
from .rollout.vllm_backend import VLLM_MISSING, vllm_available

BACKENDS = ("hf", "vllm")


def _flag(help_text: str, **kwargs):
    return field(metadata={"help": help_text}, **kwargs)


@dataclass
class ExperimentArgs:
    """A main job's settings; every field is a command-line flag (``num_groups`` -> ``--num-groups``)."""

    env: str = _flag("registered text-environment id", default="rllib_ragen/Sokoban-v0")
    env_config: dict = _flag("environment constructor arguments as JSON, e.g. '{\"reward\": \"success\"}'",
                             default_factory=dict)
    model: str = _flag("'tiny', 'smollm2-135m', or a Hugging Face id / local path", default="tiny")
    iterations: int = _flag("StarPO training iterations (one rollout batch and update each)", default=20)
    preset: str = _flag("'starpo-s' (filter, critic, no KL, clip-higher) or 'starpo' (vanilla)", default="starpo-s")
    output_dir: str = _flag("where metrics, plots, rollouts and the exported model go", default="outputs/starpo")
    seed: int = _flag("seeds the model init, warm start, rollouts and updates", default=0)
    backend: str = _flag("inference backend: 'hf' (in the env runner, CPU or GPU) or 'vllm' (engine actors; needs vLLM)",
                         default="hf")
    num_inference_engines: int = _flag("vLLM engines (with --backend vllm)", default=1)
    num_env_runners: int = _flag("remote env runners (0: sample in the driver process)", default=0)
    num_learners: int = _flag("remote learners (0: learn in the driver process)", default=0)
    num_gpus_per_learner: float = _flag("GPUs per learner", default=0.0)
    threads: int = _flag("torch threads in the driver process", default=2)
    # method knobs (StarPOConfig.training documents each)
    num_groups: int = _flag("initial states per iteration", default=8)
    group_size: int = _flag("episodes per initial state", default=8)
    rollout_filter_ratio: float = _flag("share of groups kept by reward std (1.0: no filter)", default=0.5)
    advantage_estimator: str = _flag("gae (critic), grpo, brpo or raw", default="gae")
    lr: float = _flag("actor learning rate", default=1e-4)
    critic_lr: float = _flag("critic learning rate", default=1e-3)
    temperature: float = _flag("sampling temperature of training rollouts", default=1.0)
    validation_temperature: float = _flag("sampling temperature of validation (0: greedy)", default=0.5)
    max_turns: int = _flag("replies per episode", default=5)
    max_actions_per_turn: int = _flag("actions kept from one reply", default=5)
    max_actions_per_episode: int = _flag("actions per episode", default=10)
    max_new_tokens_per_turn: int = _flag("reply length limit in tokens", default=48)
    updates_per_rollout_batch: int = _flag("optimizer steps per rollout batch", default=1)
    validation_size: int = _flag("fixed held-out initial states, played before and after training", default=128)
    enable_thinking: bool = _flag("require <think> before <answer>", default=True)
    # warm start
    warm_start_episodes: int = _flag("demonstration episodes for the supervised warm start (0: none)", default=512)
    warm_start_steps: int = _flag("supervised warm-start steps (0: start RL from the model as loaded)", default=200)
    warm_start_lr: float = _flag("warm-start learning rate", default=2e-3)
    warm_start_batch_size: int = _flag("warm-start batch size (episodes)", default=16)


# On a machine with a CUDA GPU, flags not given take the reference's settings instead of the CPU ones.
REFERENCE_GPU_SETTINGS = dict(model="Qwen/Qwen2.5-0.5B-Instruct", num_groups=8, group_size=16, iterations=200,
                              rollout_filter_ratio=0.25, lr=1e-6, critic_lr=1e-5, max_new_tokens_per_turn=400,
                              num_gpus_per_learner=1.0, validation_size=256, warm_start_steps=0)


def parse_args(defaults: ExperimentArgs, argv: list[str] | None = None,
               gpu_defaults: dict | None = None) -> ExperimentArgs:
    """Command-line flags over ``defaults`` (over the reference's GPU settings when CUDA is available).

    ``gpu_defaults``: a job's own settings for CUDA machines, over the reference's (e.g. a harder env variant).
    """
    parser = argparse.ArgumentParser(description=f"StarPO on {defaults.env}",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in dataclasses.fields(ExperimentArgs):
        flag, default = "--" + f.name.replace("_", "-"), getattr(defaults, f.name)
        if f.type in ("bool", bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=f.metadata["help"])
        else:
            kind = {"int": int, "float": float, "dict": _json_object}.get(str(f.type), str)
            parser.add_argument(flag, type=kind, default=None, help=f"{f.metadata['help']} (default: {default})")
    given = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    base = defaults
    if torch.cuda.is_available():
        base = dataclasses.replace(defaults, **REFERENCE_GPU_SETTINGS, **(gpu_defaults or {}),
                                   backend="vllm" if vllm_available() else "hf")
    args = dataclasses.replace(base, **given)
    if args.backend not in BACKENDS:
        parser.error(f"--backend {args.backend!r}: choose one of {BACKENDS}.")
    if args.backend == "vllm" and not vllm_available():
        parser.error(f"--backend vllm: {VLLM_MISSING}")
    return args


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object like '{{\"key\": 1}}', got {text!r}")
    return value


def starpo_config(args: ExperimentArgs, model: str, env_config: dict | None = None):
    """The StarPOConfig a main job trains with: validation before training and at the end."""
    from . import StarPOConfig

    return (StarPOConfig()
            .environment(args.env, env_config={**(env_config or {}), **args.env_config})
            .rl_module(model_config={"model": model})
            .preset(args.preset)
            .training(num_groups=args.num_groups, group_size=args.group_size,
                      rollout_filter_ratio=args.rollout_filter_ratio if args.preset == "starpo-s" else 1.0,
                      advantage_estimator=args.advantage_estimator, lr=args.lr, critic_lr=args.critic_lr,
                      temperature=args.temperature, validation_temperature=args.validation_temperature,
                      max_turns=args.max_turns, max_actions_per_turn=args.max_actions_per_turn,
                      max_actions_per_episode=args.max_actions_per_episode,
                      max_new_tokens_per_turn=args.max_new_tokens_per_turn,
                      updates_per_rollout_batch=args.updates_per_rollout_batch, enable_thinking=args.enable_thinking,
                      inference_backend=args.backend, num_inference_engines=args.num_inference_engines,
                      validation_size=args.validation_size, validation_interval=args.iterations)
            .env_runners(num_env_runners=args.num_env_runners)
            .learners(num_learners=args.num_learners, num_gpus_per_learner=args.num_gpus_per_learner)
            .debugging(seed=args.seed))


def warm_start(args: ExperimentArgs, rollout_config: RolloutConfig, policy: Callable[[str], str],
               path: pathlib.Path) -> str:
    """Fine-tune ``args.model`` on ``policy``'s demonstrations; save it to ``path`` and return that path."""
    from .rollout.models import load_policy
    from .sft import collect_demonstrations, supervised_warm_start

    t0 = time.perf_counter()
    sft_log = logging.getLogger("rllib_ragen.sft")  # its every-50-steps loss lines are this job's progress
    if not sft_log.handlers:
        sft_log.addHandler(logging.StreamHandler(sys.stdout))
        sft_log.setLevel(logging.INFO)
    model, tokenizer = load_policy(args.model, seed=args.seed)
    demos = collect_demonstrations(rollout_config, policy, tokenizer, args.warm_start_episodes)
    losses = supervised_warm_start(model, demos, steps=args.warm_start_steps, batch_size=args.warm_start_batch_size,
                                   lr=args.warm_start_lr, seed=args.seed, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    print(f"warm start: {len(demos)} demonstrations ({sum(t.success for t in demos) / len(demos):.0%} successful), "
          f"{args.warm_start_steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    return str(path)


def run_experiment(args: ExperimentArgs, demonstration_policy: Callable[[str], str] | None = None,
                   env_config: dict | None = None, pass_bar: float | None = None) -> dict:
    """Warm start (when a demonstration policy is given), train, and write the outputs. Returns the summary.

    ``pass_bar``: the least rise of validation success over the warm start that counts as learning; the verdict
    is printed and stored in the summary (``success_gain``, ``passed``).
    """
    import ray

    out = pathlib.Path(args.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    t_start = time.perf_counter()

    config = starpo_config(args, args.model, env_config)
    if demonstration_policy is not None and args.warm_start_steps > 0 and args.warm_start_episodes > 0:
        model = warm_start(args, config.rollout_config(), demonstration_policy, out / "warm_start")
        config = starpo_config(args, model, env_config)
    algo = config.build_algo()
    t_train = time.perf_counter()  # the time-left estimate counts training iterations only
    rows: list[dict] = []
    validations: list[dict] = []
    try:
        for _ in range(args.iterations):
            row = _flatten(algo.train())
            rows.append(row)
            # Iterations without validation report the val/ keys as NaN; keep each validation once.
            validated_at = row.get("val/iteration", math.nan)
            if math.isfinite(validated_at) and (not validations or validations[-1]["val/iteration"] != validated_at):
                validations.append({k: v for k, v in row.items() if k.startswith("val/")})
            _print_progress(args, row, t_train)
            _write_csv(out / "metrics.csv", rows)
        _write_rollouts(out / "validation_rollouts.parquet", algo.last_validation)
        algo.export_pretrained(out / "policy")
    finally:
        algo.stop()
    summary = _summary(args, rows, validations, time.perf_counter() - t_start)
    summary["success_gain"] = summary["after"]["success"] - summary["before"]["success"]
    summary["passed"] = None if pass_bar is None else bool(summary["success_gain"] >= pass_bar)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    _plot(out / "learning_curve.png", rows, validations, args.env)
    _print_table(summary, args)
    if pass_bar is not None:
        verdict = "PASS" if summary["passed"] else "below the bar"
        print(f"success gain {summary['success_gain']:+.3f} (bar {pass_bar}): {verdict}")
    return summary


# ---- outputs --------------------------------------------------------------------------------------------------
def _flatten(result: dict, prefix: str = "") -> dict:
    """Scalar results as one flat row; the learner's metrics under ``learner/``."""
    row = {}
    for key, value in result.items():
        if key == "learners":
            for module_metrics in value.values():
                row.update(_flatten(module_metrics, "learner/"))
        elif isinstance(value, dict):
            continue
        elif isinstance(value, (int, float)) and not isinstance(value, bool) or hasattr(value, "item"):
            try:
                row[prefix + key] = float(value)
            except (TypeError, ValueError):
                continue
    return row


def _print_progress(args: ExperimentArgs, row: dict, t_start: float) -> None:
    done = int(row["training_iteration"])
    elapsed = time.perf_counter() - t_start
    left = elapsed / done * (args.iterations - done)
    print(f"iter {done:3d}/{args.iterations} | success {row.get(f'{args.env}/success', math.nan):.2f} "
          f"| reward {row.get('rollout/return_mean', math.nan):+.3f} "
          f"(in-group std {row.get('rollout_filter/reward_std', math.nan):.3f}) "
          f"| entropy {row.get('learner/actor/entropy', math.nan):.3f} "
          f"| format errors {row.get('rollout/format_error_rate', math.nan):.2f} "
          f"| {row.get('time_this_iter_s', math.nan):.1f} s/it | left ~{left / 60:.1f} min", flush=True)


def _write_csv(path: pathlib.Path, rows: list[dict]) -> None:
    columns = sorted({k for row in rows for k in row})
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def _write_rollouts(path: pathlib.Path, trajectories: list[Trajectory]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [{"env": t.env_name, "group": t.group, "seed": t.seed, "success": t.success, "return": t.total_return,
                "turn_rewards": t.turn_rewards, "num_turns": t.num_turns, "num_actions": t.num_actions,
                "format_errors": t.format_errors, "response_tokens": int(sum(t.response_mask)),
                "total_tokens": len(t.token_ids), "truncated": t.truncated, "text": t.text} for t in trajectories]
    pq.write_table(pa.Table.from_pylist(records), path)


def _summary(args: ExperimentArgs, rows: list[dict], validations: list[dict], wall_s: float) -> dict:
    def val(index: int, name: str) -> float:
        return validations[index].get(f"val/{args.env}/{name}", math.nan) if validations else math.nan

    generated = sum(r.get("rollout/response_tokens_per_turn", 0) * r.get("rollout/num_turns", 0)
                    * r.get("rollout/num_trajectories", 0) for r in rows)
    generate_s = sum(r.get("time/generate_s", 0) for r in rows)
    names = ("success", "pass@1", "valid_action_rate", "format_error_rate", "return_mean", "num_actions")
    return {
        "env": args.env, "model": args.model, "preset": args.preset, "iterations": len(rows),
        "validation_episodes": int(val(0, "num_trajectories")) if validations else 0,
        "before": {n: val(0, n) for n in names}, "after": {n: val(-1, n) for n in names},
        "validated_at": [int(v["val/iteration"]) for v in validations],
        "rollout_tokens_per_s": generated / generate_s if generate_s else math.nan,
        "update_tokens_per_s": rows[-1].get("learner/perf/update_tokens_per_s", math.nan) if rows else math.nan,
        "wall_time_s": wall_s,
    }


def _print_table(summary: dict, args: ExperimentArgs) -> None:
    n = summary["validation_episodes"]
    print(f"\n{args.env}, model {args.model}, {summary['iterations']} iterations, "
          f"validation on {n} held-out initial states (temperature {args.validation_temperature})")
    print(f"{'':28s}{'before':>10s}{'after':>10s}")
    for name in ("success", "pass@1", "valid_action_rate", "format_error_rate", "return_mean", "num_actions"):
        print(f"{name:28s}{summary['before'][name]:10.3f}{summary['after'][name]:10.3f}")
    print(f"{'rollout tokens/s':28s}{summary['rollout_tokens_per_s']:20,.0f}")
    print(f"{'update tokens/s':28s}{summary['update_tokens_per_s']:20,.0f}")
    print(f"{'wall time':28s}{summary['wall_time_s'] / 60:17.1f} min")


def _plot(path: pathlib.Path, rows: list[dict], validations: list[dict], env: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"(no {path.name}: pip install matplotlib, or rllib_ragen[plots])")
        return
    panels = [(f"{env}/success", "training success"), ("rollout_filter/reward_std", "in-group reward std"),
              ("learner/actor/entropy", "entropy"), ("learner/actor/grad_norm", "actor grad norm")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3))
    steps = [r["training_iteration"] for r in rows]
    for ax, (key, title) in zip(axes, panels):
        ax.plot(steps, [r.get(key, math.nan) for r in rows], marker=".")
        ax.set_title(title)
        ax.set_xlabel("iteration")
    axes[0].plot([v["val/iteration"] for v in validations], [v.get(f"val/{env}/success") for v in validations],
                 "s", color="tab:red", label="validation (held out)")
    axes[0].legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
