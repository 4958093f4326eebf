"""A server that answers what it likes (a real HTTP server on 127.0.0.1): each bad reply is a RemoteEnvError that
names the server and the field, in bounded time, and a rollout drops and counts the episode instead of stalling."""

import http.server
import json
import threading
import time

import pytest

from rllib_ragen.envs.remote import RemoteEnvError, RemoteTextEnv
from rllib_ragen.rollout.backends import SamplingParams, ScriptedBackend
from rllib_ragen.rollout.rollout_config import RolloutConfig
from rllib_ragen.rollout.engine import RolloutEngine

GOOD_RESET = {
    "session_id": "s1",
    "description": "Guess a word.",
    "observation": "Your move.",
    "state_key": "k",
    "action_names": [],
    "action_pattern": "[a-z]+",
    "max_turns": 3,
    "info": {},
}


@pytest.fixture
def hostile_server():
    """Serves ``replies[path]`` (a dict, or raw bytes) to every POST; returns a function that sets them and the URL."""
    replies = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = replies.get(self.path, {})
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def serve(**by_path):
        replies.clear()
        replies.update(by_path)
        return f"http://127.0.0.1:{server.server_port}"

    yield serve
    server.shutdown()
    server.server_close()


def test_an_exponentially_backtracking_action_pattern_is_stopped_in_bounded_time(hostile_server):
    env = RemoteTextEnv(hostile_server(**{"/reset": {**GOOD_RESET, "action_pattern": "(a|aa)+b"}}))
    env.reset(seed=0)
    t0 = time.perf_counter()
    with pytest.raises(RemoteEnvError, match=r"action_pattern took over .* s to match an answer of 48 characters"):
        env.canonical_action("a" * 48)  # Python's re takes minutes here
    assert time.perf_counter() - t0 < 2
    assert env.canonical_action("aab") == "aab"  # a pattern that matches quickly still works


def test_a_rollout_drops_and_counts_an_episode_whose_server_pattern_backtracks(hostile_server):
    from rllib_ragen.rollout.models import load_policy

    url = hostile_server(
        **{
            "/reset": {**GOOD_RESET, "action_pattern": "(a|aa)+b"},
            "/step": {
                "observation": "ok",
                "state_key": "k",
                "reward": 0.0,
                "terminated": False,
                "truncated": False,
                "info": {},
            },
        }
    )
    _, tokenizer = load_policy("tiny", seed=0)
    engine = RolloutEngine(
        RolloutConfig(env="rllib_ragen/Remote-v0", env_config={"url": url}, max_turns=2),
        ScriptedBackend(lambda prompt: "<think>x</think><answer>" + "a" * 48 + "</answer>", tokenizer),
        tokenizer,
    )
    t0 = time.perf_counter()
    trajectories, metrics = engine.rollout([0, 1], 1, SamplingParams())
    assert time.perf_counter() - t0 < 10
    assert trajectories == [] and metrics["rollout/env_errors"] == 2
    # The cause travels with the counts, for the run's error should every episode fail.
    assert "RemoteEnvError: " in metrics["first_env_error"] and "action_pattern took over" in metrics["first_env_error"]


@pytest.mark.parametrize(
    "reply, message",
    [
        ({**GOOD_RESET, "max_turns": "many"}, r"/reset sent max_turns='many': expected a whole number >= 1 or null"),
        ({**GOOD_RESET, "observation": 7}, r"/reset sent observation=7: expected a string"),
        ({**GOOD_RESET, "action_names": ["Up", 3]}, r"action_names=\['Up', 3\]: expected a list of strings"),
        ({**GOOD_RESET, "action_pattern": "(" * 300}, r"action_pattern of 300 characters"),
        ({**GOOD_RESET, "action_pattern": "(unclosed"}, r"action_pattern='\(unclosed', which does not compile"),
        ({key: v for key, v in GOOD_RESET.items() if key != "session_id"}, r"sent session_id=None: expected a string"),
        (b"<html>not json</html>", r"answered 200 with something that is not JSON"),
        (b"[1, 2]", r"answered a JSON list, not an object"),
    ],
)
def test_a_reset_reply_of_the_wrong_shape_names_the_field(hostile_server, reply, message):
    env = RemoteTextEnv(hostile_server(**{"/reset": reply}))
    with pytest.raises(RemoteEnvError, match=message):
        env.reset(seed=0)


def test_a_huge_observation_is_refused_without_reading_it_all(hostile_server):
    url = hostile_server(**{"/reset": {**GOOD_RESET, "observation": "x" * 20_000_000}})
    env = RemoteTextEnv(url)
    t0 = time.perf_counter()
    with pytest.raises(RemoteEnvError, match=r"a reply of more than [\d,]+ bytes"):
        env.reset(seed=0)
    assert time.perf_counter() - t0 < 10
    small = RemoteTextEnv(
        hostile_server(**{"/reset": {**GOOD_RESET, "observation": "x" * 5000}}), max_observation_chars=4096
    )
    with pytest.raises(RemoteEnvError, match=r"sent observation text of 5,000 characters; this client takes at most"):
        small.reset(seed=0)


def test_a_step_reply_of_the_wrong_shape_names_the_field(hostile_server):
    step = {
        "observation": "ok",
        "state_key": "k",
        "reward": "lots",
        "terminated": False,
        "truncated": False,
        "info": {},
    }
    env = RemoteTextEnv(hostile_server(**{"/reset": GOOD_RESET, "/step": step}))
    env.reset(seed=0)
    with pytest.raises(RemoteEnvError, match=r"/step sent reward='lots': expected a number"):
        env.step("go")


# ---- served tools: their schemas are the server's too --------------------------------------------------------------
def _tool_reset(parameters):
    return {
        **GOOD_RESET,
        "action_pattern": None,
        "tools": [
            {
                "type": "function",
                "function": {"name": "spell", "description": "Spell a word.", "parameters": parameters},
            }
        ],
    }


def _tool_rollout(url, reply):
    from rllib_ragen.rollout.models import load_policy

    _, tokenizer = load_policy("tiny", seed=0)
    engine = RolloutEngine(
        RolloutConfig(env="rllib_ragen/Remote-v0", env_config={"url": url}, max_turns=2),
        ScriptedBackend(lambda prompt: reply, tokenizer),
        tokenizer,
    )
    t0 = time.perf_counter()
    trajectories, metrics = engine.rollout([0, 1], 1, SamplingParams())
    return trajectories, metrics, time.perf_counter() - t0


STEP = {"observation": "ok", "state_key": "k", "reward": 0.0, "terminated": False, "truncated": False, "info": {}}


def test_a_served_schema_pattern_that_backtracks_costs_its_episodes_not_the_run(hostile_server):
    """jsonschema matches ``pattern`` with Python's re, which holds the interpreter while it backtracks (31 s for 41
    characters, doubling every two more): the schema's patterns are matched under a time limit instead."""
    url = hostile_server(
        **{
            "/reset": _tool_reset(
                {"type": "object", "properties": {"word": {"type": "string", "pattern": "^(a|aa)+$"}}}
            ),
            "/step": STEP,
        }
    )
    call = '<tool_call>{"name": "spell", "arguments": {"word": "' + "a" * 60 + 'b"}}</tool_call>'
    trajectories, metrics, seconds = _tool_rollout(url, call)
    assert seconds < 10 and trajectories == [] and metrics["rollout/env_errors"] == 2
    assert "took over 0.05 s to match an argument" in metrics["first_env_error"]
    # A pattern that matches quickly still checks calls: a word that fits runs, one that does not is answered.
    url = hostile_server(
        **{
            "/reset": _tool_reset(
                {
                    "type": "object",
                    "properties": {"word": {"type": "string", "pattern": "^(a|aa)+$"}},
                    "patternProperties": {"^w": {"type": "string"}},
                    "additionalProperties": False,
                }
            ),
            "/step": STEP,
        }
    )
    (t, _), metrics, _ = _tool_rollout(
        url,
        '<tool_call>{"name": "spell", "arguments": {"word": "aaa"}}</tool_call>'
        '<tool_call>{"name": "spell", "arguments": {"x": "aaa"}}</tool_call>',
    )
    assert metrics["rollout/env_errors"] == 0 and t.num_valid == 2 and t.num_invalid == 2
    assert "'x' does not match any of the regexes: '^w'" in t.text


@pytest.mark.parametrize(
    "parameters, message",
    [
        ({"type": "nonsense-type"}, "the parameters schema of tool 'spell' is not one jsonschema takes"),
        ({"type": "object", "properties": {"w": {"type": "string", "pattern": "(unclosed"}}}, "is not one jsonschema"),
        (
            {"type": "object", "properties": {"w": {"$ref": "https://example.com/elsewhere.json"}}},
            "the schema of tool 'spell' could not check a call",
        ),
    ],
)
def test_a_served_schema_jsonschema_refuses_costs_its_episodes_with_the_cause_named(
    hostile_server, parameters, message
):
    url = hostile_server(**{"/reset": _tool_reset(parameters), "/step": STEP})
    trajectories, metrics, _ = _tool_rollout(url, '<tool_call>{"name": "spell", "arguments": {"w": "a"}}</tool_call>')
    assert trajectories == [] and metrics["rollout/env_errors"] == 2
    assert message in metrics["first_env_error"] and "ToolSchemaError" in metrics["first_env_error"]
