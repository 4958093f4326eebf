"""StarPO-S on 4x4 FrozenLake: warm start on the optimal policy's moves, then RL on maps never seen before.

The job plays the solid-ice lake, where a random policy scores 22% and the optimal one 100%, so every failure is
the policy's own; ``--env rllib_ragen/FrozenLake-v0`` plays RAGEN's slippery lake (and ``--preset
ragen-gpu`` does, with thinking). The agent answers one move per turn without a ``<think>`` block
(``--enable-thinking`` restores it). The warm start's rate, length and weight averaging are those that read the
map on every seed tried.

Command:  python tuned_examples/starpo_frozenlake.py [--seed 0] [--iterations 25] [--env rllib_ragen/FrozenLake-v0]
Time:     the plan line states it for this CPU (rllib_ragen/jobs/job_times.py), most of it the
          1,200-step warm start
Expect:   about 0.79 greedy success on 256 validation maps from the warm start; RL keeps it (no significant change);
          docs/results/frozenlake.md
"""

import gymnasium as gym

from rllib_ragen import StarPOConfig
from rllib_ragen.jobs.run import JobSettings, run_job
from rllib_ragen.jobs.flags import apply_job_args, job_parser
from rllib_ragen.demonstrators import FROZEN_LAKE_REASONING, frozen_lake_hole_blind_policy, frozen_lake_optimal_policy

config = (
    StarPOConfig()
    .environment("rllib_ragen/FrozenLakeNotSlippery-v0")
    # lr 1e-4: a small RL step for a warm start that already reads the map.
    .training(
        num_groups=8,
        group_size=8,
        rollout_filter_ratio=0.5,
        lr=1e-4,
        critic_lr=1e-3,
        enable_thinking=False,
        whiten_advantages=False,  # raw R - V: the setting these CPU jobs were tuned with
        max_turns=10,
        max_actions_per_turn=1,
        max_actions_per_episode=10,
        max_new_tokens_per_turn=32,
        validation_size=256,
        validation_interval=5,
    )  # 6 validation points; 256 maps take ~10 s
    .debugging(seed=0)
)
job = JobSettings(
    output_dir="outputs/starpo_frozenlake",
    iterations=25,
    warm_start_episodes=4000,
    warm_start_steps=1200,
    warm_start_lr=5e-4,
    warm_start_average_decay=0.98,
    # float32: bfloat16 was 1.4x faster on a CPU with bfloat16 units but 12x slower on one without
    # (emulated); on 256 maps the two precisions' warm starts play alike (docs/results/frozenlake.md).
    warm_start_precision="float32",
    pass_bar=0.05,  # validation success must rise at least this much
    timed_command="starpo_frozenlake.py",
)
# On the 256 validation maps: 10 uniformly random moves (8 plays each), and the optimal policy.
SOLID_ICE_KNOWN_SCORES = {"random moves": 0.216, "optimal policy": 1.0}


def ragen_gpu(config):
    """With --preset ragen-gpu, over the preset: RAGEN's slippery lake, with thinking."""
    config.environment("rllib_ragen/FrozenLake-v0").training(enable_thinking=True)


def smollm2_gpu(config):
    """With --preset smollm2-gpu, over the preset: the job's lake and warm start, in 400 steps instead of 1,200 (a
    model that already reads text; 1,200 steps would take most of a few-minute run)."""
    return {"warm_start_steps": 400}


JOB_PRESETS = {"ragen-gpu": ragen_gpu, "smollm2-gpu": smollm2_gpu}  # the job's own settings (parse_job_args)


def parse_args(config, job, argv=None, description=__doc__.splitlines()[0]):
    """The job flags plus ``--demonstration-reasoning``; returns (config, job, demonstration policy, baselines)."""
    parser = job_parser(config, job, description)
    parser.add_argument(
        "--demonstration-reasoning",
        choices=FROZEN_LAKE_REASONING,
        default="plain",
        help="the demonstrated <think> line, with --enable-thinking: 'plain' a fixed sentence; "
        "'effects' where each move would lead from the player's cell (default: plain)",
    )
    cli = parser.parse_args(argv)
    config, job = apply_job_args(parser, cli, config, job, job_presets=JOB_PRESETS)
    if cli.demonstration_reasoning != "plain" and not config.enable_thinking:
        parser.error(
            f"--demonstration-reasoning {cli.demonstration_reasoning} writes a <think> line, and this run "
            f"has enable_thinking=False; add --enable-thinking."
        )
    slippery = gym.make(config.env, **config.env_config).unwrapped.is_slippery
    # The agent is paired against this on the validation maps: a policy that has found the goal but not the holes.
    baselines = {"hole-blind policy": frozen_lake_hole_blind_policy(config.enable_thinking, slippery)}
    return (
        config,
        job,
        frozen_lake_optimal_policy(config.enable_thinking, slippery, cli.demonstration_reasoning),
        baselines,
    )


if __name__ == "__main__":
    config, job, demonstrations, baselines = parse_args(config, job)
    measured_on = (config.env, config.max_actions_per_episode, config.validation_seed_start) == (
        "rllib_ragen/FrozenLakeNotSlippery-v0",
        10,
        123,
    )  # the lines hold for the maps and budget they were measured on
    run_job(config, job, demonstrations, SOLID_ICE_KNOWN_SCORES if measured_on else None, baselines)
