"""A text environment that lives in another process, container or machine, reached over HTTP.

``make_text_env("rllib_ragen/Remote-v0", url="http://127.0.0.1:8000")``, or in a config
``.environment("rllib_ragen/Remote-v0", env_config={"url": ...})``, plays whatever
``python -m rllib_ragen.envs.serve --env ID --port P`` serves there (the routes are in
:mod:`rllib_ragen.envs.serve`).

Failures stay inside the episode. A refused or dropped connection is retried with exponential backoff
(``connect_retries``); a step is sent with its index, so a retry after a lost response never steps twice. A server
that stays down, answers with an error, or has forgotten the session raises :class:`RemoteEnvError`; one that
answers too slowly raises ``TimeoutError`` after ``request_timeout_s``. The rollout engine drops such an episode and
counts it (``rollout/env_errors``; ``rollout/env_timeouts`` when ``env_step_timeout_s`` passes first), so a dead or
slow server never hangs or crashes a run.
"""

from __future__ import annotations

import http.client
import json
import re
import time
from typing import Any
from urllib.parse import urlparse

from .base import TextEnv
from .external import AnyText, move_matching

# Errors of a connection that may succeed when made again (the server restarting, a dropped keep-alive socket).
_CONNECTION_ERRORS = (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine, BrokenPipeError)


class RemoteEnvError(RuntimeError):
    """The remote environment could not be reached, or answered with an error."""


class RemoteTextEnv(TextEnv):
    """A :class:`TextEnv` whose every reset and step is a request to an environment server.

    ## Description
    One episode is one server session: ``reset`` opens it (closing the previous one), ``step`` advances it.

    ## Action Space
    The served environment's: its action names, or its move syntax for adapted games, sent with the first reset;
    the protocol checks answer pieces against them locally, so a malformed piece costs no request.

    ## Observation Space
    The served environment's text, and its ``describe()``.

    ## Rewards and Episode End
    The served environment's.

    ## Arguments
    ``url``: the server, e.g. ``"http://127.0.0.1:8000"``. ``request_timeout_s`` (30): the longest wait for one
    answer. ``connect_retries`` (4) and ``retry_backoff_s`` (0.2): a failed connection is retried after 0.2, 0.4,
    0.8, ... seconds.
    """

    def __init__(self, url: str, request_timeout_s: float = 30.0, connect_retries: int = 4,
                 retry_backoff_s: float = 0.2, max_observation_chars: int = 16384, render_mode: str | None = "ansi"):
        parsed = urlparse(url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"url={url!r}: give the server as http://HOST:PORT (python -m rllib_ragen.envs.serve).")
        for name, value in (("request_timeout_s", request_timeout_s), ("retry_backoff_s", retry_backoff_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name}={value!r} must be a positive number of seconds.")
        if isinstance(connect_retries, bool) or not isinstance(connect_retries, int) or connect_retries < 0:
            raise ValueError(f"connect_retries={connect_retries!r} must be a whole number >= 0.")
        super().__init__(render_mode=render_mode, max_observation_chars=max_observation_chars)
        self.observation_space = AnyText(max_length=max_observation_chars)
        self.action_space = AnyText(max_length=256)
        self.url, self.request_timeout_s = url, float(request_timeout_s)
        self.connect_retries, self.retry_backoff_s = connect_retries, float(retry_backoff_s)
        self._host, self._port = parsed.hostname, parsed.port or 80
        self._connection: http.client.HTTPConnection | None = None
        self._session: str | None = None
        self._steps = 0
        self._description, self._observation, self._state_key = "", "", ""
        self._action_regex: re.Pattern | None = None

    # ---- transport --------------------------------------------------------------------------------------
    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        """One JSON request, retried on connection errors with exponential backoff."""
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(self.connect_retries + 1):
            try:
                if self._connection is None:
                    self._connection = http.client.HTTPConnection(self._host, self._port,
                                                                  timeout=self.request_timeout_s)
                self._connection.request(method, path, body=data, headers={"Content-Type": "application/json"})
                response = self._connection.getresponse()
                payload = json.loads(response.read() or b"{}")
                break
            except TimeoutError:
                self._drop_connection()
                raise TimeoutError(f"{self.url}{path} did not answer within request_timeout_s="
                                   f"{self.request_timeout_s:g} s") from None
            except (*_CONNECTION_ERRORS, OSError) as error:
                self._drop_connection()
                if attempt == self.connect_retries:
                    raise RemoteEnvError(f"cannot reach the environment server at {self.url} after "
                                         f"{attempt + 1} attempts ({type(error).__name__}: {error}); is "
                                         "`python -m rllib_ragen.envs.serve` running there?") from error
                time.sleep(self.retry_backoff_s * 2 ** attempt)
        if response.status != 200:
            raise RemoteEnvError(f"{self.url}{path} answered {response.status}: {payload.get('error', payload)}")
        return payload

    def _drop_connection(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    # ---- TextEnv ----------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super(TextEnv, self).reset(seed=seed)
        self.reset_options = options or {}
        reply = self._request("POST", "/reset", {"seed": seed, "options": self.reset_options,
                                                 "close": self._session})
        self._session, self._steps, self._success = reply["session_id"], 0, False
        self._description, self._observation = reply["description"], reply["observation"]
        self._state_key = reply["state_key"]
        self.action_names = tuple(reply["action_names"])
        self._action_lookup = {name.lower(): i for i, name in enumerate(self.action_names)}
        pattern = reply.get("action_pattern")
        self._action_regex = re.compile(pattern, re.IGNORECASE) if pattern else None
        self.max_turns = reply.get("max_turns")
        return self._observation, reply["info"]

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self._session is None:
            raise RemoteEnvError("step() before reset(): there is no session on the server yet.")
        reply = self._request("POST", "/step", {"session_id": self._session, "action": action, "index": self._steps})
        self._steps += 1
        self._observation, self._state_key = reply["observation"], reply["state_key"]
        self._success = bool(reply["info"].get("success", False))
        return (self._observation, float(reply["reward"]), reply["terminated"], reply["truncated"], reply["info"])

    def canonical_action(self, text: str) -> str | None:
        """Checked here, as the served environment checks it: an action name, or a move matching its syntax."""
        return super().canonical_action(text) if self.action_names else move_matching(text, self._action_regex)

    def describe(self) -> str:
        return self._description

    def state_key(self) -> str:
        return self._state_key

    def _render_text(self) -> str:
        return self._observation

    def close(self) -> None:
        if self._session is not None:
            try:
                self._request("POST", "/close", {"session_id": self._session})
            except (RemoteEnvError, TimeoutError):
                pass  # the server is gone; its sessions went with it
            self._session = None
        self._drop_connection()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_connection"] = None  # sockets do not travel; the copy opens its own
        return state
