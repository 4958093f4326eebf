"""Where and when StarPO's rollouts play: the groups fanned out over the env runners (a runner that dies
mid-rollout is restarted and the rollout played again, with the same seeds), the training seeds, and with
``max_policy_lag=1`` the next rollout played in a thread beside the update (one-step off-policy)."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from .. import metrics as M
from ..envs.games import make_game
from ..rollout.backends import SamplingParams
from ..rollout.seats import DEFAULT_POLICY, group_by_seat
from ..rollout.trajectory import rollout_metrics
from ..rollout.trajectory import SeedSchedule, Start, Trajectory
from .knobs import settings_from
from .league import League, league_metrics

if TYPE_CHECKING:
    from .starpo import StarPO

logger = logging.getLogger(__name__)

MAX_ROLLOUT_ATTEMPTS = 3  # a rollout played again after env runners died in it, before the step gives up
ROLLOUT_THREAD = "rllib_ragen_rollout"  # the thread that plays the next rollout beside the update (max_policy_lag)


def sample_seed(seed: int | None, purpose: str, iteration: int) -> int:
    """The sampling seed of a run of ``seed`` for ``purpose`` ("train" or "validation") at ``iteration``."""
    words = [seed or 0, iteration, 0 if purpose == "train" else 1]
    return int(np.random.SeedSequence(words).generate_state(1)[0])


def validation_sample_seed(config) -> int:
    """The sampling seed every validation of a run plays with (the same states, the same seed: paired)."""
    return sample_seed(config.seed, "validation", 0)


class RolloutScheduler:
    """The rollouts of one :class:`StarPO` algorithm, and their state: the seed schedule and the rollout in flight.

    Args:
        algorithm: the algorithm whose env runners play (its ``restore_env_runners`` restarts dead ones, its
            ``sync_rollout_weights`` sends the learner's weights).
    """

    def __init__(self, algorithm: "StarPO"):
        self.algorithm = algorithm
        self.config = algorithm.config
        self.seed_schedule = settings_from(self.config, SeedSchedule)  # from train_seed_start on
        self._thread = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=ROLLOUT_THREAD) if self.config.max_policy_lag else None
        )
        # The rollout playing beside the update: the future (or its result, once collected) and the update
        # count of the policy that played it.
        self._pending: dict | None = None
        # Self-play's frozen opponents (league_interval): snapshots taken as each rollout's starts are drawn.
        self.league = (
            League(self.config.league_interval, self.config.league_size) if self.config.league_interval else None
        )

    @property
    def in_flight(self) -> bool:
        """Whether a rollout played beside the update is waiting to be trained on."""
        return self._pending is not None

    # ---- training rollouts ----------------------------------------------------------------------------------------
    def training_rollout(self, iteration: int) -> tuple[list[Trajectory], dict[str, float], int]:
        """This iteration's training rollout and the number of updates its policy had seen: the one played beside
        the previous update when there is one (the runners then get the update's weights), else one played now."""
        if self._pending is not None:
            trajectories, results = self.collect()
            played_by, self._pending = self._pending["played_by"], None
            with self.algorithm._timer(M.TIME_SYNC):
                self.algorithm.sync_rollout_weights()  # the runners were busy during the update
            return trajectories, results, played_by
        trajectories, results = self._play_training(*self._training_rollout_args(iteration))
        return trajectories, results, iteration

    def start_next(self, iteration: int) -> None:
        """Start iteration ``iteration``'s rollout on the env runners, in the rollout thread, with their current
        weights (the update about to run is not in them)."""
        args = self._training_rollout_args(iteration)  # here, not in the thread: it takes the next seeds
        self._pending = {"future": self._thread.submit(self._play_training, *args), "played_by": iteration - 1}

    def _training_rollout_args(self, iteration: int) -> tuple:
        """What iteration ``iteration``'s training rollout plays: the next ``num_groups`` fresh seeds as starts of
        the training environment(s), its sampling and sampling seed, its curriculum stage, and with a league each
        group's opponent (None: self-play), the learner joining the league first when a snapshot is due."""
        starts = self.config.training_starts(self.seed_schedule.train(self.config.num_groups))
        opponents = None
        if self.league is not None:
            if self.league.due(iteration):
                self.league.add(iteration, self.algorithm.policy_weights())
            opponents = self.league.draw(len(starts), (self.config.seed or 0, iteration))
        return (
            starts,
            self.config.group_size,
            self.config.sampling_params(),
            self.sample_seed("train", iteration),
            self.config.curriculum_stage(iteration) if self.config.curriculum else None,
            self.config.training_env_config(iteration),
            opponents,
        )

    def _play_training(self, starts, group_size, sampling, sample_seed, stage, env_config, opponents=None):
        every_seat = self.config.self_play  # validation plays one seat against the opponent, as a text environment
        trajectories, results = self.play(
            starts, group_size, sampling, sample_seed, env_config, every_seat, opponents=opponents
        )
        if stage is not None:
            results[M.CURRICULUM_STAGE] = float(stage)
        return trajectories, results

    def collect(self) -> tuple[list[Trajectory], dict[str, float]]:
        """Wait for the rollout in flight and keep its result; the env runners are idle afterwards."""
        pending = self._pending
        if "future" in pending:
            try:
                pending["result"] = pending["future"].result()
            except BaseException:
                self._pending = None  # it failed (and says why): the next iteration plays its own rollout
                raise
            del pending["future"]
        return pending["result"]

    def drop(self) -> None:
        """Forget the rollout in flight (after a rollback its policy is the one rolled back from)."""
        self.collect()
        self._pending = None

    def wait_outside_the_rollout_thread(self) -> None:
        """Let the rollout in flight finish, unless this is the thread playing it (which restores dead runners
        itself, mid-rollout)."""
        if self._pending is not None and not threading.current_thread().name.startswith(ROLLOUT_THREAD):
            self.collect()

    def runners_on_current_weights(self) -> None:
        """Off-policy: let the runners finish the rollout in flight, then give them the learner's weights."""
        if self._pending is not None:
            self.collect()
            self.algorithm.sync_rollout_weights()

    def sample_seed(self, purpose: str, iteration: int) -> int:
        return sample_seed(self.config.seed, purpose, iteration)

    # ---- the fan-out over env runners ---------------------------------------------------------------------------
    def play(
        self,
        seeds: list[Start],
        group_size: int,
        sampling: SamplingParams,
        sample_seed: int,
        env_config: dict | None = None,
        every_seat: bool = False,
        opponents: list[str | None] | None = None,
    ) -> tuple[list[Trajectory], dict[str, float]]:
        """Split the groups over the env runners, play them, and pool trajectories and metrics (``env_config``:
        the arguments a curriculum stage builds ``config.env`` with; ``every_seat``: play every seat of the game
        ``config.env`` names, self-play; ``opponents``: with it, each group's league opponent, whose seats are
        played and then left out of the trajectories returned)."""
        algorithm, restarts = self.algorithm, 0
        if not algorithm.env_runner_group.num_remote_env_runners():
            chunks = {0: list(range(len(seeds)))}
            runner = algorithm.env_runner
            parts = [
                (
                    0,
                    runner.sample(
                        seeds=seeds,
                        group_size=group_size,
                        sampling=sampling,
                        sample_seed=sample_seed,
                        env_config=env_config,
                        every_seat=every_seat,
                        **self._league_part(opponents),
                    ),
                    runner.get_metrics(),
                )
            ]
        else:
            chunks, parts, restarts = self._play_on_remote_runners(
                seeds, group_size, sampling, sample_seed, env_config, every_seat, opponents
            )
        # Runners number their groups from 0; make the ids global, in seed order.
        offsets = dict(zip(chunks, np.cumsum([0] + [len(c) for c in chunks.values()]).tolist()))
        trajectories = []
        for index, part, _ in sorted(parts, key=lambda p: p[0]):
            for t in part:
                t.group += offsets[index]
            trajectories += part
        league = {}
        if opponents is not None:  # the snapshots' seats are played, never trained
            league = league_metrics(trajectories, opponents, len(self.league.snapshots))
            trajectories = [t for t in trajectories if t.policy_id == DEFAULT_POLICY]
        if every_seat:  # each seat of a group its own group, numbered after the offsets
            game_config = (env_config if env_config is not None else self.algorithm.config.env_config).get(
                "game_config"
            )
            group_by_seat(trajectories, make_game(self.algorithm.config.env, config=dict(game_config or {})).agents)
        runner_metrics = [m for _, _, m in parts]
        metrics = rollout_metrics(trajectories, group_size)
        for key in (M.TIME_GENERATE, M.TIME_ROLLOUT):
            metrics[key] = max(m.get(key, 0.0) for m in runner_metrics)
        for key in M.ROLLOUT_COUNTERS:
            metrics[key] = sum(m.get(key, 0.0) for m in runner_metrics)
        metrics[M.ENV_RUNNER_RESTARTS] = float(restarts)
        metrics.update(league)
        first_error = next((m[M.FIRST_ENV_ERROR] for m in runner_metrics if m.get(M.FIRST_ENV_ERROR)), None)
        if first_error is not None:  # text, not a metric: the consumers take it out before logging
            metrics[M.FIRST_ENV_ERROR] = first_error
        return trajectories, metrics

    def _play_on_remote_runners(
        self,
        seeds: list[Start],
        group_size: int,
        sampling: SamplingParams,
        sample_seed: int,
        env_config: dict | None,
        every_seat: bool,
        opponents: list[str | None] | None = None,
    ):
        """Play the groups on the healthy remote env runners; returns (chunks, parts, restarted runners).

        A runner that dies mid-rollout fails its part: RLlib's fault tolerance restarts it
        (``restart_failed_env_runners``, on by default) and the whole rollout is played again, with the same seeds,
        so a restart changes no result. Without a restart, the groups go to the runners left.
        """
        group, restarts = self.algorithm.env_runner_group, 0
        for _ in range(MAX_ROLLOUT_ATTEMPTS):
            remote = group.healthy_env_runner_ids()
            if not remote:
                break
            # Consecutive groups per runner (a mixture's environments stay in order across the runners).
            chunks = {
                rid: part.tolist() for rid, part in zip(remote, np.array_split(np.arange(len(seeds)), len(remote)))
            }

            def play(runner, starts, league):
                index = runner.worker_index
                return (
                    index,
                    runner.sample(
                        seeds=starts,
                        group_size=group_size,
                        sampling=sampling,
                        sample_seed=sample_seed + index,
                        env_config=env_config,
                        every_seat=every_seat,
                        **league,
                    ),
                    runner.get_metrics(),
                )

            # One call a runner, its own groups and league snapshots as its arguments: a closure holding every
            # runner's part would ship every snapshot to every runner.
            parts = group.foreach_env_runner(
                [play] * len(remote),
                kwargs=[
                    {"starts": [seeds[i] for i in chunks[rid]], "league": self._league_part(opponents, chunks[rid])}
                    for rid in remote
                ],
                local_env_runner=False,
                remote_worker_ids=remote,
            )
            if len(parts) == len(remote):
                return chunks, parts, restarts
            restored = self._restore_env_runners_waiting()
            restarts += len(restored)
            logger.warning(
                "env runners %s failed during a rollout; restarted %s, playing the rollout again.",
                sorted(set(remote) - {index for index, _, _ in parts}),
                restored,
            )
        raise RuntimeError(
            f"the rollout failed on its env runners {MAX_ROLLOUT_ATTEMPTS} times, or none is left "
            f"(healthy now: {group.healthy_env_runner_ids()}). See the env runner errors above; "
            "restart_failed_env_runners in .fault_tolerance() restarts dead ones."
        )

    def _league_part(self, opponents: list[str | None] | None, groups: list[int] | None = None) -> dict:
        """The league arguments of a runner playing ``groups`` (indices into the rollout's groups; None: all): each
        group's opponent and the snapshots they name (empty without a league)."""
        if opponents is None:
            return {}
        mine = [opponents[g] for g in (range(len(opponents)) if groups is None else groups)]
        return {"opponents": mine, "league": {name: self.league.snapshots[name] for name in set(mine) if name}}

    def _restore_env_runners_waiting(self) -> list[int]:
        """RLlib's restore of dead env runners, repeated while Ray restarts their processes (a ping right after a
        crash fails), up to ``env_runner_health_probe_timeout_s``; returns the restored runner ids."""
        algorithm = self.algorithm
        group = algorithm.env_runner_group
        restored = algorithm.restore_env_runners(group)
        deadline = time.monotonic() + self.config.env_runner_health_probe_timeout_s
        while (
            not restored
            and self.config.restart_failed_env_runners
            and time.monotonic() < deadline
            and len(group.healthy_env_runner_ids()) < group.num_remote_env_runners()
        ):
            time.sleep(1.0)
            restored = algorithm.restore_env_runners(group)
        return restored

    # ---- checkpoints and shutdown -----------------------------------------------------------------------------
    def get_state(self) -> dict:
        """The seed schedule, and the rollout played beside the last update: a resumed run trains on the same one."""
        pending = None
        if self._pending is not None:
            trajectories, results = self.collect()
            pending = {"trajectories": trajectories, "results": results, "played_by": self._pending["played_by"]}
        league = self.league.get_state() if self.league is not None else None
        return {"seed_schedule": self.seed_schedule.get_state(), "pending_rollout": pending, "league": league}

    def set_state(self, state: dict) -> None:
        self.seed_schedule.set_state(state["seed_schedule"])
        if self.league is not None and state.get("league") is not None:
            self.league.set_state(state["league"])
        pending = state.get("pending_rollout")
        if pending is not None and self.config.max_policy_lag:
            self._pending = {"result": (pending["trajectories"], pending["results"]), "played_by": pending["played_by"]}

    def shutdown(self) -> None:
        if self._thread is not None:
            if self._pending is not None and "future" in self._pending:
                self._pending["future"].exception()  # let it finish: the env runners are stopped next
            self._thread.shutdown()
            self._thread = None
