"""The rollout viewer: one self-contained HTML page of a run's episodes, turn by turn, with its curves.

    python -m rllib_ragen.jobs.viewer outputs/starpo_sokoban/latest/seed0      # writes .../rollouts.html

It reads a trial folder (what the main jobs write): the Parquet rollouts (``training_rollouts/``, a sample of
training episodes every few iterations with their token advantages; ``validation_before.parquet`` and
``validation_rollouts.parquet``), Tune's ``result.json`` and ``sentinel.json``. The page needs no server, no internet and
no CDN: the data sit in the page as JSON, the curves as inline SVG, and a few lines of plain JavaScript draw the
episode list (filterable by source, environment, success and iteration) and the selected episode: each turn's
observation (boards in a fixed-width font), the thinking, the answer and the actions executed, the reward, and
the reply's tokens shaded by their advantage. The filters live in the address's ``#`` part, so a view can be
linked (``rollouts.html#source=training&success=0&episode=12``). The page's HTML, style sheet and script are
package data, ``rllib_ragen/jobs/viewer_page/``.
"""

from __future__ import annotations

import argparse
import html
import importlib.resources
import json
import math
import pathlib

from .. import metrics as M
from .outputs import (AFTER_GREEDY_ROLLOUTS, AFTER_ROLLOUTS, BEFORE_GREEDY_ROLLOUTS, BEFORE_ROLLOUTS,
                                 LEARNER, RUN_CONFIG, SENTINEL_FILE,
                                 TRAINING, TRAINING_ROLLOUTS, VALIDATED_AT, VALIDATION, VIEWER_PAGE, read_results,
                                 trailing_mean, write_text_atomically)

SOURCES = ((TRAINING_ROLLOUTS, "training"), (BEFORE_ROLLOUTS, "validation before RL"),
           (AFTER_ROLLOUTS, "validation after RL"), (BEFORE_GREEDY_ROLLOUTS, "greedy before RL"),
           (AFTER_GREEDY_ROLLOUTS, "greedy after RL"))
EPISODE_COLUMNS = ("env", "seed", "group", "success", "return", "num_turns", "format_errors", "iteration", "turns")


def write_viewer(run_dir: pathlib.Path, path: pathlib.Path | None = None,
                 validation_env: str | None = None) -> pathlib.Path:
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
        raise FileNotFoundError(f"{run_dir} holds no rollouts ({', '.join(name for name, _ in SOURCES)}): is it a "
                                "run folder of a main job?")
    rows = read_results(run_dir)
    firings = json.loads((run_dir / SENTINEL_FILE).read_text()) if (run_dir / SENTINEL_FILE).is_file() else []
    run_config = json.loads((run_dir / RUN_CONFIG).read_text()) if (run_dir / RUN_CONFIG).is_file() else {}
    recorded = run_config.get("config", {})
    first = (recorded.get("train_envs") or [{}])[0]  # a mixture's curves are its first training environment's
    env = str(first.get("name") or first.get("env") or recorded.get("env", episodes[0]["env"]))
    if validation_env is None and (run_dir / "summary.json").is_file():  # the environment its final table scores
        validation_env = json.loads((run_dir / "summary.json").read_text()).get("env")
    title = f"{run_dir.name}: {env}"
    data = json.dumps({"episodes": episodes}, allow_nan=False, default=_finite)
    data = data.replace("</", "<\\/")  # a "</script>" inside an episode's text must not end the data block
    return _page_part("page.html").format(
        title=html.escape(title), curves=curves_svg(rows, firings, env, validation_env),
        firings=firings_table(firings), data=data, script=_page_part("script.js"), style=_page_part("style.css"))


def _finite(value):
    return None if isinstance(value, float) and not math.isfinite(value) else str(value)


# ---- curves: inline SVG, one small panel per signal, sentinel firings as red lines -------------------------------
def _series(rows: list[dict], env: str,
            validation_env: str | None = None) -> list[tuple[str, list[tuple[float, float]]]]:
    def points(key, smooth=False):
        its = [r.get("training_iteration", i + 1) for i, r in enumerate(rows)]
        values = [r.get(key, math.nan) for r in rows]
        if smooth:
            values = trailing_mean(values, 5)
        return [(x, y) for x, y in zip(its, values) if math.isfinite(y)]

    validation = sorted({(r[VALIDATED_AT], r.get(VALIDATION + M.env_metric(validation_env or env, M.SUCCESS), math.nan))
                         for r in rows if math.isfinite(r.get(VALIDATED_AT, math.nan))})
    return [("training success (5-iteration mean)", points(TRAINING + M.env_metric(env, M.SUCCESS), smooth=True)),
            ("validation success", [(x, y) for x, y in validation if math.isfinite(y)]),
            ("in-group reward std", points(M.FILTER_REWARD_STD)),
            ("entropy", points(LEARNER + M.ENTROPY)),
            ("actor grad norm", points(LEARNER + M.GRAD_NORM.format(optimizer="actor"))),
            ("MI estimate (nats)", points(M.MI_ESTIMATE)),
            ("retrieval accuracy", points(M.RETRIEVAL_ACCURACY)),
            ("distinct-2", points(M.DISTINCT_2)),
            ("reasoning tokens per turn", points(M.THINK_TOKENS_PER_TURN)),
            ("reasoning grounded (claims that hold)", points(TRAINING + M.env_metric(M.POOLED, M.REASONING_GROUNDED))),
            ("format error rate", points(TRAINING + M.env_metric(M.POOLED, M.FORMAT_ERROR_RATE)))]


def curves_svg(rows: list[dict], firings: list[dict], env: str, validation_env: str | None = None) -> str:
    width, height, pad = 240, 120, 28
    panels = []
    last = int(max([r.get("training_iteration", 0) for r in rows] + [1]))
    for name, points in _series(rows, env, validation_env):
        if not points:
            continue
        ys = [y for _, y in points]
        low, high = min(ys), max(ys)
        span = (high - low) or 1.0

        def x(it):
            return pad + (width - pad - 6) * (it / last)

        def y(v):
            return height - pad + 6 - (height - pad - 4) * (v - low) / span

        line = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in points)
        marks = "".join(f'<line class="firing" x1="{x(f["iteration"]):.1f}" x2="{x(f["iteration"]):.1f}" y1="4" '
                        f'y2="{height - pad + 6}"><title>{html.escape(f["rule"])}</title></line>' for f in firings)
        dots = "".join(f'<circle cx="{x(a):.1f}" cy="{y(b):.1f}" r="2"/>' for a, b in points[:30])
        panels.append(
            f'<figure class="panel"><svg width="{width}" height="{height}" role="img" aria-label="{name}">'
            f'<polyline points="{line}"/>{dots}{marks}'
            f'<text x="2" y="12">{high:.3g}</text><text x="2" y="{height - pad + 6}">{low:.3g}</text>'
            f'<text x="{pad}" y="{height - 6}">iteration 0-{last}</text></svg>'
            f'<figcaption>{html.escape(name)}</figcaption></figure>')
    return "".join(panels) or "<p>No result.json in this folder: no curves.</p>"


def firings_table(firings: list[dict]) -> str:
    if not firings:
        return "<p>The sentinel did not fire in this run.</p>"
    rows = "".join(f"<tr><td>{f['iteration']}</td><td>{html.escape(f['rule'])}</td><td>{f['value']:.4g}</td>"
                   f"<td>{html.escape(f['action'])}</td><td>{html.escape(f.get('done', ''))}</td></tr>"
                   for f in firings)
    return ("<table class='firings'><tr><th>iteration</th><th>rule</th><th>value</th><th>action</th>"
            f"<th>what was done</th></tr>{rows}</table>")


def _page_part(name: str) -> str:
    """A part of the page (``viewer_page/``: the HTML around the data, its style sheet, its script), package data."""
    return importlib.resources.files("rllib_ragen.jobs").joinpath("viewer_page", name).read_text(encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rllib_ragen.jobs.viewer", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="a run folder (or a job folder: its 'latest' run)")
    parser.add_argument("--output", default=None, help="the page's path (default: RUN_DIR/rollouts.html)")
    parser.add_argument("--screenshot", default=None, metavar="PNG",
                        help="also save a picture of the page, taken by headless Chromium (as the docs' images are)")
    parser.add_argument("--view", default="episode=0",
                        help="what the screenshot shows: the page's URL fragment (default: the first episode)")
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
        raise FileNotFoundError("no Chromium on this machine: install it (Debian: apt-get install chromium) to take "
                                "screenshots.")
    png = pathlib.Path(png).resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--virtual-time-budget=5000", f"--window-size={size[0]},{size[1]}",
                           f"--screenshot={png}", f"{pathlib.Path(page).resolve().as_uri()}#{view}"],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or not png.is_file():
        raise RuntimeError(f"Chromium could not take the screenshot: {done.stderr[-1000:]}")


if __name__ == "__main__":
    main()
