"""Our environments served to OpenEnv's clients: :func:`openenv_app` wraps a registered text environment in an OpenEnv
``Environment`` inside OpenEnv's own FastAPI app, behind :class:`ServingLimits`
(``python -m rllib_ragen.envs.remote.server --env ID --protocol openenv`` runs it with uvicorn)."""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from openenv.core.env_server import Environment
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.types import ConcurrencyConfig, EnvironmentMetadata

from .. import make_text_env
from .openenv import TextAction, TextObservation, TextState
from .wire import EnvironmentErrorLog, episode_start

logger = logging.getLogger(__name__)

# ---- serving: our environment behind OpenEnv's app -------------------------------------------------------------------
SERVED_ERRORS = EnvironmentErrorLog(logger)  # the served environments' errors, once per kind with a count


class ServedTextEnv(Environment):
    """A registered text environment as an OpenEnv ``Environment``: one instance per WebSocket session."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session builds its own environment; they share nothing

    def __init__(self, env_id: str, env_config: dict | None = None):
        super().__init__()
        self.env_id = env_id
        self.env = make_text_env(env_id, **dict(env_config or {}))
        self._state = TextState()

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, options: dict | None = None, **_: Any
    ) -> TextObservation:
        text, info = self._call("reset", lambda: self.env.reset(seed=seed, options=options or None))
        self._state = TextState(episode_id=episode_id, step_count=0, text=text, success=False)
        return TextObservation(text=text, info=info, **episode_start(self.env.unwrapped))

    def step(self, action: TextAction, timeout_s: float | None = None, **_: Any) -> TextObservation:
        text, reward, terminated, truncated, info = self._call("step", lambda: self.env.step(action.message))
        text_env = self.env.unwrapped
        self._state.step_count += 1
        self._state.text, self._state.success = text, bool(text_env.success)
        reward = float(reward)
        if not math.isfinite(reward):  # JSON has no NaN: the reward goes as its name too, and the client reads that
            info = {**info, "nonfinite_reward": repr(reward)}
        return TextObservation(
            text=text,
            reward=reward,
            done=bool(terminated or truncated),
            info=info,
            state_key=text_env.state_key(),
            success=bool(text_env.success),
            truncated=bool(truncated and not terminated),
        )

    @property
    def state(self) -> TextState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        try:
            description = self.env.unwrapped.describe()
        except Exception:  # an adapted game may describe itself only after a reset
            description = ""
        return EnvironmentMetadata(
            name=self.env_id,
            description=description or f"the text environment {self.env_id}",
            version=_package_version(),
        )

    def close(self) -> None:
        self.env.close()

    def _call(self, what: str, call):
        try:
            return call()
        except Exception as error:  # OpenEnv answers the client with an error frame; the log counts it by kind
            SERVED_ERRORS.record(f"{self.env_id} {what}", error)
            raise


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rllib_ragen")
    except PackageNotFoundError:
        return "0"


def openenv_app(
    env_id: str,
    env_config: dict | None = None,
    max_sessions: int = 4096,
    session_ttl_s: float | None = 600.0,
    max_body_bytes: int | None = None,
):
    """OpenEnv's FastAPI app serving ``env_id`` (built once here, so a bad id or argument fails now, not on the first
    connection): ``/ws`` sessions, ``/reset``, ``/step``, ``/state``, ``/schema``, ``/metadata``, ``/health``; behind
    :class:`ServingLimits` (``max_body_bytes``, and an idle WebSocket session ended after ``session_ttl_s``)."""
    ServedTextEnv(env_id, env_config).close()
    app = create_fastapi_app(
        lambda: ServedTextEnv(env_id, env_config),
        TextAction,
        TextObservation,
        env_name=env_id.replace("/", "_"),
        state_cls=TextState,
        concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=session_ttl_s),
    )
    app.add_middleware(ServingLimits, max_body_bytes=max_body_bytes, idle_timeout_s=session_ttl_s)
    return app


class ServingLimits:
    """ASGI middleware holding the server's limits where OpenEnv's app and uvicorn do not (both checked here):

    - an HTTP body over ``max_body_bytes`` is refused with 413, by its ``Content-Length`` unread, or, sent in
      chunks, as soon as it passes the limit (uvicorn bounds the request head only, and FastAPI reads any body);
    - a WebSocket session whose client sends nothing for ``idle_timeout_s`` is closed (1001): OpenEnv's idle reaper
      skips sessions with a WebSocket attached, so an idle client would hold its environment for ever.
    """

    def __init__(self, app, max_body_bytes: int | None, idle_timeout_s: float | None):
        self.app, self.max_body_bytes, self.idle_timeout_s = app, max_body_bytes, idle_timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.max_body_bytes is not None:
            await self._http(scope, receive, send)
        elif scope["type"] == "websocket" and self.idle_timeout_s is not None:
            await self._websocket(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _http(self, scope, receive, send):
        limit = self.max_body_bytes
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            size = int(length) if length.isdigit() else -1
            if not 0 <= size <= limit:
                await _json_reply(
                    send,
                    400 if size < 0 else 413,
                    f"Content-Length {length.decode(errors='replace')!r}: a body of 0 to {limit} bytes "
                    "(--max-body-bytes) is read.",
                )
                return
            await self.app(scope, receive, send)  # h11 delivers exactly that many bytes
            return
        body, more = bytearray(), True  # chunked: read it here, up to the limit, then hand it on
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > limit:
                await _json_reply(send, 413, f"the body passed {limit} bytes (--max-body-bytes); the rest is unread.")
                return
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    async def _websocket(self, scope, receive, send):
        import asyncio

        closed = False

        async def idle_bounded_receive():
            nonlocal closed
            try:
                return await asyncio.wait_for(receive(), self.idle_timeout_s)
            except asyncio.TimeoutError:
                closed = True
                await send(
                    {
                        "type": "websocket.close",
                        "code": 1001,
                        "reason": f"idle for {self.idle_timeout_s:g} s (--session-ttl-s)",
                    }
                )
                return {"type": "websocket.disconnect", "code": 1001}  # the app ends the session as on a disconnect

        async def send_unless_closed(message):
            if not closed:  # the app's own close after the disconnect above has nothing left to close
                await send(message)

        await self.app(scope, idle_bounded_receive, send_unless_closed)


async def _json_reply(send, status: int, error: str) -> None:
    data = json.dumps({"error": error}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})
