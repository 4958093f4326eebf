"""Every seat of a multi-agent game played by language-model policies in lockstep: one trajectory per seat.

Each seat keeps its own conversation, append-only and exact to the token as a single-agent episode's: its
instructions (the game's rules and its role), then, on each of its turns, what it sees and its sampled reply. A
seat's next message only exists once the others have moved, so its reply waits, unclosed, until its next turn
(or the game's end) brings the text that follows it. Each tick, the seats to move of every live game reply in one
batch per policy.

Rewards follow RLlib's multi-agent convention: a payoff reaches a seat's last action, so each trajectory's last
turn carries its seat's payoff, and any turn its format penalty. Which policy plays a seat is ``policy_of(seat,
game_index)``, RLlib's ``policy_mapping_fn``; by default one policy plays every seat (self-play, the role in its
prompt).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from typing import Any, Callable, Mapping, Sequence

from .. import metrics as M
from ..envs import make_game
from .backends import InferenceBackend, SamplingParams
from .engine import RolloutEngine, _turn_seed
from .episode_state import EpisodeState
from .rollout_config import RolloutSettingError
from .trajectory import Trajectory, rollout_metrics

logger = logging.getLogger(__name__)
DEFAULT_POLICY = "default_policy"  # RLlib's name for the one policy of a single-policy algorithm


class _Seat:
    """One seat's episode in one game: its conversation, and its last reply while it waits for its next turn."""

    def __init__(self, episode: EpisodeState):
        self.episode = episode
        self.waiting = None  # the last Generation, not yet followed by the next message


def play_games(
    engine: RolloutEngine,
    game_id: str,
    seeds: Sequence[int],
    group_size: int,
    sampling: SamplingParams,
    *,
    sample_seed: int | None = None,
    game_config: Mapping[str, Any] | None = None,
    policies: Mapping[str, InferenceBackend] | None = None,
    policy_of: Callable[[str, int], str] | None = None,
) -> tuple[list[Trajectory], dict[str, float]]:
    """Play ``len(seeds)`` groups of ``group_size`` games of ``game_id``; group g's games reset from ``seeds[g]``.

    Args:
        engine: its config (the agent loop's limits, the chat template, the format penalty) and tokenizer play
            every seat; its backend is the default policy's.
        game_id: a game of :func:`rllib_ragen.envs.games.make_game`, built with ``game_config``.
        seeds, group_size, sampling, sample_seed: as :meth:`RolloutEngine.rollout`'s.
        policies: policy id -> the backend that samples it; default ``{"default_policy": engine.backend}``.
        policy_of: ``(seat, game index) -> policy id``; default: every seat ``"default_policy"``.

    Returns:
        One trajectory per seat that moved in each game (``seat``, ``policy_id`` and ``outcome`` set; ``group`` its
        game's group), and metrics: the rollout's, with each seat's win, draw and loss rates among them.
    """
    c, chat, guard = engine.config, engine.chat, engine.text_guard
    if c.max_actions_per_turn != 1:
        raise RolloutSettingError(
            f"max_actions_per_turn={c.max_actions_per_turn}: a game's seat makes one move a turn; set it to 1."
        )
    policies = dict(policies or {DEFAULT_POLICY: engine.backend})
    policy_of = policy_of or (lambda seat, index: DEFAULT_POLICY)
    t_start, t_generate = time.perf_counter(), 0.0
    counts: Counter = Counter({key: 0 for key in M.ROLLOUT_COUNTERS})
    members = [(g, seed) for g, seed in enumerate(seeds) for _ in range(group_size)]
    games = [make_game(game_id, config=dict(game_config or {})) for _ in members]
    views: list[
        dict
    ] = []  # per game: what each seat sees now (from reset and step; TextArena hands each text out once)
    failed: set[int] = set()  # games whose reset or step raised, or paid a non-finite payoff: dropped, counted
    for index, (game, (_, seed)) in enumerate(zip(games, members)):
        try:
            observations, _ = game.reset(seed=int(seed))
        except Exception as error:  # the game's fault, isolated as the engine isolates an environment's
            logger.error("%s: reset failed for seed %s; dropping that game", game_id, seed, exc_info=error)
            counts[M.ENV_ERRORS] += 1
            failed.add(index)
            observations = {}
        views.append(dict(observations))
    seats: list[dict[str, _Seat]] = [{} for _ in games]

    def message(observation: str, t: Trajectory) -> str:
        reward = t.turn_rewards[-1] if t.turn_rewards else None
        actions_left = c.max_actions_per_episode - t.num_actions
        return engine._user_message(guard.plain(observation, counts), t.num_turns + 1, actions_left, reward, False)

    def open_seat(index: int, seat: str) -> _Seat:
        game, (group, seed) = games[index], members[index]
        instructions = guard.plain(game.instructions(seat), counts)
        trajectory = Trajectory(
            game_id, group, int(seed), [], [], [], seat=seat, policy_id=policy_of(seat, index), game=index % group_size
        )
        first = message(views[index][seat], trajectory)
        episode = EpisodeState(None, trajectory, chat.prompt_ids(instructions + "\n" + first))
        episode.chat, episode.instructions, episode.messages = chat, instructions, [first]
        episode.prompt_ids = list(trajectory.token_ids)
        return _Seat(episode)

    def continue_seat(played: _Seat, observation: str) -> bool:
        """Append the text between the seat's last reply and its next one; False when the context has no room."""
        episode, t = played.episode, played.episode.trajectory
        reply_ids = played.waiting.token_ids
        text = message(observation, t)
        continuation = chat.encode(chat.next_turn_text(reply_ids, text))
        if c.window_turns is None:
            next_length = len(t.token_ids) + len(continuation)
        else:
            next_length = len(engine._window_prompt(_with_turn(episode, text, list(reply_ids) + continuation)))
        if next_length + engine.reply_reserve + 1 > c.max_context_tokens:
            return False
        if c.window_turns is not None:
            episode.messages.append(text)
            episode.exchanges.append(list(reply_ids) + continuation)
            episode.prompt_ids = engine._window_prompt(episode)
        episode.append(continuation)
        played.waiting = None
        return True

    def close_game(index: int, payoffs: Mapping[str, float], truncated: bool) -> None:
        for seat, played in seats[index].items():
            t = played.episode.trajectory
            t.turn_rewards[-1] += float(payoffs.get(seat, 0.0))
            t.success, t.truncated = payoffs.get(seat, 0.0) > 0, truncated
            t.outcome = games[index].outcome(seat) if games[index].game_over else "unfinished"
            played.episode.append(chat.encode(chat.reply_end_text(played.waiting.token_ids)))
            played.episode.done = True

    live = set(range(len(games))) - failed
    for tick in range(1, max(game.max_moves for game in games) + 1):
        movers = []  # (game index, seat, its _Seat) of every live game
        for index in sorted(live):
            game = games[index]
            seat = game.to_move()
            if seat not in seats[index]:
                seats[index][seat] = open_seat(index, seat)
            else:
                t = seats[index][seat].episode.trajectory
                # The seat's own limits end the game as they end a single-agent episode: truncated, nobody paid.
                spent = t.num_actions >= c.max_actions_per_episode or t.num_turns >= c.max_turns
                if spent or not continue_seat(seats[index][seat], views[index][seat]):
                    counts[M.OBSERVATIONS_TOO_LONG] += int(not spent)  # no room left for the next turn
                    close_game(index, {}, truncated=True)
                    live.discard(index)
                    continue
            movers.append((index, seat, seats[index][seat]))
        if not movers:
            break
        t0 = time.perf_counter()
        generations = {}
        for policy in sorted({m[2].episode.trajectory.policy_id for m in movers}):
            mine = [m for m in movers if m[2].episode.trajectory.policy_id == policy]
            prompts = [engine._prompt(m[2].episode) for m in mine]
            sampled = policies[policy].generate(
                prompts,
                sampling,
                _turn_seed(sample_seed, tick, 0),
                max_new_tokens=[engine._reply_room(p) for p in prompts],
            )
            generations.update({(m[0], m[1]): g for m, g in zip(mine, sampled)})
        t_generate += time.perf_counter() - t0
        for index, seat, played in movers:
            episode, generation = played.episode, generations[(index, seat)]
            t = episode.trajectory
            episode.state_key = f"{seat}\n{views[index][seat]}"
            reply = engine._record_reply(episode, generation)
            move = reply.actions[0] if reply.format_ok and reply.actions else ""
            game = games[index]
            legal = game.canonical_action(seat, move) is not None
            # Valid: a move of the game (any text, where the game judges); effective: legal now, so played.
            known = bool(move) and (
                not game.action_vocabulary or move.lower() in map(str.lower, game.action_vocabulary)
            )
            t.turn_rewards.append(0.0 if reply.format_ok and reply.actions else c.format_penalty)
            t.turn_actions.append([move] if legal else [])
            t.format_errors += int(not (reply.format_ok and reply.actions))
            t.num_actions += int(bool(move))
            t.num_valid += int(known)
            t.num_effective += int(legal)
            t.num_invalid += int(bool(move) and not known)
            counts[M.ACTIONS_DROPPED] += reply.num_dropped  # moves past the first: one move a turn
            played.waiting = generation
            try:
                observations, rewards, terminated, truncated, _ = game.step({seat: move})
                if not all(math.isfinite(r) for r in rewards.values()):
                    raise ValueError(f"non-finite payoff {rewards}")
            except Exception as error:  # the game's fault: its seats' trajectories are dropped, counted
                logger.error(
                    "%s: step failed (seed %s); dropping that game", game_id, members[index][1], exc_info=error
                )
                counts[M.ENV_ERRORS] += 1
                failed.add(index)
                live.discard(index)
                continue
            views[index].update(observations)
            if terminated["__all__"] or truncated["__all__"]:
                close_game(index, rewards, truncated["__all__"])
                live.discard(index)
    for index in live:  # not over within the game's own move limit: cannot happen, its step truncates first
        close_game(index, {}, truncated=True)
    trajectories = [s.episode.trajectory for i, table in enumerate(seats) if i not in failed for s in table.values()]
    for t in trajectories:
        t.text = engine.tokenizer.decode(t.token_ids)
    metrics = rollout_metrics(trajectories, group_size)
    metrics.update({key: float(value) for key, value in counts.items()})
    metrics[M.SEATS_NEVER_MOVED] = float(
        sum(len(g.possible_agents) - len(t) for i, (g, t) in enumerate(zip(games, seats)) if i not in failed)
    )
    metrics.update({M.TIME_ROLLOUT: time.perf_counter() - t_start, M.TIME_GENERATE: t_generate})
    return trajectories, metrics


def group_by_seat(trajectories: Sequence[Trajectory], seats: Sequence[str]) -> None:
    """Give each seat of a group its own group: group ``g``'s seat ``k`` (its index in ``seats``) becomes group
    ``g * len(seats) + k``, so that advantages compare a seat's games with the same role from the same initial
    state (GRPO per role, as SPIRAL's role-conditioned baseline asks)."""
    for t in trajectories:
        t.group = t.group * len(seats) + list(seats).index(t.seat)


def _with_turn(episode: EpisodeState, message: str, exchange: list[int]) -> EpisodeState:
    """A look at ``episode`` one turn on (its messages and exchanges extended), to measure the next window."""
    ahead = EpisodeState.__new__(EpisodeState)
    ahead.__dict__.update(episode.__dict__)
    ahead.messages, ahead.exchanges = episode.messages + [message], episode.exchanges + [exchange]
    return ahead
