"""StarPO-S on a game of another package: GEM's Guess The Number (1 to 50, 7 guesses), through the GEM adapter.

After each guess GEM says "higher" or "lower". The tiny model is warm-started briefly on a bisection player's games,
so that it plays the format and some of the strategy, then trained with critic-free StarPO (mean-only GRPO) on
games never seen. A player that guesses at random among the numbers it has not tried is the baseline it is paired
against. Needs ``pip install 'rllib_ragen[gem]'``.

Command:  python tuned_examples/starpo_gem.py [--seed 0] [--iterations 80] [--env gem/game.GuessTheNumber-v0-random]
Time:     the plan line states it for this CPU (rllib_ragen/jobs/job_times.py)
Expect:   the paired before/after table on 128 validation games, and both against random guessing;
          docs/results/third-party.md
"""

from rllib_ragen import StarPOConfig
from rllib_ragen.jobs import JobSettings, parse_job_args, run_job
from rllib_ragen.demonstrators import guess_the_number_bisection_policy, guess_the_number_random_policy

config = (
    StarPOConfig()
    # reward="success": GEM pays a last guess that misses 1 - distance / range, which RL can learn to collect
    # instead of winning (docs/results/third-party.md has the runs behind each setting here).
    .environment("gem/game.GuessTheNumber-v0-hard", env_config={"reward": "success"})
    .training(
        num_groups=8,
        group_size=8,
        rollout_filter_ratio=0.5,
        lr=1e-4,
        enable_thinking=False,
        # Critic-free: a critic that cannot yet predict the return adds its noise to every token's advantage.
        advantage_estimator="grpo",
        grpo_normalize_std=False,
        temperature=0.7,  # at 1.0 the tiny model's training replies break the format often
        max_turns=10,
        max_actions_per_turn=1,
        max_actions_per_episode=10,
        max_new_tokens_per_turn=16,
        validation_size=128,
        validation_interval=40,
    )
    .debugging(seed=0)
)
job = JobSettings(
    output_dir="outputs/starpo_gem",
    iterations=80,
    # Short on purpose: a warm start that already plays bisection leaves RL nothing to add.
    warm_start_episodes=1000,
    warm_start_steps=150,
    warm_start_lr=5e-4,
    warm_start_precision="float32",  # bfloat16 runs emulated, 12x slower, on CPUs without its units
    pass_bar=0.05,  # validation success must rise at least this much
    timed_command="starpo_gem.py",
)


def parse_args(config, job, argv=None, description=__doc__.splitlines()[0]):
    """The job flags; returns (config, job, demonstration policy, baselines), as every main job's does."""
    config, job = parse_job_args(config, job, argv, description=description)
    baselines = {"random guesses": guess_the_number_random_policy(config.enable_thinking, seed=config.seed or 0)}
    return config, job, guess_the_number_bisection_policy(config.enable_thinking), baselines


if __name__ == "__main__":
    config, job, demonstrations, baselines = parse_args(config, job)
    run_job(config, job, demonstrations, None, baselines)
