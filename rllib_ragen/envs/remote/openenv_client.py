"""Any OpenEnv server played as a text environment: :class:`OpenEnvTextEnv`, through OpenEnv's own
``GenericEnvClient`` (``make_text_env("rllib_ragen/Remote-v0", url=..., protocol="openenv")``)."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from typing import Any

from openenv.core.env_server import Observation

from ..base import TextEnv
from .client import RemoteTextEnv
from .openenv import TextObservation
from .wire import RemoteEnvError

logger = logging.getLogger(__name__)

# ---- playing: an OpenEnv server as a text environment ------------------------------------------------------------
OUR_FIELDS = frozenset(TextObservation.model_fields) - frozenset(Observation.model_fields)
_OPENENV_RESERVED = frozenset({"done", "reward", "metadata"})


class OpenEnvTextEnv(RemoteTextEnv):
    """An OpenEnv server played as a text environment (``remote_text_env(url, protocol="openenv")``; the
    arguments are ``RemoteTextEnv``'s).

    One episode is one WebSocket session of OpenEnv's ``GenericEnvClient``. At the first reset the server's
    ``/schema`` and ``/metadata`` are read:

    - a server of :func:`openenv_app` (its observation has :class:`TextObservation`'s fields) is played exactly as
      in process: its action list or move syntax, state keys, success and truncation;
    - any other server: the observation's fields (``done``, ``reward`` and ``metadata`` aside) become the text, the
      one named by ``observation_field`` or the only string one, else all of them as JSON; the answer fills the
      action's ``action_field`` (default: its only required string field), else it must be a JSON object that
      matches the action schema (checked here: a mismatch costs the format penalty and no request); with
      ``raw_replies=True`` the whole reply fills ``action_field`` as written, for servers that parse model text
      themselves. The episode ends when ``done``; a reward of null is 0; success is the observation's ``success``
      field or metadata when sent, else a final reward of at least ``success_reward`` (None: never).
    - an MCP tool server (an ``MCPEnvironment``, whose action is OpenEnv's ``CallToolAction``) is played in tool
      mode: after each reset its ``list_tools`` become ``tools``, each call of the policy is a ``call_tool`` step,
      and the call's result (or its error) is the observation; reward, ``done`` and success as above.
    """

    def _connect(self) -> None:
        from openenv.core.generic_client import GenericEnvClient

        if self._client is not None:
            return
        schema, metadata = self._get_json("/schema"), self._get_json("/metadata")
        action, observation = schema.get("action"), schema.get("observation")
        if not isinstance(action, dict) or not isinstance(observation, dict):
            raise RemoteEnvError(
                f"{self.url}/schema answered without action and observation schemas: {json.dumps(schema)[:120]}"
            )
        self._ours = OUR_FIELDS <= set(observation.get("properties", {}))
        self._mcp = not self._ours and {"tool_name", "arguments"} <= set(action.get("properties", {}))
        self._action_schema = action
        self._server_description = str(metadata.get("description") or "")
        if not self._ours and not self._mcp:
            self._choose_action_field(action)
            fields = set(observation.get("properties", {})) - _OPENENV_RESERVED
            if self.observation_field is not None and self.observation_field not in fields:
                raise RemoteEnvError(
                    f"observation_field={self.observation_field!r}, but {self.url}'s observation "
                    f"has the fields {sorted(fields)}."
                )
        self._client = GenericEnvClient(
            base_url=self.url, connect_timeout_s=self.request_timeout_s, message_timeout_s=self.request_timeout_s
        )

    def _choose_action_field(self, schema: dict) -> None:
        properties = {k: v for k, v in schema.get("properties", {}).items() if k != "metadata"}
        if self.action_field is not None:
            if self.action_field not in properties:
                raise RemoteEnvError(
                    f"action_field={self.action_field!r}, but {self.url}'s action has the fields {sorted(properties)}."
                )
            return
        required = [k for k in schema.get("required", ()) if k in properties]
        strings = [k for k in required if properties[k].get("type") == "string"]
        self.action_field = strings[0] if len(required) == 1 and strings else None  # None: a JSON object
        if self.raw_replies and self.action_field is None:
            raise RemoteEnvError(
                f"raw_replies=True, but {self.url}'s action is not one string field "
                f"({sorted(properties)}): name the field that takes the reply with action_field."
            )

    def _get_json(self, path: str) -> dict:
        try:
            with urllib.request.urlopen(self.url + path, timeout=self.request_timeout_s) as response:
                raw = response.read(self._max_reply_bytes + 1)
        except urllib.error.HTTPError as error:
            raise RemoteEnvError(
                f"{self.url}{path} answered HTTP {error.code}: not an OpenEnv server? (A "
                "`python -m rllib_ragen.envs.remote.server` server without --protocol openenv is "
                "played with protocol='rllib_ragen'.)"
            ) from None
        except (urllib.error.URLError, OSError) as error:
            raise RemoteEnvError(f"cannot reach the OpenEnv server at {self.url} ({error}).") from None
        try:
            payload = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise RemoteEnvError(f"{self.url}{path} answered something that is not JSON: {raw[:80]!r}") from None
        if not isinstance(payload, dict):
            raise RemoteEnvError(f"{self.url}{path} answered a JSON {type(payload).__name__}, not an object.")
        return payload

    def _send(self, what: str, call):
        """One reset or step through OpenEnv's client, its failures turned into the two the rollout engine counts."""
        try:
            return call()
        except TimeoutError:
            self._drop_client()
            raise TimeoutError(
                f"{self.url} did not answer a {what} within request_timeout_s={self.request_timeout_s:g} s"
            ) from None
        except Exception as error:  # a refused connection, a closed socket, an error frame
            self._drop_client()
            raise RemoteEnvError(
                f"the OpenEnv server at {self.url} failed a {what}: {type(error).__name__}: {error}"
            ) from None

    def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # its connection is already broken; the caller raises the failure that led here
                pass

    # ---- TextEnv ----------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super(TextEnv, self).reset(seed=seed)  # gymnasium seeds np_random; the server builds the state
        self.reset_options = options or {}
        self._connect()
        arguments = {"seed": seed} if seed is not None else {}
        if self.reset_options:
            arguments["options"] = self.reset_options
        result = self._send("reset", lambda: self._client.reset(**arguments))
        self._steps, self._success = 0, False
        observation = self._checked_observation(result.observation, "reset")
        if self._ours:
            return self._start_episode(observation, "/ws reset", "text")
        self.action_names, self._action_lookup, self.max_turns = (), {}, None
        self._observation = self._foreign_text(observation)
        self._state_key, self._description = self._observation, self._foreign_description()
        if self._mcp:
            self.tools = self._list_tools()
        return self._observation, {"success": False}

    def _list_tools(self) -> list[dict]:
        """The MCP server's tools as function schemas (``list_tools``, one step that changes nothing)."""
        listed = self._checked_observation(
            self._send("list_tools", lambda: self._client.step({"type": "list_tools"})).observation, "list_tools"
        ).get("tools")
        if not isinstance(listed, list) or not all(
            isinstance(t, dict) and isinstance(t.get("name"), str) for t in listed
        ):
            raise RemoteEnvError(
                f"{self.url} answered list_tools with tools={listed!r:.120}: expected a list of tools with names."
            )
        return [
            {
                "type": "function",
                "function": {
                    "name": tool["name"],
                    "description": str(tool.get("description") or ""),
                    "parameters": tool.get("input_schema")
                    or tool.get("inputSchema")
                    or {"type": "object", "properties": {}},
                },
            }
            for tool in listed
        ]

    def _tool_result_text(self, observation: dict) -> tuple[str, bool]:
        """An MCP call's observation as the text the policy reads, and whether the call failed."""
        error = observation.get("error")
        if error:
            message = error.get("message") if isinstance(error, dict) else error
            return f"Error: {message}", True
        result = observation.get("result")
        if isinstance(result, dict):
            texts = [
                part.get("text")
                for part in result.get("content") or ()
                if isinstance(part, dict) and isinstance(part.get("text"), str)
            ]
            failed = bool(result.get("is_error"))
            if texts:
                return "\n".join(texts), failed
            result = result.get("data", result)
        return (result if isinstance(result, str) else json.dumps(result, sort_keys=True, default=str)), False

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self._client is None:
            raise RemoteEnvError(f"step() without an open episode on {self.url}: reset() first.")
        if self._mcp:
            call = json.loads(action)
            payload = {"type": "call_tool", "tool_name": call["name"], "arguments": call.get("arguments") or {}}
        else:
            payload = (
                {"message": action}
                if self._ours
                else ({self.action_field: action} if self.action_field else json.loads(action))
            )
        result = self._send("step", lambda: self._client.step(payload))
        self._steps += 1
        observation = self._checked_observation(result.observation, "step")
        reward = result.reward
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
            raise RemoteEnvError(f"{self.url} sent reward={reward!r:.80}: expected a number or null.")
        reward, done = float(reward or 0.0), bool(result.done)
        if self._ours:
            reply = lambda name, kind: self._field(observation, "/ws step", name, kind)  # noqa: E731
            self._observation, self._state_key = reply("text", str), reply("state_key", str)
            info = reply("info", dict)
            reward = float(info.pop("nonfinite_reward", reward))
            self._success, truncated = reply("success", bool), reply("truncated", bool)
            return self._observation, reward, done and not truncated, truncated, info
        tool_error = False
        if self._mcp:
            text, tool_error = self._tool_result_text(observation)
            if len(text) > self.max_observation_chars:
                raise RemoteEnvError(
                    f"{self.url} sent a tool result of {len(text):,} characters; this client takes at "
                    f"most max_observation_chars={self.max_observation_chars}."
                )
            self._observation = text
            self._state_key = f"{self._state_key}\n{action}"  # the task and the calls so far
        else:
            self._observation = self._state_key = self._foreign_text(observation)
        metadata = result.metadata if isinstance(result.metadata, dict) else {}
        said = observation.get("success", metadata.get("success"))
        if isinstance(said, bool):
            self._success = said
        elif done and self.success_reward is not None:
            self._success = reward >= self.success_reward
        info = {"success": self._success, "action_is_valid": True, "action_is_effective": not tool_error}
        if self._mcp:
            info["tool_error"] = tool_error
        return self._observation, reward, done, False, info

    def canonical_action(self, text: str) -> str | None:
        if self._ours or self._client is None or self.raw_replies:
            return super().canonical_action(text)
        text = text.strip()
        if not text:
            return None
        if self.action_field is not None:
            return text
        return self._matching_json(text)

    def _matching_json(self, text: str) -> str | None:
        """The answer as a JSON object that the server's action schema accepts, or None (a format error)."""
        import jsonschema

        try:
            value = json.loads(text)
            jsonschema.validate(value, self._action_schema)
        except (ValueError, RecursionError, jsonschema.ValidationError):
            return None
        return json.dumps(value, sort_keys=True) if isinstance(value, dict) else None

    def _checked_observation(self, observation: Any, what: str) -> dict:
        if not isinstance(observation, dict):
            raise RemoteEnvError(
                f"{self.url} answered a {what} with observation={observation!r:.80}: expected an object."
            )
        if len(json.dumps(observation, default=str)) > self._max_reply_bytes:
            raise RemoteEnvError(
                f"{self.url} sent an observation of more than {self._max_reply_bytes:,} bytes, more "
                f"than texts of max_observation_chars={self.max_observation_chars} can take."
            )
        return observation

    def _foreign_text(self, observation: dict) -> str:
        fields = {k: v for k, v in observation.items() if k not in _OPENENV_RESERVED}
        if self.observation_field is not None:
            value = fields.get(self.observation_field)
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        else:
            strings = [v for v in fields.values() if isinstance(v, str)]
            text = (
                strings[0]
                if len(strings) == 1 and len(fields) == 1
                else json.dumps(fields, sort_keys=True, default=str)
            )
        if len(text) > self.max_observation_chars:
            raise RemoteEnvError(
                f"{self.url} sent an observation text of {len(text):,} characters; this client takes "
                f"at most max_observation_chars={self.max_observation_chars}."
            )
        return text

    def _foreign_description(self) -> str:
        """The server's own description, and how to act: the field the answer fills, or the JSON schema (an MCP
        server's tools reach the policy through the chat template instead)."""
        if self._mcp:
            return self._server_description.strip()
        if self.action_field is not None:
            about = self._action_schema.get("properties", {}).get(self.action_field, {}).get("description")
            how = f"Answer with the action's {self.action_field!r}" + (f" ({about})." if about else ".")
        else:
            schema = {k: v for k, v in self._action_schema.items() if k not in ("title", "description")}
            schema["properties"] = {k: v for k, v in schema.get("properties", {}).items() if k != "metadata"}
            how = "Answer with one JSON object of this schema: " + json.dumps(schema, sort_keys=True)
        return "\n".join(p for p in (self._server_description.strip(), how) if p)

    def close(self) -> None:
        self._drop_client()

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_client"] = None  # a WebSocket and its event loop do not travel; the copy opens its own
        return state
