"""Each knob is declared once (``starpo/knobs.py``): its default, kind and range live in its row, its description in
``StarPOConfig.training``'s docstring, and nothing else in the package states them again. A job's own settings
(``JobSettings``) are rows of the same kind, declared in their dataclass fields."""

import ast
import inspect
import math
import pathlib

import pytest

import rllib_ragen
from rllib_ragen import StarPOConfig
from rllib_ragen.jobs.flags import config_flag_names, training_knob_help
from rllib_ragen.jobs.settings import JobSettings, job_setting_rows
from rllib_ragen.ranges import Range
from rllib_ragen.rollout import RolloutConfig
from rllib_ragen.starpo.knobs import (
    BOOL,
    INT,
    KNOB_SECTIONS,
    KNOB_TABLE,
    KNOBS,
    NUMBER,
    RLLIB_DEFAULT,
    RLLIB_FIELDS,
    Knob,
    _knob,
)

PACKAGE = pathlib.Path(rllib_ragen.__file__).parent
ROWS = [*KNOB_TABLE, *RLLIB_FIELDS.values()]


def test_every_knob_has_one_help_entry_and_every_entry_is_a_knob():
    help_texts = training_knob_help()
    assert set(help_texts) == set(KNOBS)
    assert [name for name, text in help_texts.items() if len(text) < 10] == []
    assert set(config_flag_names()) >= set(KNOBS)  # each one a job flag


def test_training_takes_exactly_the_knobs_of_the_table_in_its_order():
    parameters = list(inspect.signature(StarPOConfig.training).parameters)
    assert parameters == ["self", *KNOBS, "kwargs"]
    assert [name for section in KNOB_SECTIONS.values() for name in section] == list(KNOBS)
    with pytest.raises(TypeError, match="num_group"):
        StarPOConfig().training(num_group=4)


def test_a_new_config_holds_each_rows_default_and_shares_no_mutable_one():
    first, second = StarPOConfig(), StarPOConfig()
    for knob in ROWS:
        if knob.default is not RLLIB_DEFAULT:
            assert getattr(first, knob.name) == knob.default, knob.name
    first.sentinel_rules.append("x")
    assert second.sentinel_rules == [] and KNOBS["sentinel_rules"].default == []


def test_a_row_that_fills_a_settings_class_takes_its_default_from_there_only():
    assert KNOBS["max_turns"].default == RolloutConfig.max_turns
    with pytest.raises(ValueError, match=r"knob max_turns: its default is RolloutConfig.max_turns's"):
        _knob("max_turns", 7, INT, ">= 1", into=(RolloutConfig, "max_turns"))


def _outside_and_edges(knob: Knob) -> tuple[list, list]:
    """Values just outside each end of the row's range, and each end's nearest value inside it, from its numbers."""
    bounds, step = knob.range, 1 if knob.kind == INT else 0.5
    outside, edges = [], []
    if bounds.low is not None:
        outside.append(bounds.low if bounds.low_open else bounds.low - step)
        edges.append(bounds.low + step if bounds.low_open else bounds.low)
    if bounds.high is not None:
        outside.append(bounds.high if bounds.high_open else bounds.high + step)
        edges.append(bounds.high - step if bounds.high_open else bounds.high)
    cast = int if knob.kind == INT else float
    return [cast(v) for v in outside], [cast(v) for v in edges]


def test_the_ranges_cover_every_kind_of_end():
    """Closed and open lower ends, upper ends alone, and intervals open at either end, each among the rows."""
    ranges = {k.range for k in [*ROWS, *JOB_ROWS] if k.range is not None}
    assert all(isinstance(r, Range) for r in ranges)  # numbers, not text to parse
    assert {(r.low is not None, r.high is not None, r.low_open, r.high_open) for r in ranges} >= {
        (True, False, False, False),
        (True, False, True, False),
        (False, True, False, False),
        (True, True, False, False),
        (True, True, True, False),
        (True, True, False, True),
    }


@pytest.mark.parametrize("knob", [k for k in ROWS if k.range], ids=lambda k: k.name)
def test_each_range_is_enforced_at_validate_and_its_edges_pass(knob):
    outsides, edges = _outside_and_edges(knob)
    assert [edge for edge in edges if knob.value_error(edge) is not None] == []
    for outside in outsides:
        assert knob.value_error(outside).startswith(f"{knob.name}={outside} must")
        config = StarPOConfig()
        setattr(config, knob.name, outside)
        with pytest.raises(ValueError, match=f"{knob.name}={outside} must"):
            config.validate()


@pytest.mark.parametrize("knob", [k for k in ROWS if k.kind in (INT, NUMBER, BOOL)], ids=lambda k: k.name)
def test_each_kind_is_enforced_at_validate(knob):
    wrong = "1" if knob.kind != BOOL else 1
    config = StarPOConfig()
    setattr(config, knob.name, wrong)
    with pytest.raises(ValueError, match=f"{knob.name}={wrong!r} must be"):
        config.validate()
    if knob.kind == NUMBER:
        assert knob.kind_error(math.nan).startswith(f"{knob.name}=nan must be a finite number")


def _package_sources():
    return [p for p in PACKAGE.rglob("*.py") if p.name != "knobs.py"]


def test_no_other_module_states_a_knobs_default_again():
    """A knob's default in a dict literal or a keyword call elsewhere in the package would be a second statement
    of it (the presets derive theirs from the table)."""
    restated = []
    for path in _package_sources():
        for node in ast.walk(ast.parse(path.read_text())):
            pairs = []
            if isinstance(node, ast.Dict):
                pairs = [(k.value, v) for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)]
            elif isinstance(node, ast.Call):
                pairs = [(k.arg, k.value) for k in node.keywords if k.arg]
            for name, value in pairs:
                if (
                    name in KNOBS
                    and isinstance(value, ast.Constant)
                    and value.value is not None
                    and value.value == KNOBS[name].default
                    and type(value.value) is type(KNOBS[name].default)
                ):
                    restated.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {name}={value.value!r}")
    assert restated == []


_NEGATION = {">=": ast.Lt, ">": ast.LtE, "<=": ast.Gt, "<": ast.GtE}
_SAME = {">=": ast.GtE, ">": ast.Gt, "<=": ast.LtE, "<": ast.Lt}
_FLIPPED = {ast.Lt: ast.Gt, ast.LtE: ast.GtE, ast.Gt: ast.Lt, ast.GtE: ast.LtE}


def _ends(bounds) -> list[tuple[str, float]]:
    """Each end of a range as a one-sided condition a value must meet: ``(">=", 0)``, ``("<", 1)``."""
    ends = [(">" if bounds.low_open else ">=", bounds.low)] if bounds.low is not None else []
    return ends + ([("<" if bounds.high_open else "<=", bounds.high)] if bounds.high is not None else [])


def _a_config_knob(node) -> bool:
    """``config.<knob>`` or ``self.<knob>`` (a settings object's field of the same name is not the knob)."""
    return (
        isinstance(node, ast.Attribute) and node.attr in KNOBS and getattr(node.value, "id", "") in ("config", "self")
    )


def test_no_other_module_checks_a_knobs_kind_or_range_again():
    """``config.<knob> < 0`` where the row says ``>= 0`` (or ``isinstance(config.<knob>, ...)``) restates the
    row."""
    restated = []
    for path in _package_sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", "") in ("isinstance", "is_int", "is_number")
                and node.args
                and _a_config_knob(node.args[0])
            ):
                restated.append(f"{path.relative_to(PACKAGE)}:{node.lineno} kind of {node.args[0].attr}")
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            for left, op, right in zip(operands, node.ops, operands[1:]):  # 0 < config.x <= 1: two comparisons
                if _a_config_knob(right) and isinstance(left, ast.Constant) and type(op) in _FLIPPED:
                    left, op, right = right, _FLIPPED[type(op)](), left
                if not (_a_config_knob(left) and isinstance(right, ast.Constant)) or not KNOBS[left.attr].range:
                    continue
                knob = KNOBS[left.attr]
                for operator, bound in _ends(knob.range):
                    if right.value == bound and isinstance(op, (_NEGATION[operator], _SAME[operator])):
                        restated.append(f"{path.relative_to(PACKAGE)}:{node.lineno} range of {knob.name}")
    assert restated == []


JOB_ROWS = job_setting_rows()


def test_every_job_setting_is_one_row_with_help():
    assert [row.name for row in JOB_ROWS] == list(JobSettings.__dataclass_fields__)
    assert [row.name for row in JOB_ROWS if len(JobSettings.__dataclass_fields__[row.name].metadata["help"]) < 10] == []
    assert all(getattr(JobSettings(), row.name) == row.default for row in JOB_ROWS)


@pytest.mark.parametrize("row", [r for r in JOB_ROWS if r.range], ids=lambda r: r.name)
def test_each_job_settings_range_is_enforced_at_validate_and_its_edge_passes(row, tmp_path):
    outsides, edges = _outside_and_edges(row)
    for edge in edges:
        JobSettings(output_dir=str(tmp_path), **{row.name: edge}).validate()
    for outside in outsides:
        with pytest.raises(ValueError, match=f"{row.name}={outside} must"):
            JobSettings(output_dir=str(tmp_path), **{row.name: outside}).validate()


@pytest.mark.parametrize("row", [r for r in JOB_ROWS if r.kind in (INT, NUMBER, BOOL)], ids=lambda r: r.name)
def test_each_job_settings_kind_is_enforced_at_validate(row, tmp_path):
    wrong = "1" if row.kind != BOOL else 1
    with pytest.raises(ValueError, match=f"{row.name}={wrong!r} must be"):
        JobSettings(output_dir=str(tmp_path), **{row.name: wrong}).validate()
