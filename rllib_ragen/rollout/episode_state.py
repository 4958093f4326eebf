"""One episode's state while the rollout engine plays it: its environment, its trajectory so far, what its next
reply reads, and what a limited context window rebuilds that from."""

from __future__ import annotations

from .context import ChatFormat
from .protocol import REGION_OTHER
from .tools import ToolSet
from .trajectory import Trajectory


class EpisodeState:
    """Mutable per-environment state while a rollout runs."""

    def __init__(self, env, trajectory: Trajectory, prompt_ids: list[int]):
        self.env, self.trajectory = env, trajectory
        trajectory.token_ids.extend(prompt_ids)
        trajectory.response_mask.extend([0] * len(prompt_ids))
        trajectory.behaviour_logprobs.extend([0.0] * len(prompt_ids))
        trajectory.token_regions.extend([REGION_OTHER] * len(prompt_ids))
        self.actions_left = 0
        self.state_key = ""  # of the state the next reply answers
        self.max_turns = 0
        self.done = False
        self.failed = False  # the environment raised; the trajectory is dropped
        # A limited context window rebuilds each prompt from these: the instructions, each turn's user message,
        # and the ids between one reply's start and the next reply (the reply as sampled, then the next message).
        self.instructions = ""
        self.messages: list[str] = []
        self.exchanges: list[list[int]] = []
        self.prompt_ids: list[int] = []  # what the next reply reads
        self.raw_reply = False  # the environment reads each whole reply itself (TextEnv.raw_replies)
        self.tools: ToolSet | None = None  # the environment's tools: the episode is played in tool mode
        self.chat: ChatFormat | None = None  # the chat format of its conversation (its tools, if any)

    def append(self, ids: list[int], logprobs: list[float] | None = None, regions: list[int] | None = None) -> None:
        t = self.trajectory
        t.token_ids.extend(ids)
        t.response_mask.extend([1 if logprobs is not None else 0] * len(ids))
        t.behaviour_logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        t.token_regions.extend(regions if regions is not None else [REGION_OTHER] * len(ids))
