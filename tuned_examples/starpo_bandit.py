"""StarPO-S on the two-armed bandit: does the agent learn to prefer the arm with the higher expected value?

The tiny CPU model is first warm-started on demonstrations that pick an arm at random (the format, no
preference), so whatever preference it ends with, RL taught it. Dragon pays 1.0 with probability 0.25,
Phoenix 0.15 always: success is choosing Dragon.

Command:  python tuned_examples/starpo_bandit.py [--seed 0] [--iterations 20] [--model smollm2-135m] [--help]
Time:     the plan line states it for this CPU (rllib_ragen/jobs/job_times.py), warm start included
Expect:   the better-arm share on 128 validation states rises from about 0.6 to about 0.99, paired p < 1e-11 on
          each seed; docs/results/bandit.md
"""

from rllib_ragen import StarPOConfig
from rllib_ragen.jobs import JobSettings, parse_job_args, run_job
from rllib_ragen.demonstrators import random_arm_policy

config = (
    StarPOConfig()
    .environment(
        "rllib_ragen/Bandit-v0",
        # Beside the training bandit: the same game with unseen arm names, and with the names' roles
        # swapped (Dragon safe, Phoenix risky). A policy that reads the description chooses the risky arm
        # in all three; one that learned "say Dragon" fails the reversed one.
        validation_envs=[
            {"env": "rllib_ragen/Bandit-v0"},
            {"env": "rllib_ragen/BanditHeldOut-v0"},
            {"env": "rllib_ragen/BanditReversed-v0"},
        ],
    )
    .training(
        num_groups=8,
        group_size=8,
        rollout_filter_ratio=1.0,  # single-turn: every group informs the update
        lr=5e-4,
        critic_lr=1e-3,
        max_turns=1,
        max_new_tokens_per_turn=32,
        # Each pull of a group draws its own payoff; with RAGEN's shared draw, an update rests on
        # one coin flip per group.
        independent_transitions=True,
        whiten_advantages=False,  # raw R - V: the setting these CPU jobs were tuned with
        validation_size=128,
        validation_interval=2,
    )  # 6 validation points; 128 states take ~2 s
    .debugging(seed=0)
)
job = JobSettings(
    output_dir="outputs/starpo_bandit",
    iterations=20,
    warm_start_episodes=256,
    warm_start_steps=60,
    pass_bar=0.15,  # the better arm's share on validation must rise at least this much
    timed_command="starpo_bandit.py",
)
# Success is choosing Dragon: a random choice gets it half the time, the optimal policy always.
KNOWN_SCORES = {"random arm": 0.5, "optimal policy": 1.0}


def parse_args(config, job, argv=None, description=__doc__.splitlines()[0]):
    """The job flags; returns (config, job, demonstration policy, baselines), as every main job's does."""
    config, job = parse_job_args(config, job, argv, description=description)
    return config, job, random_arm_policy(seed=config.seed, enable_thinking=config.enable_thinking), {}


if __name__ == "__main__":
    config, job, demonstrations, _ = parse_args(config, job)
    run_job(config, job, demonstrations, KNOWN_SCORES if config.env_name == "rllib_ragen/Bandit-v0" else None)
