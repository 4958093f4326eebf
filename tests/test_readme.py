"""The README's and the documentation's examples run as written: a newcomer copies them first.

Every fenced block in ``README.md`` and ``docs/`` is preceded by a marker: ``<!-- test: NAME -->`` (a test below
runs it, finding it by NAME) or ``<!-- not run: REASON -->``."""

import contextlib
import io
import pathlib
import re

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

from rllib_ragen import make_text_env

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
DOCS = README.parent / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
BLOCK = re.compile(r"^(<!--[^\n]*-->)?\n?```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)


def code_blocks() -> list[tuple[pathlib.Path, str, str, str]]:
    """Every fenced block of the README and the docs: (page, the marker line before it, language, code)."""
    return [
        (page, marker or "", language, code)
        for page in PAGES
        for marker, language, code in BLOCK.findall(page.read_text())
    ]


def blocks(name: str) -> list[str]:
    """The code of every block marked ``<!-- test: name -->`` (an example may stand on two pages)."""
    found = [code for _, marker, _, code in code_blocks() if marker == f"<!-- test: {name} -->"]
    assert found, f"no block is marked <!-- test: {name} -->"
    return found


def _python_block_after(name: str) -> str:
    (code,) = set(blocks(name))
    return code


def test_custom_environment_example_runs_and_is_short(forget_registration):
    forget_registration("my_project/Countdown-v0")
    code = _python_block_after("custom-env")  # the README's and the Environments page's, the same
    assert len(code.strip().splitlines()) < 40
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README custom-env", "exec"), {})
    assert out.getvalue().strip() == "Counter: 0 1.0 True"
    check_env(gym.make("my_project/Countdown-v0").unwrapped)


def test_environment_and_protocol_examples_run():
    env_block, protocol_block = _python_block_after("sokoban-env"), _python_block_after("protocol")
    namespace = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(env_block, "README environments", "exec"), namespace)
        exec(compile(protocol_block, "README protocol", "exec"), namespace)
    # "Left || Up" is well-formed and both are Sokoban actions: no penalty, Left runs first.
    assert namespace["turn"].format_error is False and namespace["turn"].executed[0] == "Left"


def test_gem_example_runs():
    pytest.importorskip("gem")
    pytest.importorskip("textarena")
    namespace = {}
    printed = _run_block("gem-env", namespace)
    assert "row, column and digit" in printed and "\\boxed" not in printed.split("Write each move")[1]
    assert namespace["config"].env == "textarena/Mastermind-v0-train"
    namespace["config"].validate()  # the adapted id is registered and its environment builds


def test_remote_example_runs_against_a_real_server(env_server):
    with env_server("rllib_ragen/Sokoban-v0") as server:
        code = _python_block_after("remote-env").replace("http://127.0.0.1:8000", server.url)
        namespace = {}
        with contextlib.redirect_stdout(io.StringIO()) as out:
            exec(compile(code, "docs remote-env", "exec"), namespace)
    local = make_text_env("rllib_ragen/Sokoban-v0")
    local.reset(seed=0)
    assert out.getvalue().strip() == str(local.step("Up")[:4])  # the same step as in-process
    assert namespace["config"].env_config["url"] == server.url


def test_openenv_examples_run_against_a_real_server(env_server):
    pytest.importorskip("openenv")  # the test extra installs it
    local = make_text_env("rllib_ragen/Sokoban-v0")
    first, _ = local.reset(seed=0)
    step = local.step("Up")
    with env_server("rllib_ragen/Sokoban-v0", "--protocol", "openenv") as server:
        printed = {}
        for name in ("openenv-client", "openenv-remote"):
            code = _python_block_after(name).replace("http://127.0.0.1:8000", server.url)
            namespace = {}
            with contextlib.redirect_stdout(io.StringIO()) as out:
                exec(compile(code, f"docs {name}", "exec"), namespace)
            printed[name] = out.getvalue()
    assert printed["openenv-client"] == f"{first}\n{step[1]} {step[2]} {local.unwrapped.success}\n"
    assert printed["openenv-remote"].strip() == str(step[:4])  # the same step as in-process
    assert namespace["config"].env_config == {"url": server.url, "protocol": "openenv"}


def test_tool_examples_run():
    namespace = {}
    printed = _run_block("tool-rollout", namespace)
    first, search = printed.split("\n", 1)
    assert first == "1.0 2.0" and '"name": "search"' in search and "<|im_start|>tool\n" in search
    assert "lives in" in search
    printed = _run_block("tool-env", {})
    tools, result = printed.strip().splitlines()
    assert tools == "['ask_guard', 'enter']" and re.fullmatch(r"The code is \d{4}\.", result)
    namespace = {}
    _run_block("trl-env", namespace)
    config = namespace["config"]
    config.validate()
    env = make_text_env(config.env, **config.env_config)
    observation, _ = env.reset(seed=1)
    assert observation == "Bring the counter to its target.\nThe counter is at 0; the target is 7."
    _, reward, *_ = env.step('{"name": "add", "arguments": {"amount": 7}}')
    assert reward == 1.0 and env.unwrapped.success


def test_rollout_example_runs():
    block = _python_block_after("rollout")
    namespace = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(block, "README rollout", "exec"), namespace)
    t = namespace["t"]
    assert len(namespace["trajectories"]) == 8 and sum(t.response_mask) > 0 and len(t.turn_rewards) == t.num_turns


def _run_block(marker: str, namespace: dict) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(_python_block_after(marker), f"README {marker}", "exec"), namespace)
    return out.getvalue()


@pytest.mark.slow
def test_starpo_defaults_example_runs_as_written(ray_session, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {}
    _run_block("starpo-defaults", namespace)
    result = namespace["result"]
    # The reference's sizes, on CPU in one process: 256 validation episodes, 8 x 16 trained on, top 25% kept.
    assert result["evaluation"]["env_runners"]["rllib_ragen/Bandit-v0/num_trajectories"] == 256
    assert result["env_runners"]["rollout/num_trajectories"] == 128 and result["update/kept_trajectories"] == 32
    assert result["learners"]["default_policy"]["actor/first_step_logprob_deviation"] == 0.0


@pytest.mark.slow
def test_starpo_checkpoint_and_export_example_runs(ray_session, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(tmp_path)
    printed = _run_block("starpo-run", {})
    assert printed.strip().splitlines()[-1] == "3"  # resumed at iteration 2, trained the third
    # Relative paths work both ways (RLlib alone rejects them).
    from rllib_ragen import StarPO

    algo = StarPO.from_checkpoint("outputs/readme_starpo_run/checkpoint")
    try:
        assert algo.iteration == 2
    finally:
        algo.stop()
    AutoModelForCausalLM.from_pretrained(tmp_path / "outputs" / "readme_starpo_run" / "policy")


@pytest.mark.slow
def test_warm_start_example_runs(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(tmp_path)
    block = _python_block_after("warm-start")
    namespace = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(block, "README warm start", "exec"), namespace)
    assert len(namespace["demos"]) == 256 and all(t.success for t in namespace["demos"][:64])
    assert namespace["losses"][-1] < 0.5 * namespace["losses"][0]
    AutoModelForCausalLM.from_pretrained(tmp_path / "outputs" / "warm")


def test_the_job_file_shown_in_the_readme_is_the_bandit_job():
    import runpy

    block = _python_block_after("job-file")
    shown = {"__name__": "readme"}
    exec(compile(block, "README job file", "exec"), shown)  # defines config and job; does not run
    real = runpy.run_path(str(README.parent / "tuned_examples" / "starpo_bandit.py"), run_name="imported")
    assert shown["job"] == real["job"]
    knobs = (
        "env",
        "validation_envs",
        "num_groups",
        "group_size",
        "rollout_filter_ratio",
        "lr",
        "critic_lr",
        "max_turns",
        "max_new_tokens_per_turn",
        "independent_transitions",
        "whiten_advantages",
        "validation_size",
        "validation_interval",
        "seed",
    )
    assert {k: getattr(shown["config"], k) for k in knobs} == {k: getattr(real["config"], k) for k in knobs}


MAIN_JOBS = (
    "starpo_bandit.py",
    "starpo_frozenlake.py",
    "starpo_sokoban.py",
    "starpo_gem.py",
    "starpo_tools.py",
    "starpo_selfplay.py",
)


def readme_job_commands() -> list[tuple[str, list[str]]]:
    """Every main-job command the README and the docs show, inline or in a bash block, as (job file, flags)."""
    import shlex

    text = "".join(page.read_text() for page in PAGES)
    spans = re.findall(r"`(python tuned_examples/\w+\.py[^`]*)`", text)  # inline; may wrap over lines
    for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
        spans += [line.split(" #")[0] for line in block.replace("\\\n", " ").splitlines()]
    commands = []
    for span in spans:
        found = re.search(r"python tuned_examples/(\w+\.py)([^&;|]*)", span)
        if found and found.group(1) in MAIN_JOBS and "--help" not in found.group(2):
            commands.append((found.group(1), shlex.split(found.group(2))))
    return commands


def test_every_main_job_command_in_the_readme_parses(monkeypatch):
    """A renamed or removed flag, or a combination validate() refuses, must not leave a README command broken."""
    import runpy

    import torch

    import rllib_ragen.starpo.config_rules as config_rules
    from rllib_ragen.jobs.flags import GPU_PRESET_JOBS
    from rllib_ragen.jobs.run import parse_job_args

    # The CPU defaults, on any machine (below: but for a GPU preset's command)
    monkeypatch.setattr(config_rules, "vllm_available", lambda: True)  # the GPU cluster's command assumes vLLM
    commands = readme_job_commands()
    assert {job for job, _ in commands} == set(MAIN_JOBS) and len(commands) >= 15
    jobs = {
        name: runpy.run_path(str(README.parent / "tuned_examples" / name), run_name="imported") for name in MAIN_JOBS
    }
    for name, flags in commands:
        job = jobs[name]
        # A GPU preset's command is for a GPU machine (its driver samples on the GPU): parsed as there.
        on_gpu = any(flags[i - 1] == "--preset" and flag in GPU_PRESET_JOBS for i, flag in enumerate(flags) if i)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: on_gpu)
        try:
            if "parse_args" in job:  # the Sokoban job adds its own flag
                job["parse_args"](job["config"], job["job"], flags)
            else:
                parse_job_args(job["config"], job["job"], flags, job_presets=job.get("JOB_PRESETS"))
        except SystemExit as exit_code:
            pytest.fail(f"README command 'python tuned_examples/{name} {' '.join(flags)}' exits {exit_code.code}")


def test_sentinel_example_builds_a_valid_config_and_bad_rules_fail_validate():
    namespace = {}
    exec(compile(_python_block_after("sentinel-example"), "README sentinel", "exec"), namespace)
    rules = namespace["config"].sentinel_rules
    assert [r.action for r in rules] == ["stop", "warn", "rollback"]
    broken = (
        namespace["config"]
        .copy(copy_frozen=False)
        .training(sentinel_rules=[namespace["Rule"]("x", "below", 1.0, action="rollback", knobs={"lr_factor": 3.0})])
    )
    with pytest.raises(ValueError, match=r"knobs\['lr_factor'\]=3.0 must lie in \(0, 1\)"):
        broken.validate()


def test_lora_example_trains_adapters_and_exports_a_plain_model(ray_session, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(tmp_path)
    assert _run_block("lora-example", {}).strip() == "0.0"
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "outputs/readme_lora/policy")
    assert not any("lora" in name for name, _ in exported.named_parameters())


@pytest.mark.slow
def test_mixture_example_trains_on_two_environments_and_validates_on_three(ray_session):
    printed = _run_block("mixture-example", {})
    assert printed.split() == ["4.0", "2.0", "4.0"]


@pytest.mark.slow
def test_curriculum_example_plays_each_stage_then_the_environment_as_given():
    assert _run_block("curriculum-example", {}).strip() == "[0.0, 1.0, 2.0]"


@pytest.mark.slow
def test_context_window_example_trains_each_turn_as_a_row(ray_session):
    kept, rows = (float(x) for x in _run_block("context-window-example", {}).split())
    assert kept == 2.0 and kept <= rows <= 6 * kept  # one row per turn of each kept episode, at most six turns


def test_filter_example_keeps_the_groups_with_variance():
    assert _run_block("filter-example", {}).strip() == "[1, 3] 2.0"


def _anchor(heading: str) -> str:
    """The anchor GitHub and MkDocs give a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readmes_links_into_the_docs_resolve():
    """``mkdocs build --strict`` checks the links between the docs' pages; the README is not one of them."""
    links = re.findall(r"\]\((docs/[^)#]+)(?:#([\w\-]+))?\)", README.read_text())
    assert len(links) >= 15
    for target, anchor in links:
        page = README.parent / target
        assert page.is_file(), f"README links to {target}, which does not exist"
        if anchor:
            headings = {_anchor(h) for h in re.findall(r"^#+ (.+)$", page.read_text(), re.MULTILINE)}
            assert anchor in headings, f"README links to {target}#{anchor}, which has no such heading"


def test_every_code_block_is_run_by_a_test_or_says_why_not():
    source = pathlib.Path(__file__).read_text()
    for page, marker, language, code in code_blocks():
        where = f"{page.relative_to(README.parent)}: block starting {code.splitlines()[0][:60]!r}"
        named = re.fullmatch(r"<!-- test: ([\w-]+) -->", marker)
        if named:
            assert f'"{named.group(1)}"' in source, f"{where} is marked for a test that does not exist"
        else:
            assert re.fullmatch(r"<!-- not run: .{10,} -->", marker), (
                f"{where} has no <!-- test: --> or <!-- not run: --> marker"
            )


def test_the_readme_is_a_five_minute_manual():
    assert len(README.read_text().splitlines()) <= 250


@pytest.mark.slow
def test_the_getting_started_example_trains_and_shows_an_episode(ray_session, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    printed = _run_block("first-run", {})
    assert "Turn 1. State:" in printed and "<|im_start|>assistant" in printed  # the episode as the learner saw it
    assert printed.strip().splitlines()[-1].startswith("return ")


def test_no_docstring_quotes_a_measured_result():
    """Docstrings say what a thing does and why; figures from runs belong on the results pages."""
    import ast

    quoting = re.compile(r"p = [0-9.]+(e-?\d+)?|\b(seed|seeds) \d+ (?:and|to|-) ?\d*.*\d\.\d{3}|\d\.\d{3} -> \d\.\d{3}")
    found = []
    for path in sorted((README.parent / "rllib_ragen").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node) or ""
                found += [f"{path.name}: {m.group(0)}" for m in quoting.finditer(doc)]
    assert found == []


def test_the_multi_agent_page_runs():
    printed = _run_block("games", {})
    assert "Kuhn poker at equilibrium: -1/18 a hand, exploitability 0" in printed
    wins, draws = re.search(r"as x: (\d+) wins, (\d+) draws", printed).groups()
    assert int(wins) + int(draws) == 20 and int(wins) > int(draws)  # minimax never loses; random play seldom draws
    for block in ("seat-env", "self-play", "self-play-opponents", "league", "separate-policies", "rae"):
        namespace = {}
        _run_block(block, namespace)
        namespace["config"].validate()
    assert "['vs random', 'vs minimax']" in _run_block("self-play-opponents", {})
    exploitability, k_bets = map(
        float, re.search(r"exploitability (\S+), K bet first (\S+)", _run_block("kuhn-strategy", {})).groups()
    )
    assert exploitability < 0.05 and abs(k_bets - 0.5) < 0.1  # the equilibrium at alpha 1/6 bets K with 3 x 1/6
