"""StarPO self-play on tic-tac-toe: one policy plays both seats against itself, each seat's games its own GRPO group.

The tiny CPU model is first warm-started on demonstrations of random legal moves (the format and the rules, no
strategy), so whatever it learns beyond them, RL taught it. Training games have the policy in both seats (SPIRAL's
self-play, arXiv 2506.24119); validation plays one seat (x or o, by seed) against a random player and against
minimax, which cannot be beaten: against it the best result is a draw. ``--fixed-opponent random`` trains against the
random player instead of itself, SPIRAL's baseline, which it reports overfits to its opponent. ``--game kuhn-poker``
plays Kuhn poker instead, validated against random play and Kuhn's equilibrium, and reads after the run how
exploitable the warm start's and the trained policy's strategies are (0 at an equilibrium). With a league
(``--league-interval 5``) its players (the warm start, the snapshots held at the end, the trained policy) play each
other after the run, and a table rates them.

Command:  python tuned_examples/starpo_selfplay.py [--seed 0] [--iterations 30] [--fixed-opponent random]
          [--game kuhn-poker] [--league-interval 5]
Time:     the plan line states it for this CPU (rllib_ragen/jobs/job_times.py), warm start included
Expect:   docs/results/self-play.md
"""

import dataclasses
from pathlib import Path

from rllib_ragen import StarPOConfig
from rllib_ragen.demonstrators import (
    kuhn_poker_random_policy,
    kuhn_poker_strategy_policy,
    tic_tac_toe_minimax_policy,
    tic_tac_toe_random_policy,
)
from rllib_ragen.jobs import JobSettings, run_job
from rllib_ragen.jobs.flags import apply_job_args, job_parser
from rllib_ragen.jobs.matches import against_warm_start, kuhn_strategy_of_trial, league_ratings
from rllib_ragen.jobs.outputs import LEAGUE

GAME = "rllib_ragen/TicTacToe-v0"
# One seat (x on even seeds, o on odd) against each opponent: success against the random player is a win, against
# minimax (which cannot be beaten) a draw or a win.
OPPONENTS = [
    {"env": GAME, "env_config": {"opponent": "random"}, "name": "vs random"},
    {"env": GAME, "env_config": {"opponent": "minimax", "success": "not_lost"}, "name": "vs minimax"},
]
KUHN = "rllib_ragen/KuhnPoker-v0"
# Kuhn poker: a success is a hand won; against the equilibrium the first seat loses 1/18 chip a hand on average.
KUHN_OPPONENTS = [
    {"env": KUHN, "env_config": {"opponent": "random"}, "name": "vs random"},
    {"env": KUHN, "env_config": {"opponent": "equilibrium"}, "name": "vs equilibrium"},
]

config = (
    StarPOConfig()
    .environment(GAME, env_config={"opponent": "random"}, validation_envs=OPPONENTS)
    .training(
        self_play=True,
        advantage_estimator="grpo",  # a baseline per seat and start: SPIRAL's role-conditioned point
        num_groups=8,
        group_size=8,
        rollout_filter_ratio=1.0,  # every game informs the update
        lr=5e-4,
        enable_thinking=False,
        max_turns=5,  # x moves at most 5 times, o 4
        max_actions_per_turn=1,
        max_actions_per_episode=5,
        max_new_tokens_per_turn=16,
        # Each reply reads the rules and the board as it is now (the board is the whole state): the tiny model
        # learns to pick a free cell from one board more readily than from the whole game (docs/results/self-play.md).
        context_window="single_turn",
        micro_batch_size=32,  # the learner's pass over every row at once held gigabytes of attention (Benchmarks)
        validation_size=256,
        validation_interval=10,
    )
    .debugging(seed=0)
)
job = JobSettings(
    output_dir="outputs/starpo_selfplay",
    iterations=30,
    warm_start_episodes=2000,
    warm_start_steps=600,
    warm_start_lr=1e-3,
    pass_bar=0.05,  # the win rate against the random player must rise at least this much
    timed_command="starpo_selfplay.py",
)
MATCH_GAMES = 256  # against the warm start, after the run: the seat alternating, both sampled
RATING_GAMES = 64  # with a league, after the run: deals each pair of its players plays twice, the seats swapped
STRATEGY_HANDS = 2048  # Kuhn poker, after the run: each policy against the random player, its moves read as a strategy


def parse_args(config, job, argv=None, description=__doc__.splitlines()[0]):
    """The job flags plus ``--game``, ``--fixed-opponent``, ``--match-games`` and ``--rating-games``; returns
    (config, job, demonstration policy, baselines, games played after the run: ``{"match": ..., "rating": ...}``)."""
    parser = job_parser(config, job, description)
    parser.add_argument(
        "--game",
        choices=("tic-tac-toe", "kuhn-poker"),
        default="tic-tac-toe",
        help="the game played (default: tic-tac-toe)",
    )
    parser.add_argument(
        "--fixed-opponent",
        choices=("random", "minimax"),
        default=None,
        help="train one seat against this scripted player instead of by self-play (SPIRAL's baseline)",
    )
    parser.add_argument(
        "--match-games",
        type=int,
        default=MATCH_GAMES,
        help=f"games the trained policy and its warm start each play against the warm start after the run "
        f"(default: {MATCH_GAMES}; 0: none)",
    )
    parser.add_argument(
        "--rating-games",
        type=int,
        default=RATING_GAMES,
        help=f"with a league (--league-interval): deals each pair of its players (the warm start, the snapshots held "
        f"at the end, the trained policy) plays twice, the seats swapped, after the run, for a rating table "
        f"(default: {RATING_GAMES}; 0: none)",
    )
    cli = parser.parse_args(argv)
    kuhn = cli.game == "kuhn-poker"
    game = KUHN if kuhn else GAME
    if kuhn:  # a hand is at most two moves a seat
        config = config.copy(copy_frozen=False)
        config.environment(KUHN, env_config={"opponent": "random"}, validation_envs=KUHN_OPPONENTS)
        config.training(max_turns=2, max_actions_per_episode=2)
    if cli.fixed_opponent:
        if cli.fixed_opponent == "minimax" and kuhn:
            parser.error("--fixed-opponent minimax plays tic-tac-toe only; Kuhn poker trains against random play.")
        config = config.copy(copy_frozen=False)
        config.environment(game, env_config={"opponent": cli.fixed_opponent}).training(self_play=False)
    config, job = apply_job_args(parser, cli, config, job)
    if kuhn and job.timed_command == "starpo_selfplay.py":  # the job-time table times the Kuhn poker job on its own
        job = dataclasses.replace(job, timed_command="starpo_selfplay.py --game kuhn-poker")
    # Paired against the agent on the validation states: a random legal mover (the warm start's teacher) and the
    # game's best player (minimax; Kuhn's equilibrium).
    thinking = config.enable_thinking
    if kuhn:
        baselines = {
            "random legal moves": kuhn_poker_random_policy(thinking, seed=1),
            "equilibrium": kuhn_poker_strategy_policy(enable_thinking=thinking),
        }
        demonstrations = kuhn_poker_random_policy(thinking)
    else:
        baselines = {
            "random legal moves": tic_tac_toe_random_policy(thinking, seed=1),
            "minimax": tic_tac_toe_minimax_policy(thinking),
        }
        demonstrations = tic_tac_toe_random_policy(thinking)
    for flag, games in (("--match-games", cli.match_games), ("--rating-games", cli.rating_games)):
        if games < 0:
            parser.error(f"{flag} {games}: give 0 (none) or more games.")
    return config, job, demonstrations, baselines, {"match": cli.match_games, "rating": cli.rating_games}


if __name__ == "__main__":
    config, job, demonstrations, baselines, games = parse_args(config, job)
    summary = run_job(config, job, demonstrations, baselines=baselines)
    # The third opponent, a model: the trained policy and its warm start each against the warm start, paired.
    for trial in summary.get("trials", {"": summary}).values():
        if games["match"]:
            matches = against_warm_start(trial["run_dir"], games=games["match"], allow_imports=True)  # its own run
            print(f"against its warm start ({trial['run_dir']}): score {matches['paired']['describe']}", flush=True)
        if config.env == KUHN:  # how exploitable each policy's strategy is, read from its own play
            read = kuhn_strategy_of_trial(trial["run_dir"], hands=STRATEGY_HANDS, allow_imports=True)
            print(
                f"exploitability ({trial['run_dir']}, chips a hand, 0 at an equilibrium): warm start "
                f"{read['warm_start']['exploitability']:.3f} -> trained {read['trained']['exploitability']:.3f}",
                flush=True,
            )
        if games["rating"] and (Path(trial["run_dir"]) / LEAGUE).is_dir():  # a league's players against each other
            rated = league_ratings(trial["run_dir"], games=games["rating"], allow_imports=True)
            print(f"the league's players rated ({trial['run_dir']}), Elo against the warm start:\n{rated['table']}")
