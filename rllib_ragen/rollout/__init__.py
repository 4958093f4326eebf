"""The rollout core: the action protocol and (later layers) the multi-turn loop. No Ray imports."""

from .protocol import DEFAULT_FORMAT_PENALTY, DEFAULT_SEPARATOR, ParsedReply, TurnResult, execute_turn, parse_reply

__all__ = ["DEFAULT_FORMAT_PENALTY", "DEFAULT_SEPARATOR", "ParsedReply", "TurnResult", "execute_turn", "parse_reply"]
