"""The sentinel's rules on fabricated metric sequences: a collapse fires, a healthy run stays silent."""

import math

import pytest

from rllib_ragen.sentinel import Rule, Sentinel, echo_trap_rules, lookup, replay

ENTROPY = "learners/default_policy/actor/entropy"
REWARD_STD = "rollout_filter/reward_std"
GRAD_NORM = "learners/default_policy/actor/grad_norm"


def result(entropy=None, reward_std=None, grad_norm=None):
    """A result shaped like RLlib's: top-level keys with '/', learner values nested under their module."""
    out, learner = {}, {}
    if reward_std is not None:
        out[REWARD_STD] = reward_std
    if entropy is not None:
        learner["actor/entropy"] = entropy
    if grad_norm is not None:
        learner["actor/grad_norm"] = grad_norm
    out["learners"] = {"default_policy": learner}
    return out


ECHO_TRAP = [
    Rule(REWARD_STD, "below", 0.05, patience=3, warmup=0, name="reward std gone"),
    Rule(ENTROPY, "drop_from_peak", 0.5, patience=2, warmup=2, name="entropy halved"),
    Rule(GRAD_NORM, "spike_over_median", 5.0, warmup=3, name="grad spike"),
]


def run(sentinel, sequence):
    return [(f.iteration, f.rule) for i, r in enumerate(sequence, 1) for f in sentinel.observe(i, r)]


def test_lookup_follows_rllib_keys_with_slashes():
    r = result(entropy=1.5, reward_std=0.2)
    assert lookup(r, ENTROPY) == 1.5
    assert lookup(r, REWARD_STD) == 0.2
    assert lookup(r, "learners/default_policy/actor/missing") is None
    assert lookup({"a": "text"}, "a") is None


def test_a_fabricated_collapse_fires_each_rule_where_its_condition_first_holds_long_enough():
    # Reward std fades from 0.4 to 0.01; entropy halves by iteration 6; the grad norm spikes at iteration 8.
    stds = [0.4, 0.35, 0.3, 0.2, 0.1, 0.04, 0.03, 0.02, 0.01, 0.01]
    entropies = [2.0, 2.1, 2.0, 1.6, 1.2, 0.9, 0.8, 0.7, 0.6, 0.5]
    norms = [1.0, 1.2, 0.9, 1.1, 1.0, 1.3, 1.2, 9.0, 1.0, 1.1]
    sequence = [result(e, s, g) for e, s, g in zip(entropies, stds, norms)]
    fired = run(Sentinel(ECHO_TRAP), sequence)
    # Entropy under half its peak (2.1 -> 1.05) from iteration 6: fires at 7 (patience 2).
    # Reward std under 0.05 from iteration 6: fires at 8 (patience 3). Grad 9.0 > 5 x median 1.1 at 8.
    assert fired == [(7, "entropy halved"), (8, "reward std gone"), (8, "grad spike"), (9, "entropy halved")]


def test_a_healthy_run_never_fires():
    healthy = [
        result(
            2.0 - 0.015 * i,  # entropy eases 30% down, std and norm wobble
            0.3 + 0.02 * (i % 3),
            1.0 + 0.3 * (i % 4),
        )
        for i in range(40)
    ]
    assert run(Sentinel(ECHO_TRAP), healthy) == []


def test_warmup_and_missing_values_do_not_count():
    rule = Rule(REWARD_STD, "below", 1.0, patience=2, warmup=2, action="stop")
    sentinel = Sentinel([rule])
    # Values below 1.0 throughout, but the first two only warm up; iterations without the value are skipped.
    sequence = [
        result(reward_std=0.1),
        result(reward_std=0.1),
        result(),
        result(reward_std=0.1),
        result(reward_std=math.nan),
        result(reward_std=0.1),
    ]
    assert run(sentinel, sequence) == [(6, rule.label)]
    assert sentinel.firings[0].action == "stop"


def test_rollbacks_past_the_budget_become_stops_and_clear_streaks():
    rule = Rule(REWARD_STD, "below", 1.0, patience=1, warmup=0, action="rollback", knobs={"lr_factor": 0.5}, name="r")
    sentinel = Sentinel([rule], max_rollbacks=1)
    first = sentinel.observe(1, result(reward_std=0.0))
    assert [f.action for f in first] == ["rollback"]
    sentinel.after_rollback("r")
    assert sentinel.lr_factor == 0.5 and sentinel.rollbacks == 1 and sentinel.healthy
    assert [f.action for f in sentinel.observe(2, result(reward_std=0.0))] == ["stop"]


def test_state_round_trip_keeps_peaks_knobs_and_firings():
    sentinel = Sentinel(ECHO_TRAP)
    run(sentinel, [result(2.0, 0.3, 1.0), result(2.5, 0.02, 1.0), result(1.0, 0.01, 1.0)])
    copy = Sentinel(ECHO_TRAP)
    copy.set_state(sentinel.get_state())
    follow = [result(1.0, 0.01, 1.0), result(1.0, 0.01, 1.0)]
    assert run(copy, follow) == run(sentinel, follow)


@pytest.mark.parametrize(
    "rule, words",
    [
        (Rule(ENTROPY, "falls", 0.5), "kind='falls'"),
        (Rule(ENTROPY, "drop_from_peak", 1.5), "must lie in (0, 1)"),
        (Rule(ENTROPY, "spike_over_median", 0.5), "must be > 1"),
        (Rule(ENTROPY, "below", 0.5, action="pause"), "action='pause'"),
        (Rule(ENTROPY, "below", 0.5, patience=0), "patience=0"),
        (Rule(ENTROPY, "below", 0.5, knobs={"lr_factor": 0.5}), "only with action='rollback'"),
        (Rule(ENTROPY, "below", 0.5, action="rollback", knobs={"lr_factor": 2.0}), "knobs['lr_factor']=2.0"),
        (Rule(ENTROPY, "below", 0.5, action="rollback", knobs={"batch": 2}), "knobs ['batch'] are unknown"),
    ],
)
def test_bad_rules_fail_validate_naming_the_field(small_config, rule, words):
    with pytest.raises(ValueError, match="sentinel_rules") as error:
        small_config(sentinel_rules=[rule]).validate()
    assert words in str(error.value)


def test_a_rollback_knob_that_would_break_the_batch_shape_fails_validate(small_config):
    rule = Rule(ENTROPY, "below", 0.5, action="rollback", knobs={"rollout_filter_ratio": 0.5})
    with pytest.raises(ValueError, match="after its rollback"):
        small_config(num_groups=4, rollout_filter_ratio=1.0, minibatch_size=16, sentinel_rules=[rule]).validate()
    with pytest.raises(ValueError, match="rollout_filter='none'"):
        small_config(rollout_filter="none", sentinel_rules=[rule]).validate()
    with pytest.raises(ValueError, match="collapse_subsample=1"):
        small_config(collapse_subsample=1).validate()


def test_replay_tries_rules_offline_on_a_finished_runs_flat_rows():
    # Rows of a trial's progress.csv (Tune's) are flat: "learners/default_policy/actor/grad_norm" is one key there.
    rows = [
        {
            "training_iteration": i,
            "rollout_filter/reward_std": 0.3 if i < 6 else 0.0,
            "learners/default_policy/actor/entropy": 1.0,
            "learners/default_policy/actor/grad_norm": 1.0,
        }
        for i in range(1, 13)
    ]
    fired = replay(echo_trap_rules("rollback"), rows, max_rollbacks=1)
    # Reward std 0 from iteration 6: patience 3 -> fires at 8 (a rollback), again at 11 (budget spent: stop).
    assert [(f.iteration, f.rule, f.action) for f in fired] == [
        (8, "reward std vanished", "rollback"),
        (11, "reward std vanished", "stop"),
    ]
    assert replay(echo_trap_rules("warn"), rows[:5]) == []


def test_the_built_in_reasoning_rule_fires_on_template_collapse_and_not_without_reasoning():
    # First-turn reasoning entropy (nats) as progress.csv rows. Peak 1.2 at iteration 2; the rule holds under
    # (1 - 0.4) x 1.2 = 0.72 after 3 values of warmup: 0.70 at 4, 5, 6 -> fires at 6; 0.73 at 7 breaks the streak.
    entropies = [1.0, 1.2, 1.1, 0.70, 0.70, 0.70, 0.73, 0.5, 0.5]
    rows = [{"training_iteration": i, "collapse/reasoning_entropy": h} for i, h in enumerate(entropies, 1)]
    fired = [
        (f.iteration, f.value, f.compared_with)
        for f in replay(echo_trap_rules("warn"), rows)
        if f.rule == "reasoning collapsed"
    ]
    assert fired == [(6, 0.70, 1.2)]
    # Answer-only replies log no reasoning entropy; one fixed sentence from the start logs 0 (peak 0): both silent.
    assert replay(echo_trap_rules("warn"), [{"training_iteration": i} for i in range(1, 10)]) == []
    constant = [{"training_iteration": i, "collapse/reasoning_entropy": 0.0} for i in range(1, 10)]
    assert replay(echo_trap_rules("warn"), constant) == []
