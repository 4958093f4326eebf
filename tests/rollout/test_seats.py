"""Every seat of a game played by policies: token-exact trajectories per seat, hand-derived, and a real model's."""

import re

import pytest
import torch

from rllib_ragen.envs.games import GAMES, make_game
from rllib_ragen.envs.multi_agent import TurnBasedTextGame
from rllib_ragen.rollout.backends import HFBackend, SamplingParams, ScriptedBackend
from rllib_ragen.rollout.context import turn_message
from rllib_ragen.rollout.engine import RolloutEngine
from rllib_ragen.rollout.models import load_policy
from rllib_ragen.rollout.rollout_config import RolloutConfig, RolloutSettingError
from rllib_ragen.rollout.seats import play_games

from tests.rollout.test_engine import _learner_logprobs


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_policy("tiny", seed=0)


def _config(env: str, **settings) -> RolloutConfig:
    return RolloutConfig(env=env, enable_thinking=False, max_actions_per_turn=1, **settings)


def scripted_moves(moves: dict[str, list[str]]):
    """Plays each mark's moves in order: the mark from the last "You play X", the turn from how often it was told."""

    def policy(prompt: str) -> str:
        marks = re.findall(r"You play ([XO])\. Free cells", prompt)
        return f"<answer>{moves[marks[-1]][len(marks) - 1]}</answer>"

    return policy


def _message(observation: str, turn: int, reward: float | None, config: RolloutConfig, actions_left: int) -> str:
    return turn_message(
        observation,
        turn=turn,
        actions_left=actions_left,
        reward=reward,
        enable_thinking=False,
        max_actions_per_turn=1,
        separator=config.action_separator,
    )


@pytest.mark.parametrize("game_id", ["rllib_ragen/TicTacToe-v0", "rllib_ragen/KuhnPoker-v0"])
def test_a_seat_reads_what_it_reads_against_a_scripted_opponent(tiny, game_id):
    """Self-play trains on play_games' prompts and validates on the seat environment's: a seat's first prompt is
    the same text either way (its rules, the moves listed, the first state), so the two never drift apart."""
    _, tokenizer = tiny
    config = _config(game_id, max_turns=6, max_actions_per_episode=6)
    first_move = {"rllib_ragen/TicTacToe-v0": "5", "rllib_ragen/KuhnPoker-v0": "check"}[game_id]
    engine = RolloutEngine(
        config, ScriptedBackend(lambda prompt: f"<answer>{first_move}</answer>", tokenizer), tokenizer
    )
    games, _ = play_games(engine, game_id, [0], 1, SamplingParams())
    first_seat = next(t for t in games if t.seat == make_game(game_id).possible_agents[0])
    alone, _ = engine.rollout([0], group_size=1, sampling=SamplingParams())  # seed 0: the first seat
    assert "Valid actions: " in tokenizer.decode(alone[0].token_ids)

    def first_prompt(t):
        return t.token_ids[: t.response_mask.index(1)]

    assert first_prompt(first_seat) == first_prompt(alone[0])


def test_two_seats_by_hand(tiny):
    """x plays 1, 2, 3 and wins; o plays 5, 9. Each seat's trajectory is built here from the template by hand."""
    _, tokenizer = tiny
    config = _config("rllib_ragen/TicTacToe-v0")
    engine = RolloutEngine(
        config, ScriptedBackend(scripted_moves({"X": ["1", "2", "3"], "O": ["5", "9"]}), tokenizer), tokenizer
    )
    trajectories, metrics = play_games(engine, "rllib_ragen/TicTacToe-v0", [0], 1, SamplingParams())
    by_seat = {t.seat: t for t in trajectories}
    assert set(by_seat) == {"x", "o"} and all(t.policy_id == "default_policy" for t in trajectories)
    chat, eos = engine.chat, tokenizer.eos_token_id
    # Replay the game to get what each seat was shown, then build both conversations from the chat template.
    game = make_game("rllib_ragen/TicTacToe-v0")
    views, _ = game.reset(seed=0)
    shown = {"x": [views["x"]], "o": []}
    for seat, cell in [("x", "1"), ("o", "5"), ("x", "2"), ("o", "9"), ("x", "3")]:
        views, *_ = game.step({seat: cell})
        for other, text in views.items():
            if not game.game_over:
                shown[other].append(text)
    replies = {"x": ["1", "2", "3"], "o": ["5", "9"]}
    payoff = {"x": 1.0, "o": -1.0}
    budget = config.max_actions_per_episode
    for seat, t in by_seat.items():
        ids, mask, reply = [], [], []
        for turn, (observation, move) in enumerate(zip(shown[seat], replies[seat]), start=1):
            message = _message(observation, turn, None if turn == 1 else 0.0, config, budget - turn + 1)
            text = (
                chat.prompt_ids(game.instructions(seat) + "\n" + message)
                if turn == 1
                else chat.encode(chat.next_turn_text(reply, message))
            )
            ids += text
            mask += [0] * len(text)
            reply = chat.encode(f"<answer>{move}</answer>") + [eos]
            ids += reply
            mask += [1] * len(reply)
        close = chat.encode(chat.reply_end_text(reply))
        assert t.token_ids == ids + close and t.response_mask == mask + [0] * len(close)
        assert t.turn_rewards == [0.0] * (len(replies[seat]) - 1) + [payoff[seat]]
        assert t.turn_actions == [[m] for m in replies[seat]] and t.success == (seat == "x")
        assert [t.token_ids[s:e] for s, e in t.turn_spans] == [
            chat.encode(f"<answer>{m}</answer>") + [eos] for m in replies[seat]
        ]
    assert (
        metrics["rllib_ragen/TicTacToe-v0/x/win_rate"] == 1.0 and metrics["rllib_ragen/TicTacToe-v0/o/loss_rate"] == 1.0
    )
    assert "Your opponent played 5." in tokenizer.decode(by_seat["x"].token_ids)  # x's second turn saw o's move


def test_a_forfeit_on_the_first_move_leaves_the_other_seat_without_a_trajectory(tiny):
    _, tokenizer = tiny
    engine = RolloutEngine(
        _config("rllib_ragen/KuhnPoker-v0"), ScriptedBackend(lambda p: "no tags", tokenizer), tokenizer
    )
    trajectories, metrics = play_games(engine, "rllib_ragen/KuhnPoker-v0", [0, 1], 2, SamplingParams())
    assert [t.seat for t in trajectories] == ["first"] * 4 and metrics["rollout/seats_never_moved"] == 4.0
    # A format error is an illegal move (the game's forfeit) and pays the format penalty on top.
    assert all(t.turn_rewards == [engine.config.format_penalty - 1.0] and t.format_errors == 1 for t in trajectories)


class TakeTurns(TurnBasedTextGame):
    """Three seats speak in turn, six moves in all; any reply is a move (an untrained model's too)."""

    possible_agents = ("a", "b", "c")

    def _reset_state(self):
        self.said = []

    def to_move(self):
        return self.possible_agents[len(self.said) % 3]

    def legal_actions(self, seat):
        return None

    def canonical_action(self, seat, text):
        return text or "(nothing)"

    def _play(self, seat, action):
        self.said.append(action)
        return None if len(self.said) < 6 else {"a": 1.0, "b": 0.0, "c": -1.0}

    def observe(self, seat):
        return f"Said so far: {len(self.said)}."

    def describe(self, seat):
        return f"You are {seat}."


def test_every_seats_logprobs_equal_a_fresh_forward_pass(tiny, monkeypatch):
    model, tokenizer = tiny
    monkeypatch.setitem(GAMES, "tests/TakeTurns-v0", TakeTurns)
    engine = RolloutEngine(_config("rllib_ragen/TicTacToe-v0", max_turns=5), HFBackend(model, tokenizer), tokenizer)
    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    trajectories, metrics = play_games(engine, "tests/TakeTurns-v0", [3, 4], 2, params, sample_seed=0)
    assert len(trajectories) == 12 and all(t.num_turns == 2 for t in trajectories)
    penalty, payoff = engine.config.format_penalty, {"a": 1.0, "b": 0.0, "c": -1.0}
    for t in trajectories:  # the payoff on the seat's last turn; a format error's penalty on any turn
        assert t.turn_rewards[0] in (0.0, penalty) and t.turn_rewards[1] in (payoff[t.seat], payoff[t.seat] + penalty)
    assert metrics["tests/TakeTurns-v0/a/win_rate"] == 1.0 and metrics["tests/TakeTurns-v0/b/draw_rate"] == 1.0
    for t in trajectories:
        mask = torch.tensor(t.response_mask, dtype=torch.bool)
        recomputed = _learner_logprobs(model, t.token_ids, 1.0)
        behaviour = torch.tensor(t.behaviour_logprobs)
        assert torch.allclose(recomputed[mask], behaviour[mask], atol=1e-5, rtol=0)
        assert torch.all(behaviour[~mask] == 0)


def test_a_seat_under_a_single_turn_window_reads_its_current_view_only(tiny, monkeypatch):
    """Each seat's turn is its own row: the instructions and the seat's view now, its sampled reply, and log-probs a
    fresh forward pass over exactly that row gives back."""
    model, tokenizer = tiny
    monkeypatch.setitem(GAMES, "tests/TakeTurns-v0", TakeTurns)
    config = _config("rllib_ragen/TicTacToe-v0", max_turns=5, context_window="single_turn")
    engine = RolloutEngine(config, HFBackend(model, tokenizer), tokenizer)
    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    trajectories, _ = play_games(engine, "tests/TakeTurns-v0", [3], 2, params, sample_seed=0)
    assert len(trajectories) == 6 and all(len(t.turn_samples) == t.num_turns == 2 for t in trajectories)
    for t in trajectories:
        for turn, (sample, (start, end)) in enumerate(zip(t.turn_samples, t.turn_spans), start=1):
            a, b = sample.reply_span
            assert sample.token_ids[a:b] == t.token_ids[start:end]
            assert sample.response_mask == [0] * a + [1] * (b - a) + [0] * (len(sample.token_ids) - b)
            # The row's prompt, rebuilt by hand: the seat's rules and this turn's message, nothing before it.
            said = "abc".index(t.seat) + 3 * (turn - 1)
            left = config.max_actions_per_episode - sum(bool(m and m[0]) for m in t.turn_actions[: turn - 1])
            message = _message(f"Said so far: {said}.", turn, None if turn == 1 else t.turn_rewards[0], config, left)
            assert sample.token_ids[:a] == engine.chat.prompt_ids(f"You are {t.seat}.\n" + message)
            mask = torch.tensor(sample.response_mask, dtype=torch.bool)
            fresh = _learner_logprobs(model, sample.token_ids, 1.0)
            assert torch.allclose(fresh[mask], torch.tensor(sample.behaviour_logprobs)[mask], atol=1e-5, rtol=0)


def test_separate_policies_by_seat(tiny):
    model, tokenizer = tiny
    learner = HFBackend(model, tokenizer)
    perfect = ScriptedBackend(scripted_moves({"X": ["5", "1", "9", "3", "7"], "O": []}), tokenizer)
    engine = RolloutEngine(_config("rllib_ragen/TicTacToe-v0"), learner, tokenizer)
    trajectories, _ = play_games(
        engine,
        "rllib_ragen/TicTacToe-v0",
        [0],
        2,
        SamplingParams(max_new_tokens=8),
        sample_seed=1,
        policies={"learner": learner, "scripted": perfect},
        policy_of=lambda seat, index: "scripted" if seat == "x" else "learner",
    )
    assert {(t.seat, t.policy_id) for t in trajectories} <= {("x", "scripted"), ("o", "learner")}
    first_x = next(t for t in trajectories if t.seat == "x")
    assert tokenizer.decode(first_x.token_ids[slice(*first_x.turn_spans[0])], skip_special_tokens=True) == (
        "<answer>5</answer>"
    )


def test_games_need_one_move_a_turn(tiny):
    _, tokenizer = tiny
    config = RolloutConfig(env="rllib_ragen/TicTacToe-v0", max_actions_per_turn=2)
    engine = RolloutEngine(config, ScriptedBackend(lambda p: "", tokenizer), tokenizer)
    with pytest.raises(RolloutSettingError, match="max_actions_per_turn"):
        play_games(engine, "rllib_ragen/TicTacToe-v0", [0], 1, SamplingParams())


def test_a_textarena_game_through_the_engine_pays_textarenas_rewards(tiny):
    textarena = pytest.importorskip("textarena")
    _, tokenizer = tiny
    first_move = re.compile(r"Available Moves: '\[(\d+)\]'")

    def policy(prompt: str) -> str:  # the first move TextArena lists last
        return f"<answer>{first_move.findall(prompt)[-1]}</answer>"

    engine = RolloutEngine(_config("rllib_ragen/TicTacToe-v0"), ScriptedBackend(policy, tokenizer), tokenizer)
    trajectories, metrics = play_games(engine, "textarena/TicTacToe-v0", [5, 6], 1, SamplingParams())
    assert metrics["rollout/format_error_rate"] == 0.0 and {t.seat for t in trajectories} == {"player_0", "player_1"}
    for seed in (5, 6):
        # The same game driven directly: its seed as the adapter draws it, the first listed move each turn.
        seeded = make_game("textarena/TicTacToe-v0")
        seeded.reset(seed=seed)
        own = textarena.make("TicTacToe-v0")
        own.reset(num_players=2, seed=seeded.textarena_seed)
        done = False
        while not done:
            _, observation = own.get_observation()
            done, _ = own.step(f"[{first_move.findall(observation)[-1]}]")
        rewards, _ = own.close()
        played = {t.seat: t.turn_rewards[-1] for t in trajectories if t.seed == seed}
        assert played == {f"player_{pid}": float(r) for pid, r in rewards.items()}


class BrokenOnSeed(TakeTurns):
    """TakeTurns whose game of seed 1 raises at its second move."""

    def _play(self, seat, action):
        if self.np_random_seed == 1 and len(self.said) == 1:
            raise RuntimeError("the game broke")
        return super()._play(seat, action)


def test_a_game_that_raises_is_dropped_and_counted(tiny, monkeypatch):
    _, tokenizer = tiny
    monkeypatch.setitem(GAMES, "tests/Broken-v0", BrokenOnSeed)
    engine = RolloutEngine(
        _config("rllib_ragen/TicTacToe-v0"), ScriptedBackend(lambda p: "<answer>hi</answer>", tokenizer), tokenizer
    )
    trajectories, metrics = play_games(engine, "tests/Broken-v0", [0, 1, 2], 1, SamplingParams())
    assert sorted({t.seed for t in trajectories}) == [0, 2] and len(trajectories) == 6
    assert metrics["rollout/env_errors"] == 1.0
