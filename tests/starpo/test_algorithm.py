"""StarPO end to end on CPU with the tiny model: ratio 1 at the first step, micro-batching, exact resume,
export, and a remote env runner."""

import numpy as np
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from ray.rllib.utils.test_utils import check_train_results_new_api_stack

from rllib_ragen import StarPO

pytestmark = pytest.mark.usefixtures("ray_session")
# The actor's gradient norm with every advantage zero (the entropy term alone) is about 3e-4; with a signal, 0.1 and up.
ACTOR_SIGNAL = 1e-2
# GAE with lambda < 1: the credit of each episode's end-of-episode reward fades over the tokens before it, so even the
# untrained model's equal returns leave advantages that differ along each reply (whitened: a signal of order 1).
FADING_CREDIT = dict(lambda_=0.9)


def learner_weights(algo) -> dict[str, torch.Tensor]:
    state = algo.learner_group.get_state(components="learner/rl_module")["learner"]["rl_module"]
    return {k: torch.as_tensor(v).clone() for k, v in state[DEFAULT_MODULE_ID].items()}


def weights_after_one_iteration(config) -> dict[str, torch.Tensor]:
    """The learner's weights after one iteration, from an update that carried a signal: with every advantage zero
    (the untrained tiny model earns every Sokoban episode the same format penalty) only the entropy term moves the
    actor, and two such updates would agree whatever their code did with advantages."""
    algo = config.build_algo()
    try:
        result = algo.train()
        actor_grad_norm = result["learners"][DEFAULT_MODULE_ID]["actor/grad_norm"]
        assert actor_grad_norm > ACTOR_SIGNAL, f"no signal in the update: actor grad norm {actor_grad_norm}"
        return learner_weights(algo)
    finally:
        algo.stop()


def test_first_update_has_ratio_one_and_rollout_logprobs_match_the_learner(small_config):
    algo = small_config().build_algo()
    try:
        result = algo.train()
        learner = result["learners"][DEFAULT_MODULE_ID]
        # The old log-probs are recomputed in the exact micro-batches of the first step: identical numbers.
        assert learner["actor/first_step_logprob_deviation"] == 0.0
        # The rollout's own log-probs (KV-cached, left-padded) agree with the learner's right-padded pass.
        assert learner["rollout/logprob_gap_max"] < 1e-4
        assert result["env_runners"]["rollout/num_trajectories"] == 8 and result["update/kept_trajectories"] == 4
        assert np.isfinite(learner["actor/pg_loss"]) and np.isfinite(learner["critic/vf_loss"])
        assert learner["actor/grad_norm"] > 0 and learner["critic/grad_norm"] > 0
        assert learner["perf/optimizer_steps"] == 1
        # Validation ran before training, on the fixed set, under RLlib's evaluation results.
        assert result["evaluation"]["env_runners"]["rllib_ragen/Sokoban-v0/num_trajectories"] == 4
        # RLlib's own layout: its checker passes, and its standard env-runner metrics are filled from the rollout.
        check_train_results_new_api_stack(result)
        rollout = result["env_runners"]
        assert rollout["num_episodes"] == 8 and rollout["episode_return_mean"] == rollout["rollout/return_mean"]
        assert rollout["num_env_steps_sampled"] == 8 * rollout["episode_len_mean"]
    finally:
        algo.stop()


def test_tool_episodes_train_with_the_learners_logprobs_equal_to_the_samplers(small_config):
    """FactLookup in tool mode, with a call format the untrained tiny model writes (a block between spaces), so its
    episodes run several turns with tool turns between the replies: the learner scores every sampled token as the
    sampler did, and the tool turns are not trained on."""
    from rllib_ragen.rollout.tools import TOOL_CALL_FORMATS, HermesToolCalls

    TOOL_CALL_FORMATS["spaces"] = HermesToolCalls(name="spaces", open_tag=" ", close_tag=" ")
    algo = small_config("rllib_ragen/FactLookup-v0", tool_call_format="spaces", max_turns=3).build_algo()
    try:
        result = algo.train()
        learner = result["learners"][DEFAULT_MODULE_ID]
        assert learner["actor/first_step_logprob_deviation"] == 0.0
        assert learner["rollout/logprob_gap_max"] < 1e-4
        rollout = result["env_runners"]
        assert rollout["rollout/malformed_tool_calls"] > 0 and rollout["episode_len_mean"] > 1
    finally:
        algo.stop()
        del TOOL_CALL_FORMATS["spaces"]


def test_a_single_step_update_reads_the_batch_once_and_changes_nothing(small_config, bandit_config, monkeypatch):
    """One optimizer step: the step's forward passes are the score, so the batch goes through the model once, and
    the update is the two-pass update bit for bit (GAE with its critic, whitened and not, in one micro-batch; GRPO
    in several)."""
    from rllib_ragen.starpo.llm_rl_module import CausalLMRLModule
    from rllib_ragen.starpo.starpo_learner import StarPOTorchLearner

    calls = []
    forward_train = CausalLMRLModule.forward_train
    monkeypatch.setattr(
        CausalLMRLModule,
        "forward_train",
        lambda self, batch, **kw: calls.append(batch["input_ids"].shape) or forward_train(self, batch, **kw),
    )
    for whiten in (False, True):
        config = small_config(validation_interval=0, whiten_advantages=whiten, **FADING_CREDIT)
        calls.clear()
        once = weights_after_one_iteration(config)
        assert len(calls) == 1 and calls[0][0] == 4  # the 4 kept trajectories, read once
        with monkeypatch.context() as forced:
            forced.setattr(StarPOTorchLearner, "_step_scores_itself", staticmethod(lambda *args: False))
            calls.clear()
            twice = weights_after_one_iteration(config)
            assert len(calls) == 2
        assert all(torch.equal(once[k], twice[k]) for k in once), "the single pass changed the update"
    # In micro-batches, a critic-free estimator (its advantages come from the driver) scores each micro-batch with
    # its own forward pass too, KL term included: the same update bit for bit.
    for knobs in (dict(), dict(kl_coeff=0.01)):
        config = bandit_config(validation_interval=0, advantage_estimator="grpo", micro_batch_size=1, **knobs)
        calls.clear()
        once = weights_after_one_iteration(config)
        assert [shape[0] for shape in calls] == [1, 1, 1, 1]
        with monkeypatch.context() as forced:
            forced.setattr(StarPOTorchLearner, "_step_scores_itself", staticmethod(lambda *args: False))
            calls.clear()
            twice = weights_after_one_iteration(config)
            assert len(calls) == 8
        assert all(torch.equal(once[k], twice[k]) for k in once), f"the single pass changed the update ({knobs})"
    # A critic's advantages are whitened over the whole batch's values, so micro-batches score it first; so do two
    # optimizer steps per batch, which need the whole score before the first step.
    calls.clear()
    weights_after_one_iteration(small_config(validation_interval=0, micro_batch_size=1, **FADING_CREDIT))
    assert len(calls) == 8  # the 4 trajectories scored, then stepped
    calls.clear()
    weights_after_one_iteration(small_config(validation_interval=0, updates_per_rollout_batch=2, **FADING_CREDIT))
    assert len(calls) == 4  # a score of each half, then each half's step


def _get(result: dict, path: tuple[str, ...]):
    for key in path:
        result = result[key]
    return result


def assert_same_update(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], lr: float = 1e-3) -> None:
    """Weights after one update agree up to float reduction order.

    Adam's first step is about lr * g / (|g| + eps): where a gradient is near eps, reduction order shows up at a
    small fraction of lr (up to 1.4e-5 measured, in a handful of 65k weights). A real difference (a wrong
    accumulation, another batch) turns whole directions and moves weights by up to 2 * lr. ``lr``: small_config's.
    """
    assert a.keys() == b.keys()
    moved = max((a[k] - b[k]).abs().max().item() for k in a)
    assert moved < 0.05 * lr, f"the two updates differ by {moved}"


@pytest.mark.parametrize(
    "aggregation, advantage_mask",
    [("token-mean", "sampled"), ("seq-mean-token-mean", "sampled"), ("token-mean", "sampled_and_observations")],
)
def test_micro_batches_accumulate_to_the_full_batch_gradient(aggregation, advantage_mask, small_config):
    full, micro = (
        weights_after_one_iteration(
            small_config(
                micro_batch_size=micro_batch_size,
                loss_aggregation=aggregation,
                validation_interval=0,
                advantage_mask=advantage_mask,
                grad_clip=None,
                **FADING_CREDIT,
            )
        )
        for micro_batch_size in (None, 1)
    )
    assert_same_update(full, micro)


def test_advantage_mask_through_observations_trains_the_critic_there_and_the_policy_on_sampled_tokens(small_config):
    from rllib_ragen.objectives import compute_gae, masked_whiten
    from rllib_ragen.starpo.update_batch import prepare_update_batch

    config = small_config(
        advantage_mask="sampled_and_observations", lambda_=0.5, validation_interval=0, rollout_filter_ratio=1.0
    )
    algo = config.build_algo()
    try:
        runner = algo.env_runner
        trajectories = runner.sample(seeds=[0, 1], group_size=4, sampling=config.sampling_params(), sample_seed=0)
        columns, _ = prepare_update_batch(trajectories, config, runner.tokenizer.pad_token_id)
        data = {key: torch.as_tensor(value) for key, value in columns.items()}
        learner = algo.learner_group._learner
        rows = [torch.arange(len(data["input_ids"]))]
        learner._prepare(data, learner.module[DEFAULT_MODULE_ID], config, rows, DEFAULT_MODULE_ID)
        sampled = data["response_mask"]
        observations = data["value_mask"] - sampled  # the environment's tokens between two turns
        assert observations.min() >= 0 and observations.sum() > 0, "no two-turn trajectory to test on"
        # The recursion stepped through the observations (lambda 0.5 makes that visible), was whitened over the
        # sampled tokens, and left no advantage on an observation token: those are never trained.
        raw, returns = compute_gae(data["token_rewards"], data["old_values"], data["value_mask"], gamma=1.0, lam=0.5)
        torch.testing.assert_close(data["token_advantages"], masked_whiten(raw, sampled) * sampled)
        skipped, _ = compute_gae(data["token_rewards"], data["old_values"], sampled, gamma=1.0, lam=0.5)
        assert not torch.allclose(raw * sampled, skipped)
        # The critic gets targets on the observation tokens the recursion read its values on.
        torch.testing.assert_close(data["returns"], returns)
        assert (returns * observations).abs().sum() > 0
    finally:
        algo.stop()


def test_micro_batches_stay_exact_when_the_loss_mask_trains_a_subset(small_config):
    """The policy terms are normalised over the trained tokens, the value loss over every sampled one: each micro-
    batch weighs in by its share of both, so micro-batching still gives the whole minibatch's update."""
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    from rllib_ragen.starpo.update_batch import prepare_update_batch

    configs = [
        small_config(micro_batch_size=size, validation_interval=0, grad_clip=None, **FADING_CREDIT)
        for size in (None, 1)
    ]
    algos = [config.build_algo() for config in configs]
    try:
        runner = algos[0].env_runner
        trajectories = runner.sample(seeds=[0, 1], group_size=4, sampling=configs[0].sampling_params(), sample_seed=0)
        columns, _ = prepare_update_batch(trajectories, configs[0], runner.tokenizer.pad_token_id)
        # A subset unlike the response mask in every row's share, as "no_think" or "answer" give: even rows train
        # all their sampled tokens, odd rows only their first.
        mask = columns["response_mask"]
        first_only = (np.cumsum(mask, axis=1) == 1) * mask
        columns["loss_mask"] = np.where((np.arange(len(mask)) % 2 == 0)[:, None], mask, first_only)
        losses = []
        for algo in algos:
            result = algo.learner_group.update(
                batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(dict(columns))}, env_steps=len(trajectories))
            )
            losses.append(float(result[0][DEFAULT_MODULE_ID]["total_loss"].peek()))
            assert float(result[0][DEFAULT_MODULE_ID]["actor/grad_norm"].peek()) > ACTOR_SIGNAL
        # The accumulated loss is the whole minibatch's (Adam's first step hides gradient scale, the loss does not).
        assert losses[1] == pytest.approx(losses[0], rel=1e-5, abs=1e-6)
        assert_same_update(learner_weights(algos[0]), learner_weights(algos[1]))
    finally:
        for algo in algos:
            algo.stop()


def test_checkpoint_resume_is_exact(tmp_path, small_config, resumed_after_one_iteration):
    # Two epochs of two shuffled minibatches: the shuffle order must resume too.
    make = lambda: small_config(validation_interval=3, num_epochs=2, updates_per_rollout_batch=2).build_algo()  # noqa: E731
    straight = make()
    try:
        for _ in range(3):
            expected = straight.train()
        expected_weights = learner_weights(straight)
    finally:
        straight.stop()

    resumed = resumed_after_one_iteration(make, tmp_path)
    try:
        assert resumed.iteration == 1
        resumed.train()
        result = resumed.train()
        weights = learner_weights(resumed)
    finally:
        resumed.stop()

    assert result["training_iteration"] == expected["training_iteration"] == 3
    for path in (
        ("env_runners", "rollout/return_mean"),
        ("update/response_length",),
        ("rollout_filter/reward_std",),
        ("evaluation", "env_runners", "rollout/return_mean"),
    ):
        assert _get(result, path) == _get(expected, path), path
    assert result["learners"][DEFAULT_MODULE_ID]["perf/optimizer_steps"] == 4
    for key in ("actor/pg_loss", "actor/entropy", "critic/vf_loss", "actor/grad_norm"):
        assert result["learners"][DEFAULT_MODULE_ID][key] == expected["learners"][DEFAULT_MODULE_ID][key], key
    assert weights.keys() == expected_weights.keys()
    for key in weights:  # the critic and the policy, bit for bit
        assert torch.equal(weights[key], expected_weights[key]), key


def test_export_loads_in_plain_transformers_with_the_same_logits(tmp_path, small_config):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    algo = small_config(validation_interval=0).build_algo()
    try:
        algo.train()
        algo.export_pretrained(tmp_path / "policy")
        learner_policy = algo.learner_group._learner.module[DEFAULT_MODULE_ID].policy
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "policy")
        tokenizer = AutoTokenizer.from_pretrained(tmp_path / "policy")
        observation = "Sokoban puzzle. State:\n#####\n#P_X_#\n#__O_#\n######\nYou have 10 actions left."
        text = (
            tokenizer.apply_chat_template(
                [{"role": "user", "content": observation}], add_generation_prompt=True, tokenize=False
            )
            + "<think>push right</think><answer>Right</answer>"
        )
        ids = tokenizer(text, return_tensors="pt").input_ids
        # The exported tokenizer encodes exactly as the one the policy was trained with.
        assert ids[0].tolist() == algo.env_runner.tokenizer(text)["input_ids"]
        with torch.no_grad():
            assert torch.equal(model(ids).logits, learner_policy(ids).logits)
        assert tokenizer.chat_template == algo.env_runner.tokenizer.chat_template
        assert not any("critic" in name for name, _ in model.named_parameters())
    finally:
        algo.stop()


@pytest.mark.slow
def test_one_iteration_with_a_remote_env_runner(small_config):
    algo = small_config(validation_interval=0).env_runners(num_env_runners=1).build_algo()
    try:
        result = algo.train()
        assert result["env_runners"]["rollout/num_trajectories"] == 8
        # After the update, the remote runner holds the learner's new weights (and knows their version).
        remote = algo.env_runner_group.foreach_env_runner(
            lambda runner: (runner._weights_seq_no, runner.module.get_state()), local_env_runner=False
        )
        seq_no, state = remote[0]
        expected = learner_weights(algo)
        assert seq_no == 1
        for key, value in state.items():
            assert torch.equal(value, expected[key]), key
    finally:
        algo.stop()


@pytest.mark.slow
def test_a_remote_learner_computes_the_same_update_as_the_local_one(small_config):
    local, remote = (
        weights_after_one_iteration(small_config(validation_interval=0, **FADING_CREDIT).learners(num_learners=n))
        for n in (0, 1)
    )
    assert_same_update(local, remote)  # another process, another thread count


def test_bfloat16_policy_trains_and_resumes_from_a_checkpoint(tmp_path, small_config):
    algo = small_config(validation_interval=0).rl_module(model_config={"dtype": "bfloat16"}).build_algo()
    try:
        result = algo.train()["learners"][DEFAULT_MODULE_ID]
        assert result["actor/first_step_logprob_deviation"] == 0.0 and np.isfinite(result["actor/pg_loss"])
        # bf16 sampling and the learner's pass round differently; the gap is logged, not hidden.
        assert 0.0 < result["rollout/logprob_gap_max"] < 0.1
        checkpoint = algo.save_to_path(tmp_path / "bf16")  # module and optimizer state go through torch, not numpy
        saved = learner_weights(algo)
    finally:
        algo.stop()
    resumed = StarPO.from_checkpoint(checkpoint)
    try:
        restored = learner_weights(resumed)
        assert all(restored[k].dtype == torch.bfloat16 and torch.equal(restored[k], saved[k]) for k in saved)
        assert np.isfinite(resumed.train()["learners"][DEFAULT_MODULE_ID]["actor/pg_loss"])
    finally:
        resumed.stop()


def test_value_head_critic_trains_on_the_learner_and_stays_off_the_env_runner(small_config):
    algo = small_config(validation_interval=0).rl_module(model_config={"critic": "head"}).build_algo()
    try:
        learner_module = algo.learner_group._learner.module[DEFAULT_MODULE_ID]
        assert learner_module.critic_type == "head" and not hasattr(learner_module, "critic")
        head_before = learner_module.value_head.weight.detach().clone()
        result = algo.train()["learners"][DEFAULT_MODULE_ID]
        assert result["critic/grad_norm"] > 0 and not torch.equal(learner_module.value_head.weight, head_before)
        assert not hasattr(algo.env_runner.module, "value_head")  # inference-only: the policy alone
    finally:
        algo.stop()


def test_kl_reference_is_loaded_only_when_the_kl_term_is_on(small_config):
    off = small_config(validation_interval=0).build_algo()
    try:
        assert off.learner_group._learner._reference is None
        assert "actor/kl_to_reference" not in off.train()["learners"][DEFAULT_MODULE_ID]
    finally:
        off.stop()
    on = small_config(validation_interval=0, kl_coeff=0.01).build_algo()
    try:
        first = on.train()["learners"][DEFAULT_MODULE_ID]["actor/kl_to_reference"]
        second = on.train()["learners"][DEFAULT_MODULE_ID]["actor/kl_to_reference"]
    finally:
        on.stop()
    assert first == 0.0  # the policy starts as the reference: k3 of identical log-probs is exactly 0
    assert second > 0.0  # after one update the policy has moved away from the frozen reference


@pytest.mark.slow
def test_tune_runs_a_grid_over_starpo_fields(tmp_path, small_config):
    from ray import tune

    config = small_config(validation_interval=1).training(clip_ratio_high=tune.grid_search([0.2, 0.28]))
    results = tune.Tuner(
        StarPO,
        param_space=config,
        run_config=tune.RunConfig(stop={"training_iteration": 1}, storage_path=str(tmp_path), verbose=0),
        tune_config=tune.TuneConfig(metric="evaluation/env_runners/rollout/return_mean", mode="max"),
    ).fit()
    assert not results.errors
    assert sorted(r.config["clip_ratio_high"] for r in results) == [0.2, 0.28]
    assert all(np.isfinite(r.metrics["evaluation"]["env_runners"]["rollout/return_mean"]) for r in results)


@pytest.mark.slow
def test_a_tune_stopper_on_rllibs_episode_return_stops_the_run(tmp_path, small_config):
    from ray import tune

    # Any return beats -1e9: the stopper must end the trial after its first iteration, well before 5.
    results = tune.Tuner(
        StarPO,
        param_space=small_config(validation_interval=0),
        run_config=tune.RunConfig(
            stop={"env_runners/episode_return_mean": -1e9, "training_iteration": 5},
            storage_path=str(tmp_path),
            verbose=0,
        ),
    ).fit()
    assert not results.errors and results[0].metrics["training_iteration"] == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    "knobs",
    [
        # GAE with its critic, advantages whitened over the batch: the whitening statistics span both shards.
        dict(),
        # A critic-free estimator scored in micro-batches of one trajectory: each one's share of the tokens.
        dict(advantage_estimator="grpo", micro_batch_size=1),
        # A baseline over the whole batch: the learners gather each other's returns inside the update (that they
        # do it in step, without hanging; the values themselves: test_batch.py's two-process test).
        dict(advantage_estimator="brpo"),
    ],
    ids=["gae_whitened", "grpo_micro_batches", "brpo_batch_baseline"],
)
def test_two_data_parallel_learners_make_the_update_of_one(bandit_config, knobs):
    """RLlib's LearnerGroup with torch DDP (gloo on CPU): each learner trains a shard of whole groups, and the
    averaged gradient is the whole batch's because the loss normalisers and whitening statistics span the shards."""
    # Both groups kept, one per learner: the shards' token counts differ. The bandit's payoffs differ from pull to
    # pull, so every estimator's advantages carry a signal.
    config = bandit_config(
        rollout_filter_ratio=1.0, validation_interval=0, validate_before_training=False, grad_clip=None, **knobs
    )
    one = weights_after_one_iteration(config)
    two = weights_after_one_iteration(config.copy(copy_frozen=False).learners(num_learners=2))
    assert_same_update(one, two)


def _within(seconds: float, work):
    """``work()``'s return value, or the test fails once it has run ``seconds`` (a hang would stop CI instead)."""
    import threading

    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(value=work()), daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"still running after {seconds:g} s: hung")
    return outcome["value"]


@pytest.mark.slow
def test_the_echo_trap_probe_runs_beside_two_data_parallel_learners(bandit_config):
    """The probe runs on the first learner only. Its forward passes went through the DDP wrapper, whose buffer
    broadcast waited for the other learner, which never came: every job with two learners and the probe on (the
    default, every 5th iteration and the first) hung at its first iteration. Now the probe measures on the plain
    module and the update is the one learner's, probe included."""
    from rllib_ragen import metrics as M

    config = bandit_config(
        rollout_filter_ratio=1.0,
        validation_interval=0,
        validate_before_training=False,
        grad_clip=None,
        collapse_diagnostics_interval=1,
    )
    one = weights_after_one_iteration(config)
    algo = config.copy(copy_frozen=False).learners(num_learners=2).build_algo()
    try:
        result = _within(180, algo.train)
        two = learner_weights(algo)
    finally:
        algo.stop()
    assert result[M.TIME_COLLAPSE_PROBE] > 0 and M.RETRIEVAL_ACCURACY in result
    assert_same_update(one, two)
