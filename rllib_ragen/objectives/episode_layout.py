"""Per-turn rows laid back out as episodes, so every advantage estimator sees whole episodes.

With a limited context window (``StarPOConfig.context_window``) the learner trains each turn as its own row: its
prompt and its reply. Credit, though, is the episode's: GRPO compares episode returns, GAE runs from the last turn
back to the first. :class:`EpisodeLayout` puts each episode's replies end to end, in turn order, with one unsampled
position between two replies, so each reply is one contiguous run of sampled tokens as in the full conversation.
The estimators skip unsampled positions (or recurse over turn ends), so on this layout they give every reply token
the advantage it would have in the full conversation; :meth:`EpisodeLayout.scatter` puts them back on the rows.
"""

from __future__ import annotations

import torch


class EpisodeLayout:
    """Where each sampled token of a batch of turn rows sits in its episode.

    Args:
        episode: (R,) the episode of each row (any integer id; episodes are ordered by first appearance).
        turn: (R,) each row's turn within its episode (0, 1, ...): rows are placed in this order.
        response_mask: (R, T) 1 on each row's sampled tokens: one contiguous reply per row.
    """

    def __init__(self, episode: torch.Tensor, turn: torch.Tensor, response_mask: torch.Tensor):
        episode, turn = episode.tolist(), turn.tolist()
        self.shape = tuple(response_mask.shape)
        self.episodes = list(dict.fromkeys(episode))
        rows_of = {e: sorted((t, r) for r, (e2, t) in enumerate(zip(episode, turn)) if e2 == e) for e in self.episodes}
        sampled = [torch.nonzero(response_mask[r] > 0).flatten().tolist() for r in range(len(episode))]
        # Each episode's sampled positions in turn order, one gap (-1) between two rows' replies.
        layout = []
        for e in self.episodes:
            positions: list[int] = []
            for k, (_, row) in enumerate(rows_of[e]):
                positions += ([-1] if k else []) + [row * self.shape[1] + p for p in sampled[row]]
            layout.append(positions)
        width = max((len(p) for p in layout), default=0)
        self.index = torch.full((len(layout), width), -1, dtype=torch.long)
        for i, positions in enumerate(layout):
            self.index[i, : len(positions)] = torch.tensor(positions, dtype=torch.long)
        self.mask = (self.index >= 0).to(response_mask.dtype)
        self.first_row = torch.tensor([rows_of[e][0][1] for e in self.episodes], dtype=torch.long)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """(R, T) row values -> (E, L) episode values (0 in the gaps and the padding)."""
        flat = x.reshape(-1)
        return torch.where(self.index >= 0, flat[self.index.clamp(min=0)], torch.zeros((), dtype=x.dtype))

    def scatter(self, y: torch.Tensor) -> torch.Tensor:
        """(E, L) episode values -> (R, T) row values, on the rows' sampled tokens (0 elsewhere)."""
        out = torch.zeros(self.shape[0] * self.shape[1], dtype=y.dtype, device=y.device)
        placed = self.index >= 0
        out[self.index[placed]] = y[placed]
        return out.reshape(self.shape)

    def per_episode(self, x: torch.Tensor) -> torch.Tensor:
        """(R,) a per-row value that is the same on all of an episode's rows -> (E,)."""
        return x[self.first_row]
