"""The supervised warm start (rllib_ragen.warm_start): batching, weight averaging, learning-rate schedule, precision,
non-finite guard."""

import dataclasses
import logging
import pytest
import torch

import rllib_ragen.warm_start as warm_start_module
from rllib_ragen.jobs.warm_start import warm_start_device
from rllib_ragen.jobs.run import JobSettings
from rllib_ragen.rollout import RolloutConfig, load_policy
from rllib_ragen.demonstrators import random_arm_policy
from rllib_ragen.warm_start import (
    LENGTH_GROUP_BATCHES,
    collect_demonstrations,
    demonstration_batches,
    supervised_warm_start,
)


@pytest.fixture(scope="module")
def bandit_demos():
    model, tokenizer = load_policy("tiny", seed=0)
    demos = collect_demonstrations(
        RolloutConfig(env="rllib_ragen/Bandit-v0", max_turns=1), random_arm_policy(seed=0), tokenizer, 32
    )
    return demos, tokenizer.pad_token_id


def weights_after(steps, demos, pad, **kwargs):
    model, _ = load_policy("tiny", seed=0)
    supervised_warm_start(model, demos, steps=steps, batch_size=8, lr=2e-3, pad_token_id=pad, log_every=0, **kwargs)
    return [p.detach().clone() for p in model.parameters()]


def test_average_decay_leaves_the_moving_average_of_the_weights(bandit_demos):
    demos, pad = bandit_demos
    w0 = [p.detach().clone() for p in load_policy("tiny", seed=0)[0].parameters()]
    w1, w2 = weights_after(1, demos, pad), weights_after(2, demos, pad)  # the training path does not depend on it
    averaged = weights_after(2, demos, pad, average_decay=0.25)
    # avg0 = w0; avg1 = 0.25 w0 + 0.75 w1; avg2 = 0.25 avg1 + 0.75 w2 = 0.0625 w0 + 0.1875 w1 + 0.75 w2
    for a, p0, p1, p2 in zip(averaged, w0, w1, w2):
        torch.testing.assert_close(a, 0.0625 * p0 + 0.1875 * p1 + 0.75 * p2, rtol=0, atol=1e-6)
    assert any(not torch.equal(a, p2) for a, p2 in zip(averaged, w2))


def test_a_non_finite_warm_start_loss_raises_before_the_weights_change(bandit_demos, monkeypatch):
    demos, pad = bandit_demos
    model, _ = load_policy("tiny", seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    monkeypatch.setattr(
        warm_start_module, "scored_token_logprobs", lambda hidden, head, ids, mask: torch.full(ids.shape, float("nan"))
    )
    with pytest.raises(FloatingPointError, match="lower lr"):
        supervised_warm_start(model, demos, steps=3, batch_size=8, pad_token_id=pad, average_decay=0.9)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_micro_batches_take_the_same_step_as_one_pass(bandit_demos):
    """Rows 3 at a time, each pass's loss over the whole batch's reply tokens: the summed gradient is the batch's, so
    the weights after two steps agree with one pass's to float rounding (AdamW's first steps move every weight by
    about lr = 2e-3, and magnify the rounding of the smallest gradients: 1% of a step is allowed), and differ from
    the start."""
    demos, pad = bandit_demos
    start = [p.detach().clone() for p in load_policy("tiny", seed=0)[0].parameters()]
    whole, split = weights_after(2, demos, pad), weights_after(2, demos, pad, micro_batch_size=3)
    for a, b in zip(whole, split):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-5)
    assert any(not torch.equal(a, s) for a, s in zip(whole, start))


def test_frozen_embeddings_stay_bit_exact_while_the_other_layers_train(bandit_demos):
    demos, pad = bandit_demos
    model, _ = load_policy("tiny", seed=0)
    fixed = {
        id(p) for layer in (model.get_input_embeddings(), model.get_output_embeddings()) for p in layer.parameters()
    }
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    supervised_warm_start(
        model, demos, steps=2, batch_size=8, lr=2e-3, pad_token_id=pad, log_every=0, freeze_embeddings=True
    )
    for name, p in model.named_parameters():
        assert torch.equal(p, start[name]) == (id(p) in fixed), name  # the embeddings alone kept, every other moved
        assert p.requires_grad  # handed back trainable: RL decides what it trains


@pytest.mark.parametrize("argument", ["micro_batch_size", "lora_rank"])
def test_a_negative_micro_batch_size_or_lora_rank_is_refused(bandit_demos, argument):
    demos, pad = bandit_demos
    with pytest.raises(ValueError, match=f"{argument}=-1"):
        supervised_warm_start(load_policy("tiny", seed=0)[0], demos, steps=1, pad_token_id=pad, **{argument: -1})
    with pytest.raises(ValueError, match=f"warm_start_{argument}"):
        JobSettings(**{f"warm_start_{argument}": -1}).validate()


@pytest.mark.parametrize("decay", [1.0, -0.1, 1.5])
def test_an_average_decay_outside_0_1_is_refused(bandit_demos, decay):
    demos, pad = bandit_demos
    with pytest.raises(ValueError, match="average_decay"):
        supervised_warm_start(load_policy("tiny", seed=0)[0], demos, steps=1, pad_token_id=pad, average_decay=decay)


@pytest.mark.parametrize("value", [1.0, -0.5, True, "0.9", float("nan")])
def test_job_settings_refuse_a_bad_warm_start_average_decay(value):
    with pytest.raises(ValueError, match="warm_start_average_decay"):
        JobSettings(warm_start_average_decay=value).validate()


class LrRecordingAdamW(torch.optim.AdamW):
    """AdamW that notes the learning rate each update is taken at."""

    rates: list[float] = []

    def step(self, closure=None):
        LrRecordingAdamW.rates.append(self.param_groups[0]["lr"])
        return super().step(closure)


@pytest.mark.parametrize(
    "schedule, expected",
    [
        # (1 + cos(pi k / 4)) / 2 for k = 0..3: 1, (1 + 0.70711) / 2, 1/2, (1 - 0.70711) / 2
        ("cosine", [1e-3, 8.5355e-4, 5e-4, 1.4645e-4]),
        ("constant", [1e-3] * 4),
    ],
)
def test_the_warm_start_updates_at_the_scheduled_learning_rate(bandit_demos, monkeypatch, schedule, expected):
    demos, pad = bandit_demos
    monkeypatch.setattr(torch.optim, "AdamW", LrRecordingAdamW)
    LrRecordingAdamW.rates = []
    supervised_warm_start(
        load_policy("tiny", seed=0)[0],
        demos,
        steps=4,
        batch_size=8,
        lr=1e-3,
        pad_token_id=pad,
        log_every=0,
        lr_schedule=schedule,
    )
    assert LrRecordingAdamW.rates == pytest.approx(expected, abs=1e-8)


@pytest.mark.parametrize("argument, value", [("lr_schedule", "linear"), ("precision", "float16")])
def test_an_unknown_warm_start_choice_is_refused_naming_the_setting(bandit_demos, argument, value):
    demos, pad = bandit_demos
    with pytest.raises(ValueError, match=f"{argument}='{value}'"):
        supervised_warm_start(load_policy("tiny", seed=0)[0], demos, steps=1, pad_token_id=pad, **{argument: value})
    with pytest.raises(ValueError, match=f"warm_start_{argument}='{value}'"):
        JobSettings(**{f"warm_start_{argument}": value}).validate()


class MatmulDtypes(torch.overrides.TorchFunctionMode):
    """Notes the dtype every linear layer computes in (its result's: autocast casts below this mode)."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func is torch.nn.functional.linear:
            self.seen.add(result.dtype)
        return result


def test_a_bfloat16_warm_start_multiplies_in_bfloat16_and_keeps_float32_weights_and_loss(bandit_demos):
    demos, pad = bandit_demos
    runs = {}
    for precision in ("float32", "bfloat16"):
        model, _ = load_policy("tiny", seed=0)
        with MatmulDtypes() as products:
            losses = supervised_warm_start(
                model, demos, steps=3, batch_size=8, lr=2e-3, pad_token_id=pad, log_every=0, precision=precision
            )
        runs[precision] = (losses, [p.detach().clone() for p in model.parameters()], products.seen)
    (losses32, weights32, seen32), (losses16, weights16, seen16) = runs["float32"], runs["bfloat16"]
    assert seen32 == {torch.float32} and seen16 == {torch.bfloat16}
    # The saved model and the RL after it stay float32, and the run is a float32 one up to bfloat16 rounding:
    # the same batches, a loss within a few per cent (bfloat16 keeps 8 bits of mantissa), and weights that moved.
    assert all(w.dtype == torch.float32 for w in weights16)
    assert losses16 == pytest.approx(losses32, rel=0.03) and losses16 != losses32
    assert any(not torch.equal(a, b) for a, b in zip(weights16, weights32))


@pytest.mark.parametrize("native", [False, True])
def test_a_bfloat16_warm_start_on_a_cpu_that_emulates_it_says_so_once(bandit_demos, monkeypatch, caplog, native):
    # Without AVX512-BF16 or AMX, bfloat16 autocast on a CPU ran 12x slower than float32 (the FrozenLake job's warm
    # start: 12.5 s a step instead of about 0.5), silently.
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    demos, pad = bandit_demos
    with caplog.at_level(logging.WARNING, logger="rllib_ragen.warm_start"):
        for precision in ("bfloat16", "float32"):
            supervised_warm_start(
                load_policy("tiny", seed=0)[0],
                demos,
                steps=1,
                batch_size=4,
                pad_token_id=pad,
                log_every=0,
                precision=precision,
            )
    warned = [r.getMessage() for r in caplog.records if "runs emulated" in r.getMessage()]
    assert len(warned) == (0 if native else 1) and all("--warm-start-precision float32" in m for m in warned)


def test_plain_batches_walk_random_passes_that_run_into_each_other():
    # 5 demonstrations in batches of 2: the third batch takes the first pass's last index and the second pass's first.
    batches = demonstration_batches([10] * 5, 2, torch.Generator().manual_seed(3))
    reference = torch.Generator().manual_seed(3)
    first, second = torch.randperm(5, generator=reference).tolist(), torch.randperm(5, generator=reference).tolist()
    assert [next(batches) for _ in range(3)] == [first[0:2], first[2:4], [first[4], second[0]]]


def test_length_grouped_batches_hold_neighbours_in_length_and_use_each_demonstration_once_per_draw():
    lengths = [100 + 37 * i % 61 for i in range(40)]  # distinct lengths in a scrambled order
    batches = demonstration_batches(lengths, 2, torch.Generator().manual_seed(0), group_by_length=True)
    grouped = [next(batches) for _ in range(LENGTH_GROUP_BATCHES)]
    drawn = torch.randperm(40, generator=torch.Generator().manual_seed(0)).tolist()[: 2 * LENGTH_GROUP_BATCHES]
    by_length = sorted(drawn, key=lambda i: lengths[i])
    # The first 8 batches are the first 16 indices of the pass, sorted by length and cut in consecutive pairs...
    assert sorted(map(tuple, grouped)) == sorted(tuple(by_length[k : k + 2]) for k in range(0, 16, 2))
    # ...which come out in random order, not shortest first.
    assert grouped != [by_length[k : k + 2] for k in range(0, 16, 2)]
    # Padding: each batch is padded to its longest episode; grouping pads less than the plain batches of that draw.
    padded = sum(2 * max(lengths[i] for i in b) for b in grouped)
    plain = sum(2 * max(lengths[i] for i in drawn[k : k + 2]) for k in range(0, 16, 2))
    assert padded < plain


@pytest.mark.parametrize("value", ["yes", 1])
def test_job_settings_refuse_a_non_boolean_group_by_length(value):
    with pytest.raises(ValueError, match="warm_start_group_by_length"):
        JobSettings(warm_start_group_by_length=value).validate()


def sokoban_one_move_config(max_turns):
    from rllib_ragen import StarPOConfig

    return (
        StarPOConfig()
        .environment("rllib_ragen/Sokoban-v0")
        .training(max_turns=max_turns, max_actions_per_turn=1, max_actions_per_episode=10)
    )


def test_demonstrations_cut_to_warm_start_max_turns_are_the_first_turns_of_whole_ones():
    from rllib_ragen.jobs.warm_start import demonstration_rollout_config
    from rllib_ragen.demonstrators import sokoban_solver_policy

    config = sokoban_one_move_config(max_turns=10)
    _, tokenizer = load_policy("tiny", seed=0)
    assert demonstration_rollout_config(config, JobSettings()) == config.rollout_config()  # 0: the config's turns
    whole, cut = (
        collect_demonstrations(
            demonstration_rollout_config(config, JobSettings(warm_start_max_turns=n)),
            sokoban_solver_policy(1),
            tokenizer,
            12,
        )
        for n in (0, 2)
    )
    assert max(len(t.turn_spans) for t in whole) > 2  # some levels need more than two moves
    for w, c in zip(whole, cut, strict=True):
        assert len(c.turn_spans) == min(2, len(w.turn_spans))
        assert c.success == (w.success and len(w.turn_spans) <= 2)
        # the same conversation up to the end of the cut's last reply: the prompts do not state the turn budget
        end = c.turn_spans[-1][1]
        assert c.token_ids[:end] == w.token_ids[:end] and c.response_mask[:end] == w.response_mask[:end]
        assert sum(c.response_mask) == sum(w.response_mask[:end])


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_job_settings_refuse_a_bad_warm_start_max_turns(value):
    with pytest.raises(ValueError, match="warm_start_max_turns"):
        JobSettings(warm_start_max_turns=value).validate()


def test_warm_start_max_turns_above_the_configs_max_turns_is_refused_naming_both():
    config = sokoban_one_move_config(max_turns=5)
    JobSettings(warm_start_max_turns=5).validate(config)
    with pytest.raises(ValueError, match="warm_start_max_turns=6 exceeds max_turns=5"):
        JobSettings(warm_start_max_turns=6).validate(config)


def test_demonstrated_replies_longer_than_the_policy_may_write_are_refused_before_training(tmp_path):
    # RL would cut every such reply short, a format error each time; the job must stop and name the fix instead.
    from rllib_ragen.jobs.warm_start import warm_start
    from rllib_ragen.demonstrators import sokoban_solver_policy

    config = sokoban_one_move_config(max_turns=2).training(max_new_tokens_per_turn=30)
    job = JobSettings(warm_start_episodes=4, warm_start_steps=1)
    with pytest.raises(ValueError, match=r"max_new_tokens_per_turn=30 lets the policy write; raise it to at least 3\d"):
        warm_start(config, job, sokoban_solver_policy(1, reasoning="effects"), tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    # The same demonstrations fit the job's 48 tokens, and the shorter "plan" line fits 30.
    warm_start(
        config.copy(copy_frozen=False).training(max_new_tokens_per_turn=48),
        job,
        sokoban_solver_policy(1, reasoning="effects"),
        tmp_path / "effects",
    )
    warm_start(config, job, sokoban_solver_policy(1), tmp_path / "plan")
    assert (tmp_path / "effects" / "config.json").exists() and (tmp_path / "plan" / "config.json").exists()


def test_a_saved_warm_start_records_the_demonstrations_it_was_shown(tmp_path):
    # A later run started from the folder (--model DIR --warm-start-steps 0) must still count those levels as seen
    # when it splits validation success into seen and unseen states.
    from rllib_ragen.jobs.warm_start import warm_start
    from rllib_ragen.jobs.validation_states import demonstrated_seeds
    from rllib_ragen.demonstrators import sokoban_solver_policy
    from rllib_ragen.warm_start import DEMONSTRATION_SEED_START

    config = sokoban_one_move_config(max_turns=2)
    warm_start(
        config, JobSettings(warm_start_episodes=6, warm_start_steps=1), sokoban_solver_policy(1), tmp_path / "warm"
    )
    assert demonstrated_seeds(str(tmp_path / "warm")) == {
        "rllib_ragen/Sokoban-v0": range(DEMONSTRATION_SEED_START, DEMONSTRATION_SEED_START + 6)
    }
    assert demonstrated_seeds("tiny") == {}  # a built-in model was shown nothing


def test_evaluating_during_the_warm_start_sees_last_and_averaged_weights_and_leaves_training_bit_exact(bandit_demos):
    demos, pad = bandit_demos
    calls = []

    def evaluate(step, weights):
        calls.append((step, weights, model.training, [p.detach().clone() for p in model.parameters()]))

    model, _ = load_policy("tiny", seed=0)
    supervised_warm_start(
        model,
        demos,
        steps=5,
        batch_size=8,
        lr=2e-3,
        pad_token_id=pad,
        log_every=0,
        average_decay=0.5,
        evaluate=evaluate,
        evaluate_every=2,
    )
    final = [p.detach().clone() for p in model.parameters()]
    # After steps 2 and 4 and after the last (5), each with the last weights and then their average, in eval mode.
    assert [(step, weights) for step, weights, _, _ in calls] == [
        (2, "last"),
        (2, "averaged"),
        (4, "last"),
        (4, "averaged"),
        (5, "last"),
        (5, "averaged"),
    ]
    assert not any(training for _, _, training, _ in calls)
    # "last" is the plain run's weights at that step (averaging does not change the training path), the final
    # "averaged" is the model the warm start returns, and the run ends as it would without the calls.
    for step in (2, 4):
        seen = next(w for s, kind, _, w in calls if (s, kind) == (step, "last"))
        assert all(torch.equal(a, b) for a, b in zip(seen, weights_after(step, demos, pad)))
    assert all(torch.equal(a, b) for a, b in zip(calls[-1][3], final))
    assert all(torch.equal(a, b) for a, b in zip(final, weights_after(5, demos, pad, average_decay=0.5)))
    assert any(not torch.equal(a, b) for a, b in zip(calls[-2][3], final))  # last and averaged do differ


def test_evaluating_during_a_warm_start_with_dropout_changes_no_dropout_mask(bandit_demos):
    # With dropout the training draws from the global RNG and depends on train mode: an evaluation that samples
    # (draws from the same RNG) and switches to eval mode must leave both as they were.
    demos, pad = bandit_demos

    def run(rng_seed, **kwargs):
        torch.manual_seed(rng_seed)
        model, _ = load_policy("tiny", seed=0)
        for layer in model.model.layers:
            layer.self_attn.attention_dropout = 0.3
        supervised_warm_start(model, demos, steps=3, batch_size=8, lr=2e-3, pad_token_id=pad, log_every=0, **kwargs)
        return [p.detach().clone() for p in model.parameters()]

    plain = run(0)
    assert any(not torch.equal(a, b) for a, b in zip(run(1), plain))  # the dropout masks do shape the weights
    evaluated = run(0, evaluate=lambda step, weights: torch.rand(7), evaluate_every=1)
    assert all(torch.equal(a, b) for a, b in zip(evaluated, plain))


def test_a_negative_evaluation_interval_is_refused_naming_the_setting(bandit_demos):
    demos, pad = bandit_demos
    with pytest.raises(ValueError, match="evaluate_every=-1"):
        supervised_warm_start(
            load_policy("tiny", seed=0)[0],
            demos,
            steps=1,
            pad_token_id=pad,
            evaluate=lambda step, weights: None,
            evaluate_every=-1,
        )
    with pytest.raises(ValueError, match="warm_start_eval_interval=-1"):
        JobSettings(warm_start_eval_interval=-1).validate()


def test_the_warm_start_curve_ends_on_the_saved_models_greedy_play_of_the_validation_states(tmp_path):
    # What the job's --warm-start-eval-interval writes: its last row must be the model RL starts from, played
    # greedily on the states the "before" validation plays, here recomputed from the saved folder.
    import csv

    from rllib_ragen import StarPOConfig
    from rllib_ragen.jobs.warm_start import warm_start
    from rllib_ragen.rollout.backends import HFBackend, SamplingParams
    from rllib_ragen.rollout.engine import RolloutEngine
    from rllib_ragen.rollout.trajectory import rollout_metrics
    from rllib_ragen.demonstrators import random_arm_policy

    config = StarPOConfig().environment("rllib_ragen/Bandit-v0").training(validation_size=16)
    job = JobSettings(warm_start_episodes=32, warm_start_steps=30, warm_start_eval_interval=15)
    saved = warm_start(config, job, random_arm_policy(seed=0), tmp_path / "warm_start")
    with open(tmp_path / "warm_start" / "warm_start_curve.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(int(r["step"]), r["weights"]) for r in rows] == [(15, "last"), (30, "last")]
    model, tokenizer = load_policy(saved)
    engine = RolloutEngine(config.rollout_config(), HFBackend(model.eval(), tokenizer), tokenizer)
    trajectories, _ = engine.rollout(
        config.validation_starts(), 1, SamplingParams(temperature=0.0, max_new_tokens=config.max_new_tokens_per_turn)
    )
    metrics = rollout_metrics(trajectories, 1)
    assert len(trajectories) == 16
    assert float(rows[-1]["success"]) == metrics["rollout/success"]
    assert float(rows[-1]["format_error_rate"]) == metrics["rollout/format_error_rate"] < 1.0


def test_the_warm_start_curve_of_a_mixture_has_each_validation_environments_success(tmp_path):
    import csv

    from rllib_ragen import StarPOConfig
    from rllib_ragen.jobs.warm_start import warm_start
    from rllib_ragen.demonstrators import random_arm_policy

    config = (
        StarPOConfig()
        .environment(
            train_envs=[{"env": "rllib_ragen/Bandit-v0", "groups": 2}],
            validation_envs=[
                {"env": "rllib_ragen/Bandit-v0", "states": 6},
                {"env": "rllib_ragen/BanditHeldOut-v0", "states": 6},
            ],
        )
        .training(num_groups=2)
    )
    warm_start(
        config,
        JobSettings(warm_start_episodes=32, warm_start_steps=40, warm_start_eval_interval=40),
        random_arm_policy(seed=0),
        tmp_path / "warm_start",
    )
    with open(tmp_path / "warm_start" / "warm_start_curve.csv") as f:
        (row,) = list(csv.DictReader(f))
    per_env = [float(row[f"{name}/success"]) for name in ("rllib_ragen/Bandit-v0", "rllib_ragen/BanditHeldOut-v0")]
    assert float(row["success"]) == pytest.approx(sum(per_env) / 2)  # six states each: the pooled mean


def test_demonstrations_under_a_context_window_train_each_turn_on_the_prompt_rl_will_show():
    from rllib_ragen.demonstrators import sokoban_solver_policy

    torch.set_num_threads(1)
    model, tokenizer = load_policy("tiny", seed=0)
    config = RolloutConfig(env="rllib_ragen/Sokoban-v0", context_window="single_turn", max_actions_per_turn=1)
    demos = collect_demonstrations(config, sokoban_solver_policy(1), tokenizer, 4)
    rows = [row for d in demos for row in d.rows]
    assert len(rows) == sum(d.num_turns for d in demos) > len(demos)
    # One batch holding every row: the first loss is the mean of -log p over the rows' reply tokens, each row
    # scored alone on exactly its own prompt.
    with torch.no_grad():
        nll, count = 0.0, 0
        for row in rows:
            ids = torch.tensor([row.token_ids])
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
            mask = torch.tensor(row.response_mask[1:], dtype=torch.float32)
            nll, count = nll - float((logp * mask).sum()), count + int(mask.sum())
    first = supervised_warm_start(
        model, demos, steps=1, batch_size=len(rows), pad_token_id=tokenizer.pad_token_id, log_every=0
    )[0]
    assert first == pytest.approx(nll / count, rel=1e-5)


@pytest.mark.parametrize("gpus, sees_cuda, expected", [(0, True, "cpu"), (1, False, "cpu"), (1, True, "cuda:0")])
def test_the_warm_start_runs_on_the_learners_device_not_on_any_visible_gpu(monkeypatch, gpus, sees_cuda, expected):
    """It used to move to any GPU this process saw, although the job's settings said a GPU changes nothing by
    itself; 'learner' (the default) follows num_gpus_per_learner, and an explicit device is kept as set."""
    from rllib_ragen import StarPOConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: sees_cuda)
    config = StarPOConfig().learners(num_gpus_per_learner=gpus)
    assert JobSettings().warm_start_device == "learner"
    assert str(warm_start_device(config, "learner")) == expected
    assert str(warm_start_device(config, "cpu")) == "cpu"


@pytest.mark.parametrize(
    "value, message",
    [
        ("gpu", r"warm_start_device='gpu': choose 'learner', 'cpu', 'cuda' or 'cuda:N'"),
        (0, r"warm_start_device=0: choose"),
        ("cuda", r"warm_start_device='cuda', but torch sees 0 CUDA device\(s\) in this process"),
        ("cuda:1", r"warm_start_device='cuda:1', but torch sees 0 CUDA device\(s\)"),
    ],
)
def test_job_settings_refuse_a_warm_start_device_they_cannot_use(monkeypatch, value, message):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=message):
        JobSettings(warm_start_device=value).validate()


def test_a_cuda_index_beyond_the_devices_seen_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    JobSettings(warm_start_device="cuda:1").validate()  # seen: accepted
    with pytest.raises(ValueError, match=r"warm_start_device='cuda:2', but torch sees 2 CUDA device\(s\)"):
        JobSettings(warm_start_device="cuda:2").validate()


def test_the_warm_start_takes_every_cpu_and_the_trials_then_share_them():
    from rllib_ragen.jobs.run import JobSettings, thread_counts

    # (warm start, each trial). Two seeds on two cores gave the shared warm start one thread: 19 of a 21-minute run.
    assert thread_counts(JobSettings(), cpus=2, trials=2) == (2, 1)
    assert thread_counts(JobSettings(), cpus=16, trials=3) == (16, 5)
    assert thread_counts(JobSettings(), cpus=1, trials=4) == (1, 1)
    assert thread_counts(JobSettings(threads=3), cpus=16, trials=3) == (3, 3)  # the user's count, for both


def test_a_checkpointed_warm_start_saves_the_same_weights_to_the_bit_under_the_same_cache_key(tmp_path):
    from safetensors.torch import load_file

    from rllib_ragen.demonstrators import sokoban_solver_policy
    from rllib_ragen.jobs.warm_start import warm_start, warm_start_key

    config, policy = sokoban_one_move_config(max_turns=2), sokoban_solver_policy(1)
    saved = []
    for checkpointing in (False, True):
        job = JobSettings(
            warm_start_episodes=6,
            warm_start_steps=2,
            warm_start_micro_batch_size=2,
            warm_start_activation_checkpointing=checkpointing,
        )
        warm_start(config, job, policy, tmp_path / str(checkpointing))
        saved.append(
            (load_file(tmp_path / str(checkpointing) / "model.safetensors"), warm_start_key(config, job, policy))
        )
    (plain, plain_key), (checkpointed, checkpointed_key) = saved
    assert plain.keys() == checkpointed.keys() and all(torch.equal(plain[k], checkpointed[k]) for k in plain)
    assert plain_key == checkpointed_key  # the cache serves either
    job = JobSettings(warm_start_episodes=6, warm_start_steps=3)
    assert warm_start_key(config, job, policy) != plain_key  # a setting that changes the weights changes the key
    # A setting added later enters the key only when set: the caches made before it keep their key (this one's at
    # the commit before warm_start_freeze_embeddings existed).
    assert warm_start_key(config, job, policy) == "6c08af1030a34bba"
    frozen = dataclasses.replace(job, warm_start_freeze_embeddings=True)
    assert warm_start_key(config, frozen, policy) != "6c08af1030a34bba"


def test_a_lora_warm_start_leaves_a_plain_model_computing_what_its_trained_adapters_computed(bandit_demos):
    """Rank-4 adapters trained, then folded in: the model afterwards has its own parameters again (the same names,
    each trainable as before), the frozen embeddings are untouched, every adapted linear layer moved, and its logits
    are those the model gave with the adapters on after the last step (the ``evaluate`` call), to float rounding."""
    demos, pad = bandit_demos
    model, _ = load_policy("tiny", seed=0)
    names_before = [name for name, _ in model.named_parameters()]
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    probe = torch.tensor([demos[0].token_ids])
    with_adapters = {}

    def evaluate(step, weights):
        assert any(".lora_A." in name for name, _ in model.named_parameters())  # the adapters are on here
        with torch.no_grad():
            with_adapters[step] = model(probe).logits

    losses = supervised_warm_start(
        model, demos, steps=3, batch_size=8, lr=2e-2, pad_token_id=pad, log_every=0, lora_rank=4, evaluate=evaluate
    )
    assert [name for name, _ in model.named_parameters()] == names_before
    assert all(p.requires_grad for p in model.parameters())
    after = dict(model.named_parameters())
    assert torch.equal(after["model.embed_tokens.weight"], before["model.embed_tokens.weight"])
    linear = [name for name in before if name.endswith("proj.weight")]
    assert linear and all(not torch.equal(after[name], before[name]) for name in linear)
    with torch.no_grad():
        torch.testing.assert_close(model(probe).logits, with_adapters[3], rtol=0, atol=1e-5)
    assert losses[-1] < losses[0]


def test_a_lora_warm_start_without_peft_is_refused_naming_the_fix(monkeypatch):
    import rllib_ragen.jobs.settings as settings

    monkeypatch.setattr(settings, "peft_installed", lambda: False)
    with pytest.raises(ValueError, match=r"warm_start_lora_rank=8 .* pip install 'rllib_ragen\[lora\]'"):
        JobSettings(warm_start_lora_rank=8).validate()
    JobSettings(warm_start_lora_rank=0).validate()
