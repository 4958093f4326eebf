"""The rollout viewer: one self-contained HTML page of a run's episodes, turn by turn, with its curves.

    python -m rllib_ragen.jobs.viewer outputs/starpo_sokoban/latest/seed0      # writes .../rollouts.html

It reads a trial folder (what the main jobs write): the Parquet rollouts (``training_rollouts/``, a sample of
training episodes every few iterations with their token advantages; ``validation_before.parquet`` and
``validation_rollouts.parquet``), Tune's ``result.json`` and ``sentinel.json``. The page needs no server, no internet
and no CDN: the data sit in the page as JSON, the curves as the report's own picture (``learning_curve.png``, drawn
anew from ``result.json`` where the folder has none) embedded as an image, and a few lines of plain JavaScript draw the
episode list (filterable by source, environment, success and iteration) and the selected episode: each turn's
observation (boards in a fixed-width font), the thinking, the answer and the actions executed, the reward, and
the reply's tokens shaded by their advantage. The filters live in the address's ``#`` part, so a view can be
linked (``rollouts.html#source=training&success=0&episode=12``). The page's HTML, style sheet and script are
package data, ``rllib_ragen/jobs/viewer_page/``.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import importlib.resources
import json
import math
import pathlib

from .outputs import (
    AFTER_GREEDY_ROLLOUTS,
    AFTER_ROLLOUTS,
    BEFORE_GREEDY_ROLLOUTS,
    BEFORE_ROLLOUTS,
    read_run_json,
    LEARNING_CURVE,
    RUN_CONFIG,
    SENTINEL_FILE,
    TRAINING_ROLLOUTS,
    VIEWER_PAGE,
)
from .readers import read_results
from .curves import PANEL_EXPLANATIONS, drawn_panels, plot_learning_curve, validations_of
from ..files import write_text_atomically

# In the list's order: the trained policy's validation episodes first (the page opens on the first of them).
SOURCES = (
    (AFTER_ROLLOUTS, "validation after RL"),
    (AFTER_GREEDY_ROLLOUTS, "greedy after RL"),
    (BEFORE_ROLLOUTS, "validation before RL"),
    (BEFORE_GREEDY_ROLLOUTS, "greedy before RL"),
    (TRAINING_ROLLOUTS, "training"),
)
EPISODE_COLUMNS = ("env", "seed", "group", "success", "return", "num_turns", "format_errors", "iteration", "turns")


def write_viewer(
    run_dir: pathlib.Path, path: pathlib.Path | None = None, validation_env: str | None = None
) -> pathlib.Path:
    """Write the page for ``run_dir`` (to ``run_dir/rollouts.html`` unless ``path`` is given); returns its path.
    ``validation_env``: the environment whose validation success the curves draw (default: the run's
    ``summary.json`` says, else the first training environment)."""
    run_dir = pathlib.Path(run_dir).resolve()
    path = pathlib.Path(path) if path is not None else run_dir / VIEWER_PAGE
    write_text_atomically(path, build_page(run_dir, validation_env))
    return path


def load_episodes(run_dir: pathlib.Path) -> list[dict]:
    """Every episode of the run folder's rollout files, numbered, with its source."""
    import pyarrow.parquet as pq

    episodes = []
    for name, source in SOURCES:
        file = run_dir / name
        if not file.exists():
            continue
        table = pq.read_table(file)
        columns = [c for c in EPISODE_COLUMNS if c in table.column_names]
        for record in table.select(columns).to_pylist():
            record["source"] = source
            record.setdefault("turns", None)
            record["id"] = len(episodes)
            episodes.append(record)
    return episodes


def build_page(run_dir: pathlib.Path, validation_env: str | None = None) -> str:
    episodes = load_episodes(run_dir)
    if not episodes:
        raise FileNotFoundError(
            f"{run_dir} holds no rollouts ({', '.join(name for name, _ in SOURCES)}): is it a run folder of a main job?"
        )
    rows = read_results(run_dir)
    firings = read_run_json(run_dir / SENTINEL_FILE, [])
    run_config = read_run_json(run_dir / RUN_CONFIG, {})
    recorded = run_config.get("config", {})
    first = (recorded.get("train_envs") or [{}])[0]  # a mixture's curves are its first training environment's
    env = str(first.get("name") or first.get("env") or recorded.get("env", episodes[0]["env"]))
    if validation_env is None and (run_dir / "summary.json").is_file():  # the environment its final table scores
        validation_env = read_run_json(run_dir / "summary.json", {}).get("env")
    title = f"{run_dir.name}: {env}"
    data = json.dumps({"episodes": episodes}, allow_nan=False, default=_finite)
    data = data.replace("</", "<\\/")  # a "</script>" inside an episode's text must not end the data block
    return _page_part("page.html").format(
        title=html.escape(title),
        curves=curves_html(run_dir, rows, firings, env, validation_env),
        firings=firings_table(firings),
        data=data,
        script=_page_part("script.js"),
        style=_page_part("style.css"),
    )


def _finite(value):
    return None if isinstance(value, float) and not math.isfinite(value) else str(value)


# ---- curves: the report's learning curve (curves.plot_learning_curve), embedded in the page ---------------------
def curves_html(
    run_dir: pathlib.Path, rows: list[dict], firings: list[dict], env: str, validation_env: str | None = None
) -> str:
    """The run's learning curve as an embedded image: the report's file, or drawn now from ``rows``."""
    picture = run_dir / LEARNING_CURVE
    if picture.is_file():
        png = picture.read_bytes()
    elif not rows:
        return "<p>No result.json in this folder: no curves.</p>"
    else:
        buffer = io.BytesIO()
        if not plot_learning_curve(
            buffer,
            rows,
            validations_of(rows),
            env,
            f"{run_dir.name}: {env}",
            validation_env=validation_env,
            firings=firings,
        ):
            return "<p>The curves need matplotlib: pip install 'rllib_ragen[plots]'.</p>"
        png = buffer.getvalue()
    explained = "".join(
        f"<dt>{html.escape(name)}</dt><dd>{html.escape(PANEL_EXPLANATIONS[name])}</dd>"
        for _, name in drawn_panels(rows, env)
    )
    return (
        f'<img class="curves" alt="learning curves: success, format errors, entropy and the echo-trap signals '
        f'over iterations; sentinel firings in red" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        f'<p>Each panel, over iterations; red vertical lines: the sentinel fired.</p><dl class="panels">{explained}'
        "</dl>"
    )


def firings_table(firings: list[dict]) -> str:
    if not firings:
        return "<p>The sentinel did not fire in this run.</p>"
    rows = "".join(
        f"<tr><td>{f['iteration']}</td><td>{html.escape(f['rule'])}</td><td>{f['value']:.4g}</td>"
        f"<td>{html.escape(f['action'])}</td><td>{html.escape(f.get('done', ''))}</td></tr>"
        for f in firings
    )
    return (
        "<table class='firings'><tr><th>iteration</th><th>rule</th><th>value</th><th>action</th>"
        f"<th>what was done</th></tr>{rows}</table>"
    )


def _page_part(name: str) -> str:
    """A part of the page (``viewer_page/``: the HTML around the data, its style sheet, its script), package data."""
    return importlib.resources.files("rllib_ragen.jobs").joinpath("viewer_page", name).read_text(encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rllib_ragen.jobs.viewer", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="a run folder (or a job folder: its 'latest' run)")
    parser.add_argument("--output", default=None, help="the page's path (default: RUN_DIR/rollouts.html)")
    parser.add_argument(
        "--screenshot",
        default=None,
        metavar="PNG",
        help="also save a picture of the page, taken by headless Chromium (as the docs' images are)",
    )
    parser.add_argument(
        "--view",
        default="episode=0",
        help="what the screenshot shows: the page's URL fragment (default: the first episode)",
    )
    args = parser.parse_args(argv)
    run_dir = pathlib.Path(args.run_dir)
    if not any((run_dir / name).is_file() for name, _ in SOURCES) and (run_dir / "latest").exists():
        run_dir = run_dir / "latest"
    try:
        path = write_viewer(run_dir, args.output)
    except FileNotFoundError as error:
        parser.error(str(error))
    print(f"wrote {path}")
    if args.screenshot:
        screenshot(path, args.screenshot, args.view)
        print(f"wrote {args.screenshot}")


def find_chromium() -> str | None:
    """The path of a Chromium (or Chrome) on this machine's PATH, or None."""
    import shutil

    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


def screenshot(page: pathlib.Path, png, view: str = "episode=0", size: tuple[int, int] = (1400, 900)) -> None:
    """Save a PNG of the viewer page opened at ``#view``, rendered by headless Chromium after its script ran."""
    import subprocess

    browser = find_chromium()
    if browser is None:
        raise FileNotFoundError(
            "no Chromium on this machine: install it (Debian: apt-get install chromium) to take screenshots."
        )
    png = pathlib.Path(png).resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--virtual-time-budget=5000",
            f"--window-size={size[0]},{size[1]}",
            f"--screenshot={png}",
            f"{pathlib.Path(page).resolve().as_uri()}#{view}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0 or not png.is_file():
        raise RuntimeError(f"Chromium could not take the screenshot: {done.stderr[-1000:]}")


if __name__ == "__main__":
    main()
