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
from rllib_ragen.experiment import JobSettings, run_job
from rllib_ragen.experiment_flags import apply_job_args, job_parser
from rllib_ragen.envs.sokoban_levels import ACTION_NAMES
from rllib_ragen.rollout.scripted import SOKOBAN_REASONING, random_moves_policy, sokoban_solver_policy

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
# Measured on the 256 validation levels: the solver solves 0.996 within the job's 10 moves. Random moves are a
# strong baseline on these small levels (10 of them, 8 plays each: 0.308), and the job plays them on its own
# validation levels and pairs its greedy agent against them (parse_args' baselines): the agent, unlike them, also
# loses turns to format errors.
REFERENCE_LINES = {"optimal policy": 0.996}
# Each demonstrated reply shows as many moves of the solver's plan as a reply may carry (max_actions_per_turn).
# One move per reply (--demonstration-moves-per-reply 1: the model learns the next move and reads the board again
# each turn) plays better after RL, and with ten turns of it (--max-turns 10 --warm-start-max-turns 5) and 120
# iterations greedy success reached 0.457 on 512 levels (README, the eighth attempt). That takes ~45 min, and its
# warm start alone 9; cut to 300 steps it fell behind: over this job's budget, so these stay flags. Seed 1's warm
# start stays blind to the board after 500 steps; 1,200 grouped steps (--warm-start-steps 1200
# --warm-start-group-by-length) fix that (greedy 0.445) but leave RL no significant gain, and not seed 2's (ninth attempt).
# --demonstration-reasoning effects lifts the warm start on seeds 0-2 (greedy 0.35-0.40), but RL from
# it gained nothing on seed 2 in 80 iterations (eleventh attempt), so the plan line stays the default. Seed 2's
# warm start states 68% of those effects right (summary's reasoning_grounded; a blind guess 54%); trained 1,200
# steps it plays 0.477 greedy and RL with --ineffective-action-penalty -0.1 reaches 0.510 (+3.3, p = 0.097; twelfth).
# The same path in one command on seed 0 (--warm-start-steps 1200 --warm-start-episodes 4000): 0.518 -> 0.545 greedy
# (+2.7, p = 0.19; thirteenth): RL adds about 3 points on both seeds, and the run takes an hour.


def parse_args(config, job, argv=None, description=__doc__.splitlines()[0]):
    """The job flags plus ``--demonstration-moves-per-reply`` and ``--demonstration-reasoning``; returns (config,
    job, demonstration policy, baselines)."""
    parser = job_parser(config, job, description)
    parser.add_argument("--demonstration-moves-per-reply", type=int, default=None, metavar="INT",
                        help="moves of the solver's plan shown in each demonstrated reply, 1 to max_actions_per_turn "
                             "(default: max_actions_per_turn)")
    parser.add_argument("--demonstration-reasoning", choices=SOKOBAN_REASONING, default="plan",
                        help="the demonstrated <think> line: 'plan' states the solver's plan length; 'effects' first "
                             "says what each move would do from the board shown (default: plan)")
    cli = parser.parse_args(argv)
    config, job = apply_job_args(parser, cli, config, job)
    moves = cli.demonstration_moves_per_reply
    moves = config.max_actions_per_turn if moves is None else moves
    if not 1 <= moves <= config.max_actions_per_turn:
        parser.error(f"--demonstration-moves-per-reply is {moves}; it must be between 1 "
                     f"and max_actions_per_turn ({config.max_actions_per_turn}): the protocol cuts a longer reply.")
    baselines = {"random moves": random_moves_policy(ACTION_NAMES, config.max_actions_per_turn, config.enable_thinking,
                                                     seed=config.seed or 0)}
    return config, job, sokoban_solver_policy(moves, config.enable_thinking, cli.demonstration_reasoning), baselines


if __name__ == "__main__":
    config, job, demonstrations, baselines = parse_args(config, job)
    measured_on = (config.env, config.max_actions_per_episode, config.validation_seed_start) == (
        "rllib_ragen/Sokoban-v0", 10, 123)  # the lines hold for the levels and the move budget they were measured on
    run_job(config, job, demonstrations, REFERENCE_LINES if measured_on else None, baselines)
