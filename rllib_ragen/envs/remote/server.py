"""Serve any registered text environment over HTTP: ``python -m rllib_ragen.envs.remote.server --env ID --port P``.

rllib_ragen's own protocol (``--protocol openenv`` serves OpenEnv's instead: ``openenv_server.py``): one session per
episode, JSON over HTTP/1.1 with keep-alive:

- ``POST /reset`` ``{"seed": int | null, "options": {...}, "close": previous session id | null}`` starts an episode
  and returns ``{"session_id", "observation", "info", "description", "action_names", "action_pattern",
  "max_turns", "state_key"}``;
- ``POST /step`` ``{"session_id", "action", "index"}`` returns ``{"observation", "reward", "terminated", "truncated",
  "info", "state_key"}``. ``index`` counts the session's steps from 0: a repeated index (a client retrying after a
  lost response) returns the recorded result instead of stepping twice;
- ``GET /state?session_id=...`` returns the episode's current ``observation``, ``success`` and ``steps``;
- ``POST /close`` ``{"session_id"}`` ends a session; idle sessions also end after ``--session-ttl-s``;
- ``GET /health`` returns ``{"status": "ok", "env": ID, "sessions": n}``.

Errors come back as ``{"error": message}`` with status 400 (a bad request), 404 (an unknown session), 413 (a body
over ``--max-body-bytes``), 503 (too many sessions) or 500 (the environment raised; logged once per kind of
error with a count, :class:`EnvironmentErrorLog`). The client is :class:`rllib_ragen.envs.remote.client.RemoteTextEnv`.

What a client cannot do to the server: hold a thread with a request it never finishes (``--request-timeout-s``),
make it read a body of any size, crash a request with a deeply nested body, or fill the session table with resets
the environment refuses (a failed reset closes its session).

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
import socket
import sys
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import gymnasium as gym

from .. import make_text_env
from .wire import PROTOCOLS, EnvironmentErrorLog, episode_start

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
        max_body_bytes: the largest request body read; a larger one is refused with 413, unread.
        request_timeout_s: how long a connection may wait for the client's next bytes before it is closed.
    """

    daemon_threads = True
    request_queue_size = 256  # the listen backlog (the standard library's 5 resets clients that connect at once)

    def __init__(
        self,
        address: tuple[str, int],
        env: str,
        env_config: dict | None = None,
        max_sessions: int = 4096,
        session_ttl_s: float = 600.0,
        max_body_bytes: int = 1 << 20,
        request_timeout_s: float = 60.0,
    ):
        self.env_id, self.env_config = env, dict(env_config or {})
        make_text_env(env, **self.env_config).close()  # fail at start-up, not on the first request
        self.max_sessions, self.session_ttl_s = max_sessions, session_ttl_s
        self.max_body_bytes, self.request_timeout_s = max_body_bytes, request_timeout_s
        self.sessions: dict[str, _Session] = {}
        self.sessions_lock = threading.Lock()
        self._idle_envs: list = []  # closed sessions' environments, reused by later resets
        self.errors = EnvironmentErrorLog(logger)
        super().__init__(address, _Handler)

    def handle_error(self, request, client_address) -> None:
        """A connection that failed outside a route (most often the client went away mid-reply): one log line,
        where the standard library prints a traceback per connection on stderr."""
        error = sys.exc_info()[1]
        level = logging.DEBUG if isinstance(error, (ConnectionError, TimeoutError)) else logging.ERROR
        logger.log(level, "connection from %s ended: %s: %s", client_address[0], type(error).__name__, error)

    # ---- sessions ---------------------------------------------------------------------------------------
    def open_session(self) -> tuple[str, _Session]:
        with self.sessions_lock:
            self._expire_idle_sessions()
            if len(self.sessions) >= self.max_sessions:
                raise _RequestError(
                    HTTPStatus.SERVICE_UNAVAILABLE,
                    f"{len(self.sessions)} sessions are open (the "
                    f"limit, --max-sessions {self.max_sessions}); close finished ones.",
                )
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
            raise _RequestError(
                HTTPStatus.NOT_FOUND,
                f"no session {session_id!r}: it ended, expired after "
                f"{self.session_ttl_s:g} s idle, or the server restarted.",
            )
        session.used = time.monotonic()
        return session

    def close_session(self, session_id: Any, reuse: bool = True) -> None:
        """End a session; its environment serves a later reset unless ``reuse`` is False (one whose reset failed,
        in a state nobody knows, is dropped)."""
        with self.sessions_lock:
            session = self.sessions.pop(session_id, None) if isinstance(session_id, str) else None
            if session is not None and reuse:
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
            try:
                observation, info = session.env.reset(seed=seed, options=body.get("options") or None)
            except BaseException:  # refused (a bad seed) or broken: its session must not stay open
                self.close_session(session_id, reuse=False)
                raise
            return {
                "session_id": session_id,
                "observation": observation,
                "info": info,
                **episode_start(session.env.unwrapped),
            }

    def step(self, body: dict) -> dict:
        session = self.session(body.get("session_id"))
        index, action = body.get("index"), body.get("action")
        if not isinstance(action, str) or isinstance(index, bool) or not isinstance(index, int):
            raise _RequestError(HTTPStatus.BAD_REQUEST, "step needs a string 'action' and an integer 'index'.")
        with session.lock:
            if index == session.steps - 1 and session.last_result is not None:
                return session.last_result  # a retry of the step already taken
            if index != session.steps:
                raise _RequestError(
                    HTTPStatus.BAD_REQUEST, f"step index {index}, but this session has taken {session.steps} steps."
                )
            observation, reward, terminated, truncated, info = session.env.step(action)
            session.steps += 1
            session.last_result = {
                "observation": observation,
                "reward": _finite_or_text(float(reward)),
                "terminated": bool(terminated),
                "truncated": bool(truncated),
                "info": info,
                "state_key": session.env.unwrapped.state_key(),
            }
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

    def setup(self) -> None:
        self.timeout = self.server.request_timeout_s  # a client that stops sending loses its connection, not a thread
        super().setup()

    def do_GET(self) -> None:
        url = urlparse(self.path)
        if url.path == "/health":
            self._reply(
                HTTPStatus.OK, {"status": "ok", "env": self.server.env_id, "sessions": len(self.server.sessions)}
            )
        elif url.path == "/state":
            self._answer(lambda: self.server.state(parse_qs(url.query).get("session_id", [None])[0]))
        else:
            self._reply(HTTPStatus.NOT_FOUND, {"error": f"no route GET {url.path}"})

    def do_POST(self) -> None:
        routes = {
            "/reset": self.server.reset,
            "/step": self.server.step,
            "/close": lambda body: self.server.close_session(body.get("session_id")) or {"closed": True},
        }
        route = routes.get(urlparse(self.path).path)
        try:
            length = int(self.headers.get("Content-Length", 0))
        except ValueError:
            length = -1
        if not 0 <= length <= self.server.max_body_bytes:
            self.close_connection = True  # the body is left unread: this connection cannot carry another request
            status = HTTPStatus.BAD_REQUEST if length < 0 else HTTPStatus.REQUEST_ENTITY_TOO_LARGE
            self._reply(
                status,
                {
                    "error": f"Content-Length {self.headers.get('Content-Length')!r}: a body of 0 to "
                    f"{self.server.max_body_bytes} bytes (--max-body-bytes) is read."
                },
            )
            return
        try:
            body = json.loads(self.rfile.read(length) or b"{}") if length else {}
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
        except (ValueError, RecursionError) as error:  # RecursionError: a body nested too deep to parse
            self._reply(HTTPStatus.BAD_REQUEST, {"error": f"bad JSON body: {type(error).__name__}: {error}"})
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
        except Exception as error:  # the environment's bug: logged once per kind, and the other sessions go on
            self.server.errors.record(f"{self.command} {urlparse(self.path).path}", error)
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
    parser = argparse.ArgumentParser(
        prog="python -m rllib_ragen.envs.remote.server", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--env", required=True, help="a registered text-environment id, e.g. rllib_ragen/Sokoban-v0")
    parser.add_argument("--env-config", default="{}", help="the environment's constructor arguments, as JSON")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=int, default=8000, help="the port (0: any free one, printed at start)")
    parser.add_argument("--max-sessions", type=int, default=4096, help="episodes open at once")
    parser.add_argument("--session-ttl-s", type=float, default=600.0, help="an idle session ends after this long")
    parser.add_argument(
        "--max-body-bytes", type=int, default=1 << 20, help="the largest request body read (413 past it)"
    )
    parser.add_argument(
        "--request-timeout-s",
        type=float,
        default=60.0,
        help="a connection whose client sends nothing for this long is closed",
    )
    parser.add_argument(
        "--register",
        default=None,
        help="import this module first (one that calls register_text_env for your environments)",
    )
    parser.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        default="rllib_ragen",
        help="rllib_ragen: this module's HTTP sessions (RemoteTextEnv's default); openenv: OpenEnv's "
        "app (/ws, /schema, /metadata), for OpenEnv's clients and RemoteTextEnv(protocol="
        "'openenv'); needs the openenv extra (default: rllib_ragen)",
    )
    args = parser.parse_args(argv)
    for flag, value, least in (("--max-sessions", args.max_sessions, 1), ("--max-body-bytes", args.max_body_bytes, 0)):
        if value < least:
            parser.error(f"{flag} {value}: give at least {least}.")
    for flag, value in (("--session-ttl-s", args.session_ttl_s), ("--request-timeout-s", args.request_timeout_s)):
        if not (math.isfinite(value) and value > 0):  # a timeout of 0 would make every socket non-blocking
            parser.error(f"{flag} {value}: give a number of seconds above 0.")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.register:
        __import__(args.register)
    try:
        env_config = json.loads(args.env_config)
    except ValueError as error:
        parser.error(f"--env-config is not JSON: {error}")
    if args.protocol == "openenv":
        _serve_openenv(parser, args, env_config)
        return
    try:
        server = TextEnvServer(
            (args.host, args.port),
            args.env,
            env_config,
            args.max_sessions,
            args.session_ttl_s,
            args.max_body_bytes,
            args.request_timeout_s,
        )
    except (gym.error.Error, ValueError, TypeError, OSError) as error:  # an unknown id, bad arguments, a busy port
        parser.error(
            f"cannot serve --env {args.env} with --env-config {args.env_config} on {args.host}:{args.port}: "
            f"{type(error).__name__}: {error}"
        )
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    host, port = server.server_address[:2]
    print(f"serving {args.env} on http://{host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


PENDING_CONNECTIONS = 1024  # the OpenEnv server's connections beyond --max-sessions (uvicorn answers 503 past them)


def head_deadline_protocol(timeout_s: float):
    """uvicorn's h11 protocol, with a deadline on each request's arrival: a connection whose request head and body
    have not arrived whole within ``timeout_s`` of its start (or of the previous answer) is closed. uvicorn times out
    only an idle keep-alive connection, so a client that sends half a head and then a byte now and then would hold
    its connection for ever, and enough of them would fill ``limit_concurrency``."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadDeadlineH11(H11Protocol):
        def connection_made(self, transport):
            super().connection_made(transport)
            self._arm_request_deadline()

        def on_response_complete(self):
            super().on_response_complete()
            self._arm_request_deadline()

        def _arm_request_deadline(self):
            self._request_number = getattr(self, "_request_number", 0) + 1  # an earlier request's deadline is void
            self.loop.call_later(timeout_s, self._request_deadline, self._request_number)

        def _request_deadline(self, number):
            upgraded = self.transport.get_protocol() is not self  # a WebSocket now: its own limits apply
            if (
                number == self._request_number
                and not upgraded
                and not self.transport.is_closing()
                and self.conn.their_state in (h11.IDLE, h11.SEND_BODY)
            ):
                self.transport.close()  # the request has not arrived whole in time

    return HeadDeadlineH11


def _serve_openenv(parser: argparse.ArgumentParser, args: argparse.Namespace, env_config: dict) -> None:
    """OpenEnv's app (``openenv_server.openenv_app``) under uvicorn, with this server's limits: a WebSocket message,
    request head or body over ``--max-body-bytes`` is refused; a connection whose request has not arrived whole within
    ``--request-timeout-s`` is closed (``HeadDeadlineH11``), and so is an idle keep-alive one; an idle WebSocket
    session ends after ``--session-ttl-s``."""
    try:
        import uvicorn

        from .openenv_server import openenv_app
    except ImportError as error:
        parser.error(f'--protocol openenv needs the openenv package ({error}): pip install "rllib_ragen[openenv]"')
    try:
        app = openenv_app(args.env, env_config, args.max_sessions, args.session_ttl_s, args.max_body_bytes)
        listening = socket.create_server((args.host, args.port), backlog=TextEnvServer.request_queue_size)
    except (gym.error.Error, ValueError, TypeError, OSError) as error:
        parser.error(
            f"cannot serve --env {args.env} with --env-config {args.env_config} on {args.host}:{args.port}: "
            f"{type(error).__name__}: {error}"
        )
    # Connections beyond the sessions: requests being read or answered. A client that stops sending part-way loses
    # its connection at --request-timeout-s, so only as many as arrive in that time can wait at once.
    config = uvicorn.Config(
        app,
        log_level="warning",
        ws_max_size=max(args.max_body_bytes, 1),
        h11_max_incomplete_event_size=max(args.max_body_bytes, 1),
        timeout_keep_alive=max(1, round(args.request_timeout_s)),
        http=head_deadline_protocol(args.request_timeout_s),
        limit_concurrency=args.max_sessions + PENDING_CONNECTIONS,
    )
    host, port = listening.getsockname()[:2]
    print(f"serving {args.env} on http://{host}:{port} (OpenEnv)", flush=True)
    uvicorn.Server(config).run(sockets=[listening])


if __name__ == "__main__":
    main()
