"""The sentinel: rules over a run's signals that warn, stop, or roll back to the last healthy weights.

A :class:`Rule` watches one value of ``Algorithm.train()``'s result (a ``/`` path such as
``"rollout_filter/reward_std"`` or ``"learners/default_policy/actor/entropy"``) for one kind of trouble:

- ``below``: the value stays under ``threshold`` (reward std has vanished: the groups no longer disagree);
- ``drop_from_peak``: the value is down by the fraction ``threshold`` from its running peak (entropy, MI estimate);
- ``spike_over_median``: the value is over ``threshold`` times the running median of its earlier values (a
  gradient-norm spike, the echo trap's point of no return).

The condition must hold ``patience`` iterations in a row, after ``warmup`` observed values. Then the rule fires
its ``action``: ``warn`` (logged and recorded), ``stop`` (the result's ``done`` is set, which ends a Tune trial and
a main job) or ``rollback`` (the algorithm restores the last healthy weights and optimizer state and applies the
rule's ``knobs``: ``lr_factor`` multiplies the learning rates, ``rollout_filter_ratio`` keeps fewer groups).
Every firing is in the result (``sentinel/...``) and in ``StarPO.sentinel.firings``.

The :class:`Sentinel` itself is plain Python (no Ray, no torch): it decides; ``StarPO`` acts.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Mapping

import numpy as np

from . import metrics as M
from .objectives.rollout_filter import RATIO_RANGE as FILTER_RATIO_RANGE

logger = logging.getLogger(__name__)

RULE_KINDS = ("below", "drop_from_peak", "spike_over_median")
ACTIONS = ("warn", "stop", "rollback")
KNOBS = ("lr_factor", "rollout_filter_ratio")
HISTORY = 50  # values kept per rule for the running median


@dataclass(frozen=True)
class Rule:
    """One condition on one signal, and what to do when it holds.

    Attributes:
        signal: the value's path in the result, ``/``-separated (``"learners/default_policy/actor/entropy"``).
        kind: ``"below"``, ``"drop_from_peak"`` or ``"spike_over_median"``.
        threshold: the value (below), the fraction of the peak lost (drop_from_peak, in (0, 1)) or the factor
            over the median (spike_over_median, > 1).
        patience: iterations in a row the condition must hold before the rule fires.
        action: ``"warn"``, ``"stop"`` or ``"rollback"``.
        knobs: with ``rollback``, the changes made before going on: ``{"lr_factor": 0.5}`` (multiplies the
            current learning rates), ``{"rollout_filter_ratio": 0.125}`` (the share of groups kept from then on).
        warmup: values observed before the rule may fire (a peak or a median needs some history).
        name: how firings name the rule (default: built from the fields).
    """

    signal: str
    kind: str
    threshold: float
    patience: int = 1
    action: str = "warn"
    knobs: Mapping[str, float] = field(default_factory=dict)
    warmup: int = 3
    name: str = ""

    @property
    def label(self) -> str:
        return self.name or f"{self.signal} {self.kind} {self.threshold:g}"

    def errors(self) -> list[str]:
        """What is wrong with this rule, each naming the field and the fix (empty when it is usable)."""
        errors = []
        if self.kind not in RULE_KINDS:
            errors.append(f"kind={self.kind!r}: choose one of {list(RULE_KINDS)}.")
        if self.action not in ACTIONS:
            errors.append(f"action={self.action!r}: choose one of {list(ACTIONS)}.")
        if not isinstance(self.threshold, (int, float)) or not math.isfinite(self.threshold):
            errors.append(f"threshold={self.threshold!r} must be a finite number.")
        elif self.kind == "drop_from_peak" and not 0 < self.threshold < 1:
            errors.append(f"threshold={self.threshold} is the fraction of the peak lost: it must lie in (0, 1).")
        elif self.kind == "spike_over_median" and self.threshold <= 1:
            errors.append(f"threshold={self.threshold} is a factor over the median: it must be > 1.")
        for name in ("patience", "warmup"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (1 if name == "patience" else 0):
                errors.append(f"{name}={value!r} must be an integer >= {1 if name == 'patience' else 0}.")
        unknown = set(self.knobs) - set(KNOBS)
        if unknown:
            errors.append(f"knobs {sorted(unknown)} are unknown: choose from {list(KNOBS)}.")
        if self.knobs and self.action != "rollback":
            errors.append(f"knobs={dict(self.knobs)} apply only with action='rollback' (action={self.action!r}).")
        factor = self.knobs.get("lr_factor")
        if factor is not None and not (isinstance(factor, (int, float)) and 0 < factor < 1):
            errors.append(f"knobs['lr_factor']={factor!r} must lie in (0, 1): a rollback lowers the learning rate.")
        ratio = self.knobs.get("rollout_filter_ratio")
        if ratio is not None and not (isinstance(ratio, (int, float)) and ratio in FILTER_RATIO_RANGE):
            errors.append(f"knobs['rollout_filter_ratio']={ratio!r} must lie in {FILTER_RATIO_RANGE}.")
        return [f"{self.label}: {e}" for e in errors]


@dataclass
class Firing:
    """One firing: which rule, at which iteration (1-based, as ``training_iteration``), on what, and what was done."""

    iteration: int
    rule: str
    signal: str
    value: float
    compared_with: float  # the threshold, the peak or the median the value was judged against
    action: str
    done: str = ""  # what the algorithm did, in words (filled by the algorithm)

    def describe(self) -> str:
        return (
            f"sentinel: iteration {self.iteration}: rule '{self.rule}' fired ({self.signal} = {self.value:.4g}, "
            f"compared with {self.compared_with:.4g}): {self.action}{' - ' + self.done if self.done else ''}"
        )


def as_rule(item) -> Rule:
    """A :class:`Rule`, or one built from a dict of its fields (rules given as JSON, e.g. ``--sentinel-rules``)."""
    if isinstance(item, Rule):
        return item
    if isinstance(item, Mapping):
        unknown = set(item) - {f.name for f in fields(Rule)}
        if unknown:
            raise ValueError(
                f"rule {dict(item)} has unknown fields {sorted(unknown)}; a Rule has {[f.name for f in fields(Rule)]}."
            )
        try:
            return Rule(**item)
        except TypeError as error:
            raise ValueError(f"rule {dict(item)}: {error}") from None
    raise ValueError(f"{item!r} is not a rllib_ragen.sentinel.Rule (nor a dict of its fields).")


def echo_trap_rules(action: str = "warn", policies: list[str] | None = None) -> list[Rule]:
    """The main jobs' built-in rules: the echo trap's warning signs (RAGEN sec. 4), each with ``action``; a rollback
    halves the learning rates.

    In-group reward std under 0.01, policy entropy 70% under its peak (each for 3 iterations), an actor gradient
    norm 10x its running median, and the first turn's reasoning entropy 40% under its peak for 3 iterations
    (RAGEN-2's template collapse, which policy entropy does not show). Their thresholds were chosen to stay silent on
    healthy runs of the main jobs and to fire on collapsed ones; the runs are on the Echo trap results page.

    The mutual-information estimate is not among them: with the probe's default 8 prompts it moves from one probe
    to the next as much as it changes over a run. Add ``Rule(M.MI_ESTIMATE, "drop_from_peak", ...)`` yourself with
    a larger ``collapse_subsample``.

    ``policies``: with separate policies (``StarPOConfig.multi_agent``), the trained ones' ids: each rule once per
    policy, on that policy's own values (``policies/<id>/...`` and ``learners/<id>/...``), named after it.
    """
    if policies is not None:
        return [
            replace(
                rule,
                signal=rule.signal.replace("learners/default_policy/", f"learners/{policy}/")
                if rule.signal.startswith("learners/")
                else M.policy_metric(policy, rule.signal),
                name=f"{rule.name} ({policy})",
            )
            for policy in policies
            for rule in echo_trap_rules(action)
        ]
    knobs = {"lr_factor": 0.5} if action == "rollback" else {}
    return [
        Rule(
            M.FILTER_REWARD_STD,
            "below",
            0.01,
            patience=3,
            warmup=3,
            action=action,
            knobs=knobs,
            name="reward std vanished",
        ),
        Rule(
            "learners/default_policy/" + M.ENTROPY,
            "drop_from_peak",
            0.7,
            patience=3,
            warmup=3,
            action=action,
            knobs=knobs,
            name="entropy collapsed",
        ),
        Rule(
            "learners/default_policy/" + M.GRAD_NORM.format(optimizer="actor"),
            "spike_over_median",
            10.0,
            patience=1,
            warmup=5,
            action=action,
            knobs=knobs,
            name="grad-norm spike",
        ),
        # Template collapse: the first turn's reasoning stops depending on the state. Silent while replies carry
        # no reasoning (no value) or one fixed sentence from the start (peak 0).
        Rule(
            M.REASONING_ENTROPY,
            "drop_from_peak",
            0.4,
            patience=3,
            warmup=3,
            action=action,
            knobs=knobs,
            name="reasoning collapsed",
        ),
    ]


def replay(rules, rows, max_rollbacks: int = 3) -> list[Firing]:
    """The firings ``rules`` would have had over a finished run's rows (a trial's flat result rows, oldest first, as
    ``rllib_ragen.jobs.readers.read_results`` gives them): thresholds can be tried offline. Rollbacks are counted but
    not acted on (the run went on as it did)."""
    sentinel = Sentinel([as_rule(r) for r in rules], max_rollbacks)
    for index, row in enumerate(rows, 1):
        for firing in sentinel.observe(int(row.get("training_iteration", index)), row):
            if firing.action == "rollback":
                sentinel.after_rollback(firing.rule)
    return sentinel.firings


def lookup(result: Mapping[str, Any], path: str) -> float | None:
    """The number at ``path`` in a nested result whose keys may themselves hold ``/`` (RLlib's ``"actor/entropy"``
    under ``learners/default_policy``); None when absent or not a number."""
    parts = path.split("/")
    for cut in range(len(parts), 0, -1):
        key = "/".join(parts[:cut])
        if key not in result:
            continue
        value = result[key]
        if cut == len(parts):
            is_number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
            return float(value) if is_number else None
        if isinstance(value, Mapping):
            found = lookup(value, "/".join(parts[cut:]))
            if found is not None:
                return found
    return None


class Sentinel:
    """Watches results with ``rules``; :meth:`observe` returns the firings of one iteration.

    Args:
        rules: the rules, checked in order.
        max_rollbacks: rollbacks allowed over the run; a rollback rule firing after that stops the run instead.
    """

    def __init__(self, rules=(), max_rollbacks: int = 3):
        self.rules = [as_rule(r) for r in rules]
        self.max_rollbacks = max_rollbacks
        self.firings: list[Firing] = []
        self.rollbacks = 0
        self.lr_factor = 1.0
        self.rollout_filter_ratio: float | None = None  # None: the config's
        self.stopped = False
        self._tracks = [{"history": [], "peak": None, "streak": 0, "seen": 0} for _ in self.rules]

    @property
    def healthy(self) -> bool:
        """No rule's condition holds right now (the weights are worth keeping as a rollback point)."""
        return all(track["streak"] == 0 for track in self._tracks)

    def observe(self, iteration: int, result: Mapping[str, Any]) -> list[Firing]:
        """Update every rule with this iteration's result; the firings, in rule order (not yet acted on)."""
        fired = []
        for rule, track in zip(self.rules, self._tracks):
            value = lookup(result, rule.signal)
            if value is None or not math.isfinite(value):
                continue  # not measured this iteration (an interval signal), or not a number: nothing to judge
            holds, compared_with = self._holds(rule, track, value)
            track["streak"] = track["streak"] + 1 if holds else 0
            track["history"] = (track["history"] + [value])[-HISTORY:]
            track["peak"] = value if track["peak"] is None else max(track["peak"], value)
            track["seen"] += 1
            if track["streak"] >= rule.patience:
                track["streak"] = 0  # fires again only after another `patience` iterations
                fired.append(Firing(iteration, rule.label, rule.signal, value, compared_with, self._action(rule)))
        self.firings += fired
        return fired

    def _holds(self, rule: Rule, track: dict, value: float) -> tuple[bool, float]:
        if track["seen"] < rule.warmup:
            return False, math.nan
        if rule.kind == "below":
            return value < rule.threshold, rule.threshold
        if rule.kind == "drop_from_peak":
            peak = track["peak"]
            return peak > 0 and value < (1 - rule.threshold) * peak, peak
        median = float(np.median(track["history"]))
        return median > 0 and value > rule.threshold * median, median

    def _action(self, rule: Rule) -> str:
        if rule.action == "rollback" and self.rollbacks >= self.max_rollbacks:
            return "stop"  # the rollback budget is spent: going on would loop
        return rule.action

    def after_rollback(self, rule_label: str) -> None:
        """Count a rollback, apply its rule's knobs and clear every streak (the restored weights start afresh)."""
        rule = next(r for r in self.rules if r.label == rule_label)
        self.rollbacks += 1
        self.lr_factor *= float(rule.knobs.get("lr_factor", 1.0))
        if "rollout_filter_ratio" in rule.knobs:
            self.rollout_filter_ratio = float(rule.knobs["rollout_filter_ratio"])
        for track in self._tracks:
            track["streak"] = 0

    # ---- state (checkpoints: a resumed run keeps its knobs, peaks and firings) ------------------------------------
    def get_state(self) -> dict:
        return {
            "firings": [asdict(f) for f in self.firings],
            "rollbacks": self.rollbacks,
            "lr_factor": self.lr_factor,
            "rollout_filter_ratio": self.rollout_filter_ratio,
            "stopped": self.stopped,
            "tracks": [dict(t, history=list(t["history"])) for t in self._tracks],
        }

    def set_state(self, state: dict) -> None:
        self.firings = [Firing(**f) for f in state["firings"]]
        self.rollbacks, self.lr_factor = state["rollbacks"], state["lr_factor"]
        self.rollout_filter_ratio, self.stopped = state["rollout_filter_ratio"], state["stopped"]
        if len(state["tracks"]) == len(self._tracks):
            self._tracks = [dict(t, history=list(t["history"])) for t in state["tracks"]]
        else:
            logger.warning(
                "the checkpoint's sentinel watched %d rules and this one %d: the rules' running peaks and "
                "medians start afresh.",
                len(state["tracks"]),
                len(self._tracks),
            )
