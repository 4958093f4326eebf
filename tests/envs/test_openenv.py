"""OpenEnv's protocol both ways, with OpenEnv's own package, on real server processes on 127.0.0.1: OpenEnv's client
and `openenv validate` against ``serve --protocol openenv``; ``Remote-v0`` with ``protocol="openenv"`` against
OpenEnv servers written with ``create_app`` (``openenv_games.py``) and against ours."""

import contextlib
import json
import os
import pathlib
import random
import re
import subprocess
import sys

import pytest

from rllib_ragen.envs import SokobanLevel, make_text_env, solve_level
from rllib_ragen.envs.remote import RemoteEnvError
from rllib_ragen.rollout import RolloutConfig, RolloutEngine, SamplingParams, ScriptedBackend
from rllib_ragen.rollout.tiny_model import build_tiny_tokenizer

openenv = pytest.importorskip("openenv")  # the test extra installs it: CI runs these
from openenv.core.generic_client import GenericEnvClient  # noqa: E402

REMOTE = "rllib_ragen/Remote-v0"
GAMES = pathlib.Path(__file__).with_name("openenv_games.py")


@contextlib.contextmanager
def openenv_game(name):
    """One of ``openenv_games.py``'s OpenEnv servers, as its own process."""
    process = subprocess.Popen(
        [sys.executable, str(GAMES), name], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        line = process.stdout.readline()
        assert line.startswith("serving"), f"the OpenEnv server did not start: {line!r}"
        yield line.split(" on ")[1].split()[0]
    finally:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def sokoban_over_openenv(env_server):
    """One Sokoban server speaking OpenEnv (``serve --protocol openenv``) for this module's tests: its URL."""
    with env_server("rllib_ragen/Sokoban-v0", "--protocol", "openenv") as server:
        yield server.url


@pytest.fixture(scope="module")
def guess_game():
    with openenv_game("guess") as url:
        yield url


@pytest.fixture(scope="module")
def echo_game():
    with openenv_game("echo") as url:
        yield url


def test_openenvs_client_plays_a_served_sokoban_level_to_the_end_as_in_process(sokoban_over_openenv):
    local = make_text_env("rllib_ragen/Sokoban-v0")
    text, _ = local.reset(seed=5)
    moves = solve_level(SokobanLevel.from_text(text))
    with GenericEnvClient(base_url=sokoban_over_openenv).sync() as client:
        result = client.reset(seed=5)
        assert result.observation["text"] == text and not result.done
        assert result.observation["action_names"] == ["Up", "Down", "Left", "Right"]
        for move in moves:
            result = client.step({"message": move})
            step = local.step(move)
            assert (result.observation["text"], result.reward, result.done) == (step[0], step[1], step[2] or step[3])
        assert result.done and result.observation["success"] and local.unwrapped.success
        state = client.state()
        assert state["step_count"] == len(moves) and state["success"]


def test_openenv_validate_passes_on_a_served_environment(sokoban_over_openenv):
    run = subprocess.run(
        [sys.executable, "-m", "openenv.cli", "validate", "--url", sokoban_over_openenv, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(run.stdout[run.stdout.index("{") :])
    assert run.returncode == 0 and report["passed"], report
    assert {c["id"] if "id" in c else c["name"] for c in report["criteria"]} >= {
        "health_endpoint",
        "schema_endpoint",
        "metadata_endpoint",
    }


def test_a_rollout_over_openenv_is_token_for_token_the_in_process_one(sokoban_over_openenv):
    tokenizer = build_tiny_tokenizer(seed=0)
    backend = ScriptedBackend(
        lambda prompt: "<think>go</think><answer>Up || Left || Sideways || Down</answer>", tokenizer
    )

    def play(env, env_config):
        engine = RolloutEngine(RolloutConfig(env=env, env_config=env_config), backend, tokenizer)
        return engine.rollout(list(range(8)), 2, SamplingParams(), sample_seed=0)

    remote, remote_metrics = play(REMOTE, {"url": sokoban_over_openenv, "protocol": "openenv"})
    local, local_metrics = play("rllib_ragen/Sokoban-v0", {})
    assert [t.token_ids for t in remote] == [t.token_ids for t in local]
    assert [t.turn_rewards for t in remote] == [t.turn_rewards for t in local]
    assert [t.turn_states for t in remote] == [t.turn_states for t in local]
    assert remote_metrics["rollout/env_errors"] == 0
    assert remote_metrics["rollout/format_error_rate"] == local_metrics["rollout/format_error_rate"] > 0


def _bisect(env, seed):
    """Binary search through the rendered feedback; returns the guesses and the last step."""
    text, _ = env.reset(seed=seed)
    low, high, guesses = 1, 8, []
    while True:
        guess = (low + high) // 2
        action = env.unwrapped.canonical_action(json.dumps({"guess": guess}))
        text, reward, terminated, truncated, info = step = env.step(action)
        guesses.append(guess)
        feedback = json.loads(text)["feedback"]
        if terminated or truncated:
            return guesses, step
        low, high = (guess + 1, high) if "higher" in feedback else (low, guess - 1)


def test_remote_v0_plays_an_openenv_game_with_json_actions_to_the_end(guess_game):
    env = make_text_env(REMOTE, url=guess_game, protocol="openenv", success_reward=1.0)
    text, info = env.reset(seed=11)
    assert json.loads(text) == {"feedback": "Guess a number from 1 to 8.", "guesses_left": 4}
    description = env.unwrapped.describe()
    assert "JSON object" in description and '"guess"' in description and "metadata" not in description
    # A reply that is not an object of the schema is a format error, caught here without a request.
    for answer in ("7", '{"guess": 9}', '{"guess": "two"}', '{"guess": 2, "hint": 1}', "{not json"):
        assert env.unwrapped.canonical_action(answer) is None, answer
    for seed in range(6):
        guesses, (_, reward, terminated, truncated, info) = _bisect(env, seed)
        assert terminated and not truncated and len(guesses) <= 4
        assert info["success"] == (reward == 1.0) == (guesses[-1] == random.Random(seed).randint(1, 8))
    env.close()


def test_a_rollout_plays_an_openenv_game_to_the_end_and_charges_malformed_actions(guess_game):
    tokenizer = build_tiny_tokenizer(seed=0)
    replies = iter(
        ['<think>a</think><answer>{"guess": 4}</answer>', '<think>b</think><answer>{"guess": 12}</answer>'] * 8
    )
    backend = ScriptedBackend(lambda prompt: next(replies), tokenizer)
    config = RolloutConfig(
        env=REMOTE,
        env_config={"url": guess_game, "protocol": "openenv", "success_reward": 1.0},
        max_turns=8,
        max_actions_per_turn=1,
    )
    trajectories, metrics = RolloutEngine(config, backend, tokenizer).rollout([2], 1, SamplingParams(), sample_seed=0)
    (trajectory,) = trajectories
    # 4 is wrong for seed 2 (its number is 1): two valid guesses of 4 and two schema failures ({"guess": 12}) in
    # between, then the fourth guess ends the game: 4 turns that reached the server, 3 that did not.
    assert random.Random(2).randint(1, 8) != 4
    assert metrics["rollout/env_errors"] == 0 and metrics["rollout/format_error_rate"] > 0
    assert not trajectory.success and trajectory.format_errors == 3
    assert [len(actions) for actions in trajectory.turn_actions] == [1, 0, 1, 0, 1, 0, 1]  # then the game ended


def test_remote_v0_fills_the_one_string_field_of_an_openenv_action(echo_game):
    env = make_text_env(REMOTE, url=echo_game, protocol="openenv")
    assert env.reset(seed=0)[0] == "Say something."
    assert "Answer with the action's 'message' (the text to echo)." in env.unwrapped.describe()
    steps = [env.step(env.unwrapped.canonical_action(text)) for text in ("hi", "hello || there", "bye")]
    assert [s[:4] for s in steps] == [
        ("hi", 2.0, False, False),
        ("hello || there", 14.0, False, False),
        ("bye", 3.0, True, False),
    ]
    assert not any(s[4]["success"] for s in steps)  # no success field and no success_reward: never solved
    with pytest.raises(RemoteEnvError, match=r"action_field='text', but .* has the fields \['message'\]"):
        make_text_env(REMOTE, url=echo_game, protocol="openenv", action_field="text").reset(seed=0)


def test_a_server_of_the_other_protocol_or_none_fails_with_one_clear_error(env_server, echo_game):
    with env_server("rllib_ragen/Sokoban-v0") as server:  # rllib_ragen's protocol, played as OpenEnv
        with pytest.raises(RemoteEnvError, match=re.escape(server.url) + r"/schema answered HTTP 404: not an OpenEnv"):
            make_text_env(REMOTE, url=server.url, protocol="openenv").reset(seed=0)
    with pytest.raises(RemoteEnvError, match="answered in OpenEnv's shape.*protocol='openenv'"):  # the other way
        make_text_env(REMOTE, url=echo_game, connect_retries=0).reset(seed=0)
    with pytest.raises(RemoteEnvError, match="cannot reach the OpenEnv server at http://127.0.0.1:9"):
        make_text_env(REMOTE, url="http://127.0.0.1:9", protocol="openenv").reset(seed=0)


def test_a_web_page_where_an_openenv_server_should_be_is_named_not_parsed(tmp_path):
    (tmp_path / "schema").write_text("<html><body>Welcome!</body></html>")
    page = subprocess.Popen(
        [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # its "Serving HTTP on ... port N" line
    try:
        port = re.search(r"port (\d+)", page.stdout.readline()).group(1)
        with pytest.raises(
            RemoteEnvError,
            match=rf"http://127.0.0.1:{port}/schema answered something that is not "
            r"JSON: b'<html><body>Welcome!",
        ):
            make_text_env(REMOTE, url=f"http://127.0.0.1:{port}", protocol="openenv").reset(seed=0)
    finally:
        page.kill()
        page.wait()


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"protocol": "grpc"}, r"protocol='grpc': choose one of \('rllib_ragen', 'openenv'\)"),
        ({"action_field": "message"}, "action_field='message' applies to OpenEnv servers only: set protocol='openenv'"),
        ({"protocol": "openenv", "success_reward": float("nan")}, "success_reward=nan must be a finite number"),
    ],
)
def test_bad_remote_settings_fail_when_the_environment_is_built(settings, message):
    with pytest.raises(ValueError, match=message):
        make_text_env(REMOTE, url="http://127.0.0.1:8000", **settings)


RAW_REPLY = "<think>a || b</think>\n  two lines,\nkept as written  "


@pytest.mark.parametrize("protocol", ["rllib_ragen", "openenv"])
def test_a_served_environment_that_reads_raw_replies_gets_them_whole_over_either_protocol(protocol, env_server):
    flags = ("--protocol", "openenv") if protocol == "openenv" else ()
    with env_server("tests/ServedRawEcho-v0", *flags) as server:
        env = make_text_env(REMOTE, url=server.url, protocol=protocol)
        env.reset(seed=0)
        assert env.unwrapped.raw_replies is True  # the server says so
        assert env.unwrapped.canonical_action(RAW_REPLY) == RAW_REPLY and env.unwrapped.canonical_action(" ") is None
        assert env.step(RAW_REPLY)[0] == RAW_REPLY
        env.close()


def test_raw_replies_fill_a_foreign_servers_action_field_as_written(echo_game, guess_game):
    env = make_text_env(REMOTE, url=echo_game, protocol="openenv", raw_replies=True)
    env.reset(seed=0)
    assert env.unwrapped.canonical_action(RAW_REPLY) == RAW_REPLY
    assert env.step(RAW_REPLY)[0] == RAW_REPLY
    with pytest.raises(RemoteEnvError, match=r"raw_replies=True, but .* is not one string field \(\['guess'\]\)"):
        make_text_env(REMOTE, url=guess_game, protocol="openenv", raw_replies=True).reset(seed=0)
    with pytest.raises(ValueError, match="raw_replies=True applies to OpenEnv servers only"):
        make_text_env(REMOTE, url=echo_game, raw_replies=True)


@pytest.fixture(scope="module")
def lookup_mcp_game():
    with openenv_game("lookup") as url:
        yield url


def test_an_openenv_mcp_tool_server_is_played_in_tool_mode(lookup_mcp_game):
    """An ``MCPEnvironment`` written as an OpenEnv user writes it (``openenv_games.py``): its tools are listed after
    each reset and handed to the policy; each call is a ``call_tool`` step; its reward and ``done`` end the episode."""
    env = make_text_env(REMOTE, url=lookup_mcp_game, protocol="openenv", success_reward=1.0)
    observation, _ = env.reset(seed=3)
    assert observation == "Where does Ada live?"  # the one text field of its reset observation
    assert [(t["function"]["name"], t["function"]["parameters"]["required"]) for t in env.unwrapped.tools] == [
        ("search", ["name"]),
        ("answer", ["city"]),
    ]
    env.close()
    tokenizer = build_tiny_tokenizer(seed=0)

    def solver(prompt):
        person = re.findall(r"Where does (\w+) live", prompt)[-1]
        found = re.findall(rf"{person} lives in (\w+)\.", prompt)
        if found:
            return f'<tool_call>{{"name": "answer", "arguments": {{"city": "{found[-1]}"}}}}</tool_call>'
        return (
            f'<tool_call>{{"name": "lookup", "arguments": {{}}}}</tool_call>'  # refused here: no such tool
            f'<tool_call>{{"name": "search", "arguments": {{"name": "{person}"}}}}</tool_call>'
        )

    engine = RolloutEngine(
        RolloutConfig(
            env=REMOTE, env_config={"url": lookup_mcp_game, "protocol": "openenv", "success_reward": 1.0}, max_turns=3
        ),
        ScriptedBackend(solver, tokenizer),
        tokenizer,
    )
    trajectories, metrics = engine.rollout([0, 1, 2, 3], group_size=2, sampling=SamplingParams())
    assert metrics["rollout/success"] == 1.0 and metrics["rollout/env_errors"] == 0
    assert metrics["rollout/tool_call_errors"] == 8  # the unknown tool, once per episode, answered before any request
    t = trajectories[0]
    assert t.turn_rewards == [-0.1, 1.0] and t.num_turns == 2
    assert re.search(
        r"<\|im_start\|>tool\nError: there is no tool 'lookup'.*<\|im_end\|>\n<\|im_start\|>tool\n"
        r"\w+ lives in \w+\.<\|im_end\|>",
        t.text,
        re.DOTALL,
    )
