"""The layers below RLlib stand on their own: environments, the rollout core and the math import without Ray."""

import subprocess
import sys


def test_envs_rollout_and_objectives_import_with_ray_unimportable():
    code = ("import sys; sys.modules['ray'] = None\n"  # any `import ray` now raises ImportError
            "import rllib_ragen.envs, rllib_ragen.rollout, rllib_ragen.objectives, rllib_ragen.metrics\n"
            "import rllib_ragen.warm_start\n"
            "import rllib_ragen.rollout.vllm_backend\n"
            "print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_the_starpo_layer_does_need_ray():
    # The check above would pass vacuously if the import hook did not bite; it does for the RLlib layer.
    code = "import sys; sys.modules['ray'] = None\nimport rllib_ragen.starpo"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "ray" in done.stderr


def test_the_job_layer_runs_no_rollouts_of_its_own():
    # The job layer (rllib_ragen/jobs/: the driver, its flags, outputs, callbacks, report, viewer, statistics) writes
    # what the algorithm played: every rollout goes through StarPO (play_validation_states,
    # play_validation_states_with), never a second loop in the job code, and no rollout module is imported.
    import ast
    import pathlib

    jobs = pathlib.Path(__file__).resolve().parents[1] / "rllib_ragen" / "jobs"
    modules = sorted(jobs.glob("*.py"))
    assert {p.stem for p in modules} >= {"run", "flags", "outputs", "callbacks", "report", "viewer", "paired_stats",
                                          "validation_states", "storage"}
    for path in modules:  # every module of the job layer, one added later too
        name = path.stem
        tree = ast.parse(path.read_text())
        imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
        type_only = [node for node in ast.walk(tree) if isinstance(node, ast.If)
                     and getattr(node.test, "id", "") == "TYPE_CHECKING"]
        hinted = {n.module for node in type_only for n in ast.walk(node) if isinstance(n, ast.ImportFrom)}
        assert [m for m in imported if "rollout" in m and m not in hinted] == [], name
