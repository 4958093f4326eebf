"""A Ray Tune search over the reference's three data-quality knobs on Sokoban.

Actions per turn, updates per rollout batch ("Online-k") and the rollout filter's keep ratio, each trial a
StarPO-S run from one shared warm-start model, ranked by validation success on fixed held-out levels. Sized
for a 2-core CPU (two 1-CPU trials at a time); give larger grids and budgets by flag on a cluster. Writes
`trials.csv` and `comparison.png` to the output directory and prints the table and the best trial.

    python tuned_examples/tune_sokoban.py [--actions-per-turn 1,5] [--updates 1,2] [--keep-ratios 0.25,1.0]
"""

import argparse
import csv
import os
import pathlib

import ray
from ray import tune

from rllib_ragen import StarPO
from rllib_ragen.experiment import ExperimentArgs, starpo_config, warm_start
from rllib_ragen.rollout.scripted import sokoban_solver_policy

BASE = ExperimentArgs(
    env="rllib_ragen/Sokoban-v0", env_config={"reward": "success"},  # as starpo_sokoban.py
    iterations=8, num_groups=4, group_size=8, lr=1e-4, critic_lr=1e-3, max_new_tokens_per_turn=48,
    validation_size=64, warm_start_episodes=1000, warm_start_steps=300,
)
METRIC = f"val/{BASE.env}/success"


def csv_list(kind):
    return lambda text: [kind(x) for x in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--actions-per-turn", type=csv_list(int), default=[1, 5], help="max_actions_per_turn grid")
    parser.add_argument("--updates", type=csv_list(int), default=[1, 2], help="updates_per_rollout_batch grid")
    parser.add_argument("--keep-ratios", type=csv_list(float), default=[0.25, 1.0], help="rollout_filter_ratio grid")
    parser.add_argument("--iterations", type=int, default=BASE.iterations, help="StarPO iterations per trial")
    parser.add_argument("--validation-size", type=int, default=BASE.validation_size, help="held-out levels")
    parser.add_argument("--warm-start-steps", type=int, default=BASE.warm_start_steps, help="shared SFT steps")
    parser.add_argument("--warm-start-episodes", type=int, default=BASE.warm_start_episodes, help="SFT episodes")
    parser.add_argument("--model", default=BASE.model, help="'tiny', 'smollm2-135m', or a HF id / local path")
    parser.add_argument("--cpus-per-trial", type=int, default=1, help="CPUs (and torch threads) per trial")
    parser.add_argument("--output-dir", default="outputs/tune_sokoban", help="where results go")
    cli = parser.parse_args()

    out = pathlib.Path(cli.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(include_dashboard=False, log_to_driver=False)
    args = ExperimentArgs(**{**vars(BASE), "iterations": cli.iterations, "validation_size": cli.validation_size,
                             "warm_start_steps": cli.warm_start_steps, "model": cli.model,
                             "warm_start_episodes": cli.warm_start_episodes, "threads": 2})
    # Warm-start once; every trial starts from the same model, so the knobs alone differ.
    model = cli.model
    if args.warm_start_steps > 0:
        demo_config = starpo_config(args, cli.model).rollout_config()
        model = warm_start(args, demo_config, sokoban_solver_policy(max(cli.actions_per_turn)), out / "warm_start")

    param_space = (starpo_config(args, model)
                   .resources(num_cpus_for_main_process=cli.cpus_per_trial)
                   .training(max_actions_per_turn=tune.grid_search(cli.actions_per_turn),
                             updates_per_rollout_batch=tune.grid_search(cli.updates),
                             rollout_filter_ratio=tune.grid_search(cli.keep_ratios)))
    results = tune.Tuner(
        StarPO, param_space=param_space,
        run_config=tune.RunConfig(name="tune_sokoban", storage_path=str(out), verbose=1,
                                  stop={"training_iteration": cli.iterations}),
        tune_config=tune.TuneConfig(metric=METRIC, mode="max"),
    ).fit()

    rows = []
    for result in results:
        history = result.metrics_dataframe
        validated = history[history["val/iteration"].notna()] if "val/iteration" in history else history.iloc[:0]
        rows.append({"max_actions_per_turn": result.config["max_actions_per_turn"],
                     "updates_per_rollout_batch": result.config["updates_per_rollout_batch"],
                     "rollout_filter_ratio": result.config["rollout_filter_ratio"],
                     "success_before": float(validated[METRIC].iloc[0]) if len(validated) else float("nan"),
                     "success_after": float(validated[METRIC].iloc[-1]) if len(validated) else float("nan"),
                     "error": str(result.error) if result.error else ""})
    with open(out / "trials.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"\n{len(rows)} trials, {cli.iterations} iterations each, validation on {cli.validation_size} held-out levels")
    print(f"{'actions/turn':>12s} {'updates':>8s} {'keep':>6s} {'before':>8s} {'after':>8s}")
    for r in sorted(rows, key=lambda r: -r["success_after"]):
        print(f"{r['max_actions_per_turn']:12d} {r['updates_per_rollout_batch']:8d} {r['rollout_filter_ratio']:6.2f} "
              f"{r['success_before']:8.3f} {r['success_after']:8.3f} {r['error'][:40]}")
    best = results.get_best_result(metric=METRIC, mode="max")
    print("best:", {k: best.config[k] for k in ("max_actions_per_turn", "updates_per_rollout_batch",
                                                "rollout_filter_ratio")}, f"{METRIC} = {best.metrics[METRIC]:.3f}")
    plot(rows, out / "comparison.png")
    ray.shutdown()


def plot(rows, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"a{r['max_actions_per_turn']} u{r['updates_per_rollout_batch']} k{r['rollout_filter_ratio']:g}"
              for r in rows]
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(rows)), 3))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["success_before"] for r in rows], width=0.4, label="before RL")
    ax.bar([i + 0.2 for i in x], [r["success_after"] for r in rows], width=0.4, label="after RL")
    ax.set_xticks(list(x), labels, rotation=30, fontsize=8)
    ax.set_ylabel("validation success")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
