"""An MkDocs hook: the marker ``<!-- knob table -->`` in a page becomes the table of StarPO's knobs, read from
``rllib_ragen/starpo/knobs.py`` when the site is built, so the page and the code cannot disagree."""

import json

MARKER = "<!-- knob table -->"


def _shown(value) -> str:
    return json.dumps(list(value) if isinstance(value, tuple) else value)


def _values(knob) -> str:
    if knob.options is not None:
        values = [f"`{_shown(option)}`" for option in knob.options]
    elif knob.kind == "boolean":
        values = ["`true`", "`false`"]
    elif knob.range:
        values = [f"`{knob.range}`"]
    else:
        values = ["see its description"]
    return ", ".join(values + ["`null`"] * (knob.optional and None not in (knob.options or ())))


def on_page_markdown(markdown: str, **_) -> str:
    if MARKER not in markdown:
        return markdown
    from rllib_ragen.starpo.knobs import KNOB_TABLE

    rows = ["| knob | section | default | kind | values |", "|---|---|---|---|---|"]
    for knob in KNOB_TABLE:
        rows.append(f"| `{knob.name}` | {knob.section} | `{_shown(knob.default)}` | {knob.kind} | {_values(knob)} |")
    return markdown.replace(MARKER, "\n".join(rows))
