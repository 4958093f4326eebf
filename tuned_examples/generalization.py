"""The generalisation study at CPU scale: train on 6x6 Sokoban, validate before and after RL on held-out 6x6
levels, on the same game drawn with other symbols, on 8x8 levels with two boxes, and on FrozenLake.

Training is ``starpo_sokoban.py``'s, warm start included (its config and settings are loaded from that file); only
the validation list differs. Every validation environment plays ``--validation-size`` states (seeds 123...), each
at the validation temperature and greedily, before and after RL, and each gets its paired before/after comparison
with a 95% interval and a p-value (``summary.json``'s ``by_env``, printed under the final table). RAGEN
(Table 2) trains on Sokoban and reports the same kind of transfer.

Command:  python tuned_examples/generalization.py [--iterations 80] [--validation-size 256] [--help]
Time:     the plan line states it for this CPU (rllib_ragen/jobs/job_times.py)
Expect:   gains on held-out 6x6 levels, on the same game with other symbols and on slippery FrozenLake; hardly any
          on 8x8 two-box levels; docs/results/generalisation.md
"""

import dataclasses
import pathlib
import runpy

from rllib_ragen.jobs.run import run_job

sokoban = runpy.run_path(str(pathlib.Path(__file__).with_name("starpo_sokoban.py")), run_name="generalization")
SOKOBAN_CONFIG = sokoban["config"].env_config  # the training reward, {"reward": "success"}: variants are scored alike
config = (
    sokoban["config"]
    .copy(copy_frozen=False)
    .environment(
        validation_envs=[
            {"env": "rllib_ragen/Sokoban-v0", "env_config": SOKOBAN_CONFIG},  # the training distribution, held out
            {"env": "rllib_ragen/SokobanAltSymbols-v0", "env_config": SOKOBAN_CONFIG},  # same levels, other symbols
            {"env": "rllib_ragen/Sokoban8x8TwoBoxes-v0", "env_config": SOKOBAN_CONFIG},  # bigger, two boxes
            {"env": "rllib_ragen/FrozenLake-v0"},  # another game (slippery 4x4 lakes)
        ]
    )
    .training(validation_interval=40)  # before, halfway, after: each pass plays 4 x 256 states
)
job = dataclasses.replace(sokoban["job"], output_dir="outputs/generalization", timed_command="generalization.py")

if __name__ == "__main__":
    # That job's flags, --demonstration-moves-per-reply among them, and its demonstrations.
    config, job, demonstrations, baselines = sokoban["parse_args"](config, job, description=__doc__.splitlines()[0])
    run_job(config, job, demonstrations, baselines=baselines)  # random moves, on the held-out 6x6 levels
