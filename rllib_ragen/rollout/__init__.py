"""The rollout core: action protocol, token-level context, inference backends and the multi-turn engine.

No Ray imports: everything here runs in a plain Python process.
"""

from .backends import Generation, HFBackend, InferenceBackend, SamplingParams, ScriptedBackend
from .context import ChatFormat, TemplateError
from .engine import RolloutConfig, RolloutEngine, SeedSchedule, Trajectory, rollout_metrics
from .models import load_policy
from .protocol import DEFAULT_FORMAT_PENALTY, DEFAULT_SEPARATOR, ParsedReply, TurnResult, execute_turn, parse_reply

__all__ = [
    "ChatFormat", "DEFAULT_FORMAT_PENALTY", "DEFAULT_SEPARATOR", "Generation", "HFBackend", "InferenceBackend",
    "ParsedReply", "RolloutConfig", "RolloutEngine", "SamplingParams", "ScriptedBackend", "SeedSchedule",
    "TemplateError", "Trajectory", "TurnResult", "execute_turn", "load_policy", "parse_reply", "rollout_metrics",
]
