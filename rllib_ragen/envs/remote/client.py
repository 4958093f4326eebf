"""Our protocol's client: a text environment that lives in another process, container or machine, reached over HTTP.

``make_text_env("rllib_ragen/Remote-v0", url="http://127.0.0.1:8000")``, or in a config
``.environment("rllib_ragen/Remote-v0", env_config={"url": ...})``, plays whatever
``python -m rllib_ragen.envs.remote.server --env ID --port P`` serves there (the routes are in
:mod:`rllib_ragen.envs.remote.server`). With ``protocol="openenv"`` the id builds
:class:`rllib_ragen.envs.remote.openenv_client.OpenEnvTextEnv` instead
(:func:`rllib_ragen.envs.remote.remote_text_env`).

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
import math
import time
from typing import Any
from urllib.parse import urlparse

import regex

from ..base import TextEnv
from ..external import AnyText, move_matching
from .wire import PROTOCOLS, RemoteEnvError

# A server is trusted with its game, not with this process: what it sends is checked before it is used.
MAX_ACTION_PATTERN_CHARS = 256  # a served move syntax (a regular expression) longer than this is refused
ACTION_PATTERN_TIMEOUT_S = 0.05  # the longest one match of an answer against the served syntax may take
MAX_REPLY_OVERHEAD_BYTES = 65_536  # a reply's bytes beyond its texts (JSON escapes count 6 bytes a character)

# Errors of a connection that may succeed when made again (the server restarting, a dropped keep-alive socket).
_CONNECTION_ERRORS = (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine, BrokenPipeError)


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
    ``url``: the server, e.g. ``"http://127.0.0.1:8000"``. ``protocol``: ``"rllib_ragen"`` (default; the server
    of ``python -m rllib_ragen.envs.remote.server``) or ``"openenv"`` (any OpenEnv server, or ours with ``--protocol
    openenv``). ``request_timeout_s`` (30): the longest wait for one answer. ``connect_retries`` (4) and
    ``retry_backoff_s`` (0.2): a failed connection is retried after 0.2, 0.4, 0.8, ... seconds (``"rllib_ragen"``
    only: an OpenEnv episode lives on one connection). For OpenEnv servers that are not ours: ``action_field``,
    ``observation_field``, ``success_reward`` and ``raw_replies`` (see
    :class:`~rllib_ragen.envs.remote.openenv_client.OpenEnvTextEnv`). A server of ours says itself whether its
    environment reads raw replies (:attr:`TextEnv.raw_replies`).
    """

    def __init__(
        self,
        url: str,
        protocol: str = "rllib_ragen",
        request_timeout_s: float = 30.0,
        connect_retries: int = 4,
        retry_backoff_s: float = 0.2,
        max_observation_chars: int = 16384,
        action_field: str | None = None,
        observation_field: str | None = None,
        success_reward: float | None = None,
        raw_replies: bool | None = None,
        render_mode: str | None = "ansi",
    ):
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol={protocol!r}: choose one of {PROTOCOLS}.")
        if protocol == "openenv" and type(self) is RemoteTextEnv:  # this class speaks our protocol only
            raise ValueError(
                "protocol='openenv' is played by OpenEnvTextEnv: build it with "
                "rllib_ragen.envs.remote.remote_text_env(url, protocol='openenv') or make_text_env("
                "'rllib_ragen/Remote-v0', url=..., protocol='openenv')."
            )
        parsed = urlparse(url) if isinstance(url, str) else None
        if (
            parsed is None
            or parsed.scheme not in ("http", "https")
            or not parsed.hostname
            or (protocol == "rllib_ragen" and parsed.scheme != "http")
        ):
            raise ValueError(
                f"url={url!r}: give the server as http://HOST:PORT (python -m rllib_ragen.envs.remote.server)."
            )
        openenv_only = {
            "action_field": action_field,
            "observation_field": observation_field,
            "success_reward": success_reward,
            "raw_replies": raw_replies,
        }
        for name, value in openenv_only.items():
            if value is not None and protocol != "openenv":
                raise ValueError(f"{name}={value!r} applies to OpenEnv servers only: set protocol='openenv'.")
        for name in ("action_field", "observation_field"):
            if openenv_only[name] is not None and not isinstance(openenv_only[name], str):
                raise ValueError(f"{name}={openenv_only[name]!r} must be a field name (a string) or None.")
        if raw_replies is not None and not isinstance(raw_replies, bool):
            raise ValueError(f"raw_replies={raw_replies!r} must be True, False or None.")
        if success_reward is not None and (
            isinstance(success_reward, bool)
            or not isinstance(success_reward, (int, float))
            or not math.isfinite(success_reward)
        ):
            raise ValueError(f"success_reward={success_reward!r} must be a finite number or None.")
        for name, value in (("request_timeout_s", request_timeout_s), ("retry_backoff_s", retry_backoff_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"{name}={value!r} must be a positive, finite number of seconds.")
        if isinstance(connect_retries, bool) or not isinstance(connect_retries, int) or connect_retries < 0:
            raise ValueError(f"connect_retries={connect_retries!r} must be a whole number >= 0.")
        super().__init__(render_mode=render_mode, max_observation_chars=max_observation_chars)
        self.observation_space = AnyText(max_length=max_observation_chars)
        self.action_space = AnyText(max_length=256)
        self.url, self.request_timeout_s = url, float(request_timeout_s)
        self.max_observation_chars = max_observation_chars
        self.connect_retries, self.retry_backoff_s = connect_retries, float(retry_backoff_s)
        self.protocol, self.action_field, self.observation_field = protocol, action_field, observation_field
        self.success_reward = success_reward
        self.raw_replies = bool(raw_replies)  # a server of ours says so at each reset
        self._host, self._port = parsed.hostname, parsed.port or 80
        self._connection: http.client.HTTPConnection | None = None
        self._client = None  # OpenEnv's client, with protocol="openenv"
        self._ours, self._action_schema, self._server_description = True, {}, ""
        self._mcp = False  # an OpenEnv MCP tool server (openenv_client.py)
        self._session: str | None = None
        self._steps = 0
        self._description, self._observation, self._state_key = "", "", ""
        self._action_regex: regex.Pattern | None = None
        # The longest reply taken: an observation and a description, JSON-escaped, and the other fields.
        self._max_reply_bytes = 12 * max_observation_chars + MAX_REPLY_OVERHEAD_BYTES

    # ---- transport --------------------------------------------------------------------------------------
    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        """One JSON request, retried on connection errors with exponential backoff. By hand, not urllib3's ``Retry``:
        that counts a read timeout and a dropped connection alike (``read=``), and a timeout here must fail at once
        (the server may still be stepping) while a dropped connection is re-sent (the step index makes it safe)."""
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(self.connect_retries + 1):
            try:
                if self._connection is None:
                    self._connection = http.client.HTTPConnection(
                        self._host, self._port, timeout=self.request_timeout_s
                    )
                self._connection.request(method, path, body=data, headers={"Content-Type": "application/json"})
                response = self._connection.getresponse()
                raw = response.read(self._max_reply_bytes + 1)
                break
            except TimeoutError:
                self._drop_connection()
                raise TimeoutError(
                    f"{self.url}{path} did not answer within request_timeout_s={self.request_timeout_s:g} s"
                ) from None
            except (*_CONNECTION_ERRORS, OSError) as error:
                self._drop_connection()
                if attempt == self.connect_retries:
                    raise RemoteEnvError(
                        f"cannot reach the environment server at {self.url} after "
                        f"{attempt + 1} attempts ({type(error).__name__}: {error}); is "
                        "`python -m rllib_ragen.envs.remote.server` running there?"
                    ) from error
                time.sleep(self.retry_backoff_s * 2**attempt)
        if len(raw) > self._max_reply_bytes:
            self._drop_connection()  # the rest of that reply is never read
            raise RemoteEnvError(
                f"{self.url}{path} sent a reply of more than {self._max_reply_bytes:,} bytes, more "
                f"than texts of max_observation_chars={self.max_observation_chars} can take."
            )
        try:
            payload = json.loads(raw or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise RemoteEnvError(
                f"{self.url}{path} answered {response.status} with something that is not JSON ({error}): {raw[:80]!r}"
            ) from None
        if not isinstance(payload, dict):
            raise RemoteEnvError(f"{self.url}{path} answered a JSON {type(payload).__name__}, not an object.")
        if response.status != 200:
            raise RemoteEnvError(f"{self.url}{path} answered {response.status}: {payload.get('error', payload)}")
        return payload

    def _field(self, reply: dict, path: str, name: str, kind, *, optional: bool = False):
        """``reply[name]``, checked to be of ``kind`` (``str``, ``int``, ``float``, ``bool``, ``dict``, or
        ``list`` of strings): a server's field of another kind is its fault, named here rather than failing later."""
        value = reply.get(name)
        if value is None and optional:
            return None
        if kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        elif kind is list:
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        else:
            ok = isinstance(value, kind)
        if not ok:
            wanted = {
                float: "a number",
                int: "a whole number >= 1",
                list: "a list of strings",
                bool: "true or false",
                str: "a string",
                dict: "an object",
            }[kind]
            raise RemoteEnvError(
                f"{self.url}{path} sent {name}={value!r:.80}: expected {wanted}{' or null' if optional else ''}."
            )
        if kind is str and name in ("observation", "description") and len(value) > self.max_observation_chars:
            raise RemoteEnvError(
                f"{self.url}{path} sent {name} text of {len(value):,} characters; this client "
                f"takes at most max_observation_chars={self.max_observation_chars}."
            )
        return value

    def _served_tools(self, reply: dict, path: str) -> list[dict]:
        """``reply["tools"]``: function schemas, each ``{"type": "function", "function": {"name": ..., ...}}``, or
        none."""
        tools = reply.get("tools") or []
        if not isinstance(tools, list) or not all(
            isinstance(tool, dict)
            and isinstance(tool.get("function"), dict)
            and isinstance(tool["function"].get("name"), str)
            for tool in tools
        ):
            raise RemoteEnvError(
                f"{self.url}{path} sent tools={tools!r:.80}: expected a list of function schemas "
                "({'type': 'function', 'function': {'name': ..., 'parameters': ...}}) or null."
            )
        return tools

    def _compile_action_pattern(self, pattern: str | None):
        if pattern is None:
            return None
        if len(pattern) > MAX_ACTION_PATTERN_CHARS:
            raise RemoteEnvError(
                f"{self.url}/reset sent an action_pattern of {len(pattern)} characters; at most "
                f"{MAX_ACTION_PATTERN_CHARS} are taken."
            )
        try:
            return regex.compile(pattern, regex.IGNORECASE)
        except regex.error as error:
            raise RemoteEnvError(
                f"{self.url}/reset sent action_pattern={pattern!r}, which does not compile ({error})."
            ) from None

    def _drop_connection(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    # ---- TextEnv ----------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super(TextEnv, self).reset(seed=seed)
        self.reset_options = options or {}
        reply = self._request("POST", "/reset", {"seed": seed, "options": self.reset_options, "close": self._session})
        if "session_id" not in reply and isinstance(reply.get("observation"), dict) and "done" in reply:
            raise RemoteEnvError(
                f"{self.url}/reset answered in OpenEnv's shape (an observation object and 'done', no "
                "session): play it with env_config protocol='openenv'."
            )
        self._session, self._steps, self._success = self._field(reply, "/reset", "session_id", str), 0, False
        return self._start_episode(reply, "/reset", "observation")

    def _start_episode(self, reply: dict, where: str, text_field: str) -> tuple[str, dict]:
        """Take what a server of ours sends at a reset (``wire.episode_start``, and the observation under
        ``text_field``), each field checked; return the observation and the info."""
        field = lambda name, kind, **kw: self._field(reply, where, name, kind, **kw)  # noqa: E731
        self._description, self._observation = field("description", str), field(text_field, str)
        self._state_key = field("state_key", str)
        self.action_names = tuple(field("action_names", list))
        self._action_lookup = {name.lower(): i for i, name in enumerate(self.action_names)}
        self._action_regex = self._compile_action_pattern(field("action_pattern", str, optional=True) or None)
        self.max_turns = field("max_turns", int, optional=True)
        self.raw_replies = bool(field("raw_replies", bool, optional=True))
        self.tools = self._served_tools(reply, where)
        return self._observation, field("info", dict)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self._session is None:
            raise RemoteEnvError("step() before reset(): there is no session on the server yet.")
        reply = self._request("POST", "/step", {"session_id": self._session, "action": action, "index": self._steps})
        self._steps += 1
        field = lambda name, kind: self._field(reply, "/step", name, kind)  # noqa: E731
        self._observation, self._state_key = field("observation", str), field("state_key", str)
        info = field("info", dict)
        self._success = bool(info.get("success", False))
        reward, terminated = float(field("reward", float)), field("terminated", bool)
        return self._observation, reward, terminated, field("truncated", bool), info

    def canonical_action(self, text: str) -> str | None:
        """Checked here, as the served environment checks it: an action name, or a move matching its syntax; an
        environment that reads raw replies gets any non-empty one, as written."""
        if self.raw_replies:
            return text if isinstance(text, str) and text.strip() else None
        if self.action_names:
            return super().canonical_action(text)
        try:  # a served pattern may backtrack for ages on some answers: each match is bounded in time
            return move_matching(text, self._action_regex, timeout=ACTION_PATTERN_TIMEOUT_S)
        except TimeoutError:
            raise RemoteEnvError(
                f"{self.url}'s action_pattern took over {ACTION_PATTERN_TIMEOUT_S} s to match an "
                f"answer of {len(' '.join(text.split()))} characters (a pattern that backtracks "
                "exponentially?); fix the served game's move syntax."
            ) from None

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
