"""StarPO-S on 6x6 one-box Sokoban: warm start on solver demonstrations, then RL on levels never seen before.

The tiny CPU model first learns the answer format and a first sense of the game by supervised fine-tuning on
the fewest-moves solver's replies (demonstration levels come from seeds 1,000,000+, far from training and
validation). StarPO-S then trains on fresh levels every iteration. Success is measured before and after RL on
256 fixed validation levels (seeds 123...). The reward is solved/not solved (``reward="success"``): with 16
trajectories per update RAGEN's shaped terms mostly add noise; ``--env-config '{"reward": "shaped"}'``
restores them.

Command:  python tuned_examples/starpo_sokoban.py [--seed 0] [--iterations 80] [--model smollm2-135m] [--help]
Time:     the plan line states it for this CPU (rllib_ragen/jobs/job_times.py), warm start included
Expect:   sampled success (T = 0.5) gains on seeds 1 and 2 but not on seed 0 on a 2-core AVX2 CPU, where greedy play
          falls below ten random moves; the final table's last lines compare greedy play with them. The figures,
          the flags whose greedy play learns, and the history: docs/results/sokoban.md
SmolLM2:  on a CPU, --preset smollm2-cpu --demonstration-moves-per-reply 1 --max-turns 10 (its warm start then reads
          the board: one move per demonstrated reply, each from the board it changes); docs/results/sokoban.md
"""

from rllib_ragen import StarPOConfig
from rllib_ragen.jobs.run import JobSettings, run_job
from rllib_ragen.jobs.flags import apply_job_args, job_parser
from rllib_ragen.envs.sokoban_levels import ACTION_NAMES
from rllib_ragen.demonstrators import SOKOBAN_REASONING, random_moves_policy, sokoban_solver_policy

config = (
    StarPOConfig()
    .environment("rllib_ragen/Sokoban-v0", env_config={"reward": "success"})
    # 16 levels x 4 attempts, RAGEN's top-25% filter: RL sees the 4 levels whose outcomes vary most.
    .training(
        num_groups=16,
        group_size=4,
        rollout_filter_ratio=0.25,
        lr=1e-4,
        critic_lr=1e-3,
        whiten_advantages=False,  # raw R - V: the setting these CPU jobs were tuned with
        max_turns=5,
        max_actions_per_turn=5,
        max_actions_per_episode=10,
        max_new_tokens_per_turn=48,
        validation_size=256,
        validation_interval=20,
    )  # 5 validation points; 256 levels take ~40 s
    .debugging(seed=0)
)
job = JobSettings(
    output_dir="outputs/starpo_sokoban",
    iterations=80,
    warm_start_episodes=2000,
    warm_start_steps=500,
    pass_bar=0.05,  # validation success must rise at least this much over the warm start
    timed_command="starpo_sokoban.py",
)
KNOWN_SCORES = {"optimal policy": 0.996}  # the solver, within the job's 10 moves, on the validation levels


def smollm2_gpu(config):
    """With --preset smollm2-gpu, over the preset: the first 10 iterations on levels of at most 3 moves (this
    curriculum kept the tiny model's greedy play from falling, docs/results/sokoban.md). The job's warm start
    stays (what SmolLM2 reached with it on a GPU: docs/scaling.md)."""
    config.environment(curriculum=[{"iterations": 10, "env_config": {"max_solution_moves": 3}}])


JOB_PRESETS = {"smollm2-gpu": smollm2_gpu}  # the job's own settings under a GPU preset (parse_job_args)


def parse_args(config, job, argv=None, description=__doc__.splitlines()[0]):
    """The job flags plus ``--demonstration-moves-per-reply`` and ``--demonstration-reasoning``; returns (config,
    job, demonstration policy, baselines)."""
    parser = job_parser(config, job, description)
    parser.add_argument(
        "--demonstration-moves-per-reply",
        type=int,
        default=None,
        metavar="INT",
        help="moves of the solver's plan shown in each demonstrated reply, 1 to max_actions_per_turn "
        "(default: max_actions_per_turn)",
    )
    parser.add_argument(
        "--demonstration-reasoning",
        choices=SOKOBAN_REASONING,
        default="plan",
        help="the demonstrated <think> line: 'plan' states the solver's plan length; 'effects' first "
        "says what each move would do from the board shown (default: plan)",
    )
    cli = parser.parse_args(argv)
    config, job = apply_job_args(parser, cli, config, job, job_presets=JOB_PRESETS)
    moves = cli.demonstration_moves_per_reply
    moves = config.max_actions_per_turn if moves is None else moves
    if not 1 <= moves <= config.max_actions_per_turn:
        parser.error(
            f"--demonstration-moves-per-reply is {moves}; it must be between 1 "
            f"and max_actions_per_turn ({config.max_actions_per_turn}): the protocol cuts a longer reply."
        )
    baselines = {
        "random moves": random_moves_policy(
            ACTION_NAMES, config.max_actions_per_turn, config.enable_thinking, seed=config.seed or 0
        )
    }
    return config, job, sokoban_solver_policy(moves, config.enable_thinking, cli.demonstration_reasoning), baselines


if __name__ == "__main__":
    config, job, demonstrations, baselines = parse_args(config, job)
    measured_on = (config.env, config.max_actions_per_episode, config.validation_seed_start) == (
        "rllib_ragen/Sokoban-v0",
        10,
        123,
    )  # the lines hold for the levels and the move budget they were measured on
    run_job(config, job, demonstrations, KNOWN_SCORES if measured_on else None, baselines)
