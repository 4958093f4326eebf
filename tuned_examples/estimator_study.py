"""Which advantage estimator gives credit best across turns? A main job with one trial per estimator.

The trials of one Tune experiment share the main job's config, seed and warm start (trained once); each trains
with its estimator and the reward placed on the turn that earned it (``turn_level_rewards=True``), and plays the
same 512 validation states before and after RL. The report pairs each trial's states before and after (95% interval,
exact McNemar p) and each estimator against ``gae``, the grid's first value, on the same states after RL
(``summary.json``'s ``versus_control``, printed at the end).

- ``--job starpo_frozenlake`` (the default): the solid-ice 4x4 lake, up to 10 turns of one move each; reward 1 on
  reaching the goal; 25 iterations from the job's earlier, shorter warm start (300 steps at lr 2e-3 on 1,000
  demonstrations, no weight averaging) at RL rate 3e-4, which leaves RL room to gain (from the job's own warm
  start RL has little to add).
- ``--job starpo_sokoban``: 6x6 one-box Sokoban, RAGEN's shaped reward (-0.1 per move, +1 box on target,
  +10 solved) on the turn that earned it; 40 iterations from the Sokoban job's warm start.

Every flag of the chosen job works (``--iterations``, ``--seeds``, ``--resume``, ``--help``).

Command:  python tuned_examples/estimator_study.py [--job starpo_sokoban]
              [--grid '{"advantage_estimator": ["gae", "grpo"]}']
Time:     the plan line states it for this CPU (rllib_ragen/jobs/job_times.py); Sokoban's not timed
Expect:   on FrozenLake every estimator gains from the warm start, within a few points of each other;
          docs/results/estimators.md
"""

import argparse
import dataclasses
import pathlib
import runpy

from rllib_ragen.jobs.run import run_job

ESTIMATORS = ["gae", "bi_level_gae", "turn_gae", "gigpo", "grpo"]  # gae first: the others are paired against it
# FrozenLake's study starts from the job's earlier, shorter warm start, which leaves RL room to gain; the job's
# own leaves the estimators little to tell apart (docs/results/estimators.md).
FROZEN_LAKE_WARM_START = {
    "warm_start_steps": 300,
    "warm_start_episodes": 1000,
    "warm_start_lr": 2e-3,
    "warm_start_average_decay": 0.0,
    "warm_start_precision": "float32",
}
# main job -> (its environment's arguments, iterations, its warm start's settings changed, its RL rate changed)
STUDIES = {
    "starpo_frozenlake": ({}, 25, FROZEN_LAKE_WARM_START, {"lr": 3e-4}),
    "starpo_sokoban": ({"reward": "shaped"}, 40, {}, {}),
}


def study(job_name: str):
    """The main job's namespace, and its config and settings made into the study."""
    main_job = runpy.run_path(str(pathlib.Path(__file__).with_name(f"{job_name}.py")), run_name="imported")
    env_config, iterations, warm_start, training = STUDIES[job_name]
    timed_command = "estimator_study.py" + ("" if job_name == "starpo_frozenlake" else f" --job {job_name}")
    config = main_job["config"].copy(copy_frozen=False)
    config.environment(config.env, env_config={**config.env_config, **env_config}).training(
        turn_level_rewards=True, validation_size=512, validation_interval=0, **training
    )  # before and after RL only
    job = dataclasses.replace(
        main_job["job"],
        output_dir=f"outputs/estimator_study/{job_name}",
        iterations=iterations,
        grid={"advantage_estimator": ESTIMATORS},
        timed_command=timed_command,
        **warm_start,
    )
    return main_job, config, job


if __name__ == "__main__":
    chooser = argparse.ArgumentParser(add_help=False)
    chooser.add_argument("--job", choices=sorted(STUDIES), default="starpo_frozenlake")
    chosen, flags = chooser.parse_known_args()
    main_job, config, job = study(chosen.job)
    config, job, demonstrations, baselines = main_job["parse_args"](
        config, job, flags, description=__doc__.splitlines()[0]
    )
    run_job(config, job, demonstrations, baselines=baselines)
