"""The learning curve: which panels a run's results draw, their validation points, and the one renderer
(:func:`plot_learning_curve`), whose picture the report saves and the rollout viewer shows.
"""

from __future__ import annotations

import math

from .. import metrics as M
from .outputs import BEFORE_RL, LEARNER, TRAINING, VALIDATED_AT, VALIDATION


def trailing_mean(values: list[float], window: int) -> list[float]:
    """Mean of the last ``window`` finite values up to each point (NaN until one exists)."""
    out = []
    for i in range(len(values)):
        recent = [v for v in values[max(0, i + 1 - window) : i + 1] if math.isfinite(v)]
        out.append(sum(recent) / len(recent) if recent else math.nan)
    return out


SMOOTHING = 5  # iterations in the trailing mean drawn over noisy training series


def learning_curve_panels(env: str) -> list[tuple[str, str]]:
    """The learning curve's panels in order, each as (result row column, as Tune's progress.csv names it; title)."""
    return [
        (TRAINING + M.env_metric(env, M.SUCCESS), "success"),
        (TRAINING + M.env_metric(M.POOLED, M.FORMAT_ERROR_RATE), "format-error rate"),
        (M.RESPONSE_LENGTH, "generated tokens per trajectory"),
        (M.FILTER_REWARD_STD, "in-group reward std"),
        (LEARNER + M.ENTROPY, "entropy"),
        (LEARNER + M.GRAD_NORM.format(optimizer="actor"), "actor grad norm"),
        (M.REASONING_ENTROPY, "reasoning entropy, first turn (nats)"),
        (TRAINING + M.env_metric(M.POOLED, M.EFFECTIVE_ACTION_RATE), "actions that changed the state"),
        (TRAINING + M.env_metric(M.POOLED, M.REASONING_GROUNDED), "reasoning grounded (claims that hold)"),
    ]


# The echo-trap probe's signals (collapse_diagnostics_interval), drawn after the others when a run logged them.
ECHO_TRAP_PANELS = [
    (M.MI_ESTIMATE, "MI estimate, prompts and reasonings (nats; an estimate, can dip below 0)"),
    (M.RETRIEVAL_ACCURACY, "retrieval accuracy of the prompt from its reasoning"),
    (M.DISTINCT_2, "distinct-2 of the reasonings"),
    (M.THINK_TOKENS_PER_TURN, "reasoning tokens per turn"),
]


# One line on each panel, shown under the curves in the rollout viewer: what it measures, and what a bad sign is.
PANEL_EXPLANATIONS = {
    "success": "share of episodes solved: training (raw and smoothed) and the fixed validation states (red)",
    "format-error rate": "share of replies off the <think>/<answer> template or naming no valid action",
    "generated tokens per trajectory": "tokens the policy sampled in an episode, all turns together",
    "in-group reward std": "spread of returns among episodes from one start; near 0 everywhere: nothing left to learn "
    "from (RAGEN's filter keeps the groups where it is highest)",
    "entropy": "the policy's mean token entropy on the update's tokens; a fall to near 0 is collapse",
    "actor grad norm": "size of the policy's gradient before clipping",
    "reasoning entropy, first turn (nats)": "how varied the first turn's reasoning is across episodes; falling while "
    "success does not rise: one template for every state",
    "actions that changed the state": "share of executed actions that changed the environment's state",
    "reasoning grounded (claims that hold)": 'share of checkable claims in the reasoning ("Up wall") that are true',
    ECHO_TRAP_PANELS[0][1]: "how much a reasoning tells about the state it answers (InfoNCE bound; at most log of the "
    "probe's size); near 0: the same reasoning for every state, the echo trap. An estimate "
    "from a few rows: it can dip below 0, which means no information found",
    ECHO_TRAP_PANELS[1][1]: "how often a reasoning's own prompt explains it better than the other prompts do; at "
    "chance, the reasoning ignores the state",
    ECHO_TRAP_PANELS[2][1]: "distinct token pairs over all pairs of the replies; falling: replies repeat each other",
    ECHO_TRAP_PANELS[3][1]: "length of the <think> block; traces shrink before they vanish",
}


# Why a panel can be empty in a run that works.
PANEL_EMPTY_REASONS = {
    "reasoning entropy, first turn (nats)": ":\nno reasoning in the replies",
    "reasoning grounded (claims that hold)": ":\nthe environment checks no claims",
}


def drawn_panels(rows: list[dict], env: str) -> list[tuple[str, str]]:
    """The learning curve's panels for these result rows: the nine, then the echo-trap probe's where logged."""
    return learning_curve_panels(env) + [
        (key, name) for key, name in ECHO_TRAP_PANELS if any(math.isfinite(r.get(key, math.nan)) for r in rows)
    ]


def validations_of(rows: list[dict]) -> list[dict]:
    """Each validation once, in order, as ``{evaluation/env_runners/...: value}`` (the one before RL first)."""
    validations: list[dict] = []
    if rows and BEFORE_RL + "/" in "".join(rows[0]):
        validations.append(
            {
                VALIDATION + k.removeprefix(f"{BEFORE_RL}/{TRAINING}"): v
                for k, v in rows[0].items()
                if k.startswith(f"{BEFORE_RL}/{TRAINING}")
            }
        )
    for row in rows:
        at = row.get(VALIDATED_AT, math.nan)
        if math.isfinite(at) and (not validations or validations[-1][VALIDATED_AT] != at):
            validations.append({k: v for k, v in row.items() if k.startswith(VALIDATION)})
    return validations


def validation_points(
    validations: list[dict], column: str, env: str, validation_env: str | None = None
) -> list[tuple[float, float]]:
    """(iteration, value) of a training rollout column (``env_runners/...``) in each validation that logged it:
    the validation counterpart a learning-curve panel draws beside the training series. A pooled column
    (``rollout/...``) and a column of the training environment ``env`` are read on ``validation_env`` (default
    ``env``), the environment the final table scores: validation may also play variants that training never sees,
    and pooling them would not compare with training; and a run may validate only on environments it does not
    train on. None for learner columns."""
    if not column.startswith(TRAINING):
        return []
    name = column.removeprefix(TRAINING)
    for prefix in (M.env_metric(M.POOLED, ""), M.env_metric(env, "")):
        if name.startswith(prefix):
            name = M.env_metric(validation_env or env, name.removeprefix(prefix))
            break
    key = VALIDATION + name
    return [
        (v[VALIDATED_AT], v[key]) for v in validations if isinstance(v.get(key), (int, float)) and math.isfinite(v[key])
    ]


def plot_learning_curve(
    path,
    rows: list[dict],
    validations: list[dict],
    env: str,
    title: str,
    known_scores: dict[str, float] | None = None,
    validation_env: str | None = None,
    firings: list[dict] = (),
) -> bool:
    """Nine panels over iterations (:func:`learning_curve_panels`): success (training raw and smoothed, validation
    joined, known scores), format-error rate, response length, in-group reward std, token entropy, actor grad
    norm, the first turn's reasoning entropy (the template collapse that token entropy and distinct-2 can miss),
    the share of actions that changed the state, and the share of checkable claims in the reasoning that hold.
    A rollout panel also draws its validation values (on ``validation_env``, default ``env``, the training
    environment) where validation logs them. A panel whose signal the run never logged says so. The echo-trap
    probe's panels (``ECHO_TRAP_PANELS``) follow when the run logged them, and the sentinel's ``firings`` are red
    lines on every panel. The one renderer of a run's curves: the rollout viewer shows this picture.

    ``path``: a file name or a binary file. Returns False (nothing drawn) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"(no {getattr(path, 'name', 'learning curve')}: pip install matplotlib, or rllib_ragen[plots])")
        return False
    steps = [r["training_iteration"] for r in rows]
    panels = drawn_panels(rows, env)
    columns = 3 if len(panels) <= 9 else 4
    lines = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(lines, columns, figsize=(5 * columns, 3.3 * lines), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    for ax, (key, name) in zip(axes.flat, panels):
        series = [r.get(key, math.nan) for r in rows]
        validated = validation_points(validations, key, env, validation_env)
        if not validated and not any(isinstance(v, (int, float)) and math.isfinite(v) for v in series):
            # answer-only replies have no reasoning; say so rather than leave an empty frame that looks broken
            ax.text(
                0.5,
                0.5,
                "not logged in this run" + PANEL_EMPTY_REASONS.get(name, ""),
                ha="center",
                va="center",
                transform=ax.transAxes,
                color="gray",
                wrap=True,
            )
            ax.set_yticks([])
            if steps:
                ax.set_xlim(min(steps), max(steps) + 1)
        ax.plot(steps, series, color="tab:blue", alpha=0.35, linewidth=1, label="training (raw)")
        ax.plot(
            steps,
            trailing_mean(series, SMOOTHING),
            color="tab:blue",
            linewidth=2,
            label=f"training ({SMOOTHING}-iteration mean)",
        )
        if validated:
            ax.plot(*zip(*validated), "s-", color="tab:red", label="validation")
        for firing in firings:
            ax.axvline(firing["iteration"], color="#c22", linewidth=1, alpha=0.7)
        ax.set_title(name)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    ax = axes.flat[0]
    styles = iter(["--", ":", "-."])
    for name, value in (known_scores or {}).items():
        if value is not None and math.isfinite(value):
            ax.axhline(value, color="gray", linestyle=next(styles, "--"), linewidth=1, label=f"{name} {value:.2f}")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(loc="best", fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)
    return True
