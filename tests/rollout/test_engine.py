"""The rollout engine: known success rates with scripted policies, token exactness with a real model."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from rllib_ragen.envs import TRANSITION_SEED, SokobanLevel, TextEnv, solve_level
from rllib_ragen.envs.sokoban_levels import move_effects
from rllib_ragen.rollout.backends import HFBackend, SamplingParams, ScriptedBackend
from rllib_ragen.rollout.context import RAW_REPLY_HINT
from rllib_ragen.rollout.rollout_config import RolloutConfig
from rllib_ragen.rollout.engine import RolloutEngine
from rllib_ragen.rollout.trajectory import SeedSchedule
from rllib_ragen.rollout.models import load_policy
from rllib_ragen.demonstrators import (
    countdown_solver_policy,
    frozen_lake_optimal_policy,
    guess_the_number_bisection_policy,
    guess_the_number_random_policy,
    sokoban_solver_policy,
    sudoku_solver_policy,
)


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_policy("tiny", seed=0)


def test_solver_policy_solves_every_validation_level(tiny):
    _, tokenizer = tiny
    # Budget 25 actions (5 turns x 5) exceeds every 6x6 level's optimal length (max 11 in 1,000 levels).
    config = RolloutConfig(env="rllib_ragen/Sokoban-v0", max_actions_per_episode=25)
    engine = RolloutEngine(config, ScriptedBackend(sokoban_solver_policy(), tokenizer), tokenizer)
    seeds = list(range(123, 123 + 64))  # the validation seeds
    trajectories, metrics = engine.rollout(seeds, group_size=1, sampling=SamplingParams())
    assert len(trajectories) == 64 and metrics["rllib_ragen/Sokoban-v0/success"] == 1.0
    assert metrics["rollout/format_error_rate"] == 0.0 and metrics["rollout/valid_action_rate"] == 1.0
    lengths = []
    for seed in seeds:
        env = gym.make("rllib_ragen/Sokoban-v0")
        env.reset(seed=seed)
        lengths.append(len(solve_level(env.unwrapped.level)))
    assert [t.num_actions for t in trajectories] == lengths  # optimal plans, executed exactly
    print(f"\n{np.mean(np.array(lengths) <= 10):.1%} of the 64 validation levels fit the default 10-action budget")


@pytest.mark.parametrize(
    "env_id, policy",
    [
        ("rllib_ragen/Countdown-v0", countdown_solver_policy()),
        ("rllib_ragen/Sudoku4x4-v0", sudoku_solver_policy(max_actions_per_turn=2)),
        ("rllib_ragen/SokobanCoordinates-v0", sokoban_solver_policy()),  # reads the level back from coordinates
    ],
)
def test_solver_policies_of_the_new_environments_solve_every_validation_state(tiny, env_id, policy):
    _, tokenizer = tiny
    config = RolloutConfig(env=env_id, enable_thinking=False, max_actions_per_episode=25)
    trajectories, metrics = RolloutEngine(config, ScriptedBackend(policy, tokenizer), tokenizer).rollout(
        list(range(123, 123 + 32)), group_size=1, sampling=SamplingParams()
    )
    assert metrics[f"{env_id}/success"] == 1.0 and metrics["rollout/format_error_rate"] == 0.0
    if env_id == "rllib_ragen/Sudoku4x4-v0":  # 6 empty cells, two a reply: three turns, every move effective
        assert {t.num_turns for t in trajectories} == {3} and metrics["rollout/effective_action_rate"] == 1.0


def test_bisection_finds_every_number_within_its_bound_and_random_guessing_does_not(tiny):
    pytest.importorskip("gem")
    _, tokenizer = tiny
    config = RolloutConfig(
        env="gem/game.GuessTheNumber-v0-hard",
        enable_thinking=False,
        max_turns=10,
        max_actions_per_turn=1,
        max_actions_per_episode=10,
        max_context_tokens=8192,
    )
    played = {}
    for name, policy in (
        ("bisection", guess_the_number_bisection_policy()),
        ("random", guess_the_number_random_policy(seed=0)),
    ):
        engine = RolloutEngine(config, ScriptedBackend(policy, tokenizer), tokenizer)
        played[name] = engine.rollout(list(range(64)), group_size=1, sampling=SamplingParams())
    # 1 to 50 in at most ceil(log2(51)) = 6 guesses, within GEM's 7 turns: every game won.
    trajectories, metrics = played["bisection"]
    assert metrics["rollout/success"] == 1.0 and max(t.num_turns for t in trajectories) <= 6
    assert trajectories[0].turn_actions[0] == ["25"]  # (1 + 50) // 2
    assert played["random"][1]["rollout/success"] < 0.5


@pytest.mark.slow
def test_frozen_lake_optimal_policy_reaches_its_predicted_success(tiny):
    _, tokenizer = tiny
    config = RolloutConfig(
        env="rllib_ragen/FrozenLake-v0", max_turns=10, max_actions_per_turn=1, max_actions_per_episode=10
    )
    engine = RolloutEngine(config, ScriptedBackend(frozen_lake_optimal_policy(), tokenizer), tokenizer)
    seeds = list(range(1000))
    trajectories, metrics = engine.rollout(seeds, group_size=1, sampling=SamplingParams())
    predicted, direct = [], []
    for seed in seeds:
        # The same policy played on the env directly: the reset seed fixes map and slips, so outcomes must match
        # the engine's episode for episode (the prompt carries everything the policy needs).
        env = gym.make("rllib_ragen/FrozenLake-v0")
        env.reset(seed=seed)
        predicted.append(env.unwrapped.success_probability(10))
        for moves_left in range(10, 0, -1):
            if env.step(env.unwrapped.optimal_action(moves_left))[2]:
                break
        direct.append(env.unwrapped.success)
    assert [t.success for t in trajectories] == direct
    p = np.array(predicted)
    stderr = np.sqrt((p * (1 - p)).sum()) / len(p)
    achieved = metrics["rllib_ragen/FrozenLake-v0/success"]
    print(f"\nFrozenLake via the engine: success {achieved:.3f}, optimal-policy prediction {p.mean():.3f}")
    assert abs(achieved - p.mean()) < 4 * stderr


class _Recording:
    """Wraps a real backend and keeps what it returned, to check the trajectories against."""

    def __init__(self, backend):
        self.backend, self.generations = backend, []

    def generate(self, prompts, params, seed=None, max_new_tokens=None):
        out = self.backend.generate(prompts, params, seed, max_new_tokens)
        self.generations.append(out)
        return out

    def load_weights(self, state_dict):
        self.backend.load_weights(state_dict)


def _learner_logprobs(model, token_ids, temperature):
    ids = torch.tensor([token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    logprobs = torch.log_softmax(logits[0, :-1] / temperature, dim=-1)
    return torch.cat([torch.zeros(1), logprobs.gather(-1, ids[0, 1:, None]).squeeze(-1)])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_equal_a_fresh_forward_pass(tiny, temperature):
    model, tokenizer = tiny
    backend = _Recording(HFBackend(model, tokenizer))
    config = RolloutConfig(env="rllib_ragen/Sokoban-v0", max_turns=3)
    engine = RolloutEngine(config, backend, tokenizer)
    params = SamplingParams(temperature=temperature, max_new_tokens=24)
    trajectories, _ = engine.rollout([5, 6], group_size=2, sampling=params, sample_seed=1)
    assert all(t.num_turns == 3 for t in trajectories)  # multi-turn: nothing valid ends these episodes early
    # Prompts of different lengths were left-padded together in one batch each turn.
    for t in trajectories:
        mask = torch.tensor(t.response_mask, dtype=torch.bool)
        expected_mask = torch.zeros(len(t.token_ids), dtype=torch.bool)
        for start, end in t.turn_spans:
            expected_mask[start:end] = True
        assert torch.equal(mask, expected_mask)
        recomputed = _learner_logprobs(model, t.token_ids, temperature)
        behaviour = torch.tensor(t.behaviour_logprobs)
        assert torch.allclose(recomputed[mask], behaviour[mask], atol=1e-5, rtol=0), (
            (recomputed[mask] - behaviour[mask]).abs().max()
        )
        assert torch.all(behaviour[~mask] == 0)
    # The masked tokens are exactly the sampled ids, turn by turn, in order.
    for i, t in enumerate(trajectories):
        sampled = [turn[i].token_ids for turn in backend.generations]
        assert [t.token_ids[s:e] for s, e in t.turn_spans] == sampled


def test_same_sample_seed_repeats_the_rollout_exactly(tiny):
    model, tokenizer = tiny
    engine = RolloutEngine(
        RolloutConfig(env="rllib_ragen/Bandit-v0", max_turns=2), HFBackend(model, tokenizer), tokenizer
    )
    params = SamplingParams(max_new_tokens=16)
    a, _ = engine.rollout([1, 2], 2, params, sample_seed=3)
    b, _ = engine.rollout([1, 2], 2, params, sample_seed=3)
    c, _ = engine.rollout([1, 2], 2, params, sample_seed=4)
    assert [t.token_ids for t in a] == [t.token_ids for t in b]
    assert [t.token_ids for t in a] != [t.token_ids for t in c]


class CountingBackend(HFBackend):
    """The HF backend, noting how many prompts each call brings."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[int] = []

    def generate(self, prompts, params, seed=None, max_new_tokens=None):
        self.calls.append(len(prompts))
        return super().generate(prompts, params, seed, max_new_tokens)


def test_episodes_play_in_waves_of_whole_groups_and_the_first_wave_as_before(tiny):
    """5 groups of 2 with at most 5 episodes at a time: waves of 2, 2 and 1 groups (4, 4, 2 episodes), each played
    to its end before the next; the first wave samples exactly as an unbounded rollout samples its episodes."""
    import dataclasses

    model, tokenizer = tiny
    config = RolloutConfig(
        env="rllib_ragen/FrozenLakeNotSlippery-v0", max_turns=3, max_actions_per_turn=1, enable_thinking=False
    )
    params = SamplingParams(max_new_tokens=8)
    backend = CountingBackend(model, tokenizer)
    waves, _ = RolloutEngine(dataclasses.replace(config, max_concurrent_episodes=5), backend, tokenizer).rollout(
        [1, 2, 3, 4, 5], 2, params, sample_seed=7
    )
    assert max(backend.calls) <= 4 and backend.calls[0] == 4 and backend.calls[-1] <= 2
    assert [(t.group, t.seed) for t in waves] == [(g, s) for g, s in enumerate([1, 2, 3, 4, 5]) for _ in range(2)]
    all_at_once, _ = RolloutEngine(config, HFBackend(model, tokenizer), tokenizer).rollout(
        [1, 2], 2, params, sample_seed=7
    )
    assert [t.token_ids for t in waves[:4]] == [t.token_ids for t in all_at_once]
    assert [t.behaviour_logprobs for t in waves[:4]] == [t.behaviour_logprobs for t in all_at_once]
    # A cap of at least every episode changes nothing; one smaller than a group still plays whole groups.
    capped, _ = RolloutEngine(
        dataclasses.replace(config, max_concurrent_episodes=10), HFBackend(model, tokenizer), tokenizer
    ).rollout([1, 2, 3, 4, 5], 2, params, sample_seed=7)
    unbounded, _ = RolloutEngine(config, HFBackend(model, tokenizer), tokenizer).rollout(
        [1, 2, 3, 4, 5], 2, params, sample_seed=7
    )
    assert [t.token_ids for t in capped] == [t.token_ids for t in unbounded]
    backend = CountingBackend(model, tokenizer)
    RolloutEngine(dataclasses.replace(config, max_concurrent_episodes=1), backend, tokenizer).rollout(
        [1, 2], 2, params, sample_seed=7
    )
    assert backend.calls[0] == 2


def test_training_seeds_never_repeat_and_resume():
    schedule = SeedSchedule()
    seen = schedule.train(8) + schedule.train(8) + schedule.train(8)
    assert len(set(seen)) == 24
    state = schedule.get_state()
    restored = SeedSchedule()
    restored.set_state(state)
    assert restored.train(8) == schedule.train(8)


@pytest.mark.parametrize("independent", [False, True])
def test_a_groups_episodes_share_the_start_and_their_luck_only_when_asked(tiny, independent):
    _, tokenizer = tiny
    config = RolloutConfig(env="rllib_ragen/Bandit-v0", independent_transitions=independent)
    engine = RolloutEngine(
        config, ScriptedBackend(lambda prompt: "<think></think><answer>Dragon</answer>", tokenizer), tokenizer
    )
    seeds = list(range(40))
    trajectories, _ = engine.rollout(seeds, 4, SamplingParams())
    payoffs = np.array([t.total_return for t in trajectories]).reshape(len(seeds), 4)
    env = gym.make("rllib_ragen/Bandit-v0")
    for seed, group in zip(seeds, payoffs):
        for member, paid in enumerate(group):
            # Episode 0 keeps the seed's own draw; the others draw from (seed, member) when asked to.
            options = {TRANSITION_SEED: (seed, member)} if independent and member else None
            env.reset(seed=seed, options=options)
            assert paid == env.step("Dragon")[1]
    varied = (payoffs.std(axis=1) > 0).sum()
    # Shared luck: every group's 4 pulls pay alike. Independent Bernoulli(0.25) groups of 4 vary w.p. 0.68.
    assert varied == 0 if not independent else 15 < varied < 40


class _FlakyEnv(TextEnv):
    """Raises on its first step when the reset seed is odd."""

    action_names = ("Go",)

    def _reset_state(self):
        self.crash = bool(self.np_random_seed % 2)

    def _apply(self, action_index):
        if self.crash:
            raise RuntimeError("simulated environment bug")
        self._success = True
        return 1.0, True, True

    def _render_text(self):
        return "ready"


def test_failing_environment_is_isolated_and_counted(tiny):
    _, tokenizer = tiny
    engine = RolloutEngine(
        RolloutConfig(env=_FlakyEnv),
        ScriptedBackend(lambda prompt: "<think></think><answer>Go</answer>", tokenizer),
        tokenizer,
    )
    trajectories, metrics = engine.rollout([0, 1, 2, 3], 2, SamplingParams())
    assert metrics["rollout/env_errors"] == 4.0
    assert sorted({t.seed for t in trajectories}) == [0, 2] and all(t.success for t in trajectories)


def test_context_limit_ends_the_episode_and_is_reported(tiny):
    _, tokenizer = tiny
    reply = "<think>hmm</think><answer>Left</answer>"  # never solves: episodes run all turns
    engine = RolloutEngine(
        RolloutConfig(env="rllib_ragen/Sokoban-v0", max_context_tokens=260, max_actions_per_episode=50),
        ScriptedBackend(lambda prompt: reply, tokenizer),
        tokenizer,
    )
    trajectories, metrics = engine.rollout([0], 2, SamplingParams())
    assert metrics["rollout/truncated_rate"] == 1.0
    assert all(len(t.token_ids) <= 260 and t.num_turns < 5 for t in trajectories)


def test_an_environments_own_turn_limit_caps_the_episode(tiny):
    _, tokenizer = tiny
    # An off-format reply executes nothing, so only the turn limit ends these episodes.
    babble = ScriptedBackend(lambda prompt: "I am not sure which arm.", tokenizer)
    bandit = RolloutEngine(RolloutConfig(env="rllib_ragen/Bandit-v0", max_turns=5), babble, tokenizer)
    trajectories, _ = bandit.rollout([0, 1], 2, SamplingParams())
    # The bandit is single-turn: one reply, one format penalty, whatever the config's max_turns.
    assert [t.num_turns for t in trajectories] == [1] * 4
    assert all(t.turn_rewards == [-0.1] and not t.success for t in trajectories)
    sokoban = RolloutEngine(RolloutConfig(env="rllib_ragen/Sokoban-v0", max_turns=3), babble, tokenizer)
    assert [t.num_turns for t in sokoban.rollout([0], 2, SamplingParams())[0]] == [3, 3]  # no own limit


def test_each_turn_records_the_state_it_answered(tiny):
    _, tokenizer = tiny
    config = RolloutConfig(env="rllib_ragen/Sokoban-v0", max_turns=3, max_actions_per_turn=1)
    # Off-format replies execute nothing: the board never changes, so every turn answers the reset state.
    babble = RolloutEngine(config, ScriptedBackend(lambda prompt: "no idea", tokenizer), tokenizer)
    (stuck,), _ = babble.rollout([5], 1, SamplingParams())
    env = gym.make("rllib_ragen/Sokoban-v0")
    reset_board, _ = env.reset(seed=5)
    assert stuck.turn_states == [reset_board] * 3
    # The solver moves every turn: each turn answers the board its previous move left.
    solver = RolloutEngine(config, ScriptedBackend(sokoban_solver_policy(1), tokenizer), tokenizer)
    (solved,), _ = solver.rollout([5], 1, SamplingParams())
    boards = [reset_board]
    for action in solve_level(env.unwrapped.level)[: solved.num_turns - 1]:
        boards.append(env.step(action)[0])
    assert solved.turn_states == boards and len(set(boards)) == len(boards)


def test_reasoning_claims_are_checked_turn_by_turn_and_reported(tiny, tmp_path):
    import pyarrow.parquet as pq

    from rllib_ragen.jobs.outputs import SAMPLED_AND_GREEDY
    from rllib_ragen.jobs.report import _reasoning_grounded
    from rllib_ragen.jobs.outputs import write_rollouts

    _, tokenizer = tiny
    config = RolloutConfig(env="rllib_ragen/Sokoban-v0", max_turns=4, max_actions_per_turn=1)
    seeds = [5, 6, 7]
    # The solver's effects line is true of every board it was written for, turn after turn: four claims a turn.
    honest = RolloutEngine(config, ScriptedBackend(sokoban_solver_policy(1, reasoning="effects"), tokenizer), tokenizer)
    honest_episodes, metrics = honest.rollout(seeds, 1, SamplingParams())
    assert all(t.reasoning_claims == t.reasoning_claims_true == 4 * t.num_turns for t in honest_episodes)
    assert metrics["rllib_ragen/Sokoban-v0/reasoning_grounded"] == metrics["rollout/reasoning_grounded"] == 1.0
    # A policy that calls every move a walk, then plays the solver's move: right exactly where the board shows
    # floor next to the player, counted on the boards the solver's moves pass through (before each move).
    solver = sokoban_solver_policy(1)

    def walker(prompt):
        return "<think>Up walk, Down walk, Left walk, Right walk.</think>" + solver(prompt).split("</think>")[1]

    trajectories, metrics = RolloutEngine(config, ScriptedBackend(walker, tokenizer), tokenizer).rollout(
        seeds, 1, SamplingParams()
    )
    walks = claims = 0
    for t in trajectories:
        env = gym.make("rllib_ragen/Sokoban-v0")
        board, _ = env.reset(seed=t.seed)
        for action in solve_level(env.unwrapped.level)[: t.num_turns]:
            walks += move_effects(SokobanLevel.from_text(board)).count("walk")
            claims += 4
            board = env.step(action)[0]
    assert sum(t.reasoning_claims for t in trajectories) == claims
    assert 0 < walks < claims and metrics["rollout/reasoning_grounded"] == pytest.approx(walks / claims)
    # A run's summary reads the same counts back from its validation episodes' files, before and after RL.
    before_file, after_file = SAMPLED_AND_GREEDY["sampled"]
    write_rollouts(tmp_path / before_file, trajectories, tokenizer)
    write_rollouts(tmp_path / after_file, honest_episodes, tokenizer)
    after_claims = sum(4 * t.num_turns for t in honest_episodes)
    # The files show each turn's reasoning whole, though this tokenizer writes "<think>Up" as "<think", ">Up".
    saved = pq.read_table(tmp_path / before_file).to_pylist()
    thoughts = {turn["think"] for episode in saved for turn in episode["turns"]}
    assert thoughts == {"Up walk, Down walk, Left walk, Right walk."}
    assert _reasoning_grounded(tmp_path, None) == {
        "sampled": {  # no greedy files: nothing said about greedy play
            "before": pytest.approx(walks / claims),
            "after": 1.0,
            "claims_before": claims,
            "claims_after": after_claims,
        }
    }
    # Reasoning without claims the environment checks (the plan line) reports nothing.
    engine = RolloutEngine(config, ScriptedBackend(solver, tokenizer), tokenizer)
    _, metrics = engine.rollout(seeds, 1, SamplingParams())
    assert not any(key.endswith("reasoning_grounded") for key in metrics)


def test_the_ungrounded_reasoning_penalty_lands_on_the_turn_whose_reasoning_erred(tiny):
    _, tokenizer = tiny
    seeds, penalty = [5, 6, 7], -0.25
    solver = sokoban_solver_policy(1)

    def walker(prompt):  # calls every move a walk, then plays the solver's move
        return "<think>Up walk, Down walk, Left walk, Right walk.</think>" + solver(prompt).split("</think>")[1]

    def play(policy, ungrounded_reasoning_penalty):
        config = RolloutConfig(
            env="rllib_ragen/Sokoban-v0",
            max_turns=4,
            max_actions_per_turn=1,
            ungrounded_reasoning_penalty=ungrounded_reasoning_penalty,
        )
        return RolloutEngine(config, ScriptedBackend(policy, tokenizer), tokenizer).rollout(seeds, 1, SamplingParams())[
            0
        ]

    for plain, charged in zip(play(walker, 0.0), play(walker, penalty)):
        assert (charged.seed, charged.num_turns, charged.success) == (plain.seed, plain.num_turns, plain.success)
        # Each turn pays once per move that is not a walk on the board that turn was written for.
        env = gym.make("rllib_ragen/Sokoban-v0")
        board, _ = env.reset(seed=plain.seed)
        expected = []
        for reward, action in zip(plain.turn_rewards, solve_level(env.unwrapped.level)):
            expected.append(reward + penalty * (4 - move_effects(SokobanLevel.from_text(board)).count("walk")))
            board = env.step(action)[0]
        assert charged.turn_rewards == pytest.approx(expected) and charged.turn_rewards != plain.turn_rewards
    # Reasoning that is true of every board costs nothing.
    honest = sokoban_solver_policy(1, reasoning="effects")
    assert [t.turn_rewards for t in play(honest, penalty)] == [t.turn_rewards for t in play(honest, 0.0)]


def test_frozen_lake_effects_are_checked_and_the_learning_curve_draws_them_validation_splits(tiny):
    from rllib_ragen.jobs.outputs import LEARNER, TRAINING, VALIDATED_AT, VALIDATION
    from rllib_ragen.jobs.curves import validation_points
    from rllib_ragen.jobs.curves import learning_curve_panels

    _, tokenizer = tiny
    config = RolloutConfig(env="rllib_ragen/FrozenLakeNotSlippery-v0", max_turns=10, max_actions_per_turn=1)
    policy = frozen_lake_optimal_policy(is_slippery=False, reasoning="effects")
    episodes, metrics = RolloutEngine(config, ScriptedBackend(policy, tokenizer), tokenizer).rollout(
        [1, 2, 3], 2, SamplingParams()
    )
    # The optimal policy's effects line is true of every cell it stands on: four claims a turn, all hold.
    assert all(t.success and t.reasoning_claims == t.reasoning_claims_true == 4 * t.num_turns for t in episodes)
    assert metrics["rllib_ragen/FrozenLakeNotSlippery-v0/reasoning_grounded"] == 1.0
    # The learning curve's grounding panel reads that pooled metric, and beside it each validation's value on the
    # training environment (not pooled: validation may add variants training never plays), skipping a
    # validation that checked no claim; a learner column has no validation counterpart.
    column = next(key for key, title in learning_curve_panels(config.env) if "grounded" in title)
    assert column == TRAINING + "rollout/reasoning_grounded" and "rollout/reasoning_grounded" in metrics
    on_env = VALIDATION + "rllib_ragen/FrozenLakeNotSlippery-v0/reasoning_grounded"
    pooled = VALIDATION + "rollout/reasoning_grounded"
    validations = [
        {VALIDATED_AT: 0, on_env: 0.5, pooled: 0.25},
        {VALIDATED_AT: 5},
        {VALIDATED_AT: 10, on_env: 0.75, pooled: 0.5},
    ]
    assert validation_points(validations, column, config.env) == [(0, 0.5), (10, 0.75)]
    assert validation_points(validations, LEARNER + "entropy", config.env) == []
    # A run that validates only on another environment draws that one's values beside the training series.
    success = TRAINING + "rllib_ragen/FrozenLakeNotSlippery-v0/success"
    other = VALIDATION + "rllib_ragen/FrozenLake-v0/success"
    validations = [{VALIDATED_AT: 0, other: 0.25}, {VALIDATED_AT: 10, other: 0.5}]
    assert validation_points(validations, success, config.env) == []
    assert validation_points(validations, success, config.env, "rllib_ragen/FrozenLake-v0") == [(0, 0.25), (10, 0.5)]


class _QueryEnv(TextEnv):
    """Takes any text as its one action (a SQL query) and pays 1 for the query that concatenates the names."""

    instructions = "Write the query."
    max_turns = 1
    ANSWER = "SELECT first || ' ' || last FROM t"

    def _reset_state(self):
        self.received = []

    def canonical_action(self, text):
        return text.strip() or None

    def step(self, action):
        self.received.append(action)
        self._success = action == self.ANSWER
        return (
            "done",
            float(self._success),
            True,
            False,
            {"success": self._success, "action_is_valid": True, "action_is_effective": True},
        )

    def _render_text(self):
        return "Table t has columns first and last."


@pytest.mark.parametrize(
    "separator, actions, success",
    [
        (None, [_QueryEnv.ANSWER], True),  # the answer is the one action, as written
        # RAGEN's protocol splits it at the first ||: the environment gets a fragment (SkyRL's text2sql got the pieces).
        ("||", ["SELECT first"], False),
    ],
)
def test_without_a_separator_the_whole_answer_is_one_action(tiny, separator, actions, success):
    _, tokenizer = tiny
    prompts = []

    def policy(prompt):
        prompts.append(prompt)
        return f"<think>concatenate</think><answer>{_QueryEnv.ANSWER}</answer>"

    config = RolloutConfig(
        env=_QueryEnv,
        max_turns=1,
        max_actions_per_turn=1 if separator is None else 5,
        action_separator=separator,
        max_context_tokens=100_000,
    )
    (trajectory,), _ = RolloutEngine(config, ScriptedBackend(policy, tokenizer), tokenizer).rollout(
        [0], group_size=1, sampling=SamplingParams()
    )
    assert trajectory.turn_actions == [actions]
    assert bool(trajectory.success) is success
    # The format hint tells the policy what the answer holds.
    hint = "the answer is one action" if separator is None else "<answer>action || action</answer> with at most 5"
    assert hint in prompts[0]


class _RawQueryEnv(_QueryEnv):
    """Parses the model's text itself, as SkyRL-Gym's text2sql does: the query in <sql></sql>, thinking allowed."""

    raw_replies = True
    instructions = "Think in <think></think>, then write the query in <sql></sql>."

    def step(self, action):
        self.received.append(action)
        query = action.split("<sql>")[-1].split("</sql>")[0] if "<sql>" in action else None
        self._success = query == self.ANSWER
        return (
            "done",
            float(self._success),
            True,
            False,
            {"success": self._success, "action_is_valid": True, "action_is_effective": True},
        )


@pytest.mark.parametrize(
    "reply, success, format_error",
    [
        (f"<think>concatenate, with || between</think><sql>{_QueryEnv.ANSWER}</sql>", True, 0),
        (f"<think>x</think><answer>{_QueryEnv.ANSWER}</answer>", False, 0),  # our template means nothing to it
        ("   ", False, 1),  # nothing to hand over: a format error, and the environment is not called
    ],
)
def test_an_environment_that_reads_raw_replies_gets_each_whole_reply(tiny, reply, success, format_error):
    _, tokenizer = tiny
    prompts = []

    def policy(prompt):
        prompts.append(prompt)
        return reply

    config = RolloutConfig(env=_RawQueryEnv, max_turns=1, max_context_tokens=100_000)  # separator and 5 actions on
    engine = RolloutEngine(config, ScriptedBackend(policy, tokenizer), tokenizer)
    (trajectory,), metrics = engine.rollout([0], group_size=1, sampling=SamplingParams())
    envs = [env.unwrapped for env in engine._envs[None]]
    # Special tokens aside (the reply's end-of-sequence), the text as sampled, || and tags included.
    assert envs[0].received == ([] if format_error else [reply])
    assert bool(trajectory.success) is success and trajectory.format_errors == format_error
    assert RAW_REPLY_HINT in prompts[0] and "<answer>" not in prompts[0]
    assert metrics["rollout/format_error_rate"] == format_error
