"""The multi-agent games: RLlib's own checks, hand-played episodes, the solvers against known values, TextArena."""

import itertools
import re
from fractions import Fraction

import pytest
from ray.rllib.utils.pre_checks.env import check_multiagent_environments

from rllib_ragen.envs.games import make_game
from rllib_ragen.envs.kuhn_poker import (
    CARDS,
    DECISIONS,
    GAME_VALUE,
    KuhnPokerGame,
    StrategyPlayer,
    best_response_payoff,
    equilibrium_strategy,
    expected_payoff,
    exploitability,
    info_sets,
    payoff,
    strategy_from_play,
)
from rllib_ragen.envs.multi_agent import RandomPlayer, play_match
from rllib_ragen.envs.tic_tac_toe import MinimaxPlayer, TicTacToeGame, best_cells, minimax_value


@pytest.mark.parametrize("game_id", ["rllib_ragen/TicTacToe-v0", "rllib_ragen/KuhnPoker-v0"])
def test_rllibs_checker_accepts_the_games(game_id):
    check_multiagent_environments(make_game(game_id))


def test_unknown_game_names_the_choices():
    with pytest.raises(ValueError, match="rllib_ragen/KuhnPoker-v0"):
        make_game("rllib_ragen/Chess-v0")


def test_tic_tac_toe_by_hand():
    game = TicTacToeGame()
    observations, infos = game.reset(seed=0)
    assert list(observations) == ["x"] and infos == {"x": {}}
    assert "Free cells: 1, 2, 3, 4, 5, 6, 7, 8, 9" in observations["x"]
    for seat, cell in [("x", "1"), ("o", "5"), ("x", "2"), ("o", "9")]:
        observations, rewards, terminated, truncated, _ = game.step({seat: cell})
        assert list(observations) == ["o" if seat == "x" else "x"] and rewards == {}
        assert terminated == truncated == {"__all__": False}
    assert observations["x"].startswith("Your opponent played 9.")
    observations, rewards, terminated, truncated, infos = game.step({"x": " 3 "})  # X X X on the top row
    assert rewards == {"x": 1.0, "o": -1.0} and terminated == {"__all__": True} and truncated == {"__all__": False}
    assert set(observations) == {"x", "o"} and "You won." in observations["x"] and "You lost." in observations["o"]
    assert infos["x"] == {"success": True, "outcome": "win", "illegal_move": False, "action_is_valid": True}
    assert infos["o"]["outcome"] == "loss"
    with pytest.raises(RuntimeError, match="reset"):
        game.step({"o": "4"})


def test_an_illegal_move_forfeits_or_retries():
    game = TicTacToeGame()
    game.reset(seed=0)
    game.step({"x": "5"})
    _, rewards, terminated, _, infos = game.step({"o": "5"})  # taken
    assert rewards == {"x": 1.0, "o": -1.0} and terminated["__all__"] and infos["o"]["illegal_move"]
    retrying = TicTacToeGame({"illegal_move": "retry"})
    retrying.reset(seed=0)
    retrying.step({"x": "5"})
    observations, rewards, terminated, _, infos = retrying.step({"o": "five"})
    assert list(observations) == ["o"] and rewards == {} and infos == {"o": {"action_is_valid": False}}
    assert retrying.board.count("") == 8  # nothing changed
    for _ in range(TicTacToeGame.max_moves - 3):
        retrying.step({"o": "5"})
    _, rewards, terminated, truncated, _ = retrying.step({"o": "5"})  # the 32nd move: truncated, nobody paid
    assert truncated == {"__all__": True} and terminated == {"__all__": False} and rewards == {"x": 0.0, "o": 0.0}
    with pytest.raises(ValueError, match="illegal_move"):
        TicTacToeGame(illegal_move="ignore")
    fresh = TicTacToeGame()
    with pytest.raises(RuntimeError, match="reset"):
        fresh.step({"x": "1"})
    fresh.reset(seed=0)
    with pytest.raises(ValueError, match="'x'"):
        fresh.step({"o": "1"})


def test_minimax_values():
    empty = ("",) * 9
    assert minimax_value(empty, "X") == 0  # perfect play draws
    # X X . / O O . / . . . with X to move: X wins at once (cell index 2).
    board = ("X", "X", "", "O", "O", "", "", "", "")
    assert minimax_value(board, "X") == 1 and 2 in best_cells(board, "X")
    # The same board with O to move: O wins at index 5 at once, or blocks at 2 and wins anyway: X must then block
    # the middle row at 5, and O completes the diagonal 2-4-6.
    assert minimax_value(board, "O") == 1 and best_cells(board, "O") == [2, 5]


def _outcomes_against_every_reply(seat_of_minimax: str) -> set[str]:
    """Every outcome for minimax's seat over every possible sequence of the other seat's moves."""
    outcomes = set()

    def explore(moves: list[str]) -> None:
        game = TicTacToeGame()
        game.reset(seed=0)
        perfect = MinimaxPlayer(seed=0)
        replies = iter(moves)
        while not game.game_over:
            seat = game.to_move()
            if seat == seat_of_minimax:
                game.step({seat: perfect(game, seat)})
            else:
                reply = next(replies, None)
                if reply is None:  # branch on every legal reply here
                    for option in game.legal_actions(seat):
                        explore(moves + [option])
                    return
                game.step({seat: reply})
        outcomes.add(game.outcome(seat_of_minimax))

    explore([])
    return outcomes


@pytest.mark.parametrize("seat", ["x", "o"])
def test_minimax_never_loses(seat):
    assert "loss" not in _outcomes_against_every_reply(seat)
    for seed in range(5):
        rewards = play_match(TicTacToeGame(), {"x": MinimaxPlayer(seed), "o": MinimaxPlayer(seed + 1)}, seed=seed)
        assert rewards == {"x": 0.0, "o": 0.0}


def test_kuhn_poker_payoffs_by_hand():
    assert payoff(("K", "J"), ("check", "check")) == 1
    assert payoff(("J", "Q"), ("bet", "call")) == -2
    assert payoff(("J", "K"), ("bet", "fold")) == 1
    assert payoff(("Q", "K"), ("check", "bet", "fold")) == -1
    assert payoff(("K", "Q"), ("check", "bet", "call")) == 2
    assert payoff(("K", "Q"), ("check", "bet")) is None
    # Symmetric showdowns are worth 0; a bet the other always folds to wins the ante.
    checks = dict.fromkeys(info_sets("first") + info_sets("second"), Fraction(0))
    always = dict.fromkeys(checks, Fraction(1))
    assert expected_payoff(checks, checks) == 0 and expected_payoff(always, always) == 0
    assert expected_payoff(always, checks) == 1  # first always bets, second always folds
    assert best_response_payoff(checks, "first") == 1


def test_kuhn_equilibrium_value_and_exploitability():
    for alpha in (Fraction(0), Fraction(1, 6), Fraction(1, 3)):
        strategy = equilibrium_strategy(alpha)
        assert expected_payoff(strategy, strategy) == GAME_VALUE == Fraction(-1, 18)
        assert exploitability(strategy, strategy) == 0
    bluffer = dict(equilibrium_strategy()) | {("Q", ()): Fraction(1)}  # bets Q as well
    assert exploitability(bluffer, bluffer) > 0
    with pytest.raises(ValueError, match="alpha"):
        equilibrium_strategy(Fraction(1, 2))


def test_kuhn_game_matches_the_analysis_on_every_deal_and_line():
    game = KuhnPokerGame()
    for cards in itertools.permutations(CARDS, 2):
        for line in [("check", "check"), ("bet", "call"), ("bet", "fold"), ("check", "bet", "call")]:
            game.reset(seed=0)
            game.cards = cards
            for move in line:
                seat = game.to_move()
                assert seat == DECISIONS[game.history][0] and move in game.legal_actions(seat)
                observations, rewards, terminated, _, _ = game.step({seat: move})
            assert terminated["__all__"] and rewards["first"] == payoff(cards, line) == -rewards["second"]


def test_kuhn_poker_hides_the_other_card():
    game = KuhnPokerGame()
    observations, _ = game.reset(seed=3)
    mine, theirs = game.cards
    assert f"Your card: {mine}." in observations["first"] and theirs not in observations["first"]
    observations, *_ = game.step({"first": "bet"})
    assert f"Your card: {theirs}." in observations["second"] and mine not in observations["second"]
    assert observations["second"].endswith("Your move: fold or call.")
    observations, *_ = game.step({"second": "call"})
    assert f"your opponent held {theirs}" in observations["first"]


def test_kuhn_equilibrium_player_against_random_play():
    # The equilibrium player wins against random play on average; its mean over 4,000 hands is far above -1/18.
    total = 0.0
    for seed in range(4000):
        seats = {"first": StrategyPlayer(equilibrium_strategy(), seed), "second": RandomPlayer(seed)}
        total += play_match(KuhnPokerGame(), seats, seed=seed)["first"]
    assert total / 4000 > 0.1


def _played_decisions(players, hands: int) -> list[tuple[str, str]]:
    """(what the seat saw, its move) at every decision of ``hands`` hands between scripted ``players``."""
    game, decisions = KuhnPokerGame(), []
    for seed in range(hands):
        views, _ = game.reset(seed=seed)
        while not game.game_over:
            seat = game.to_move()
            move = players[seat](game, seat)
            decisions.append((views[seat], move))
            views, *_ = game.step({seat: move})
    return decisions


def test_a_kuhn_strategy_is_read_back_from_play():
    # By hand: the first seat bets K once and checks it once, checks J twice (then folds to a bet once, and once makes
    # no legal move), and never holds Q; the second seat calls every bet with K.
    views = {
        "K": "Your card: K.\nYour move: check or bet.",
        "J": "Your card: J.\nYour move: check or bet.",
        "J bet": "Your card: J.\nYou checked.\nYour opponent bet 1 chip.\nYour move: fold or call.",
        "K 2nd": "Your card: K.\nYour opponent bet 1 chip.\nYour move: fold or call.",
    }
    decisions = [(views["K"], "bet"), (views["K"], "check"), (views["J"], "check"), (views["J"], "check")]
    decisions += [(views["J bet"], "fold"), (views["J bet"], ""), (views["K 2nd"], "call")]
    read = strategy_from_play(decisions)
    assert read["counts"]["K first"] == {"passive": 1, "aggressive": 1, "none": 0}
    assert read["counts"]["J after check bet"] == {"passive": 1, "aggressive": 0, "none": 1}
    assert read["strategy"]["K first"] == 0.5 and read["strategy"]["J first"] == 0.0
    assert read["strategy"]["K after bet"] == 1.0 and read["strategy"]["Q first"] == 0.5  # unvisited: 1/2
    assert "Q first" in read["unvisited"] and "K after bet" not in read["unvisited"]
    assert read["no_move_rate"] == 1 / 7
    # The estimate's exploitability is exploitability() of exactly those fractions.
    estimate = {point: Fraction(1, 2) for seat in ("first", "second") for point in info_sets(seat)}
    estimate |= {("K", ()): Fraction(1, 2), ("J", ()): Fraction(0), ("J", ("check", "bet")): Fraction(0)}
    estimate |= {("K", ("bet",)): Fraction(1)}
    halves = [{p: estimate[p] for p in info_sets(seat)} for seat in ("first", "second")]
    assert read["exploitability"] == float(exploitability(*halves))
    # Kuhn's equilibrium, played 20,000 hands by scripted players, reads back close to unexploitable; a player that
    # always bets or calls does not.
    equilibrium = {seat: StrategyPlayer(equilibrium_strategy(), i) for i, seat in enumerate(("first", "second"))}
    assert strategy_from_play(_played_decisions(equilibrium, 20_000))["exploitability"] < 0.01
    always = StrategyPlayer(dict.fromkeys(info_sets("first") + info_sets("second"), 1.0))
    assert strategy_from_play(_played_decisions({"first": always, "second": always}, 200))["exploitability"] > 0.2


AVAILABLE = re.compile(r"'\[(\d+)\]'")


def _textarena_moves(observation: str) -> list[str]:
    return AVAILABLE.findall(observation.rsplit("Available Moves:", 1)[-1])


def test_textarena_tic_tac_toe_pays_as_textarena():
    textarena = pytest.importorskip("textarena")
    game = make_game("textarena/TicTacToe-v0")
    check_multiagent_environments(game)
    for seed in range(3):
        observations, _ = game.reset(seed=seed)
        own = textarena.make("TicTacToe-v0")  # the same game, driven directly with the same moves
        own.reset(num_players=2, seed=game.textarena_seed)
        assert "Tic Tac Toe" in next(iter(observations.values()))
        done = False
        while not done:
            (seat,) = observations
            move = _textarena_moves(observations[seat])[seed % 2]  # some legal move
            assert own.get_observation()[0] == int(seat[-1])
            own_done, _ = own.step(f"[{move}]")
            observations, rewards, terminated, _, infos = game.step({seat: move})
            done = terminated["__all__"]
            assert done == own_done
        own_rewards, _ = own.close()
        assert rewards == {f"player_{pid}": float(r) for pid, r in own_rewards.items()}
        assert set(observations) == {"player_0", "player_1"}
    # Invalid moves: TextArena's own rule decides (here: one warning, then the game is lost), and its rewards are paid.
    observations, _ = game.reset(seed=0)
    (seat,) = observations
    observations, rewards, terminated, _, _ = game.step({seat: "42"})
    assert list(observations) == [seat] and "invalid move" in observations[seat] and not terminated["__all__"]
    observations, rewards, terminated, _, _ = game.step({seat: "42"})
    own = textarena.make("TicTacToe-v0")
    own.reset(num_players=2, seed=game.textarena_seed)
    own.step("[42]")
    assert own.step("[42]")[0] and terminated["__all__"]
    own_rewards, _ = own.close()
    assert rewards == {f"player_{pid}": float(r) for pid, r in own_rewards.items()} and rewards[seat] < 0


@pytest.fixture(scope="module")
def tiny_tokenizer():
    from rllib_ragen.rollout.models import load_policy

    return load_policy("tiny", seed=0)[1]


def _scripted_rollout(tokenizer, policy, env: str, opponent: str, turns: int, seeds: int, group_size: int = 1):
    """``policy`` (a demonstrator) playing one seat of ``env`` against ``opponent`` through the engine, ``seeds``
    groups of ``group_size``, at most ``turns`` moves; (trajectories, metrics)."""
    from rllib_ragen.rollout.backends import SamplingParams, ScriptedBackend
    from rllib_ragen.rollout.engine import RolloutEngine
    from rllib_ragen.rollout.rollout_config import RolloutConfig

    config = RolloutConfig(
        env=env,
        env_config={"opponent": opponent},
        enable_thinking=False,
        max_turns=turns,
        max_actions_per_episode=turns,
    )
    backend = ScriptedBackend(policy, tokenizer)
    return RolloutEngine(config, backend, tokenizer).rollout(
        list(range(seeds)), group_size=group_size, sampling=SamplingParams()
    )


def test_a_seat_against_scripted_opponents_is_a_text_env():
    from rllib_ragen.envs import TRANSITION_SEED, make_text_env

    env = make_text_env("rllib_ragen/TicTacToe-v0", opponent="minimax").unwrapped
    observation, _ = env.reset(seed=0)
    assert env.seat == "x" and "You play X" in observation and "You move first" in env.describe()
    observation, _ = env.reset(seed=1)  # odd seeds play the second seat: the opponent has moved already
    assert env.seat == "o" and observation.startswith("Your opponent played")
    assert env.canonical_action(" 5 ") == "5" and env.canonical_action("Up") is None
    taken = next(c for c in "123456789" if c not in env.game.legal_actions("o"))
    _, reward, terminated, _, info = env.step(taken)  # an illegal move forfeits, by the game's default rule
    assert (reward, terminated, info["action_is_effective"], info["outcome"]) == (-1.0, True, False, "loss")
    assert info["action_is_valid"]  # a move of the game, illegal now
    # The same seed replays the opponents' moves; a member's own transition seed draws other ones.
    openings = set()
    for member in range(8):
        env.reset(seed=1, options={TRANSITION_SEED: (1, member)})
        openings.add(env.game.board)
    assert len(openings) > 1
    assert len({env.reset(seed=1)[0] for _ in range(3)}) == 1
    with pytest.raises(ValueError, match="minimax"):
        make_text_env("rllib_ragen/KuhnPoker-v0", opponent="minimax")
    with pytest.raises(ValueError, match="seat"):
        make_text_env("rllib_ragen/KuhnPoker-v0", seat="dealer")


def test_minimax_demonstrator_through_the_engine(tiny_tokenizer):
    from rllib_ragen.demonstrators import tic_tac_toe_minimax_policy

    for opponent, outcomes in [("minimax", {0.0}), ("random", {0.0, 1.0})]:
        policy = tic_tac_toe_minimax_policy()
        trajectories, metrics = _scripted_rollout(
            tiny_tokenizer, policy, "rllib_ragen/TicTacToe-v0", opponent, 5, 16, group_size=2
        )
        assert len(trajectories) == 32 and metrics["rollout/format_error_rate"] == 0.0
        assert {sum(t.turn_rewards) for t in trajectories} <= outcomes  # perfect play never loses
        if opponent == "random":
            assert metrics["rllib_ragen/TicTacToe-v0/success"] > 0.5
        assert {t.seed % 2 for t in trajectories} == {0, 1}  # both seats played


def test_random_demonstrator_plays_only_legal_moves(tiny_tokenizer):
    from rllib_ragen.demonstrators import tic_tac_toe_random_policy

    policy = tic_tac_toe_random_policy()
    trajectories, metrics = _scripted_rollout(tiny_tokenizer, policy, "rllib_ragen/TicTacToe-v0", "random", 5, 32)
    assert metrics["rollout/format_error_rate"] == 0.0
    assert metrics["rollout/effective_action_rate"] == 1.0  # never an occupied cell: no forfeit
    assert {sum(t.turn_rewards) for t in trajectories} == {-1.0, 0.0, 1.0}  # no strategy: wins, draws and losses


@pytest.mark.parametrize("success, counted", [("win", False), ("not_lost", True)])
def test_a_draw_against_minimax_is_a_success_only_when_not_losing_counts(success, counted):
    """Perfect play against minimax draws every game, from either seat: a success under ``not_lost`` alone."""
    import re

    from rllib_ragen.demonstrators import tic_tac_toe_minimax_policy
    from rllib_ragen.envs import make_text_env

    policy = tic_tac_toe_minimax_policy()
    env = make_text_env("rllib_ragen/TicTacToe-v0", opponent="minimax", success=success)
    for seed in range(4):  # x on even seeds, o on odd
        observation, info = env.reset(seed=seed)
        done = False
        while not done:
            move = re.search(r"<answer>(\d)</answer>", policy(observation)).group(1)
            observation, reward, done, _, info = env.step(move)
        assert (info["outcome"], reward, info["success"]) == ("draw", 0.0, counted)
    with pytest.raises(ValueError, match="not_lost"):
        make_text_env("rllib_ragen/TicTacToe-v0", success="draw")


def test_kuhn_demonstrators_play_their_strategy_through_the_engine(tiny_tokenizer):
    # The equilibrium demonstrator, one seat against the equilibrium player through the engine over 800 hands: every
    # move legal, and its moves read back as Kuhn's equilibrium (its first-seat hands; the random demonstrator's as
    # 1/2 at every point they reach).
    from rllib_ragen.demonstrators import kuhn_poker_random_policy, kuhn_poker_strategy_policy
    from rllib_ragen.envs.kuhn_poker import equilibrium_strategy

    equilibrium = {f"{card} first": float(equilibrium_strategy()[(card, ())]) for card in CARDS}
    for policy, expected in [(kuhn_poker_strategy_policy(), equilibrium), (kuhn_poker_random_policy(), None)]:
        trajectories, metrics = _scripted_rollout(
            tiny_tokenizer, policy, "rllib_ragen/KuhnPoker-v0", "equilibrium", 2, 400, group_size=2
        )
        assert metrics["rollout/format_error_rate"] == 0.0 and all(
            t.num_effective == t.num_actions for t in trajectories
        )
        decisions = [
            (key.split("\n", 1)[1], a[0]) for t in trajectories for key, a in zip(t.turn_states, t.turn_actions)
        ]
        read = strategy_from_play(decisions)
        for point, share in (expected or dict.fromkeys(read["strategy"], 0.5)).items():
            if point not in read["unvisited"]:
                counts = read["counts"][point]
                n = counts["passive"] + counts["aggressive"]
                assert abs(read["strategy"][point] - share) < 4 * (0.25 / n) ** 0.5 + 1e-9, (point, counts)
