"""Serve any registered text environment over HTTP: ``python -m rllib_ragen.envs.serve --env ID --port P``.

One session per episode, in OpenEnv's reset / step / state shape, JSON over HTTP/1.1 with keep-alive:

- ``POST /reset`` ``{"seed": int | null, "options": {...}, "close": previous session id | null}`` starts an episode
  and returns ``{"session_id", "observation", "info", "description", "action_names", "action_pattern",
  "max_turns", "state_key"}``;
- ``POST /step`` ``{"session_id", "action", "index"}`` returns ``{"observation", "reward", "terminated", "truncated",
  "info", "state_key"}``. ``index`` counts the session's steps from 0: a repeated index (a client retrying after a
  lost response) returns the recorded result instead of stepping twice;
- ``GET /state?session_id=...`` returns the episode's current ``observation``, ``success`` and ``steps``;
- ``POST /close`` ``{"session_id"}`` ends a session; idle sessions also end after ``--session-ttl-s``;
- ``GET /health`` returns ``{"status": "ok", "env": ID, "sessions": n}``.

Errors come back as ``{"error": message}`` with status 400 (a bad request), 404 (an unknown session), 503 (too many
sessions) or 500 (the environment raised). The client is :class:`rllib_ragen.envs.remote.RemoteTextEnv`.

The standard library's threaded HTTP server is used on purpose: the server then needs nothing beyond what
``rllib_ragen.envs`` imports (no torch, no Ray, no web framework), so it runs wherever an environment's own
dependencies do, and one thread per connection is what a handful of env runners with persistent connections need
(``benchmarks/third_party_envs.py`` measures it against in-process stepping).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import threading
import time
import traceback
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from . import make_text_env

logger = logging.getLogger(__name__)


class _RequestError(Exception):
    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


class _Session:
    def __init__(self, env):
        self.env, self.lock = env, threading.Lock()
        self.steps, self.last_result, self.used = 0, None, time.monotonic()


def _finite_or_text(value: float) -> float | str:
    """JSON has no NaN or infinity: send those as their names, which the client turns back into floats."""
    return value if math.isfinite(value) else repr(value)


class TextEnvServer(ThreadingHTTPServer):
    """A threaded HTTP server holding one environment per session (see the module docstring for the routes).

    Args:
        address: ``(host, port)``; port 0 picks a free one (``server_address`` has it after binding).
        env: a registered text-environment id; env_config: its constructor arguments.
        max_sessions: sessions open at once; a reset past it is refused with 503.
        session_ttl_s: a session unused this long is closed.
    """

    daemon_threads = True

    def __init__(self, address: tuple[str, int], env: str, env_config: dict | None = None, max_sessions: int = 4096,
                 session_ttl_s: float = 600.0):
        self.env_id, self.env_config = env, dict(env_config or {})
        make_text_env(env, **self.env_config).close()  # fail at start-up, not on the first request
        self.max_sessions, self.session_ttl_s = max_sessions, session_ttl_s
        self.sessions: dict[str, _Session] = {}
        self.sessions_lock = threading.Lock()
        self._idle_envs: list = []  # closed sessions' environments, reused by later resets
        super().__init__(address, _Handler)

    # ---- sessions ---------------------------------------------------------------------------------------
    def open_session(self) -> tuple[str, _Session]:
        with self.sessions_lock:
            self._expire_idle_sessions()
            if len(self.sessions) >= self.max_sessions:
                raise _RequestError(HTTPStatus.SERVICE_UNAVAILABLE, f"{len(self.sessions)} sessions are open (the "
                                    f"limit, --max-sessions {self.max_sessions}); close finished ones.")
            env = self._idle_envs.pop() if self._idle_envs else None
        if env is None:
            env = make_text_env(self.env_id, **self.env_config)
        session_id, session = uuid.uuid4().hex, _Session(env)
        with self.sessions_lock:
            self.sessions[session_id] = session
        return session_id, session

    def session(self, session_id: Any) -> _Session:
        with self.sessions_lock:
            session = self.sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None:
            raise _RequestError(HTTPStatus.NOT_FOUND, f"no session {session_id!r}: it ended, expired after "
                                f"{self.session_ttl_s:g} s idle, or the server restarted.")
        session.used = time.monotonic()
        return session

    def close_session(self, session_id: Any) -> None:
        with self.sessions_lock:
            session = self.sessions.pop(session_id, None) if isinstance(session_id, str) else None
            if session is not None:
                self._idle_envs.append(session.env)

    def _expire_idle_sessions(self) -> None:
        cutoff = time.monotonic() - self.session_ttl_s
        for session_id in [sid for sid, s in self.sessions.items() if s.used < cutoff]:
            self._idle_envs.append(self.sessions.pop(session_id).env)

    # ---- routes -----------------------------------------------------------------------------------------
    def reset(self, body: dict) -> dict:
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise _RequestError(HTTPStatus.BAD_REQUEST, f"seed must be an integer or null, got {seed!r}.")
        self.close_session(body.get("close"))
        session_id, session = self.open_session()
        with session.lock:
            observation, info = session.env.reset(seed=seed, options=body.get("options") or None)
            text_env = session.env.unwrapped
            return {"session_id": session_id, "observation": observation, "info": info,
                    "description": text_env.describe(), "action_names": list(text_env.action_names),
                    "action_pattern": getattr(text_env, "action_pattern", None),
                    "max_turns": getattr(text_env, "max_turns", None), "state_key": text_env.state_key()}

    def step(self, body: dict) -> dict:
        session = self.session(body.get("session_id"))
        index, action = body.get("index"), body.get("action")
        if not isinstance(action, str) or isinstance(index, bool) or not isinstance(index, int):
            raise _RequestError(HTTPStatus.BAD_REQUEST, "step needs a string 'action' and an integer 'index'.")
        with session.lock:
            if index == session.steps - 1 and session.last_result is not None:
                return session.last_result  # a retry of the step already taken
            if index != session.steps:
                raise _RequestError(HTTPStatus.BAD_REQUEST, f"step index {index}, but this session has taken "
                                    f"{session.steps} steps.")
            observation, reward, terminated, truncated, info = session.env.step(action)
            session.steps += 1
            session.last_result = {"observation": observation, "reward": _finite_or_text(float(reward)),
                                   "terminated": bool(terminated), "truncated": bool(truncated), "info": info,
                                   "state_key": session.env.unwrapped.state_key()}
            return session.last_result

    def state(self, session_id: Any) -> dict:
        session = self.session(session_id)
        with session.lock:
            text_env = session.env.unwrapped
            return {"observation": text_env.observation, "success": bool(text_env.success), "steps": session.steps}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: an env runner's connection serves a whole rollout
    # The headers and the body go out as two writes; with Nagle's algorithm on, the body then waits for the client's
    # delayed ACK (40 ms a request on Linux).
    disable_nagle_algorithm = True
    server: TextEnvServer

    def do_GET(self) -> None:
        url = urlparse(self.path)
        if url.path == "/health":
            self._reply(HTTPStatus.OK, {"status": "ok", "env": self.server.env_id,
                                        "sessions": len(self.server.sessions)})
        elif url.path == "/state":
            self._answer(lambda: self.server.state(parse_qs(url.query).get("session_id", [None])[0]))
        else:
            self._reply(HTTPStatus.NOT_FOUND, {"error": f"no route GET {url.path}"})

    def do_POST(self) -> None:
        routes = {"/reset": self.server.reset, "/step": self.server.step,
                  "/close": lambda body: self.server.close_session(body.get("session_id")) or {"closed": True}}
        route = routes.get(urlparse(self.path).path)
        try:
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length) or b"{}") if length else {}
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
        except ValueError as error:
            self._reply(HTTPStatus.BAD_REQUEST, {"error": f"bad JSON body: {error}"})
            return
        if route is None:
            self._reply(HTTPStatus.NOT_FOUND, {"error": f"no route POST {self.path}"})
            return
        self._answer(lambda: route(body))

    def _answer(self, compute) -> None:
        try:
            payload = compute()
        except _RequestError as error:
            self._reply(error.status, {"error": str(error)})
        except Exception as error:  # the environment's bug: report it, keep serving other sessions
            logger.error("environment call failed:\n%s", traceback.format_exc())
            self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(error).__name__}: {error}"})
        else:
            self._reply(HTTPStatus.OK, payload)

    def _reply(self, status: HTTPStatus, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # one line per request would flood the log
        logger.debug(format, *args)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rllib_ragen.envs.serve", description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True, help="a registered text-environment id, e.g. rllib_ragen/Sokoban-v0")
    parser.add_argument("--env-config", default="{}", help="the environment's constructor arguments, as JSON")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=int, default=8000, help="the port (0: any free one, printed at start)")
    parser.add_argument("--max-sessions", type=int, default=4096, help="episodes open at once")
    parser.add_argument("--session-ttl-s", type=float, default=600.0, help="an idle session ends after this long")
    parser.add_argument("--register", default=None,
                        help="import this module first (one that calls register_text_env for your environments)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.register:
        __import__(args.register)
    try:
        env_config = json.loads(args.env_config)
    except ValueError as error:
        parser.error(f"--env-config is not JSON: {error}")
    server = TextEnvServer((args.host, args.port), args.env, env_config, args.max_sessions, args.session_ttl_s)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    host, port = server.server_address[:2]
    print(f"serving {args.env} on http://{host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
