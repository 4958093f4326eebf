"""Echo-trap diagnostics: signals that multi-turn RL is collapsing onto repetitive, state-blind reasoning.

Two kinds (RAGEN, arXiv 2504.20073 sec. 4; RAGEN-2, arXiv 2604.06268):

- **Cheap, every iteration, from the rollout's tokens** (:func:`reply_diagnostics`): reasoning and answer tokens
  per turn (traces shrink before they vanish), distinct bigrams over replies (within each group and across the
  batch), the share of replies identical to another reply of their group, and the entropy of the first turn's
  reasoning over the batch (:func:`reasoning_entropy`: a fixed template whose few free words collapse to one
  value keeps its bigrams, but not its entropy). The main jobs also report that entropy on the validation states
  before and after RL, greedy and sampled, where a collapse can show before it shows at the training temperature.
- **Costlier, every ``collapse_diagnostics_interval`` iterations, on the learner** (``StarPOTorchLearner.
  collapse_probe``): cross-scoring for template collapse (:func:`cross_scoring_pairs`, :func:`cross_scoring`).
  Each of m first-turn reasoning traces is scored under its own prompt and under the other m - 1 prompts; when
  the reasoning stops depending on the state, its own prompt no longer explains it best. Retrieval accuracy is how
  often it does; the MI estimate is the InfoNCE bound ``mean_i [s_ii - logmeanexp_j s_ij]`` (nats, at most
  log m). The same probe gives each reward-variance bucket's share of groups (:func:`variance_buckets`):
  low-variance groups carry no signal, and RAGEN-2 sees their share grow. With its first run in every window
  of ``gradient_analysis_interval`` iterations it also measures each bucket's policy-gradient norm, a backward pass
  over the batch that costs about as much again as the rest of the probe.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from . import metrics as M
from .rollout.protocol import REGION_ANSWER, REGION_THINK

VARIANCE_BUCKETS = ("zero", "low", "high")  # in-group reward std: 0, at most the median of the rest, above it


def probe_schedule(iteration: int, probe_interval: int, gradient_interval: int) -> tuple[bool, bool]:
    """Whether the learner's probe runs at ``iteration``, and whether with the buckets' gradient norms: the probe
    every ``probe_interval`` iterations (0: never), the gradient norms with its first run in each window of
    ``gradient_interval`` iterations (0: never), so that switching the probe off switches them off too."""
    if not probe_interval or iteration % probe_interval:
        return False, False
    if not gradient_interval:
        return True, False
    return True, iteration == 0 or iteration // gradient_interval != (iteration - probe_interval) // gradient_interval


def reply_diagnostics(trajectories: Sequence) -> dict[str, float]:
    """The cheap collapse signals of one rollout (``Trajectory`` objects), keyed by their metric names.

    A reply is a turn's sampled tokens (end-of-turn token included). Bigrams are over token ids, so the figures
    do not depend on how a tokenizer decodes.
    """
    think, answer, replies_by_group, first_reasonings = [], [], defaultdict(list), []
    for t in trajectories:
        regions = np.asarray(t.token_regions if t.token_regions else [0] * len(t.token_ids))
        if t.turn_spans:  # the first turn's reasoning tokens
            start, end = t.turn_spans[0]
            reasoning = np.asarray(t.token_ids[start:end])[regions[start:end] == REGION_THINK]
            first_reasonings.append(tuple(reasoning.tolist()))
        for turn, (start, end) in enumerate(t.turn_spans):
            think.append(int((regions[start:end] == REGION_THINK).sum()))
            answer.append(int((regions[start:end] == REGION_ANSWER).sum()))
            replies_by_group[t.group].append((turn, tuple(t.token_ids[start:end])))
    if not think:
        return {}
    all_replies = [reply for replies in replies_by_group.values() for _, reply in replies]
    repeated = sum(_num_repeated(replies) for replies in replies_by_group.values())
    # Only where the replies reason at all: an answer-only policy has nothing to collapse.
    entropy = {M.REASONING_ENTROPY: reasoning_entropy(first_reasonings)} if any(first_reasonings) else {}
    return {
        M.THINK_TOKENS_PER_TURN: float(np.mean(think)),
        M.ANSWER_TOKENS_PER_TURN: float(np.mean(answer)),
        M.DISTINCT_2: distinct_n(all_replies, 2),
        M.DISTINCT_2_IN_GROUP: float(
            np.mean([distinct_n([r for _, r in replies], 2) for replies in replies_by_group.values()])
        ),
        M.REPEAT_RATE: repeated / len(all_replies),
        **entropy,
    }


def reasoning_entropy(reasonings: Sequence) -> float:
    """Entropy in nats of the empirical distribution of reasoning traces (texts or token-id tuples; equal ones
    count together). 0: every trace is the same; log n: all n differ. NaN for no traces.

    It sees what distinct bigrams miss: a reply template with one free word ("Optimal plan has N moves.") keeps
    the same bigrams whether N follows the state or is always 1, but its entropy falls when N stops following the
    state (RAGEN-2's template collapse; a measured case is on the Sokoban results page).
    """
    counts = Counter(reasonings)
    total = sum(counts.values())
    return sum(c / total * math.log(total / c) for c in counts.values()) if total else math.nan


def distinct_n(replies: Sequence[Sequence[int]], n: int = 2) -> float:
    """Distinct n-grams over all n-grams of ``replies`` (each reply's own n-grams; none span two replies).

    1.0: no n-gram repeats anywhere; near 0: the replies are one template. 1.0 when there are no n-grams.
    """
    grams = [tuple(reply[i : i + n]) for reply in replies for i in range(len(reply) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def _num_repeated(turn_replies: Sequence[tuple[int, tuple]]) -> int:
    """How many of a group's replies equal another reply of the group at the same turn."""
    counts = defaultdict(int)
    for key in turn_replies:
        counts[key] += 1
    return sum(c for c in counts.values() if c > 1)


# ---- cross-scoring (template collapse) ---------------------------------------------------------------------------
@dataclass
class CrossScoringPairs:
    """m first-turn prompts and the reasoning sampled after each, ready to be scored in all m x m pairings.

    ``continuations[i]`` is reply i from its first token up to the end of its reasoning; ``scored[i]`` marks the
    tokens of it that count (the reasoning inside ``<think>``, or the whole reply when it has none).
    """

    prompts: list[list[int]]
    continuations: list[list[int]]
    scored: list[list[int]]

    def __len__(self) -> int:
        return len(self.prompts)

    def sequences(self) -> tuple[list[list[int]], list[list[int]], list[tuple[int, int]]]:
        """Every pairing (reasoning i after prompt j), row by row: token ids, score masks and (i, j)."""
        ids, masks, pairs = [], [], []
        for i, (continuation, scored) in enumerate(zip(self.continuations, self.scored)):
            for j, prompt in enumerate(self.prompts):
                ids.append(list(prompt) + list(continuation))
                masks.append([0] * len(prompt) + list(scored))
                pairs.append((i, j))
        return ids, masks, pairs


def cross_scoring_pairs(trajectories: Sequence, subsample: int) -> CrossScoringPairs | None:
    """The first turn of one trajectory from each of the first ``subsample`` groups (distinct initial states).

    Returns None when fewer than 2 groups have a first reply with tokens to score: nothing to compare.
    """
    prompts, continuations, scored, seen = [], [], [], set()
    for t in trajectories:
        if t.group in seen or not t.turn_spans or len(prompts) >= subsample:
            continue
        start, end = t.turn_spans[0]
        regions = np.asarray(t.token_regions[start:end] if t.token_regions else [0] * (end - start))
        think = np.flatnonzero(regions == REGION_THINK)
        # The reasoning when there is some (its template prefix is context, not scored), else the whole reply.
        stop = start + int(think[-1]) + 1 if len(think) else end
        mask = (regions[: stop - start] == REGION_THINK) if len(think) else np.ones(end - start, dtype=bool)
        if stop <= start or not mask.any():
            continue
        seen.add(t.group)
        prompts.append(list(t.token_ids[:start]))
        continuations.append(list(t.token_ids[start:stop]))
        scored.append(mask.astype(int).tolist())
    return CrossScoringPairs(prompts, continuations, scored) if len(prompts) >= 2 else None


def cross_scoring(scores: np.ndarray) -> dict[str, float]:
    """Template-collapse statistics from ``scores[i, j]`` = log p(reasoning i | prompt j) (summed over tokens).

    - retrieval accuracy: share of reasonings whose own prompt scores strictly highest (chance: 1/m);
    - MI estimate: ``mean_i [s_ii - log(1/m sum_j exp s_ij)]``, the InfoNCE lower bound on I(prompt; reasoning)
      in nats, between about -inf and log m (0: the prompt makes no difference);
    - margin: ``mean_i [s_ii - max_{j != i} s_ij]``, in nats.
    """
    scores = np.asarray(scores, dtype=np.float64)
    m = scores.shape[0]
    own = np.diag(scores)
    others = np.where(np.eye(m, dtype=bool), -np.inf, scores)
    best_other = others.max(axis=1)
    log_mean = np.logaddexp.reduce(scores, axis=1) - math.log(m)
    return {
        M.RETRIEVAL_ACCURACY: float(np.mean(own > best_other)),
        M.MI_ESTIMATE: float(np.mean(own - log_mean)),
        M.CROSS_SCORE_MARGIN: float(np.mean(own - best_other)),
    }


# ---- reward-variance buckets ---------------------------------------------------------------------------------------
def variance_buckets(
    returns: np.ndarray, group_ids: np.ndarray, episode_ids: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Rows of each reward-variance bucket of groups: ``zero`` (every episode of the group earned the same),
    ``low`` (std at most the median std of the other groups) and ``high`` (above it). Empty buckets are left out.
    ``episode_ids``: each row's episode, when an episode has several rows (its turns): each counts once.
    """
    returns, group_ids = np.asarray(returns, dtype=np.float64), np.asarray(group_ids)
    first = (
        np.unique(np.asarray(episode_ids), return_index=True)[1] if episode_ids is not None else np.arange(len(returns))
    )
    stds = {g: float(returns[first][group_ids[first] == g].std()) for g in np.unique(group_ids)}
    varied = [s for s in stds.values() if s > 1e-8]
    median = float(np.median(varied)) if varied else 0.0
    label = {g: "zero" if s <= 1e-8 else ("low" if s <= median else "high") for g, s in stds.items()}
    rows = {name: np.flatnonzero([label[g] == name for g in group_ids]) for name in VARIANCE_BUCKETS}
    return {name: r for name, r in rows.items() if len(r)}
