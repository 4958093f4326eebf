import gymnasium as gym
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rllib_ragen  # noqa: F401
from rllib_ragen.envs import SokobanLevel
from rllib_ragen.rollout import ParsedReply, execute_turn, parse_reply


@pytest.mark.parametrize(
    "reply, format_ok, actions",
    [
        ("<think>push it</think><answer>Right || Right</answer>", True, ("Right", "Right")),
        ("  <think>a</think>\n\n<answer> up </answer>\n", True, ("up",)),
        ("<THINK>x</Think><Answer>Left</ANSWER>", True, ("Left",)),  # tag case does not matter
        ("<think>multi\nline</think><answer>Up||Down||</answer>", True, ("Up", "Down")),  # trailing separator
        ("<think>x</think><answer>Up || || Down ||||</answer>", True, ("Up", "Down")),  # extra separators
        ("<think>x</think><answer></answer>", True, ()),  # empty answer: well-formed, but no action
        ("<think>x</think><answer>  ||  </answer>", True, ()),
        ("<answer>Up</answer>", False, ()),  # missing think while thinking is on
        ("<think>x</think>Up", False, ()),  # missing answer tags
        ("<think>x</think><answer>Up", False, ()),  # unclosed answer (cut off by the token limit)
        ("<think>x<answer>Up</answer>", False, ()),  # unclosed think
        ("<think>x</think><answer>Up</answer> trailing words", False, ()),
        ("preamble <think>x</think><answer>Up</answer>", False, ()),
        ("<think>x</think><answer>Up</answer><answer>Down</answer>", False, ()),  # repeated answer
        ("<think>a</think><think>b</think><answer>Up</answer>", False, ()),  # repeated think
        ("<think>a<think>b</think></think><answer>Up</answer>", False, ()),  # nested think
        ("<think>x</think><answer><answer>Up</answer></answer>", False, ()),  # nested answer
        ("<answer>Up</answer><think>x</think>", False, ()),  # wrong order
        ("", False, ()),
    ],
)
def test_edge_cases_small_models_produce(reply, format_ok, actions):
    parsed = parse_reply(reply)
    assert (parsed.format_ok, parsed.actions) == (format_ok, actions)


def test_thinking_off_requires_only_the_answer():
    assert parse_reply("<answer>Up || Left</answer>", enable_thinking=False).actions == ("Up", "Left")
    assert parse_reply("<think>t</think><answer>Up</answer>", enable_thinking=False).thinking == "t"
    assert not parse_reply("Up", enable_thinking=False).format_ok


def test_actions_are_capped_and_the_rest_counted():
    parsed = parse_reply("<think></think><answer>1||2||3||4||5||6||7</answer>", max_actions_per_turn=5)
    assert parsed.actions == ("1", "2", "3", "4", "5") and parsed.num_dropped == 2


def test_custom_separator():
    assert parse_reply("<think></think><answer>Up, Left</answer>", separator=",").actions == ("Up", "Left")


# ---- fuzzing --------------------------------------------------------------------------------------------------
_alphabet = st.sampled_from(list("<>/|thinkanswerTHINKANSWER UpDownLeftRight\n\t√_#xyz0123456789,.!?"))
_noise = st.text(alphabet=_alphabet, max_size=80) | st.text(max_size=80)


@settings(max_examples=500, deadline=None)
@given(text=_noise, thinking=st.booleans(), cap=st.integers(-2, 8))
def test_parser_never_raises_and_respects_the_cap(text, thinking, cap):
    parsed = parse_reply(text, enable_thinking=thinking, max_actions_per_turn=cap)
    assert isinstance(parsed, ParsedReply)
    assert len(parsed.actions) <= max(cap, 0)
    assert all(a == a.strip() and a for a in parsed.actions)
    if not parsed.format_ok:
        assert parsed.actions == ()


_word = st.text(
    alphabet=st.characters(blacklist_characters="<>|", blacklist_categories=("Cs",)), min_size=1, max_size=12
).filter(lambda w: w.strip())


@settings(max_examples=300, deadline=None)
@given(
    thought=st.text(alphabet=st.characters(blacklist_characters="<>", blacklist_categories=("Cs",)), max_size=40),
    words=st.lists(_word, min_size=1, max_size=5),
)
def test_well_formed_replies_round_trip(thought, words):
    reply = f"<think>{thought}</think><answer>{' || '.join(words)}</answer>"
    parsed = parse_reply(reply)
    assert parsed.format_ok and parsed.actions == tuple(w.strip() for w in words) and parsed.thinking == thought


# ---- executing a turn -----------------------------------------------------------------------------------------
LEVEL = """\
######
#P_XO#
#____#
#____#
#____#
######"""


def _sokoban():
    env = gym.make("rllib_ragen/Sokoban-v0")
    env.reset(seed=0, options={"level": SokobanLevel.from_text(LEVEL)})
    return env


def test_valid_turn_sums_rewards_without_penalty():
    result = execute_turn(_sokoban(), parse_reply("<think></think><answer>Right || Down</answer>"), actions_left=10)
    assert result.executed == ["Right", "Down"] and not result.format_error
    assert result.reward == pytest.approx(-0.2) and result.num_effective == 2


def test_ineffective_actions_are_penalised_once_each():
    # From the top-left corner, Up and Left hit the wall (the state stays) and Right walks: -0.1 per move from the
    # shaped reward, and the penalty twice.
    reply = parse_reply("<think></think><answer>Up || Left || Right</answer>")
    result = execute_turn(_sokoban(), reply, actions_left=10, ineffective_action_penalty=-0.5)
    assert result.executed == ["Up", "Left", "Right"] and result.num_effective == 1 and not result.format_error
    assert result.env_reward == pytest.approx(-0.3) and result.reward == pytest.approx(-0.3 - 2 * 0.5)
    unpenalised = execute_turn(_sokoban(), reply, actions_left=10)
    assert unpenalised.reward == pytest.approx(-0.3)


def test_ungrounded_reasoning_is_charged_once_per_action_not_stated_truly():
    # From the top-left corner of LEVEL: Up wall, Down walk, Left wall, Right walk (the box is two cells away).
    def turn(thinking, env=None, penalty=-0.5):
        reply = parse_reply(f"<think>{thinking}</think><answer>Down</answer>")
        return execute_turn(env or _sokoban(), reply, actions_left=10, ungrounded_reasoning_penalty=penalty)

    true = turn("Up wall, Down walk, Left wall, Right walk.")
    assert (true.claims_checked, true.claims_true) == (4, 4) and true.reward == pytest.approx(-0.1)  # the step only
    # One true claim (Down), one false (Up), two moves not mentioned: three actions not stated truly.
    half = turn("Up walk, Down walk.")
    assert (half.claims_checked, half.claims_true) == (2, 1) and half.reward == pytest.approx(-0.1 - 3 * 0.5)
    # A move claimed twice counts its first claim; no reasoning at all is charged for all four actions.
    assert turn("Up walk, Up wall, Down walk, Left wall, Right walk.").reward == pytest.approx(-0.1 - 0.5)
    assert turn("").reward == pytest.approx(-0.1 - 4 * 0.5) and turn("").env_reward == pytest.approx(-0.1)
    assert turn("Up walk, Down walk.", penalty=0.0).reward == pytest.approx(-0.1)  # off: claims counted, not charged
    assert turn("Up walk, Down walk.", penalty=0.0).claims_true == 1
    # An environment that checks no claims is never charged (a validation environment of a mixture).
    bandit = gym.make("rllib_ragen/Bandit-v0")
    bandit.reset(seed=0)
    pick = parse_reply("<think>anything</think><answer>phoenix</answer>")
    charged = execute_turn(bandit, pick, actions_left=1, ungrounded_reasoning_penalty=-0.5)
    assert charged.reward == charged.env_reward and charged.claims_checked == 0


def test_invalid_piece_is_skipped_and_penalised():
    reply = parse_reply("<think></think><answer>Right || jump || down</answer>")
    result = execute_turn(_sokoban(), reply, actions_left=10, format_penalty=-0.1)
    assert result.executed == ["Right", "Down"] and result.num_invalid == 1 and result.format_error
    assert result.reward == pytest.approx(-0.3) and result.env_reward == pytest.approx(-0.2)


@pytest.mark.parametrize(
    "reply", ["garbage", "<think></think><answer></answer>", "<think></think><answer>fly</answer>"]
)
def test_turn_without_valid_action_costs_the_penalty_only(reply):
    env = _sokoban()
    before = env.unwrapped.observation
    result = execute_turn(env, parse_reply(reply), actions_left=10, format_penalty=-0.1)
    assert result.executed == [] and result.format_error and result.reward == pytest.approx(-0.1)
    assert result.observation == before and not result.terminated


def test_budget_and_episode_end_stop_the_turn():
    env = _sokoban()
    result = execute_turn(env, parse_reply("<think></think><answer>Down||Down||Down</answer>"), actions_left=2)
    assert result.executed == ["Down", "Down"]
    # The second Right pushes the box onto the target and ends the episode; the rest does not run.
    env = _sokoban()
    result = execute_turn(env, parse_reply("<think></think><answer>Right||Right||Down||Left</answer>"), actions_left=10)
    assert result.executed == ["Right", "Right"] and result.terminated and result.success
    assert result.reward == pytest.approx(-0.1 + 10.9)


def test_reply_regions_mark_thinking_and_answer_tokens():
    from rllib_ragen.rollout.protocol import REGION_ANSWER as A, REGION_OTHER as O, REGION_THINK as T, reply_regions

    tokens = ["<think>", "go", " left", "</think>", "<answer>", "Left", "</answer>", "<|im_end|>"]
    assert reply_regions(tokens) == [O, T, T, O, A, A, A, O]
    # Tags split over tokens: a token only partly inside the reasoning is not reasoning; one touching the answer is.
    assert reply_regions(["<th", "ink>a", "b", "</thi", "nk><answer>L", "</answer>"]) == [O, O, T, O, A, A]
    assert reply_regions(["<think>", "abc", "def"]) == [O, T, T]  # unclosed: reasoning to the end
    assert reply_regions(["<answer>", "Up", " || ", "Left"]) == [A, A, A, A]  # unclosed answer, no thinking
    assert reply_regions(["I", " do", " not", " know"]) == [O] * 4


def test_reply_sections_keep_the_characters_of_tokens_that_straddle_a_tag():
    from rllib_ragen.rollout.protocol import reply_sections

    # The tiny model's tokenizer writes "<think>Up push" as "<think", ">Up", " push": the region of ">Up" is
    # neither reasoning nor answer, yet the reasoning the rollout files and viewer show must start with "Up".
    assert reply_sections("<think>Up push, Down wall.</think><answer>Up</answer>") == (
        "Up push, Down wall.",
        "<answer>Up</answer>",
    )
    assert reply_sections("<think>abc") == ("abc", "")  # unclosed: reasoning to the end, no answer
    assert reply_sections("<answer>Left</answer>") == ("", "<answer>Left</answer>")
    assert reply_sections("I do not know") == ("", "")
