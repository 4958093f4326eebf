"""The layers below RLlib stand on their own: environments, the rollout core and the math import without Ray."""

import subprocess
import sys


def test_envs_rollout_and_objectives_import_with_ray_unimportable():
    code = ("import sys; sys.modules['ray'] = None\n"  # any `import ray` now raises ImportError
            "import rllib_ragen.envs, rllib_ragen.rollout, rllib_ragen.objectives, rllib_ragen.metrics, rllib_ragen.sft\n"
            "import rllib_ragen.rollout.vllm_backend\n"
            "print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_the_starpo_layer_does_need_ray():
    # The check above would pass vacuously if the import hook did not bite; it does for the RLlib layer.
    code = "import sys; sys.modules['ray'] = None\nimport rllib_ragen.starpo"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "ray" in done.stderr
