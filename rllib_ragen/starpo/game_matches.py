"""A saved policy against another in one of the package's games, every seat in its own conversation: the rollout
half of :mod:`rllib_ragen.jobs.matches` (the job layer plays nothing itself)."""

from __future__ import annotations

import dataclasses

__all__ = ["MATCH_SEED_START", "play_against", "play_one_seat"]

# Far from the training (10000...), validation (123...) and demonstration (1,000,000...) seeds.
MATCH_SEED_START = 2_000_000


def _sampler(config, folder: str, device: str):
    """A saved model folder as the ``hf`` backend's sampler, and its tokenizer."""
    from ..rollout.models import load_policy
    from .inference_engines import make_backend

    model, tokenizer = load_policy(str(folder), dtype=config.sampling_dtype)
    return make_backend("hf", model.to(device), tokenizer, config), tokenizer


def _validation_sampling(config):
    """How matches sample: the validation's temperature and sampling seed (greedy would repeat one game a seat)."""
    from .rollout_scheduler import validation_sample_seed

    sampling = dataclasses.replace(config.sampling_params(validation=True), temperature=config.validation_temperature)
    return sampling, validation_sample_seed(config)


def play_one_seat(
    config, policy: str, opponent: str, games: int, *, seed_start: int = MATCH_SEED_START, device: str = "cpu"
) -> list:
    """Play ``games`` games of the built-in game ``config.env``, the model folder ``policy`` in seat ``seed % 2`` of
    game ``seed`` against the scripted ``opponent`` (``SeatEnv``'s: "random", "minimax", "equilibrium"), sampled as
    :func:`play_against` samples. Returns the policy's trajectories."""
    from ..rollout.engine import RolloutEngine

    if games < 1:
        raise ValueError(f"games={games!r}: play at least one game.")
    backend, tokenizer = _sampler(config, policy, device)
    rollout_config = dataclasses.replace(config.rollout_config(), env_config={"opponent": opponent}, environments=())
    sampling, sample_seed = _validation_sampling(config)
    seeds = list(range(seed_start, seed_start + games))
    trajectories, _ = RolloutEngine(rollout_config, backend, tokenizer).rollout(seeds, 1, sampling, sample_seed)
    return trajectories


def play_against(
    config, agent: str, opponent: str, games: int, *, seed_start: int = MATCH_SEED_START, device: str = "cpu"
) -> list:
    """Play ``games`` games of a two-seat game ``config.env`` (of :data:`rllib_ragen.envs.games.GAMES`), the model
    folder ``agent`` in seat ``seed % 2`` of game ``seed`` and ``opponent`` in the other. Returns every seat's
    trajectories (``policy_id`` "agent" or "opponent"; ``outcome`` and ``seed`` set): a seat whose game ended before
    its first turn (the other forfeited) has none, which :func:`match_outcomes` reads from the other's."""
    from ..envs.games import make_game
    from ..rollout.engine import RolloutEngine
    from ..rollout.seats import play_games

    if games < 1:
        raise ValueError(f"games={games!r}: play at least one game.")
    seats = make_game(config.env, config=dict(config.env_config.get("game_config") or {})).possible_agents
    if len(seats) != 2:
        raise ValueError(f"{config.env} has {len(seats)} seats; matches pair an agent with one opponent.")
    backends, tokenizers = {}, {}
    for name, folder in (("agent", agent), ("opponent", opponent)):
        backends[name], tokenizers[name] = _sampler(config, folder, device)
    if tokenizers["agent"].get_vocab() != tokenizers["opponent"].get_vocab():
        raise ValueError(f"{agent} and {opponent} have different tokenizers: the games' texts would differ.")
    seeds = list(range(seed_start, seed_start + games))
    engine = RolloutEngine(config.rollout_config(), backends["agent"], tokenizers["agent"])
    sampling, sample_seed = _validation_sampling(config)
    trajectories, _ = play_games(
        engine,
        config.env,
        seeds,
        1,
        sampling,
        sample_seed=sample_seed,
        game_config=config.env_config.get("game_config"),
        policies=backends,
        policy_of=lambda seat, index: "agent" if seat == seats[seeds[index] % 2] else "opponent",
    )
    return trajectories
