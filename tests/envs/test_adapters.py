"""GEM and TextArena games through rllib_ragen's adapters, checked against the packages' own loops.

For every adapted id, the same seeds and the same moves (a seeded random policy over each game's move space, with
malformed pieces mixed in, and a scripted policy) give the same observations, rewards, ends and successes through
the adapter as through the package driven directly, while the process's random generators stay untouched.
"""

import itertools
import random

import numpy as np
import pytest

from rllib_ragen.envs import make_text_env
from rllib_ragen.envs.gem_env import SUCCESS_PREFIX

gem = pytest.importorskip("gem")
ta = pytest.importorskip("textarena")

GEM_IDS = [
    "game:GuessTheNumber-v0-easy",
    "game:Mastermind-v0-easy",
    "game:Sudoku-v0-easy",
    "game:Minesweeper-v0-easy",
    "game:TowerofHanoi-v0-easy",
    "game:Game2048-v0-easy",
    "game:FifteenPuzzle-v0-easy",
    "game:Sokoban-v0-easy",
]
TEXTARENA_IDS = [
    "GuessTheNumber-v0-train",
    "Mastermind-v0-train",
    "Sudoku-v0-very-easy-train",
    "Minesweeper-v0-small-train",
    "TowerOfHanoi-v0-train",
    "2048-v0-ultra-easy-train",
    "FrozenLake-v0-train",
    "Sokoban-v0-train",
]
DIRECTIONS = ["up", "down", "left", "right"]


def random_move(game: str, rng: np.random.Generator) -> str:
    """A move in the game's syntax (sometimes one the game itself refuses), or, one time in eight, a malformed piece
    the adapter must not send."""
    if rng.random() < 0.125:
        return str(rng.choice(["nonsense", "", "1 2 3 4 5 x", "[up]", "boxed"]))
    digits = lambda k, high: " ".join(str(d) for d in rng.choice(np.arange(1, high + 1), size=k, replace=False))
    return {
        "GuessTheNumber": lambda: str(rng.integers(1, 21)),
        "Mastermind": lambda: digits(int(rng.choice([2, 4])), 6),
        "Sudoku": lambda: " ".join(str(v) for v in rng.integers(1, 10 if rng.random() < 0.2 else 5, size=3)),
        "Minesweeper": lambda: f"{rng.choice(['reveal', 'reveal', 'flag'])} {rng.integers(0, 6)} {rng.integers(0, 6)}",
        "MinesweeperTA": lambda: f"{rng.integers(0, 6)} {rng.integers(0, 6)}",
        "TowerofHanoi": lambda: " ".join(rng.choice(list("ABC"), size=2, replace=False)),
        "Directions": lambda: str(rng.choice(DIRECTIONS)),
    }[game]()


def scripted_moves(game: str):
    """A fixed policy: bisection for the guessing games, the optimal 3-disk Tower of Hanoi, else a fixed cycle."""
    if game == "TowerofHanoi":
        return iter(["A C", "A B", "C B", "A C", "B A", "B C", "A C"])
    if game == "Mastermind":
        return itertools.cycle(["1 2", "3 4", "5 6", "2 1", "4 3", "6 5", "1 3", "2 4", "1 2 3 4"])
    if game == "Sudoku":
        return (f"{r} {c} {d}" for r, c, d in itertools.product(range(1, 5), range(1, 5), range(1, 5)))
    if game in ("Minesweeper", "MinesweeperTA"):
        cells = itertools.product(range(5), range(5))
        return (f"reveal {r} {c}" if game == "Minesweeper" else f"{r} {c}" for r, c in cells)
    return itertools.cycle(DIRECTIONS)


class Bisection:
    """Guess the number by halving the range on each 'higher' / 'lower' hint."""

    def __init__(self, high: int):
        self.low, self.high, self.last = 1, high, None

    def move(self, observation: str) -> str:
        hints = [line for line in observation.lower().splitlines() if "higher" in line or "lower" in line]
        if self.last is not None and hints:  # the newest hint is about the last guess
            if "higher" in hints[-1]:
                self.low = self.last + 1
            else:
                self.high = self.last - 1
        self.last = (self.low + self.high) // 2
        return str(self.last)


def _policy(game: str, kind: str, seed: int, highest_number: int = 20):
    rng = np.random.default_rng(seed)
    if kind == "random":
        return lambda observation: random_move(game, rng)
    if game == "GuessTheNumber":
        return Bisection(highest_number).move
    moves = scripted_moves(game)
    return lambda observation: next(moves, "up")


def _gem_game(gem_id: str) -> str:
    name = gem_id.split(":")[1].split("-")[0]
    return "Directions" if name in ("Game2048", "FifteenPuzzle", "Sokoban") else name


def _textarena_game(textarena_id: str) -> str:
    name = textarena_id.split("-")[0]
    return {
        "2048": "Directions",
        "FrozenLake": "Directions",
        "Sokoban": "Directions",
        "Minesweeper": "MinesweeperTA",
        "TowerOfHanoi": "TowerofHanoi",
    }.get(name, name)


def _play_gem_side_by_side(gem_id: str, kind: str, seed: int, max_moves: int = 25) -> tuple[int, bool]:
    """One episode through the adapter and through GEM directly; returns (moves sent, success)."""
    adapter, direct = make_text_env("gem/" + gem_id.replace(":", ".", 1)), gem.make(gem_id)
    policy = _policy(_gem_game(gem_id), kind, seed, highest_number=10)  # the easy variant's range
    observation, _ = adapter.reset(seed=seed)
    instructions, info = direct.reset(seed=seed)
    assert observation == (info.get("suffix") or "(no move yet)")  # the instructions are describe()'s alone
    assert adapter.unwrapped.describe().startswith(instructions.strip())
    sent, success = 0, False
    for _ in range(max_moves):
        move = policy(observation)
        observation, reward, terminated, truncated, step_info = adapter.step(move)
        valid = adapter.unwrapped.canonical_action(move) is not None
        assert step_info["action_is_valid"] is valid
        if not valid:  # never reaches GEM: nothing changes, nothing paid
            assert (reward, terminated, truncated) == (0.0, False, False)
            continue
        sent += 1
        text, direct_reward, direct_terminated, direct_truncated, direct_info = direct.step(
            "\\boxed{" + " ".join(move.split()) + "}"
        )
        expected = text if direct_terminated else f"{text}\n{direct_info['suffix']}"
        assert (observation, reward, terminated, truncated) == (
            expected,
            direct_reward,
            direct_terminated,
            direct_truncated,
        )
        success = step_info["success"]
        assert success == (direct_terminated and text.startswith(SUCCESS_PREFIX))
        if terminated or truncated:
            break
    return sent, success


def _play_textarena_side_by_side(textarena_id: str, kind: str, seed: int, max_moves: int = 25) -> tuple[int, bool]:
    adapter, direct = make_text_env("textarena/" + textarena_id), ta.make(textarena_id)
    policy = _policy(_textarena_game(textarena_id), kind, seed)
    observation, _ = adapter.reset(seed=seed)
    direct.reset(num_players=1, seed=seed)
    _, text = direct.get_observation()
    prompt = adapter.unwrapped.describe().rsplit("\nWrite each move", 1)[0]
    assert prompt and prompt in text
    assert observation == (text.replace(prompt, "", 1).strip() or "(no move yet)")
    sent, success = 0, False
    for _ in range(max_moves):
        move = policy(observation)
        observation, reward, terminated, truncated, step_info = adapter.step(move)
        if not step_info["action_is_valid"]:
            assert (reward, terminated, truncated) == (0.0, False, False)
            continue
        sent += 1
        done, _ = direct.step(" ".join(move.split()))
        _, text = direct.get_observation()
        expected = text.replace(prompt, "", 1).strip() or "(no move yet)"
        direct_reward = 0.0
        if done:
            rewards, game_info = direct.close()
            direct_reward = float(rewards[0])
            expected = f"{expected}\n{game_info[0].get('reason', '')}".strip()
            assert step_info["success"] == (direct_reward >= 1.0 and not game_info[0]["invalid_move"])
        assert (observation, reward, terminated) == (expected, direct_reward, done)
        success = step_info["success"]
        if terminated:
            break
    return sent, success


@pytest.mark.parametrize("package, game_id", [("gem", i) for i in GEM_IDS] + [("textarena", i) for i in TEXTARENA_IDS])
def test_adapted_games_match_the_package_itself(package, game_id):
    play = {"gem": _play_gem_side_by_side, "textarena": _play_textarena_side_by_side}[package]
    sent, wins = 0, 0
    for seed in range(24):
        for kind in ("random", "scripted"):
            moves, success = play(game_id, kind, seed)
            sent, wins = sent + moves, wins + success
    assert sent > 60  # the comparison saw real play, not only refused pieces
    if game_id.startswith(("game:GuessTheNumber", "game:TowerofHanoi", "GuessTheNumber", "TowerOfHanoi")):
        assert wins >= 24  # the scripted solver wins: the success path is compared too


@pytest.mark.parametrize(
    "env_id",
    [
        "gem/game.Mastermind-v0-easy",
        "gem/game.Game2048-v0-easy",
        "textarena/Minesweeper-v0-small-train",
        "textarena/2048-v0-ultra-easy-train",
    ],
)
def test_adapters_leave_the_process_generators_alone_and_interleave_exactly(env_id):
    """An adapted episode replays from its seed whatever else draws from the global generators in between, and its
    own draws never reach them."""
    game = _gem_game(env_id[4:].replace(".", ":")) if env_id.startswith("gem/") else _textarena_game(env_id[10:])

    def episode(env, seed, disturb):
        rng, trace = np.random.default_rng(seed), [env.reset(seed=seed)[0]]
        for _ in range(12):
            before = random.getstate(), np.random.get_state()[1].copy()
            trace.append(env.step(random_move(game, rng))[:4])
            after = random.getstate(), np.random.get_state()[1]
            assert before[0] == after[0] and np.array_equal(before[1], after[1])
            if disturb:  # another user of the global generators (a sampler, another environment) draws
                random.random(), np.random.random(), make_text_env(env_id).reset(seed=seed + 1)
        return trace

    for seed in range(3):
        assert episode(make_text_env(env_id), seed, False) == episode(make_text_env(env_id), seed, True)


def test_each_adapter_refuses_what_needs_downloads_or_other_players():
    with pytest.raises(ValueError, match="NLTK word lists"):
        make_text_env("gem/game.Wordle-v0-easy")
    with pytest.raises(ValueError, match="NLTK word lists"):
        make_text_env("textarena/Hangman-v0-train")
    with pytest.raises(ValueError, match="not a single-player game"):
        make_text_env("textarena/TicTacToe-v0").reset(seed=0)


def test_gem_sees_one_move_per_piece_and_the_protocol_penalises_malformed_ones():
    from rllib_ragen.rollout.protocol import execute_turn, parse_reply

    env = make_text_env("gem/game.GuessTheNumber-v0-easy")
    env.reset(seed=4)
    result = execute_turn(
        env, parse_reply("<think>bisect</think><answer>5 || five || 8</answer>"), actions_left=10, format_penalty=-0.1
    )
    # "five" is no number: not sent to GEM (which would end the game with -0.1), penalised by the protocol once.
    assert result.executed == ["5", "8"] and result.num_invalid == 1 and result.format_error
    assert result.reward == pytest.approx(result.env_reward - 0.1)


def test_success_reward_pays_the_win_alone():
    # GEM pays 1 - distance / range for a last guess that misses; reward="success" pays 1 for the win, else 0.
    game, success_only = (
        make_text_env("gem/game.GuessTheNumber-v0-easy"),
        make_text_env("gem/game.GuessTheNumber-v0-easy", reward="success"),
    )
    for env in (game, success_only):
        env.reset(seed=0)  # the number is 7; four guesses, all too low
    steps = [(game.step(move)[1:3], success_only.step(move)[1:3]) for move in ("1", "2", "3", "4")]
    assert game.unwrapped.game.game_number == 7
    assert steps[-1][0] == (pytest.approx(1 - (7 - 4) / (10 - 1)), True)  # GEM's partial credit: 2/3
    assert [only for _, only in steps] == [(0.0, False)] * 3 + [(0.0, True)]
    with pytest.raises(ValueError, match="reward='partial'"):
        make_text_env("gem/game.GuessTheNumber-v0-easy", reward="partial")


def test_a_transition_seed_keeps_the_start_and_draws_its_own_luck():
    # 2048 places a random tile after every move: the luck that independent_transitions gives each episode.
    from rllib_ragen.envs import TRANSITION_SEED

    env, plays = make_text_env("gem/game.Game2048-v0-easy"), []
    for options in (None, {TRANSITION_SEED: (5, 1)}, {TRANSITION_SEED: (5, 1)}, {TRANSITION_SEED: (5, 2)}):
        start = env.reset(seed=5, options=options)[0]
        plays.append((start, [env.step(move)[0] for move in ["up", "left", "down", "right"] * 2]))
    assert len({start for start, _ in plays}) == 1  # one initial board
    assert plays[1] == plays[2]  # the same transition seed replays
    assert plays[1][1] != plays[0][1] and plays[3][1] != plays[1][1]  # another draws other tiles


def test_a_game_stuck_in_its_package_cannot_stall_the_others(monkeypatch):
    import threading
    import time

    from rllib_ragen.envs import external

    stuck, release = make_text_env("gem/game.Mastermind-v0-easy"), threading.Event()
    stuck.reset(seed=0)
    # GEM's step hangs (until released) while it holds the swapped-in generators.
    monkeypatch.setattr(
        stuck.unwrapped.game, "step", lambda action: (release.wait(30), ("hung", 0.0, False, False, {}))[1]
    )
    threading.Thread(target=stuck.step, args=("1 2",), daemon=True).start()
    while not external._GLOBAL_GENERATORS.locked():
        time.sleep(0.01)
    monkeypatch.setattr(external, "GENERATOR_LOCK_TIMEOUT_S", 0.2)
    try:
        with pytest.raises(TimeoutError, match="held the process's random generators for 0.2 s"):
            make_text_env("gem/game.Mastermind-v0-easy")  # building one needs the generators too: an error, no wait
    finally:
        release.set()
    while external._GLOBAL_GENERATORS.locked():
        time.sleep(0.01)
    make_text_env("gem/game.Mastermind-v0-easy").reset(seed=1)  # released: the others play again


def test_gems_reasoning_gym_tasks_count_a_right_answer_as_success_and_end_terminated_only():
    # GEM's rg: tasks end every answer with terminated and truncated both set, and have no "Congratulations" line:
    # before this was fixed, 8 of 8 right answers paid 1.0 and none counted as success.
    env = make_text_env("gem/rg.basic_arithmetic")
    right = wrong = 0
    for seed in range(8):
        env.reset(seed=seed)
        entry = env.unwrapped.game.unwrapped.data  # the task GEM drew; its question opens describe()
        assert env.unwrapped.describe().startswith(entry["question"])
        answer = entry["answer"] if seed % 2 == 0 else str(int(entry["answer"]) + 1)
        _, reward, terminated, truncated, info = env.step(answer)
        assert (terminated, truncated) == (True, False)
        assert info["success"] == (reward == 1.0) == (seed % 2 == 0)
        right, wrong = right + info["success"], wrong + (not info["success"])
    assert (right, wrong) == (4, 4)


def test_reasoning_gym_tasks_by_id_are_scored_by_their_own_verifier():
    rg = pytest.importorskip("reasoning_gym")
    for task in ("basic_arithmetic", "mini_sudoku", "word_sorting"):
        dataset = rg.create_dataset(task, size=100_000, seed=0)
        env = make_text_env(f"reasoning_gym/{task}")
        for seed in (0, 7, 100_007):  # 100,007 wraps to entry 7: a seed is one question, whichever way it is met
            before = random.getstate(), np.random.get_state()[1].copy()
            question, _ = env.reset(seed=seed)
            entry = dataset[seed % 100_000]
            assert question == entry["question"] and env.unwrapped.max_turns == 1
            # The answer as written: a grid keeps its lines.
            _, reward, terminated, truncated, info = env.step(entry["answer"] + "\n")
            assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
            env.reset(seed=seed)
            _, reward, _, _, info = env.step("no idea")
            assert reward == dataset.score_answer(answer="no idea", entry=entry) < 1.0 and not info["success"]
            assert before[0] == random.getstate() and np.array_equal(before[1], np.random.get_state()[1])
    assert make_text_env("reasoning_gym/basic_arithmetic").reset(seed=1) != make_text_env(
        "reasoning_gym/basic_arithmetic"
    ).reset(seed=2)
    with pytest.raises(ValueError, match="reasoning-gym has no task 'arithmetics'"):
        make_text_env("reasoning_gym/arithmetics")
    with pytest.raises(ValueError, match="size=0 must be a whole number >= 1"):
        make_text_env("reasoning_gym/basic_arithmetic", size=0)


def test_a_rollout_counts_a_right_reasoning_gym_answer_as_success():
    rg = pytest.importorskip("reasoning_gym")
    from rllib_ragen.rollout import RolloutConfig, RolloutEngine, SamplingParams, ScriptedBackend
    from rllib_ragen.rollout.context import last_turn_message
    from rllib_ragen.rollout.tiny_model import build_tiny_tokenizer

    dataset = rg.create_dataset("basic_arithmetic", size=100_000, seed=0)
    answers = {entry["question"]: entry["answer"] for entry in (dataset[s] for s in range(8))}
    tokenizer = build_tiny_tokenizer(seed=0)
    # Right on even seeds' questions, off by one on odd ones.
    wrong = {dataset[s]["question"] for s in range(1, 8, 2)}

    def policy(prompt):
        question = last_turn_message(prompt).observation
        answer = answers[question] if question not in wrong else str(int(answers[question]) + 1)
        return f"<think>compute</think><answer>{answer}</answer>"

    config = RolloutConfig(env="reasoning_gym/basic_arithmetic", action_separator=None, max_actions_per_turn=1)
    trajectories, metrics = RolloutEngine(config, ScriptedBackend(policy, tokenizer), tokenizer).rollout(
        list(range(8)), 1, SamplingParams(), sample_seed=0
    )
    assert [t.success for t in trajectories] == [seed % 2 == 0 for seed in range(8)]
    assert [t.turn_rewards for t in trajectories] == [[1.0] if seed % 2 == 0 else [0.0] for seed in range(8)]
    assert metrics["rollout/format_error_rate"] == 0


@pytest.mark.parametrize(
    "env_id, replies",
    [
        (
            "gem/game.GuessTheNumber-v0-easy",
            ["<think>halve</think> My guess: \\boxed{5}.", "\\boxed{7} <- seven", "no number", "\\boxed{8}\\boxed{9}"],
        ),
        (
            "textarena/GuessTheNumber-v0-train",
            ["<think>halve</think> I say [10].", "[15], surely", "no number", "[12]"],
        ),
    ],
)
def test_with_raw_replies_the_package_reads_each_whole_reply_as_its_own_agents_do(env_id, replies):
    adapter = make_text_env(env_id, raw_replies=True)
    if env_id.startswith("gem/"):
        direct = gem.make(env_id[4:].replace(".", ":", 1))
        direct_reset, direct_step = (lambda seed: direct.reset(seed=seed)), (lambda text: direct.step(text)[:4])
    else:
        direct = ta.make(env_id[10:])
        direct_reset = lambda seed: direct.reset(num_players=1, seed=seed)  # noqa: E731
        direct_step = lambda text: (direct.step(text), direct.get_observation()[1])  # noqa: E731
    adapter.reset(seed=3)
    direct_reset(3)
    assert "<answer>" not in adapter.unwrapped.describe()  # the package's instructions alone: they say the format
    for reply in replies:
        assert adapter.unwrapped.canonical_action(reply) == reply  # as written, no syntax check
        observation, *_ = adapter.step(reply)
        expected = direct_step(reply)
        text = expected[0] if env_id.startswith("gem/") else expected[1]
        assert observation.split("\n")[0] in text  # the package saw the same text and answered the same
    assert adapter.unwrapped.canonical_action("  ") is None


def test_raw_replies_must_be_a_bool_and_reasoning_gym_refuses_them():
    with pytest.raises(ValueError, match="raw_replies='yes' must be True or False"):
        make_text_env("gem/game.GuessTheNumber-v0-easy", raw_replies="yes")
    pytest.importorskip("reasoning_gym")
    with pytest.raises(ValueError, match="reasoning-gym's verifiers read the answer alone"):
        make_text_env("reasoning_gym/basic_arithmetic", raw_replies=True)
