"""parse_reply under hostile input: the same answers as the template's regular grammar, in linear time."""

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from rllib_ragen.rollout import parse_reply

# The template as a regular expression: the oracle (it backtracks, so only small inputs go through it).
_TAG = re.compile(r"</?\s*(?:think|answer)\s*>", re.IGNORECASE)
_ORACLE = {
    True: re.compile(r"\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*", re.IGNORECASE | re.DOTALL),
    False: re.compile(r"\s*(?:<think>(.*?)</think>\s*)?<answer>(.*?)</answer>\s*", re.IGNORECASE | re.DOTALL),
}


def oracle(text: str, enable_thinking: bool):
    match = _ORACLE[enable_thinking].fullmatch(text)
    if match is None or any(part is not None and _TAG.search(part) for part in match.groups()):
        return False, None, None
    return True, match.group(1), match.group(2)


_alphabet = st.sampled_from(
    [
        "<think>",
        "</think>",
        "<answer>",
        "</answer>",
        "<THINK>",
        "< answer>",
        "</ think >",
        "||",
        " ",
        "\n",
        "Up",
        "x",
        "<",
        ">",
        "/",
    ]
)


@settings(max_examples=2000, deadline=None)
@given(parts=st.lists(_alphabet, max_size=12), enable_thinking=st.booleans())
def test_parser_agrees_with_the_templates_grammar(parts, enable_thinking):
    text = "".join(parts)
    parsed = parse_reply(text, enable_thinking=enable_thinking, max_actions_per_turn=None)
    ok, thinking, answer = oracle(text, enable_thinking)
    assert parsed.format_ok == ok, text
    if ok:
        assert parsed.thinking == thinking
        assert parsed.actions == tuple(p.strip() for p in answer.split("||") if p.strip())


def test_a_megabyte_of_repeated_tags_is_a_format_error_not_a_hang():
    # The backtracking regexes took ~400 s on this at 1 MB (benchmarks/parser.py times it).
    for text in ("<think>" + "</think><answer>" * 65_536, "<think>" * 150_000, "<answer>" + "x" * 1_000_000):
        assert not parse_reply(text).format_ok


def test_every_documented_argument_value_is_accepted():
    reply = "<think>t</think><answer>A || B || C</answer>"
    assert parse_reply(reply, max_actions_per_turn=None).actions == ("A", "B", "C")
    assert parse_reply(reply, max_actions_per_turn=0).num_dropped == 3
    assert parse_reply(reply, separator=None).actions == ("A || B || C",)
    assert not parse_reply(None).format_ok and not parse_reply(b"<answer>x</answer>").format_ok
