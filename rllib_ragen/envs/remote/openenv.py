"""OpenEnv's protocol, both ways, on the ``openenv`` package (``pip install "rllib_ragen[openenv]"``): this
module holds the wire types both ways share; ``openenv_server.py`` serves, ``openenv_client.py`` plays.

- **Serving** (``openenv_server.py``): ``openenv_app`` wraps any registered text environment in an OpenEnv
  ``Environment`` and builds OpenEnv's own FastAPI app around it (``create_fastapi_app``), so OpenEnv's clients
  (``GenericEnvClient``, TRL's, SkyRL's) play it over ``/ws`` and ``openenv validate --url`` passes. ``python -m
  rllib_ragen.envs.remote.server --env ID --protocol openenv`` runs it with uvicorn. The action is
  :class:`TextAction` (``{"message": "Up"}``); the observation, :class:`TextObservation`, carries the text and
  everything ``RemoteTextEnv`` needs to play the episode as it plays in process (the action list, the state key,
  success, truncation).
- **Playing** (``openenv_client.py``): ``OpenEnvTextEnv`` plays any OpenEnv server as a text environment, through
  OpenEnv's own ``GenericEnvClient``: ``make_text_env("rllib_ragen/Remote-v0", url=..., protocol="openenv")``. Its
  observation is rendered to text and its action schema told to the policy; ``done`` is ``terminated``; seeds pass
  through.

Why two remote protocols: OpenEnv keeps an episode on one WebSocket, and its HTTP ``/reset`` and ``/step`` are
stateless, so a dropped connection ends the episode. ``rllib_ragen``'s own HTTP protocol (``server.py``,
``client.py``) keeps the episode in a server session and numbers each step, so a client reconnects and retries a
step whose answer was lost without stepping twice; and it needs nothing beyond the standard library.
"""

from __future__ import annotations

from typing import Any

from openenv.core.env_server import Action, Observation, State
from pydantic import Field


# ---- the wire types of a served text environment -------------------------------------------------------------------
class TextAction(Action):
    """One action of a text environment."""

    message: str = Field(
        description="One action: a name from the observation's action_names (case ignored), or "
        "a move matching its action_pattern."
    )


class TextObservation(Observation):
    """A text environment's state, with what a client needs to play it exactly as in process."""

    text: str = Field(description="The state as text.")
    description: str = Field(default="", description="Instructions, symbols and valid actions (set on reset).")
    action_names: list[str] = Field(default_factory=list, description="The valid actions (empty: see action_pattern).")
    action_pattern: str | None = Field(default=None, description="The move syntax, a regular expression.")
    max_turns: int | None = Field(default=None, description="The environment's own cap on the agent's replies.")
    state_key: str = Field(default="", description="Equal keys mark equal states (GiGPO's anchor states).")
    success: bool = Field(default=False, description="Whether the episode's goal is reached.")
    truncated: bool = Field(default=False, description="Whether the episode ended by a time limit, not the game.")
    raw_replies: bool = Field(default=False, description="The environment reads a model's whole reply itself.")
    tools: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Function schemas of the environment's "
        'tools: each action is then a call, {"name": ..., "arguments": {...}}.',
    )
    info: dict[str, Any] = Field(default_factory=dict, description="The environment's step info.")


class TextState(State):
    """The episode so far."""

    text: str = Field(default="", description="The state as text.")
    success: bool = Field(default=False, description="Whether the episode's goal is reached.")
