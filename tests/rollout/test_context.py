"""The token-level context: the chat template used append-only, the turn message and its parser."""

import pytest

from rllib_ragen.rollout.context import ChatFormat, TemplateError, TurnMessage, last_turn_message, turn_message
from rllib_ragen.rollout.tiny_model import build_tiny_tokenizer
from rllib_ragen.demonstrators import (
    frozen_lake_hole_blind_policy,
    frozen_lake_optimal_policy,
    random_moves_policy,
    sokoban_solver_policy,
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer(seed=0)


def test_turn_pieces_rebuild_the_templates_own_rendering(tokenizer):
    chat = ChatFormat(tokenizer, system_prompt="Play.")
    reply_ids = chat.encode("<think>go</think><answer>Up</answer>") + [tokenizer.eos_token_id]
    ids = chat.prompt_ids("Turn 1") + reply_ids + chat.encode(chat.next_turn_text(reply_ids, "Turn 2"))
    # ChatML by hand: every message is <|im_start|>role\ncontent<|im_end|>\n, then the generation prompt.
    assert tokenizer.decode(ids) == (
        "<|im_start|>system\nPlay.<|im_end|>\n<|im_start|>user\nTurn 1<|im_end|>\n"
        "<|im_start|>assistant\n<think>go</think><answer>Up</answer><|im_end|>\n"
        "<|im_start|>user\nTurn 2<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_reply_is_closed_once_whether_or_not_it_sampled_its_end_token(tokenizer):
    chat = ChatFormat(tokenizer)
    answer = chat.encode("<answer>Up</answer>")
    assert chat.reply_end_text(answer + [tokenizer.eos_token_id]) == "\n"  # <|im_end|> was sampled: only "\n"
    assert chat.reply_end_text(answer) == "<|im_end|>\n"  # cut by max_new_tokens: the template closes it


def test_template_that_rewrites_earlier_turns_is_refused(tokenizer):
    ChatFormat(tokenizer)  # the tiny ChatML template is append-only
    stripping = tokenizer.chat_template.replace(
        "{{ message['content'] }}",
        "{% if message['role'] == 'assistant' and not loop.last %}{{ message['content'].split('</think>')[-1] }}"
        "{% else %}{{ message['content'] }}{% endif %}",
    )
    original = tokenizer.chat_template
    tokenizer.chat_template = stripping
    try:
        with pytest.raises(TemplateError, match="append-only"):
            ChatFormat(tokenizer)
    finally:
        tokenizer.chat_template = original


@pytest.mark.parametrize("reward", [None, -0.1, 10.0])
def test_turn_message_parses_back_to_its_parts(reward):
    board = "######\n#P_X_#\n#__O_#\n######"
    message = turn_message(board, turn=3, actions_left=7, reward=reward, enable_thinking=False)
    assert last_turn_message(message) == TurnMessage(observation=board, turn=3, actions_left=7, reward=reward)


def test_the_last_turn_message_of_a_conversation_is_read():
    first = turn_message("#P_O#", turn=1, actions_left=10)
    second = turn_message("#_PO#", turn=2, actions_left=9, reward=-0.1)
    conversation = f"<|im_start|>user\n{first}<|im_end|>\n<answer>Right</answer>\n<|im_start|>user\n{second}"
    assert last_turn_message(conversation) == TurnMessage("#_PO#", 2, 9, -0.1)
    with pytest.raises(ValueError, match="Turn N"):
        last_turn_message("no state here")


def test_scripted_policies_read_the_state_through_the_same_parser():
    # A player left of a box with the target right of it: the solver's first move is Right.
    level = "######\n#PX_O#\n#____#\n#____#\n#____#\n######"
    assert "<answer>Right || Right</answer>" in sokoban_solver_policy()(turn_message(level, turn=1, actions_left=10))
    assert sokoban_solver_policy(1, reasoning="effects")(turn_message(level, turn=1, actions_left=10)) == (
        "<think>Up wall, Down walk, Left wall, Right push. Optimal plan has 2 moves.</think><answer>Right</answer>"
    )
    with pytest.raises(ValueError, match="reasoning='moves'"):
        sokoban_solver_policy(reasoning="moves")
    # Solid ice, goal two cells right of the player: a shortest path starts Right.
    lake = "P_G_\n____\n____\n____"
    reply = frozen_lake_optimal_policy(enable_thinking=False, is_slippery=False)(
        turn_message(lake, turn=1, actions_left=5)
    )
    assert reply == "<answer>Right</answer>"
    # With reasoning="effects" the think line says where each move leads from the player's cell.
    assert frozen_lake_optimal_policy(is_slippery=False, reasoning="effects")(
        turn_message("_O__\nP_G_\n____\n____", turn=1, actions_left=5)
    ) == ("<think>Left edge, Down ice, Right ice, Up ice.</think><answer>Right</answer>")
    assert frozen_lake_optimal_policy(is_slippery=False, reasoning="effects")(
        turn_message("P_G_\nO___\n____\n____", turn=1, actions_left=5)
    ) == ("<think>Left edge, Down hole, Right ice, Up edge.</think><answer>Right</answer>")
    with pytest.raises(ValueError, match="reasoning='plan'"):
        frozen_lake_optimal_policy(reasoning="plan")


def test_the_hole_blind_policy_steps_into_the_hole_the_optimal_policy_walks_around():
    def first_move(policy, lake):
        return policy(enable_thinking=False, is_slippery=False)(turn_message(lake, turn=1, actions_left=10))

    # Solid ice, the goal two cells right of the player and a hole between them. Ignoring holes, the only
    # two-move path is Right, Right; the optimal policy goes around below (Down, Right, Right, Up: Up is the edge).
    lake = "POG_\n____\n____\n____"
    assert first_move(frozen_lake_hole_blind_policy, lake) == "<answer>Right</answer>"
    assert first_move(frozen_lake_optimal_policy, lake) == "<answer>Down</answer>"
    # A hole off the way changes nothing: both head straight for the goal.
    lake = "P_G_\nO___\n____\n____"
    assert (
        first_move(frozen_lake_hole_blind_policy, lake)
        == first_move(frozen_lake_optimal_policy, lake)
        == ("<answer>Right</answer>")
    )


def test_random_moves_are_uniform_and_the_same_for_the_same_conversation_whatever_the_order():
    names = ("Up", "Down", "Left", "Right")
    policy = random_moves_policy(names, per_reply=5, enable_thinking=False, seed=3)
    prompts = [turn_message("#P" + "_" * k + "O#", turn=1, actions_left=10) for k in range(40)]
    replies = [policy(p) for p in prompts]
    assert [policy(p) for p in reversed(prompts)] == replies[::-1]  # a state's draw does not depend on play order
    moves = [move for r in replies for move in r.removeprefix("<answer>").removesuffix("</answer>").split(" || ")]
    assert len(moves) == 200 and all(25 <= moves.count(name) <= 75 for name in names)  # 50 each expected
    assert [random_moves_policy(names, 5, False, seed=4)(p) for p in prompts] != replies  # the seed matters
    with pytest.raises(ValueError, match="per_reply >= 1"):
        random_moves_policy(names, per_reply=0)


def test_the_format_hint_is_ragens_by_default_and_says_when_the_answer_is_one_action():
    from rllib_ragen.rollout.context import format_hint

    # Every prompt ends with it: the default text is kept to the letter (runs reproduce token for token).
    assert format_hint(True, 5) == (
        "Reply exactly as <think>your reasoning</think><answer>action || action</answer> with at most 5 actions."
    )
    assert format_hint(False, 1, ";") == "Reply exactly as <answer>action ; action</answer> with at most 1 actions."
    assert format_hint(True, 1, None) == (
        "Reply exactly as <think>your reasoning</think><answer>action</answer>: the answer is one action."
    )
