"""StarPO end to end with a limited context window (turn rows) and with RAGEN's filter strategies: the learner's
log-probs of each turn row, the critic's advantages, the viewer's token advantages, exact resume, and the
iterations a filter leaves without an update."""

import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_ragen.envs import TextEnv

pytestmark = pytest.mark.usefixtures("ray_session")


def _weights(algo) -> dict[str, torch.Tensor]:
    state = algo.learner_group.get_state(components="learner/rl_module")["learner"]["rl_module"]
    return {k: torch.as_tensor(v).clone() for k, v in state[DEFAULT_MODULE_ID].items()}


def test_turn_rows_train_exact_to_the_token_with_the_critic(small_config):
    # The critic (gae) runs on the learner over each episode's replies laid end to end; the probe maps the rows'
    # advantages back onto each conversation for the viewer. Lambda < 1: the credit of the untrained model's equal
    # returns fades over the replies, so the whitened advantages are not all zero.
    algo = small_config(
        context_window="single_turn", max_turns=3, collapse_diagnostics_interval=1, lambda_=0.9
    ).build_algo()
    try:
        result = algo.train()
        learner = result["learners"][DEFAULT_MODULE_ID]
        assert learner["actor/first_step_logprob_deviation"] == 0.0
        assert learner["rollout/logprob_gap_max"] < 1e-4  # rollout vs the learner's pass over each turn row
        kept = sorted(algo.last_token_advantages)
        turns = sum(algo.last_rollout[i].num_turns for i in kept)
        assert result["update/rows"] == turns > result["update/kept_trajectories"] == len(kept) == 4
        for i in kept:
            t, advantages = algo.last_rollout[i], algo.last_token_advantages[i]
            assert len(advantages) == len(t.token_ids)
            on_replies = {p for start, end in t.turn_spans for p in range(start, end)}
            assert any(advantages[p] != 0 for p in on_replies)
            assert all(advantages[p] == 0 for p in range(len(advantages)) if p not in on_replies)
    finally:
        algo.stop()


def test_a_windowed_run_resumes_exactly(tmp_path, small_config, resumed_after_one_iteration):
    make = lambda: small_config(
        context_window="last_k_turns",
        context_window_turns=2,
        max_turns=3,  # noqa: E731
        advantage_estimator="grpo",
        validation_interval=0,
    ).build_algo()
    straight = make()
    try:
        straight.train()
        expected = straight.train()
        expected_weights = _weights(straight)
    finally:
        straight.stop()
    resumed = resumed_after_one_iteration(make, tmp_path)
    try:
        result = resumed.train()
        weights = _weights(resumed)
    finally:
        resumed.stop()
    assert result["update/rows"] == expected["update/rows"]
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert result["learners"][DEFAULT_MODULE_ID][key] == expected["learners"][DEFAULT_MODULE_ID][key], key
    for key in weights:
        assert torch.equal(weights[key], expected_weights[key]), key


class _SameForAll(TextEnv):
    """Every reply earns the same: no group has reward variance."""

    action_names = ("Go",)
    instructions = "Say Go."

    def _reset_state(self):
        pass

    def _apply(self, action_index):
        return 0.0, True, True

    def _render_text(self):
        return "here"


def test_a_filter_that_keeps_nothing_skips_the_update_and_stops_the_run(small_config):
    algo = small_config(
        env=_SameForAll,
        rollout_filter="snr_adaptive",
        rollout_filter_empty_stop_steps=2,
        format_penalty=0.0,
        validation_interval=0,
        validate_before_training=False,
    ).build_algo()
    try:
        before = _weights(algo)
        first = algo.train()
        assert first["rollout_filter/kept_groups"] == 0 and first["rollout_filter/empty_steps"] == 1
        assert first["rollout_filter/zero_variance_groups"] == 2 and not first["done"]
        assert all(torch.equal(v, before[k]) for k, v in _weights(algo).items())  # no update
        second = algo.train()
        assert second["rollout_filter/empty_steps"] == 2 and second["done"]  # RAGEN's early stop
    finally:
        algo.stop()
