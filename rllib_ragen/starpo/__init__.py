"""StarPO / StarPO-S as a Ray RLlib algorithm: config, algorithm, LLM RLModule, learner and text EnvRunner."""

from .presets import PRESETS
from .config import STARPO_S_DEFAULTS, StarPOConfig
from .inference_engines import INFERENCE_BACKENDS, register_inference_backend
from .llm_rl_module import CausalLMRLModule
from .starpo import LearnerDiedError, StarPO
from .starpo_learner import StarPOTorchLearner
from .text_env_runner import TextEnvRunner

__all__ = [
    "CausalLMRLModule",
    "INFERENCE_BACKENDS",
    "LearnerDiedError",
    "PRESETS",
    "STARPO_S_DEFAULTS",
    "StarPO",
    "StarPOConfig",
    "StarPOTorchLearner",
    "TextEnvRunner",
    "register_inference_backend",
]
