"""StarPO-S on 6x6 one-box Sokoban: warm start on solver demonstrations, then RL on levels never seen before.

The tiny CPU model first learns the answer format and a first sense of the game by supervised fine-tuning on
the fewest-moves solver's replies (demonstration levels come from seeds 1,000,000+, far from training and
validation). StarPO-S then trains on fresh levels every iteration. Success is measured before and after RL on
256 fixed held-out levels (seeds 123...). Tested on a 2-core CPU (see the README for the figures).

The reward is solved/not solved (``reward="success"``) rather than the reference's shaped return: with 16
trajectories per update the -0.1 step and +1 box terms mostly add noise, and RL with them raised validation
success by only 1-4 points in the same time. ``--env-config '{"reward": "shaped"}'`` restores the reference's.

    python tuned_examples/starpo_sokoban.py [--iterations 80] [--model smollm2-135m] [--output-dir DIR] [--help]
"""

from rllib_ragen import StarPOConfig
from rllib_ragen.experiment import JobSettings, parse_job_args, run_job
from rllib_ragen.rollout.scripted import sokoban_solver_policy

config = (
    StarPOConfig()
    .environment("rllib_ragen/Sokoban-v0", env_config={"reward": "success"})
    # 16 levels x 4 attempts, the reference's top-25% filter: RL sees the 4 levels whose outcomes vary most.
    .training(num_groups=16, group_size=4, rollout_filter_ratio=0.25, lr=1e-4, critic_lr=1e-3,
              # Raw R - V, the setting these CPU jobs were tuned and measured with (README); the library
              # default whitens as the reference does, which on the bandit job gave 0.828 instead of 0.867.
              whiten_advantages=False,
              max_turns=5, max_actions_per_turn=5, max_actions_per_episode=10, max_new_tokens_per_turn=48,
              validation_size=256, validation_interval=20)  # 5 validation points; 256 levels take ~40 s
    .debugging(seed=0)
)
job = JobSettings(output_dir="outputs/starpo_sokoban", iterations=80, warm_start_episodes=2000, warm_start_steps=500,
                  pass_bar=0.05,  # validation success must rise at least this much over the warm start
                  expected_minutes=17)
# Measured on the 256 validation levels: 10 uniformly random moves (8 plays each) solve 0.308 of them, and the
# solver solves 0.996 within the job's 10 moves. Random moves are a strong baseline on these small levels: the
# agent, unlike them, also loses turns to format errors.
REFERENCE_LINES = {"random moves": 0.308, "optimal policy": 0.996}

if __name__ == "__main__":
    config, job = parse_job_args(config, job, description=__doc__.splitlines()[0])
    measured_on = (config.env, config.max_actions_per_episode, config.validation_seed_start) == (
        "rllib_ragen/Sokoban-v0", 10, 123)  # the lines hold for the levels and the move budget they were measured on
    run_job(config, job, sokoban_solver_policy(config.max_actions_per_turn, config.enable_thinking),
            REFERENCE_LINES if measured_on else None)
