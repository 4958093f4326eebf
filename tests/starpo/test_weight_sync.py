"""Weight sync in one process (``weight_sync.py``): the env runner plays the learner's own tensors, moves no bytes,
and samples exactly what a fresh forward pass of the learner's weights gives, after every update."""

import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_ragen import metrics as M
from rllib_ragen.hardware import peak_rss_gib
from rllib_ragen.rollout.backends import SamplingParams
from rllib_ragen.rollout.models import load_policy
from rllib_ragen.starpo.weight_sync import share_or_copy, shares_storage, state_bytes


def _learner_policy(algo):
    return algo.learner_group._learner.module[DEFAULT_MODULE_ID].unwrapped().policy


def _fresh_logprobs(policy, trajectory, temperature):
    ids = torch.tensor([trajectory.token_ids])
    with torch.no_grad():
        logits = policy(input_ids=ids).logits.float()[0, :-1] / temperature
    logp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    mask = torch.tensor(trajectory.response_mask[1:], dtype=torch.bool)
    return logp[mask], torch.tensor(trajectory.behaviour_logprobs[1:])[mask]


def test_the_env_runner_plays_the_learners_own_tensors_after_each_update(ray_session, small_config):
    algo = small_config(temperature=0.8).build_algo()
    try:
        for _ in range(2):
            result = algo.train()
            learner, sampler = _learner_policy(algo), algo.env_runner.module.policy
            assert shares_storage(learner.state_dict(), sampler)  # the same tensors, not equal copies
            assert result[M.SYNC_BYTES] == 0.0
            # The algorithm's process (here this one) at its fullest so far: the iteration's own reading.
            assert 0.1 < result[M.PEAK_RSS] <= peak_rss_gib()
            assert algo.env_runner.weights_seq_no == algo.learner_group._learner._weights_seq_no
        # An optimizer step changes what the sampler plays at once: a rollout now samples the learner's policy.
        trajectories = algo.play_validation_states(temperature=0.8)
        learner = _learner_policy(algo)
        for t in trajectories:
            fresh, recorded = _fresh_logprobs(learner, t, 0.8)
            torch.testing.assert_close(recorded, fresh, atol=1e-5, rtol=0)
    finally:
        algo.stop()


def test_the_sampler_does_not_keep_a_kv_cache_of_old_weights(ray_session, small_config):
    algo = small_config().build_algo()
    try:
        algo.train()
        backend = algo.env_runner.backend
        assert not backend._caches  # train() ended with a sync after its update
        played = algo.play_validation_states(temperature=0.0)
        assert not backend._caches  # the rollout's conversations ended, and their keys and values went with them
        backend.generate([played[0].token_ids[:8]], SamplingParams(max_new_tokens=2, stop_strings=()), seed=0)
        assert backend._caches  # a conversation still open keeps its cache...
        algo.sync_rollout_weights()
        assert not backend._caches  # ...until new weights come
    finally:
        algo.stop()


def test_share_or_copy_shares_or_copies_as_asked_and_counts_bytes():
    source, _ = load_policy("tiny", seed=0)
    target, _ = load_policy("tiny", seed=1)
    state = source.state_dict()
    assert share_or_copy(state, target, share=True) == 0
    assert shares_storage(state, target)
    with torch.no_grad():
        next(source.parameters()).add_(1.0)  # an optimizer step, in place
    torch.testing.assert_close(next(target.parameters()), next(source.parameters()), atol=0, rtol=0)

    # Two versions (the sampler keeps its own until the next sync): a copy of every distinct tensor, un-shared.
    copied = share_or_copy(state, target, share=False)
    distinct = {id(t): t for t in target.state_dict(keep_vars=True).values()}
    assert copied == sum(t.numel() * t.element_size() for t in distinct.values())
    assert not shares_storage(state, target)
    with torch.no_grad():
        next(source.parameters()).add_(1.0)
    assert not torch.equal(next(target.parameters()), next(source.parameters()))
    assert state_bytes(state) >= copied  # tied weights are listed twice in a state dict, copied once
    assert state_bytes({"module": {"default_policy": state}}) == state_bytes(state) > 0  # an RLlib state, nested


def test_share_or_copy_refuses_another_model():
    source, _ = load_policy("tiny", seed=0)
    target, _ = load_policy("tiny", seed=0)
    state = dict(source.state_dict())
    name = next(iter(state))
    with pytest.raises(ValueError, match="same model"):
        share_or_copy({k: v for k, v in state.items() if k != name}, target, share=True)
    state[name] = torch.zeros(3)
    with pytest.raises(ValueError, match="same model"):
        share_or_copy(state, target, share=True)


def test_remote_env_runners_get_the_weights_through_the_object_store_and_the_bytes_are_counted(
    ray_session, small_config
):
    algo = small_config(validation_interval=0).env_runners(num_env_runners=1).build_algo()
    try:
        result = algo.train()
        learner_state = algo.learner_group._learner.module[DEFAULT_MODULE_ID].unwrapped().policy.state_dict()
        distinct = {t.data_ptr(): t for t in learner_state.values()}
        assert result[M.SYNC_BYTES] >= sum(t.numel() * t.element_size() for t in distinct.values())
        played = algo.env_runner_group.foreach_env_runner(
            lambda runner: runner.module.policy.state_dict(), local_env_runner=False
        )[0]
        assert all(torch.equal(played[k], learner_state[k].cpu()) for k in played)
    finally:
        algo.stop()
