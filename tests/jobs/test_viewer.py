"""The rollout viewer, opened in a real browser (headless Chromium): the page lists the expected episodes for each
filter, shows an episode turn by turn with its tokens shaded by advantage, and loads nothing from the network."""

import base64
import io
import json
import re
import subprocess

import pytest
import torch

from rllib_ragen.jobs.outputs import AFTER_ROLLOUTS, SENTINEL_FILE, TRAINING_ROLLOUTS, write_rollouts
from rllib_ragen.rollout.backends import SamplingParams, ScriptedBackend
from rllib_ragen.rollout.rollout_config import RolloutConfig
from rllib_ragen.rollout.engine import RolloutEngine
from rllib_ragen.rollout.models import load_policy
from rllib_ragen.demonstrators import frozen_lake_optimal_policy, sokoban_solver_policy
from rllib_ragen.jobs.viewer import find_chromium
from rllib_ragen.jobs.viewer import main as viewer_main

CHROMIUM = find_chromium()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run folder as a main job leaves it: training samples with advantages, validation episodes of another
    environment, metrics and one sentinel firing."""
    torch.set_num_threads(1)
    _, tokenizer = load_policy("tiny", seed=0)
    out = tmp_path_factory.mktemp("run")
    # 3 actions are too few for some levels: a mix of solved and unsolved episodes, several turns each.
    sokoban = RolloutEngine(
        RolloutConfig(env="rllib_ragen/Sokoban-v0", max_actions_per_episode=3, max_actions_per_turn=1),
        ScriptedBackend(sokoban_solver_policy(max_actions_per_turn=1), tokenizer),
        tokenizer,
    )
    training, _ = sokoban.rollout(list(range(10_000, 10_004)), 2, SamplingParams())
    advantages = {0: [0.5] * len(training[0].token_ids), 1: [-0.25] * len(training[1].token_ids)}
    (out / TRAINING_ROLLOUTS).mkdir()  # one file per probe iteration, as the job's callback writes them
    write_rollouts(
        out / TRAINING_ROLLOUTS / "iteration_000005.parquet", training, tokenizer, iteration=5, advantages=advantages
    )
    lake = RolloutEngine(
        RolloutConfig(env="rllib_ragen/FrozenLake-v0"),
        ScriptedBackend(frozen_lake_optimal_policy(), tokenizer),
        tokenizer,
    )
    validation, _ = lake.rollout(list(range(123, 126)), 1, SamplingParams())
    write_rollouts(out / AFTER_ROLLOUTS, validation, tokenizer, iteration=10)
    (out / "result.json").write_text(
        "".join(  # Tune's results, one JSON line per iteration
            json.dumps(
                {
                    "training_iteration": i,
                    "rollout_filter": {"reward_std": 0.3 / i},
                    "env_runners": {"rllib_ragen/Sokoban-v0": {"success": 0.1 * i}},
                }
            )
            + "\n"
            for i in range(1, 11)
        )
    )
    firing = {
        "iteration": 7,
        "rule": "reward std vanished",
        "signal": "rollout_filter/reward_std",
        "value": 0.04,
        "compared_with": 0.05,
        "action": "warn",
        "done": "warned",
    }
    (out / SENTINEL_FILE).write_text(json.dumps([firing]))
    viewer_main([str(out)])
    return out, training, validation


def dom(page, fragment: str) -> str:
    """The page's DOM after its script ran, opened at ``rollouts.html#fragment``."""
    if CHROMIUM is None:
        pytest.skip("no Chromium on this machine (.ci/run installs Debian's chromium where apt is available)")
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=5000",
            "--dump-dom",
            f"{page.as_uri()}#{fragment}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def rows(html: str) -> list[str]:
    return re.findall(r'<tr class="episode-row[^"]*" data-id="(\d+)"', html)


def test_the_page_is_self_contained(run_dir):
    out, _, _ = run_dir
    page = (out / "rollouts.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # no CDN, no network
    assert page.count("</script>") == 2  # the data block cannot close the script early
    assert "reward std vanished" in page  # the firing in the table (and on the curves: below)
    # The curves are the report's one renderer's picture, drawn here from result.json (the folder has none yet).
    embedded = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert embedded and base64.b64decode(embedded.group(1)).startswith(b"\x89PNG")


def test_the_viewer_shows_the_reports_learning_curve_and_the_firings_are_drawn_on_it(run_dir):
    from rllib_ragen.jobs.outputs import LEARNING_CURVE
    from rllib_ragen.jobs.readers import read_results
    from rllib_ragen.jobs.curves import plot_learning_curve, validations_of
    from rllib_ragen.jobs.viewer import build_page

    out, _, _ = run_dir
    rows = read_results(out)
    firings = json.loads((out / SENTINEL_FILE).read_text())
    drawn = {}
    for name, marks in (("with", firings), ("without", [])):
        buffer = io.BytesIO()
        assert plot_learning_curve(buffer, rows, validations_of(rows), "rllib_ragen/Sokoban-v0", "t", firings=marks)
        drawn[name] = buffer.getvalue()
    assert drawn["with"] != drawn["without"]  # the firing's red line
    (out / LEARNING_CURVE).write_bytes(drawn["with"])  # as the report writes it: the page shows that very picture
    assert base64.b64encode(drawn["with"]).decode() in build_page(out)


def test_filters_list_the_expected_episodes(run_dir):
    out, training, validation = run_dir
    page = out / "rollouts.html"
    everything = dom(page, "")
    assert len(rows(everything)) == len(training) + len(validation)
    solved_training = dom(page, "source=training&success=1")
    assert len(rows(solved_training)) == sum(t.success for t in training) > 0
    assert len(rows(dom(page, "source=training&success=0"))) == sum(not t.success for t in training) > 0
    # The list starts with the trained policy's validation episodes, and the page opens on the first of them.
    lake = dom(page, "env=rllib_ragen/FrozenLake-v0")
    assert rows(lake) == rows(everything)[: len(validation)] == [str(i) for i in range(len(validation))]
    assert rows(dom(page, "iteration=5")) == [str(len(validation) + i) for i in range(len(training))]
    assert f"0 of {len(training) + len(validation)} episodes" in dom(page, "iteration=99")
    opened = everything.split('id="detail"')[1]
    assert "validation after RL, iteration 10: rllib_ragen/FrozenLake-v0, seed 123" in opened
    assert '<tr class="episode-row selected" data-id="0"' in everything


def test_each_panel_of_the_curves_is_explained_in_one_line(run_dir):
    from rllib_ragen.jobs.readers import read_results
    from rllib_ragen.jobs.curves import PANEL_EXPLANATIONS, drawn_panels

    out, _, _ = run_dir
    page = (out / "rollouts.html").read_text()
    panels = drawn_panels(read_results(out), "rllib_ragen/Sokoban-v0")
    explained = re.findall(r"<dt>([^<]*)</dt><dd>([^<]*)</dd>", page)
    assert [name for name, _ in explained] == [name.replace("&", "&amp;") for _, name in panels]
    assert all(len(line) < 200 and "\n" not in line for _, line in explained)
    assert set(PANEL_EXPLANATIONS) >= {name for _, name in panels}


def test_an_episode_shows_each_turn_with_its_board_and_tokens_shaded_by_advantage(run_dir):
    out, training, validation = run_dir
    episode = training[0]
    html = dom(out / "rollouts.html", f"episode={len(validation)}")
    assert html.count('class="turn"') == episode.num_turns >= 2
    # Every reply token is a span, shaded (green: advantage 0.5) with its value as a tooltip.
    tokens = re.findall(r'<span class="token" title="([^"]*)"', html)
    assert len(tokens) == sum(end - start for start, end in episode.turn_spans)
    assert set(tokens) == {"advantage 0.5000"}
    assert "rgba(23, 121, 27" in html
    # The board before each turn, in a fixed-width block; the executed actions in the turn's heading.
    assert html.count('<pre class="board">') == episode.num_turns
    assert all(action in html for actions in episode.turn_actions for action in actions)
    untrained = dom(out / "rollouts.html", f"episode={len(validation) + 2}")  # no advantages: not shaded
    detail = untrained.split('id="detail"')[1].split("<script")[0]
    assert "no advantage" in detail and "rgba(" not in detail


def test_the_screenshot_the_docs_use_is_taken_from_the_page(run_dir, tmp_path):
    import struct

    out, _, _ = run_dir
    if CHROMIUM is None:
        pytest.skip("no Chromium on this machine (.ci/run installs Debian's chromium where apt is available)")
    png = tmp_path / "viewer.png"
    viewer_main([str(out), "--screenshot", str(png)])
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (1400, 900)  # the IHDR's width and height


def test_a_hostile_environment_name_is_shown_as_text_never_run_as_markup(tmp_path):
    """An environment's name comes from the run (a user's registration, a mixture's label, a served game): the page
    puts it into its filters and rows as text, so an opened page runs no handler hidden in it."""
    _, tokenizer = load_policy("tiny", seed=0)
    engine = RolloutEngine(
        RolloutConfig(env="rllib_ragen/FrozenLake-v0"),
        ScriptedBackend(frozen_lake_optimal_policy(), tokenizer),
        tokenizer,
    )
    episodes, _ = engine.rollout([123], 1, SamplingParams())
    hostile = "<img src=x onerror=\"document.body.setAttribute('data-pwned', '1')\">"
    episodes[0].env_name = hostile
    write_rollouts(tmp_path / AFTER_ROLLOUTS, episodes, tokenizer, iteration=1)
    viewer_main([str(tmp_path)])
    html = dom(tmp_path / "rollouts.html", "")
    assert not re.search(r"<body[^>]*data-pwned", html)  # the handler never ran (it would mark the body)
    assert "<img" not in html.split("<script")[0]  # no element was made from the name
    assert re.search(r"<option[^>]*>&lt;img src=x", html)  # it is there, as the filter's text


def test_a_tool_episode_shows_each_call_and_what_it_returned(tmp_path):
    from rllib_ragen.demonstrators import fact_lookup_solver_policy

    _, tokenizer = load_policy("tiny", seed=0)
    engine = RolloutEngine(
        RolloutConfig(env="rllib_ragen/FactLookup-v0", max_turns=3),
        ScriptedBackend(fact_lookup_solver_policy(), tokenizer),
        tokenizer,
    )
    (episode,), _ = engine.rollout([123], 1, SamplingParams())
    write_rollouts(tmp_path / AFTER_ROLLOUTS, [episode], tokenizer, iteration=1)
    viewer_main([str(tmp_path)])
    html = dom(tmp_path / "rollouts.html", "episode=0")
    shown = re.findall(r'<pre class="tool">tool call (\w+) returned: ([^<]*)</pre>', html)
    (found,), (verdict,) = episode.turn_tool_results
    assert shown == [("search", found["result"]), ("answer", "Correct.")] and verdict["result"] == "Correct."
    assert 'class="answer"' not in html.split('id="detail"')[1]  # a tool turn has calls, not an <answer>
