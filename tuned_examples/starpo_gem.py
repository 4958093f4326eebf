"""StarPO-S on a game of another package: GEM's Guess The Number, played through the GEM adapter.

``gem/game.GuessTheNumber-v0-random`` draws a range (between 1-10 and up to 50 numbers wide), a target in it, and a
turn limit of ceil(sqrt(width)) + 1; after each guess GEM says "higher" or "lower". The tiny model is warm-started on
a bisection player's games, then trained with StarPO-S on ranges never seen. A player that guesses at random
without reading the hints is the baseline it is paired against. Needs ``pip install 'rllib_ragen[gem]'``.

Command:  python tuned_examples/starpo_gem.py [--seed 0] [--iterations 15] [--env gem/game.GuessTheNumber-v0-hard]
Time:     about 15 minutes on 2 CPU cores
Expect:   the paired before/after table on 128 held-out games, and both against random guessing;
          docs/results/third-party.md
"""

from rllib_ragen import StarPOConfig
from rllib_ragen.experiment import JobSettings, parse_job_args, run_job
from rllib_ragen.rollout.scripted import guess_the_number_bisection_policy, guess_the_number_random_policy

config = (
    StarPOConfig()
    .environment("gem/game.GuessTheNumber-v0-random")
    .training(num_groups=8, group_size=8, rollout_filter_ratio=0.5, lr=1e-4, critic_lr=1e-3, enable_thinking=False,
              whiten_advantages=False,  # raw R - V: the setting these CPU jobs were tuned with
              max_turns=10, max_actions_per_turn=1, max_actions_per_episode=10, max_new_tokens_per_turn=16,
              validation_size=128, validation_interval=5)
    .debugging(seed=0)
)
job = JobSettings(output_dir="outputs/starpo_gem", iterations=15, warm_start_episodes=1000, warm_start_steps=300,
                  warm_start_lr=5e-4, warm_start_precision="bfloat16",
                  pass_bar=0.05,  # validation success must rise at least this much
                  expected_minutes=15)


def parse_args(config, job, argv=None, description=__doc__.splitlines()[0]):
    """The job flags; returns (config, job, demonstration policy, baselines), as every main job's does."""
    config, job = parse_job_args(config, job, argv, description=description)
    baselines = {"random guesses": guess_the_number_random_policy(config.enable_thinking, seed=config.seed or 0)}
    return config, job, guess_the_number_bisection_policy(config.enable_thinking), baselines


if __name__ == "__main__":
    config, job, demonstrations, baselines = parse_args(config, job)
    run_job(config, job, demonstrations, None, baselines)
