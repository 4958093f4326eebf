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
    if (turn.tool_results && turn.tool_results.length) {  // tool mode: each call and what it returned
      turn.tool_results.forEach(r => box.appendChild(
        el('pre', 'tool', `tool call ${r.tool || '(unreadable)'} returned: ${r.result}`)));
    } else {
      box.appendChild(el('div', 'answer', 'answer: ' + (turn.answer || '(none)')));
    }
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
  // No episode picked yet: the first one listed, the trained policy's first validation episode.
  const picked = state.episode === undefined ? shown[0] : EPISODES.find(e => String(e.id) === state.episode);
  if (picked && state.episode === undefined) body.firstChild.classList.add('selected');
  renderDetail(picked);
}
for (const id of FILTERS) document.getElementById(id).onchange = () => {
  const state = readHash();
  state[id] = document.getElementById(id).value;
  writeHash(state);
  render();
};
window.addEventListener('hashchange', render);
render();
