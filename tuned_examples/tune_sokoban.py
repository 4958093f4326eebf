"""A Ray Tune search over the reference's three data-quality knobs on Sokoban.

Actions per turn, updates per rollout batch ("Online-k") and the rollout filter's keep ratio, each trial a
StarPO-S run from one shared warm-start model, ranked by validation success on fixed held-out levels. Sized
for a 2-core CPU (two 1-CPU trials at a time); give larger grids and budgets by flag on a cluster. Writes
`trials.csv` and `comparison.png` to the output directory and prints the table and the best trial.

    python tuned_examples/tune_sokoban.py [--actions-per-turn 1,5] [--updates 1,2] [--keep-ratios 0.25,1.0] [--help]

Every knob of the main jobs is a flag here too (``--iterations``, ``--validation-size``, ``--model``, ...). The search
lives in ``<output-dir>/<run-name>`` (default ``tune_sokoban``), Tune's experiment folder, with TensorBoard events per
trial. Each trial checkpoints every ``--checkpoint-interval`` iterations; ``--resume`` continues an interrupted
search (same ``--output-dir`` and ``--run-name``): finished trials are kept, the others go on from their last
checkpoint.
"""

import csv
import os
import pathlib

import ray
from ray import tune

from rllib_ragen import StarPO, StarPOConfig
from rllib_ragen.experiment import JobSettings, warm_start
from rllib_ragen.experiment_flags import apply_job_args, job_parser
from rllib_ragen.experiment_outputs import keep_notices_off_the_console, send_notices_to
from rllib_ragen.rollout.scripted import sokoban_solver_policy

config = (
    StarPOConfig()
    .environment("rllib_ragen/Sokoban-v0", env_config={"reward": "success"})  # as starpo_sokoban.py
    .training(num_groups=4, group_size=8, rollout_filter_ratio=0.5, lr=1e-4, critic_lr=1e-3,
              max_new_tokens_per_turn=48, validation_size=64, validation_interval=8)
    .debugging(seed=0)
)
job = JobSettings(output_dir="outputs/tune_sokoban", iterations=8, warm_start_episodes=1000, warm_start_steps=300)
METRIC = f"evaluation/env_runners/{config.env}/success"


def csv_list(kind):
    return lambda text: [kind(x) for x in text.split(",")]


def main() -> None:
    parser = job_parser(config, job, description=__doc__.split("\n")[0])
    grid = parser.add_argument_group("the grid (comma-separated values)")
    grid.add_argument("--actions-per-turn", type=csv_list(int), default=[1, 5], help="max_actions_per_turn grid")
    grid.add_argument("--updates", type=csv_list(int), default=[1, 2], help="updates_per_rollout_batch grid")
    grid.add_argument("--keep-ratios", type=csv_list(float), default=[0.25, 1.0], help="rollout_filter_ratio grid")
    grid.add_argument("--cpus-per-trial", type=int, default=1, help="CPUs (and torch threads) per trial")
    cli = parser.parse_args()
    base, settings = apply_job_args(parser, cli, config, job)
    if "validation_interval" not in vars(cli):  # unless told otherwise, validate before training and after the last iteration
        base.training(validation_interval=settings.iterations)

    out = pathlib.Path(settings.output_dir).resolve()
    experiment = out / (settings.run_name or "tune_sokoban")  # Tune's experiment folder: one per search
    if settings.resume and not tune.Tuner.can_restore(str(experiment)):
        parser.error(f"--resume: there is no Tune experiment at {experiment} to continue.")
    if not settings.resume and experiment.exists():
        parser.error(f"{experiment} holds an earlier search: continue it with --resume, or choose another "
                     "--output-dir. Nothing was overwritten.")
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if not settings.verbose:  # library notices go to job.log; Tune's own trial table stays on the console
        send_notices_to(out / "job.log")
    ray.init(include_dashboard=False, log_to_driver=False, **({} if settings.verbose else {"logging_level": "ERROR"}))
    if not settings.verbose:
        keep_notices_off_the_console()
    if settings.resume:
        # Finished trials keep their results; unfinished and crashed ones go on from their last checkpoint.
        tuner = tune.Tuner.restore(str(experiment), StarPO, resume_errored=True)
    else:
        # Warm-start once; every trial starts from the same model, so the knobs alone differ.
        if settings.warm_start_steps > 0:
            model = warm_start(base, settings, sokoban_solver_policy(max(cli.actions_per_turn)), out / "warm_start")
            base.rl_module(model_config={"model": model})
        param_space = (base.resources(num_cpus_for_main_process=cli.cpus_per_trial)
                       .training(max_actions_per_turn=tune.grid_search(cli.actions_per_turn),
                                 updates_per_rollout_batch=tune.grid_search(cli.updates),
                                 rollout_filter_ratio=tune.grid_search(cli.keep_ratios)))
        checkpoints = tune.CheckpointConfig(checkpoint_frequency=settings.checkpoint_interval,
                                            checkpoint_at_end=settings.checkpoint_interval > 0)
        tuner = tune.Tuner(
            StarPO, param_space=param_space,
            run_config=tune.RunConfig(name=experiment.name, storage_path=str(out), verbose=1,
                                      stop={"training_iteration": settings.iterations},
                                      checkpoint_config=checkpoints),
            tune_config=tune.TuneConfig(metric=METRIC, mode="max"),
        )
    results = tuner.fit()

    rows = []
    for result in results:
        history = result.metrics_dataframe
        validated_at = "evaluation/env_runners/iteration"
        validated = history[history[validated_at].notna()] if validated_at in history else history.iloc[:0]
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
    print(f"\n{len(rows)} trials, {settings.iterations} iterations each, validation on {base.validation_size} "
          "held-out levels")
    print(f"{'actions/turn':>12s} {'updates':>8s} {'keep':>6s} {'before':>8s} {'after':>8s}")
    for r in sorted(rows, key=lambda r: -r["success_after"]):
        print(f"{r['max_actions_per_turn']:12d} {r['updates_per_rollout_batch']:8d} {r['rollout_filter_ratio']:6.2f} "
              f"{r['success_before']:8.3f} {r['success_after']:8.3f} {r['error'][:40]}")
    best = results.get_best_result(metric=METRIC, mode="max")
    print("best:", {k: best.config[k] for k in ("max_actions_per_turn", "updates_per_rollout_batch",
                                                "rollout_filter_ratio")},
          f"{METRIC} = {best.metrics_dataframe[METRIC].dropna().iloc[-1]:.3f}")  # the flattened history
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
