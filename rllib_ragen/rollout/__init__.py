"""The rollout core: action protocol, token-level context, inference backends and the multi-turn engine.

No Ray imports: everything here runs in a plain Python process (a test imports it with Ray unimportable).
"""

from .backends import Generation, HFBackend, InferenceBackend, SamplingParams, ScriptedBackend
from .context import ChatFormat, TemplateError, TurnMessage, last_turn_message, turn_message
from .engine import RolloutEngine
from .models import load_policy
from .protocol import DEFAULT_FORMAT_PENALTY, DEFAULT_SEPARATOR, ParsedReply, TurnResult, execute_turn, parse_reply
from .rollout_config import RolloutConfig
from .trajectory import SeedSchedule, Trajectory, pad_trajectories, rollout_metrics
from .vllm_backend import VLLMBackend, VLLMEngine

__all__ = [
    "ChatFormat",
    "DEFAULT_FORMAT_PENALTY",
    "DEFAULT_SEPARATOR",
    "Generation",
    "HFBackend",
    "InferenceBackend",
    "ParsedReply",
    "RolloutConfig",
    "RolloutEngine",
    "SamplingParams",
    "ScriptedBackend",
    "SeedSchedule",
    "TemplateError",
    "Trajectory",
    "TurnMessage",
    "TurnResult",
    "VLLMBackend",
    "VLLMEngine",
    "execute_turn",
    "last_turn_message",
    "load_policy",
    "pad_trajectories",
    "parse_reply",
    "rollout_metrics",
    "turn_message",
]
