"""A Ray Tune search over RAGEN's three data-quality knobs on Sokoban: the Sokoban job with a grid.

Actions per turn, updates per rollout batch ("Online-k") and the rollout filter's keep ratio; each trial is a
StarPO-S run of ``starpo_sokoban.py`` from one shared warm start, reported on the same validation levels. Sized for a
2-core CPU: two 1-CPU trials at a time, 8 trials of 8 iterations. Any main job sweeps the same way with
``--grid``, and every flag of the Sokoban job works here (``--iterations``, ``--threads``, ``--resume``, ...).

Command:  python tuned_examples/tune_sokoban.py [--grid '{"rollout_filter_ratio": [0.25, 1.0]}'] [--help]
Time:     the plan line states it for this CPU (rllib_ragen/jobs/job_times.py)
Expect:   a table of the 8 trials' success before and after on the same 64 levels; docs/results/log.md (the sweep)
"""

import dataclasses
import pathlib
import runpy

from rllib_ragen.jobs.run import run_job

sokoban = runpy.run_path(str(pathlib.Path(__file__).with_name("starpo_sokoban.py")), run_name="imported")
config = (
    sokoban["config"]
    .copy(copy_frozen=False)
    .training(num_groups=4, group_size=8, rollout_filter_ratio=0.5, validation_size=64, validation_interval=8)
)
job = dataclasses.replace(
    sokoban["job"],
    output_dir="outputs/tune_sokoban",
    iterations=8,
    warm_start_episodes=1000,
    warm_start_steps=300,
    threads=1,
    timed_command="tune_sokoban.py",
    grid={"max_actions_per_turn": [1, 5], "updates_per_rollout_batch": [1, 2], "rollout_filter_ratio": [0.25, 1.0]},
)

if __name__ == "__main__":
    config, job, demonstrations, baselines = sokoban["parse_args"](config, job, description=__doc__.splitlines()[0])
    run_job(config, job, demonstrations, baselines=baselines)
