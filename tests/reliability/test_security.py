"""Hostile or careless surroundings must not run code as the user: a job's Ray keeps its token authentication, and a
report on a run folder someone sent reads data, never a pickle. (The viewer's escaping: tests/jobs/test_viewer.py.)"""

import json
import os
import subprocess
import sys

import pytest

from rllib_ragen.jobs import readers


def test_a_jobs_local_ray_keeps_token_authentication(tmp_path):
    """Ray's processes listen on the machine's interfaces during a job; without its token anyone reaching their ports
    could run code as the user. The job starts Ray as a fresh process would (RAY_AUTH_MODE unset)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    env["HOME"] = str(tmp_path)  # the token Ray writes goes here, not into the user's ~/.ray
    script = (
        "import ray\n"
        "from rllib_ragen.jobs.run import start_ray\n"
        "start_ray(verbose=False)\n"
        "from ray._private.authentication.authentication_utils import is_token_auth_enabled\n"
        "print('token auth', is_token_auth_enabled())\n"
        "ray.shutdown()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "token auth True" in done.stdout
    assert (tmp_path / ".ray" / "auth_token").is_file()


class _Payload:
    """What a hostile params.pkl holds: unpickling it runs a command (here: it writes a marker file)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _trial_folder(tmp_path, params_json):
    import pickle

    from rllib_ragen import StarPOConfig

    trial = tmp_path / "seed0"
    trial.mkdir()
    marker = tmp_path / "pwned"
    with open(trial / "params.pkl", "wb") as f:
        pickle.dump({"env": _Payload(marker)}, f)
    if params_json is not None:
        from ray.tune.utils.util import SafeFallbackEncoder

        config = StarPOConfig().environment("rllib_ragen/FrozenLake-v0").training(validation_size=7)
        text = json.dumps(
            {**config.to_dict(), "seed": 3} if params_json == "tune" else params_json, cls=SafeFallbackEncoder
        )
        (trial / "params.json").write_text(text)
    return trial, marker


def test_the_report_reads_a_trials_settings_from_params_json_and_never_unpickles(tmp_path):
    trial, marker = _trial_folder(tmp_path, "tune")
    config = readers.trial_config(trial)
    assert not marker.exists()  # params.pkl was not unpickled
    assert (config.env, config.validation_size, config.seed) == ("rllib_ragen/FrozenLake-v0", 7, 3)
    assert config.adam_betas == (0.9, 0.999)  # a tuple again
    assert isinstance(config.callbacks_class, type)  # a class Tune wrote as its repr keeps the default


def test_a_missing_or_broken_params_json_is_named_not_replaced_by_the_pickle(tmp_path):
    import pytest

    trial, marker = _trial_folder(tmp_path, None)
    with pytest.raises(FileNotFoundError, match="params.json is missing.*never from params.pkl"):
        readers.trial_config(trial)
    (trial / "params.json").write_text('{"env": "rllib_ragen/FrozenLake-v0", ')
    with pytest.raises(ValueError, match="params.json is not valid JSON"):
        readers.trial_config(trial)
    (trial / "params.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="holds a list"):
        readers.trial_config(trial)
    assert not marker.exists()


def test_the_report_finds_trials_without_tunes_experiment_state_which_runs_the_pickle_it_holds(tmp_path):
    """Why the report reads trial folders itself rather than through ``tune.ExperimentAnalysis`` (issue 64 asked
    for it): Tune's reader expands the cloudpickle payloads of ``experiment_state-*.json``, so opening a folder
    someone sent runs their code (checked on Ray's own class below; if Ray stops doing so, this test fails and the
    report can move to it). The report never opens that file."""
    from ray import cloudpickle
    import pytest
    from ray import tune

    trial, marker = _trial_folder(tmp_path, "tune")
    (trial / "result.json").write_text("")
    blob = {"_type": "CLOUDPICKLE_FALLBACK", "value": cloudpickle.dumps(_Payload(marker)).hex()}
    (tmp_path / "experiment_state-2026-11-28_00-00-00.json").write_text(json.dumps({"trial_data": blob}))
    assert readers.trial_folders(tmp_path) == [trial]
    readers.trial_config(trial)
    assert not marker.exists()
    with pytest.raises(Exception):  # the payload is not trial data: Tune fails, after running it
        tune.ExperimentAnalysis(str(tmp_path))
    assert marker.exists()


# ---- a run folder's params.json names code: nothing is imported unless the user says so ---------------------------
EVIL_MODULE = "import pathlib\npathlib.Path(__file__).with_name('imported').write_text('ran')\nclass E:\n    pass\n"


def _policy_and_trial(tmp_path, params: dict):
    """A trial folder whose params.json is ``params`` (over the defaults of a TRL-v0 config), a tiny policy in it,
    and, in the working folder, ``evil_mod.py``, which leaves ``imported`` beside itself when imported."""
    from rllib_ragen.rollout.models import load_policy

    trial = tmp_path / "run" / "seed0"
    trial.mkdir(parents=True)
    model, tokenizer = load_policy("tiny")
    model.save_pretrained(trial / "policy")
    tokenizer.save_pretrained(trial / "policy")
    (trial / "params.json").write_text(
        json.dumps({"env": "rllib_ragen/TRL-v0", "validation_size": 2, "rl_module_spec": None, **params})
    )
    (tmp_path / "evil_mod.py").write_text(EVIL_MODULE)
    return trial


def _evaluate_in(folder, *args):
    """``python -m rllib_ragen.jobs.evaluate`` run from ``folder`` (which Python then puts first on sys.path)."""
    return subprocess.run(
        [sys.executable, "-m", "rllib_ragen.jobs.evaluate", *map(str, args)],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "params, named",
    [
        ({"env_config": {"environment": "evil_mod:E"}}, "env_config['environment']='evil_mod:E' is an import path"),
        (
            {"env_config": {"environment": "tempfile:mkdtemp", "tasks": "evil_mod:E"}},
            "env_config['environment']='tempfile:mkdtemp' is an import path",
        ),
        (
            {
                "env": "rllib_ragen/Bandit-v0",
                "validation_envs": [
                    {"env": "rllib_ragen/TRL-v0", "env_config": {"environment": "evil_mod:E"}, "states": 2}
                ],
            },
            "validation_envs[0]['env_config']['environment']='evil_mod:E'",
        ),
    ],
)
def test_evaluate_refuses_a_run_folder_that_names_an_import_path(tmp_path, params, named):
    trial = _policy_and_trial(tmp_path, params)
    done = _evaluate_in(tmp_path, trial / "policy")
    assert done.returncode == 2, done.stderr[-2000:]
    error = done.stderr.strip().splitlines()[-1]
    assert named in error and "--allow-run-imports" in error and "params.json" in error
    assert not (tmp_path / "imported").exists()


def test_rllibs_own_import_paths_in_a_run_folder_are_never_resolved(tmp_path):
    """RLlib's update_from_dict imports the class paths of a few of its keys (deserialize_type); a run folder's text
    there must not reach it, and neither must keys this version has no setting for."""
    trial = tmp_path / "seed0"
    trial.mkdir()
    (trial / "params.json").write_text(
        json.dumps(
            {
                "env": "rllib_ragen/Bandit-v0",
                "exploration_config": {"type": "evil_mod.E"},
                "model": {"custom_model": "evil_mod.E"},
                "replay_buffer_config": {"type": "evil_mod.E"},
                "sample_collector": "evil_mod.E",
                "callbacks_class": "evil_mod.E",
                "not_a_setting": "evil_mod.E",
            }
        )
    )
    (tmp_path / "evil_mod.py").write_text(EVIL_MODULE)
    script = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "from rllib_ragen.jobs.readers import trial_config\n"
        f"config = trial_config(__import__('pathlib').Path({str(trial)!r}))\n"
        "print(config.env, 'evil_mod' in sys.modules, hasattr(config, 'not_a_setting'))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["rllib_ragen/Bandit-v0", "False", "False"]
    assert not (tmp_path / "imported").exists()


def test_the_import_paths_of_a_trusted_run_are_read_when_allowed(tmp_path):
    trial = _policy_and_trial(tmp_path, {"env_config": {"environment": "evil_mod:E"}})
    config = readers.trial_config(trial, allow_imports=True)
    assert config.env_config == {"environment": "evil_mod:E"}  # read; importing waits for the environment's build


@pytest.mark.parametrize("reader", ["against_warm_start", "kuhn_strategy_of_trial"])
def test_the_self_play_readers_refuse_a_run_folder_that_names_an_import_path(tmp_path, reader):
    """The match and strategy readers open a run folder someone may have sent: its settings are data, as for
    ``evaluate``, and nothing is played or written."""
    from rllib_ragen.jobs import matches

    trial = _policy_and_trial(tmp_path, {"env_config": {"environment": "evil_mod:E"}})
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(readers.RunFolderImportError, match="evil_mod:E.*--allow-run-imports"):
            getattr(matches, reader)(str(trial))
    finally:
        sys.path.remove(str(tmp_path))
    assert "evil_mod" not in sys.modules and not (tmp_path / "imported").exists()
    assert sorted(p.name for p in trial.iterdir()) == ["params.json", "policy"]
