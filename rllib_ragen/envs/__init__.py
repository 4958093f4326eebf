"""Text environments and their registry.

Built-in environments are registered with gymnasium under the ``rllib_ragen/`` namespace when this package is
imported, so ``gymnasium.make("rllib_ragen/Sokoban-v0", dim=8, num_boxes=2)`` works. Users add their own with
:func:`register_text_env`; the trainer then accepts the id anywhere it accepts a built-in one.
"""

from __future__ import annotations

import typing
from typing import Any, Callable

import gymnasium as gym

from .bandit import BanditEnv
from .base import TRANSITION_SEED, TextEnv, load_import_path
from .countdown import CountdownEnv
from .frozen_lake import FrozenLakeTextEnv
from .games import make_game
from .lookup import FactLookupEnv
from .sokoban import SokobanEnv
from .sokoban_levels import SokobanLevel, generate_level, solve_level
from .sudoku import SudokuEnv
from .tool_env import ToolTextEnv, TRLEnvironment

__all__ = [
    "BanditEnv",
    "CountdownEnv",
    "FactLookupEnv",
    "FrozenLakeTextEnv",
    "SokobanEnv",
    "SokobanLevel",
    "SudokuEnv",
    "TRANSITION_SEED",
    "TextEnv",
    "ToolTextEnv",
    "TRLEnvironment",
    "ensure_registered",
    "generate_level",
    "make_game",
    "make_text_env",
    "register_text_env",
    "registered_text_envs",
    "solve_level",
]

_TEXT_ENV_IDS: list[str] = []


def register_text_env(
    env_id: str,
    entry_point: type[TextEnv] | str,
    *,
    max_episode_steps: int | None = 100,
    reward_threshold: float | None = None,
    **kwargs: Any,
) -> None:
    """Register a text environment under a gymnasium id so training configs can name it.

    Args:
        env_id: a versioned gymnasium id, e.g. ``"myproject/Maze-v0"``.
        entry_point: a :class:`TextEnv` subclass, or a function that builds one (``make_text_env`` checks what it
            built), or the import path of either, ``"package.module:Name"``. Each reaches Ray's worker processes: a
            ``StarPOConfig`` naming the id carries the registration (:func:`registrations_of`).
        max_episode_steps: env steps (single actions) before gymnasium's ``TimeLimit`` truncates. The agent's
            own per-episode action budget is a rollout setting; this is only a safety net.
        reward_threshold: the return at which the env counts as solved, if known.
        **kwargs: default constructor arguments; ``gymnasium.make(env_id, **overrides)`` overrides them.
    """
    cls = entry_point if not isinstance(entry_point, str) else load_import_path(entry_point, "entry_point")
    if not isinstance(cls, type) and callable(cls):  # a factory: the config's checks read the class it names
        cls = typing.get_type_hints(cls).get("return")
    if not (isinstance(cls, type) and issubclass(cls, TextEnv)):
        raise TypeError(
            f"{env_id}: entry_point {entry_point!r} must be a subclass of rllib_ragen.envs.TextEnv, or "
            "a function that builds one with its return annotated as that class."
        )
    if env_id in gym.registry:
        if env_id in _TEXT_ENV_IDS and gym.registry[env_id].entry_point == entry_point:
            return  # re-import of the same module: nothing to do
        raise ValueError(f"{env_id!r} is already registered with gymnasium; choose another id or version.")
    gym.register(
        id=env_id,
        entry_point=entry_point,
        max_episode_steps=max_episode_steps,
        reward_threshold=reward_threshold,
        kwargs=kwargs,
    )
    _TEXT_ENV_IDS.append(env_id)


# Other packages' games, registered on first use under these namespaces: "gem/<GEM id>", "textarena/<id>",
# "reasoning_gym/<task>". A colon in a GEM id is written as a dot ("gem/game.Sudoku-v0-easy" plays
# "game:Sudoku-v0-easy"): gymnasium.make reads a colon as "import this module first".
ADAPTED_NAMESPACES = {
    "gem/": "rllib_ragen.envs.gem_env:GemTextEnv",
    "textarena/": "rllib_ragen.envs.textarena_env:TextArenaTextEnv",
    "reasoning_gym/": "rllib_ragen.envs.reasoning_gym_env:ReasoningGymTextEnv",
}
# An environment served over HTTP (rllib_ragen.envs.remote), played with env_config={"url": ...}; registered on first
# use too, so that code iterating over the built-ins never builds it without a url.
REMOTE_ENV_ID = "rllib_ragen/Remote-v0"
# A class written for TRL's environment_factory, played with env_config={"environment": "pkg.module:Class", ...}.
TRL_ENV_ID = "rllib_ragen/TRL-v0"


def ensure_registered(env_id: Any) -> None:
    """Register an adapted game's id (``"gem/game.Sudoku-v0-easy"``, ``"textarena/Mastermind-v0-train"``), or
    ``REMOTE_ENV_ID``, the first time it is named; any other id, or one already registered, is left as it is.
    The game's (or the server's) own turn limit applies, so no gymnasium ``TimeLimit`` is added."""
    if not isinstance(env_id, str) or env_id in gym.registry:
        return
    if env_id == REMOTE_ENV_ID:
        register_text_env(env_id, "rllib_ragen.envs.remote:remote_text_env", max_episode_steps=None)
    if env_id == TRL_ENV_ID:
        register_text_env(env_id, "rllib_ragen.envs.tool_env:TRLEnvironment", max_episode_steps=None)
    for namespace, entry_point in ADAPTED_NAMESPACES.items():
        if env_id.startswith(namespace) and len(env_id) > len(namespace):
            game_id = env_id[len(namespace) :]
            if namespace == "gem/":
                game_id = game_id.replace(".", ":", 1)
            register_text_env(env_id, entry_point, max_episode_steps=None, game_id=game_id)


def registrations_of(env_ids) -> dict[str, Any]:
    """The gymnasium specs of the user-registered text environments among ``env_ids``. A config carries them to
    Ray's worker processes, which import this package (and so its built-ins) but never ran the user's
    :func:`register_text_env` calls; :func:`register_carried` registers them there."""
    for env_id in env_ids:
        ensure_registered(env_id)
    return {
        env_id: gym.spec(env_id)
        for env_id in env_ids
        if isinstance(env_id, str) and env_id in _TEXT_ENV_IDS and env_id not in BUILT_IN_TEXT_ENVS
    }


def register_carried(specs: dict[str, Any]) -> None:
    """Register, in this process, each carried spec (:func:`registrations_of`) it does not know yet."""
    for env_id, spec in specs.items():
        if env_id not in gym.registry:
            register_text_env(
                env_id,
                spec.entry_point,
                max_episode_steps=spec.max_episode_steps,
                reward_threshold=spec.reward_threshold,
                **spec.kwargs,
            )


def registered_text_envs() -> list[str]:
    """Ids of every text environment registered so far, built-in ones first."""
    return list(_TEXT_ENV_IDS)


def make_text_env(env: str | type[TextEnv] | Callable[..., gym.Env], **config: Any) -> gym.Env:
    """Build a text environment from a registered id, a ``TextEnv`` subclass or a factory callable.

    Raises:
        TypeError: if what gets built is not a :class:`TextEnv` (possibly wrapped).
    """
    ensure_registered(env)
    built = gym.make(env, **config) if isinstance(env, str) else env(**config)
    if not isinstance(built.unwrapped, TextEnv):
        raise TypeError(
            f"{env!r} built a {type(built.unwrapped).__name__}, not a rllib_ragen.envs.TextEnv: text training needs "
            "string observations and named actions (subclass TextEnv)."
        )
    return built


# ---- built-ins: one id per variant, like gymnasium's own registrations ---------------------------------------
# Bandit: the best expected return is 0.25 (always pull the risky arm).
register_text_env("rllib_ragen/Bandit-v0", "rllib_ragen.envs.bandit:BanditEnv", reward_threshold=0.25)
register_text_env(
    "rllib_ragen/BanditHeldOut-v0",
    "rllib_ragen.envs.bandit:BanditEnv",
    reward_threshold=0.25,
    low_risk_name="Librarian",
    high_risk_name="Trader",
)
register_text_env(
    "rllib_ragen/BanditReversed-v0",
    "rllib_ragen.envs.bandit:BanditEnv",
    reward_threshold=0.25,
    low_risk_name="Dragon",
    high_risk_name="Phoenix",
)
# Sokoban: solving a 1-box level in L moves returns 11 - 0.1 L; >= 10 means solved within 10 moves.
register_text_env("rllib_ragen/Sokoban-v0", "rllib_ragen.envs.sokoban:SokobanEnv", reward_threshold=10.0)
register_text_env(
    "rllib_ragen/Sokoban8x8TwoBoxes-v0",
    "rllib_ragen.envs.sokoban:SokobanEnv",
    reward_threshold=10.0,
    dim=8,
    num_boxes=2,
)
register_text_env(
    "rllib_ragen/SokobanAltSymbols-v0",
    "rllib_ragen.envs.sokoban:SokobanEnv",
    reward_threshold=10.0,
    symbols="alternate",
)
register_text_env(  # RAGEN's CoordSokoban: the same levels as cell coordinates instead of a drawn grid
    "rllib_ragen/SokobanCoordinates-v0",
    "rllib_ragen.envs.sokoban:SokobanEnv",
    reward_threshold=10.0,
    render="coordinates",
)
# FrozenLake: the return is the success probability; gymnasium's fixed 4x4 map uses 0.70.
register_text_env("rllib_ragen/FrozenLake-v0", "rllib_ragen.envs.frozen_lake:FrozenLakeTextEnv", reward_threshold=0.7)
register_text_env(
    "rllib_ragen/FrozenLakeNotSlippery-v0",
    "rllib_ragen.envs.frozen_lake:FrozenLakeTextEnv",
    reward_threshold=1.0,
    is_slippery=False,
)
# Countdown (multi-turn) and 4x4 Sudoku, two of RAGEN's 2026 environments; the return of a solved game is 1.
register_text_env("rllib_ragen/Countdown-v0", "rllib_ragen.envs.countdown:CountdownEnv", reward_threshold=1.0)
register_text_env("rllib_ragen/Sudoku4x4-v0", "rllib_ragen.envs.sudoku:SudokuEnv", reward_threshold=1.0)
# FactLookup: played with tools (search, then answer); a correct answer returns 1.
# Games of two seats, one seat played against scripted opponents (envs/seat.py; the games themselves: envs/games.py).
register_text_env("rllib_ragen/TicTacToe-v0", "rllib_ragen.envs.seat:SeatEnv", max_episode_steps=None)
register_text_env(
    "rllib_ragen/KuhnPoker-v0", "rllib_ragen.envs.seat:SeatEnv", max_episode_steps=None, game="rllib_ragen/KuhnPoker-v0"
)
register_text_env("rllib_ragen/FactLookup-v0", "rllib_ragen.envs.lookup:FactLookupEnv", reward_threshold=1.0)
BUILT_IN_TEXT_ENVS = frozenset(_TEXT_ENV_IDS)
