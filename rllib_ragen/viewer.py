"""The rollout viewer: one self-contained HTML page of a run's episodes, turn by turn, with its curves.

    python -m rllib_ragen.viewer outputs/starpo_sokoban/latest/seed0      # writes .../rollouts.html

It reads a trial folder (what the main jobs write): the Parquet rollouts (``training_rollouts/``, a sample of
training episodes every few iterations with their token advantages; ``validation_before.parquet`` and
``validation_rollouts.parquet``), Tune's ``result.json`` and ``sentinel.json``. The page needs no server, no internet and
no CDN: the data sit in the page as JSON, the curves as inline SVG, and a few lines of plain JavaScript draw the
episode list (filterable by source, environment, success and iteration) and the selected episode: each turn's
observation (boards in a fixed-width font), the thinking, the answer and the actions executed, the reward, and
the reply's tokens shaded by their advantage. The filters live in the address's ``#`` part, so a view can be
linked (``rollouts.html#source=training&success=0&episode=12``).
"""

from __future__ import annotations

import argparse
import html
import json
import math
import pathlib

from . import metrics as M
from .experiment_outputs import (AFTER_GREEDY_ROLLOUTS, AFTER_ROLLOUTS, BEFORE_GREEDY_ROLLOUTS, BEFORE_ROLLOUTS,
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
    return PAGE.format(title=html.escape(title), curves=curves_svg(rows, firings, env, validation_env),
                       firings=firings_table(firings), data=data, script=SCRIPT, style=STYLE)


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


STYLE = """
body { font-family: system-ui, sans-serif; margin: 1em 2em; color: #222; }
.panels { display: flex; flex-wrap: wrap; gap: 8px; }
.panel { margin: 0; } .panel figcaption { font-size: 12px; text-align: center; }
.panel svg { background: #fafafa; border: 1px solid #ddd; }
.panel polyline { fill: none; stroke: #1f5fa8; stroke-width: 1.5; } .panel circle { fill: #1f5fa8; }
.panel text { font-size: 9px; fill: #666; } .panel line.firing { stroke: #c22; stroke-width: 1.5; }
table.firings td, table.firings th { padding: 2px 8px; text-align: left; font-size: 13px; }
.layout { display: flex; gap: 16px; align-items: flex-start; }
#list { width: 34%; max-height: 80vh; overflow-y: auto; border: 1px solid #ddd; }
#list table { border-collapse: collapse; width: 100%; font-size: 13px; }
#list tr.episode-row { cursor: pointer; } #list tr.episode-row:hover { background: #eef; }
#list tr.selected { background: #dde6ff; } #list td { padding: 2px 6px; border-bottom: 1px solid #eee; }
#detail { flex: 1; } .turn { border: 1px solid #ddd; margin-bottom: 10px; padding: 6px 10px; }
pre.board { font-family: ui-monospace, monospace; background: #f6f6f6; padding: 6px; white-space: pre-wrap; }
.think { color: #555; font-style: italic; white-space: pre-wrap; } .answer { font-weight: 600; }
.tokens span.token { font-family: ui-monospace, monospace; white-space: pre-wrap; border-radius: 2px; }
.yes { color: #17791b; } .no { color: #b3261e; } .filters label { margin-right: 12px; }
"""

SCRIPT = r"""
const DATA = JSON.parse(document.getElementById('data').textContent);
const EPISODES = DATA.episodes;
const FILTERS = ['source', 'env', 'success', 'iteration'];

function readHash() {
  const state = {};
  new URLSearchParams(location.hash.slice(1)).forEach((v, k) => { state[k] = v; });
  return state;
}
function writeHash(state) {
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(state)) if (v !== '' && v !== undefined) params.set(k, v);
  history.replaceState(null, '', '#' + params.toString());
}
function fillSelect(id, values, current) {
  // Options as elements with text, never as HTML: an environment's name is data from the run, not markup.
  const select = document.getElementById(id);
  select.replaceChildren(...['', ...values].map(v => {
    const option = el('option', '', v === '' ? 'all' : v);
    option.value = v;
    return option;
  }));
  select.value = current || '';
}
function matches(ep, state) {
  return (!state.source || ep.source === state.source) && (!state.env || ep.env === state.env) &&
    (!state.success || String(Number(ep.success)) === state.success) &&
    (!state.iteration || String(ep.iteration) === state.iteration);
}
function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}
function shade(a, scale) {
  if (a === null || a === undefined) return '';
  const alpha = Math.min(1, Math.abs(a) / scale) * 0.6;
  return a >= 0 ? `rgba(23,121,27,${alpha})` : `rgba(179,38,30,${alpha})`;
}
function renderDetail(ep) {
  const detail = document.getElementById('detail');
  detail.innerHTML = '';
  if (!ep) { detail.appendChild(el('p', '', 'Pick an episode.')); return; }
  detail.appendChild(el('h3', '', `${ep.source}, iteration ${ep.iteration}: ${ep.env}, seed ${ep.seed} — ` +
    `${ep.success ? 'solved' : 'not solved'}, return ${Number(ep['return']).toFixed(3)}`));
  if (!ep.turns) { detail.appendChild(el('p', '', 'This file has no turn-by-turn record.')); return; }
  const all = ep.turns.flatMap(t => t.advantages || []).map(Math.abs);
  const scale = all.length ? Math.max(...all) || 1 : 1;
  ep.turns.forEach((turn, i) => {
    const box = el('div', 'turn');
    box.appendChild(el('h4', '', `turn ${i + 1}: reward ${Number(turn.reward).toFixed(3)}, actions ` +
      (turn.actions.length ? turn.actions.join(', ') : 'none') +
      (turn.context_tokens == null ? '' : `; read ${turn.context_tokens} tokens` +
       (turn.windowed ? ' (its context window)' : ''))));
    box.appendChild(el('pre', 'board', turn.observation));
    box.appendChild(el('div', 'think', 'thinking: ' + (turn.think || '(none)')));
    box.appendChild(el('div', 'answer', 'answer: ' + (turn.answer || '(none)')));
    const tokens = el('div', 'tokens');
    tokens.appendChild(el('span', '', turn.advantages ? 'reply tokens by advantage: ' :
      'reply tokens (not trained on: no advantages): '));
    turn.tokens.forEach((tok, j) => {
      const a = turn.advantages ? turn.advantages[j] : null;
      const span = el('span', 'token', tok);
      span.style.background = shade(a, scale);
      span.title = a === null ? 'no advantage' : `advantage ${a.toFixed(4)}`;
      tokens.appendChild(span);
    });
    box.appendChild(tokens);
    detail.appendChild(box);
  });
}
function render() {
  const state = readHash();
  const unique = key => [...new Set(EPISODES.map(e => String(e[key])))];
  fillSelect('source', unique('source'), state.source);
  fillSelect('env', unique('env'), state.env);
  fillSelect('iteration', unique('iteration').sort((a, b) => a - b), state.iteration);
  document.getElementById('success').value = state.success || '';
  const shown = EPISODES.filter(e => matches(e, state));
  const body = document.getElementById('rows');
  body.innerHTML = '';
  for (const ep of shown) {
    const tr = el('tr', 'episode-row' + (String(ep.id) === state.episode ? ' selected' : ''));
    tr.dataset.id = ep.id;
    for (const text of [ep.source, ep.iteration, ep.env.split('/').pop(), ep.seed])
      tr.appendChild(el('td', '', String(text)));
    tr.appendChild(el('td', ep.success ? 'yes' : 'no', ep.success ? 'yes' : 'no'));
    tr.appendChild(el('td', '', String(ep.num_turns)));
    tr.onclick = () => { writeHash({...readHash(), episode: ep.id}); render(); };
    body.appendChild(tr);
  }
  document.getElementById('count').textContent = `${shown.length} of ${EPISODES.length} episodes`;
  renderDetail(EPISODES.find(e => String(e.id) === state.episode));
}
for (const id of FILTERS) document.getElementById(id).onchange = () => {
  const state = readHash();
  state[id] = document.getElementById(id).value;
  writeHash(state);
  render();
};
window.addEventListener('hashchange', render);
render();
"""

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title><style>{style}</style></head>
<body>
<h1>{title}</h1>
<h2>Curves</h2><div class="panels">{curves}</div>
<h2>Sentinel</h2>{firings}
<h2>Episodes</h2>
<div class="filters">
<label>source <select id="source"></select></label>
<label>environment <select id="env"></select></label>
<label>success <select id="success"><option value="">all</option><option value="1">yes</option>
<option value="0">no</option></select></label>
<label>iteration <select id="iteration"></select></label>
<span id="count"></span>
</div>
<div class="layout">
<div id="list"><table><thead><tr><th>source</th><th>iter</th><th>env</th><th>seed</th><th>success</th><th>turns</th>
</tr></thead><tbody id="rows"></tbody></table></div>
<div id="detail"></div>
</div>
<script type="application/json" id="data">{data}</script>
<script>{script}</script>
</body></html>
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rllib_ragen.viewer", description=__doc__.splitlines()[0])
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
