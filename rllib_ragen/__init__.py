"""rllib_ragen: train LLM agents in multi-turn text environments with StarPO, as a Ray RLlib algorithm.

Importing the package registers the built-in environments with gymnasium (``rllib_ragen/Sokoban-v0``, ...).
"""

from . import envs
from .envs import make_text_env, register_text_env, registered_text_envs


def __getattr__(name):
    # StarPO pulls in Ray and torch; import it only when asked for, so the envs stay light.
    if name in ("StarPO", "StarPOConfig"):
        from . import starpo

        return getattr(starpo, name)
    raise AttributeError(f"module 'rllib_ragen' has no attribute {name!r}")


__version__ = "0.1.0"
__all__ = [
    "StarPO",
    "StarPOConfig",
    "envs",
    "make_text_env",
    "register_text_env",
    "registered_text_envs",
    "__version__",
]
