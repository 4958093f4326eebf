"""``python -m rllib_ragen.jobs.evaluate``: a saved policy played on the run's validation states gives back what the
run's own validation measured, state by state; bad inputs exit 2 with one line."""

import json
import logging

import pytest

from rllib_ragen.jobs import evaluate


def _trial_folder(tmp_path, config):
    """A trial folder as Tune leaves it, as far as evaluate reads one: its settings in ``params.json``."""
    from ray.tune.utils.util import SafeFallbackEncoder

    trial = tmp_path / "seed0"
    trial.mkdir()
    (trial / "params.json").write_text(json.dumps(config.to_dict(), cls=SafeFallbackEncoder))
    return trial


def test_an_exported_policy_plays_the_runs_validation_state_for_state(
    ray_session, small_config, tmp_path, capsys, monkeypatch
):
    """The algorithm validates after one update; its exported policy, evaluated from the folder, scores each state
    as that validation did, sampled (the validation's temperature and sampling seed) and greedy; the untrained
    policy beside it is paired against it on the same states."""
    from rllib_ragen.jobs.readers import trajectory_outcomes

    config = small_config("rllib_ragen/Bandit-v0", validation_size=6, validation_interval=1, num_groups=2, max_turns=1)
    algo = config.build_algo()
    try:
        algo.train()
        sampled = trajectory_outcomes(algo.last_validation)
        greedy = trajectory_outcomes(algo.play_validation_states(0.0))
        trial = _trial_folder(tmp_path, algo.config)
        algo.export_pretrained(trial / "policy")
    finally:
        algo.stop()
    untrained = tmp_path / "untrained"
    from rllib_ragen.rollout.models import load_policy

    model, tokenizer = load_policy("tiny")
    model.save_pretrained(untrained)
    tokenizer.save_pretrained(untrained)

    output = tmp_path / "evaluation.json"
    # Before, then after, as the job pairs them; the settings come from the one policy in a trial folder.
    assert evaluate.main([str(untrained), str(trial / "policy"), "--output", str(output)]) == 0
    result = json.loads(output.read_text())
    played = result["outcomes"][str(trial / "policy")]
    assert played["sampled"] == sampled and played["greedy"] == greedy
    entry = result["environments"]["rllib_ragen/Bandit-v0"]
    assert entry["states"] == 6
    assert entry["success"][str(trial / "policy")]["sampled"] == pytest.approx(sum(sampled.values()) / 6)
    pair = entry["paired"][str(trial / "policy")]["greedy"]
    assert pair["after"] == pytest.approx(sum(greedy.values()) / 6) and pair["n"] == 6
    captured = capsys.readouterr()
    printed = captured.out
    assert "success on 6 validation states" in printed and f"{trial / 'policy'} against {untrained}" in printed
    # Progress as it plays: off a terminal, a plain line as each policy and mode ends.
    assert f"[1/4] {untrained}, greedy (T=0): 6/6 episodes [" in printed
    assert f"[4/4] {trial / 'policy'}, sampled (T={config.validation_temperature:g}): success " in printed
    assert "Loading weights" not in printed + captured.err  # transformers' bars stay off the console

    # Other states: --states and --seed-start choose them, and the run's folder stays the settings' source.
    assert (
        evaluate.main(
            [
                str(trial / "policy"),
                "--states",
                "3",
                "--seed-start",
                "500",
                "--modes",
                "greedy",
                "--output",
                str(output),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    result = json.loads(output.read_text())
    assert sorted(result["outcomes"][str(trial / "policy")]["greedy"]) == [
        f"rllib_ragen/Bandit-v0:{seed}" for seed in (500, 501, 502)
    ]
    assert list(result["temperatures"]) == ["greedy"]

    # Library notices raised while it plays go to --log (appended), which the last line names; none reach the console.
    real_evaluate = evaluate.evaluate

    def evaluate_with_a_notice(*args, **kwargs):
        logging.getLogger("transformers").warning("a library notice while loading")
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(evaluate, "evaluate", evaluate_with_a_notice)
    log = tmp_path / "notices.log"
    log.write_text("kept\n")
    capsys.readouterr()
    assert evaluate.main([str(trial / "policy"), "--states", "2", "--modes", "greedy", "--log", str(log)]) == 0
    captured = capsys.readouterr()
    assert log.read_text().startswith("kept\n") and "a library notice while loading" in log.read_text()
    assert captured.out.strip().splitlines()[-1] == f"library notices (model loading, warnings): {log}"
    assert "a library notice" not in captured.out + captured.err
    assert sorted(p.name for p in trial.iterdir()) == ["params.json", "policy"]  # nothing written into the run


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--modes", "fast"], "--modes 'fast': choose from greedy, sampled"),
        (["--env-config", "[1]"], "--env-config must be a JSON object"),
        (["--device", "gpu0"], "--device 'gpu0': not a torch device; choose 'cpu', 'cuda' or 'cuda:N'"),
        (["--device", "meta"], "--device 'meta': choose 'cpu', 'cuda' or 'cuda:N'"),
        (["--device", "cuda:64"], "--device 'cuda:64': this process sees"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(flags, message, tmp_path, capsys):
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main([str(policy), *flags])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_a_folder_without_a_model_or_without_settings_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main([str(tmp_path)])
    assert exit_info.value.code == 2 and "holds no config.json" in capsys.readouterr().err
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main([str(tmp_path)])
    assert exit_info.value.code == 2 and "no policy sits in a trial folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main([str(tmp_path), "--run", str(tmp_path)])
    assert exit_info.value.code == 2 and "holds no params.json" in capsys.readouterr().err


def test_a_runs_sentinel_rules_read_back_as_data_and_rule_objects_reprs_are_left_out(tmp_path):
    """Tune stores a setting it cannot write as JSON by its repr. A main job gives its rules as dicts, which come
    back; a user's Rule objects come back as reprs, never read as code: the restored config has no rules and still
    validates (evaluate and the report need none)."""
    import dataclasses

    from rllib_ragen import StarPOConfig
    from rllib_ragen.sentinel import echo_trap_rules

    rules = echo_trap_rules("warn")
    for name in ("data", "objects"):
        (tmp_path / name).mkdir()
    as_data = _trial_folder(
        tmp_path / "data", StarPOConfig().training(sentinel_rules=[dataclasses.asdict(rule) for rule in rules])
    )
    assert evaluate.evaluation_config(as_data).sentinel_rules == [dataclasses.asdict(rule) for rule in rules]
    as_objects = _trial_folder(tmp_path / "objects", StarPOConfig().training(sentinel_rules=rules))
    assert json.loads((as_objects / "params.json").read_text())["sentinel_rules"][0].startswith("Rule(")
    assert evaluate.evaluation_config(as_objects).sentinel_rules == []


def _tiny_policy(folder):
    from rllib_ragen.rollout.models import load_policy

    model, tokenizer = load_policy("tiny")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    "params, message",
    [
        ({"validation_size": "x"}, "validation_size='x' must be an integer"),
        ({"validation_size": -4}, "validation_size=-4 must lie in [1, 10000]"),
        ({"validation_size": 1_000_000_000}, "validation_size=1000000000 must lie in [1, 10000]"),
        ({"env": "no_such/Env-v0"}, "env='no_such/Env-v0' is not a registered text environment"),
        ({"env_config": {"bogus": 1}}, "env_config has unknown keys ['bogus']"),
    ],
)
def test_a_bad_setting_in_params_json_exits_2_with_its_reason(params, message, tmp_path, capsys):
    trial = tmp_path / "seed0"
    trial.mkdir()
    (trial / "params.json").write_text(json.dumps({"env": "rllib_ragen/Bandit-v0", **params}))
    policy = _tiny_policy(trial / "policy")
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main([str(policy)])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_info.value.code == 2 and message in error and "params.json" in error


@pytest.mark.parametrize("states", ["0", "-3"])
def test_states_below_one_exit_2_naming_the_flag(states, tmp_path, capsys):
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main([str(policy), "--states", states])
    assert exit_info.value.code == 2 and f"--states {states}: give a positive number" in capsys.readouterr().err


@pytest.mark.parametrize("cut", ["first", "second"])
def test_cut_weights_exit_2_naming_the_file_before_anything_plays(cut, tmp_path, capsys):
    trial = tmp_path / "seed0"
    trial.mkdir()
    (trial / "params.json").write_text(json.dumps({"env": "rllib_ragen/Bandit-v0", "validation_size": 2}))
    policies = [_tiny_policy(trial / "policy"), _tiny_policy(tmp_path / "other")]
    weights = policies[0 if cut == "first" else 1] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main([str(p) for p in policies])
    error = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and str(weights) in error[-1] and "cut short" in error[-1]
