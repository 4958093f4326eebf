"""The layers below RLlib stand on their own: environments, the rollout core and the math import without Ray."""

import subprocess
import sys


def test_envs_rollout_and_objectives_import_with_ray_unimportable():
    code = (
        "import sys; sys.modules['ray'] = None\n"  # any `import ray` now raises ImportError
        "import rllib_ragen.envs, rllib_ragen.rollout, rllib_ragen.objectives, rllib_ragen.metrics\n"
        "import rllib_ragen.warm_start\n"
        "import rllib_ragen.rollout.vllm_backend\n"
        "print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_the_starpo_layer_does_need_ray():
    # The check above would pass vacuously if the import hook did not bite; it does for the RLlib layer.
    code = "import sys; sys.modules['ray'] = None\nimport rllib_ragen.starpo"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "ray" in done.stderr


WARM_START_STEP_ROLLOUT_NAMES = {
    "rollout.models.load_policy",
    "rollout.models.enable_activation_checkpointing",
    "rollout.trajectory.rollout_metrics",
}


def test_the_job_layer_runs_no_rollouts_of_its_own():
    # The job layer (rllib_ragen/jobs/: the driver, its flags, outputs, callbacks, report, viewer, statistics) writes
    # what the algorithm played: every rollout goes through StarPO (play_validation_states,
    # play_validation_states_with), never a second loop in the job code, and no rollout module is imported. The
    # warm-start step plays its demonstrations through the library (rllib_ragen.warm_start) and takes from the
    # rollout layer the model it fine-tunes and the sum of its curve's episodes, nothing that plays.
    import ast
    import pathlib

    jobs = pathlib.Path(__file__).resolve().parents[1] / "rllib_ragen" / "jobs"
    modules = sorted(jobs.glob("*.py"))
    assert {p.stem for p in modules} >= {
        "run",
        "flags",
        "outputs",
        "callbacks",
        "report",
        "viewer",
        "paired_stats",
        "validation_states",
        "storage",
    }
    for path in modules:  # every module of the job layer, one added later too
        name = path.stem
        tree = ast.parse(path.read_text())
        imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
        type_only = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
        ]
        hinted = {n.module for node in type_only for n in ast.walk(node) if isinstance(n, ast.ImportFrom)}
        allowed = WARM_START_STEP_ROLLOUT_NAMES if name == "warm_start" else set()
        from_rollout = {
            f"{node.module}.{alias.name}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and "rollout" in (node.module or "") and node.module not in hinted
            for alias in node.names
        }
        assert from_rollout - allowed == set(), name
        assert [m for m in imported if "rollout" in m and m not in hinted and m.startswith("rllib_ragen")] == [], name


# The layers, lowest first: a module imports from its own layer and those below, never from one above (type hints
# aside). At the bottom the modules every layer may ask (metric names, the machine, progress bars, whole-or-absent
# files, ranges of numbers); the warm start, the echo-trap measures and the sentinel's rules sit on the rollout core
# and the math, under the RLlib algorithm; the job layer is on top.
LAYERS = [
    ("metrics", "hardware", "progress", "files", "ranges"),
    ("envs",),
    ("rollout",),
    ("objectives",),
    ("warm_start", "demonstrators", "collapse", "sentinel"),
    ("starpo",),
    ("jobs",),
]


def _layer(module: str) -> int | None:
    first = module.split(".")[0]
    return next((i for i, names in enumerate(LAYERS) if first in names), None)


def test_no_module_imports_from_a_layer_above_its_own():
    import ast
    import pathlib

    package = pathlib.Path(__file__).resolve().parents[1] / "rllib_ragen"
    upward = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).with_suffix("")
        own = _layer(".".join(relative.parts))
        if own is None:  # the package's __init__ (its lazy StarPO import) and viewer assets
            continue
        tree = ast.parse(path.read_text())
        type_only = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
            for n in ast.walk(node)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or id(node) in type_only:
                continue
            if node.level:  # relative: resolve against the module's own package
                base = list(relative.parts[:-1])[: len(relative.parts) - node.level]
                target = ".".join([*base, node.module or ""]).strip(".")
            elif (node.module or "").startswith("rllib_ragen."):
                target = node.module.removeprefix("rllib_ragen.")
            else:
                continue
            names = [target] if target else [alias.name for alias in node.names]
            for imported in names:
                layer = _layer(imported)
                if layer is not None and layer > own:
                    upward.append(f"{'/'.join(relative.parts)} imports {imported}")
    assert upward == []


def test_the_rollout_core_imports_no_game():
    """The rollout core reaches environments through the registry and the text-environment base only; the games'
    own modules (their solvers, rules, levels) are the demonstrators' business (rllib_ragen/demonstrators.py)."""
    import ast
    import pathlib

    rollout = pathlib.Path(__file__).resolve().parents[1] / "rllib_ragen" / "rollout"
    reached = {
        (path.stem, node.module)
        for path in rollout.glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level == 2 and (node.module or "").startswith("envs")
    }
    assert {module for _, module in reached} <= {"envs", "envs.base"}, reached


# The one import cycle kept: StarPOConfig names its algorithm as RLlib's configs do (PPOConfig defaults algo_class to
# PPO), and the algorithm imports its config; the config's import is deferred to its constructor.
ALLOWED_CYCLES = [{"starpo.config", "starpo.starpo"}]


def test_no_import_cycles_among_the_packages_modules():
    """Every import between the package's modules, deferred ones inside functions included (type-hint-only ones
    left out), as a graph: its strongly connected components of more than one module are the cycles."""
    import ast
    import pathlib

    package = pathlib.Path(__file__).resolve().parents[1] / "rllib_ragen"
    modules = {
        ".".join(p.relative_to(package).with_suffix("").parts).removesuffix(".__init__"): p
        for p in package.rglob("*.py")
    }
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        type_only = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
            for n in ast.walk(node)
        }
        own_package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        edges = set()
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or id(node) in type_only:
                continue
            if node.level:
                base = own_package[: len(own_package) - (node.level - 1)]
                target = ".".join([*base, node.module or ""]).strip(".")
            elif (node.module or "").startswith("rllib_ragen."):
                target = node.module.removeprefix("rllib_ragen.")
            else:
                continue
            for alias in node.names:  # "from .x import y": y is a module of the package, or a name in x
                edges.add(
                    f"{target}.{alias.name}".strip(".") if f"{target}.{alias.name}".strip(".") in modules else target
                )
        graph[name] = {e for e in edges if e in modules} - {name}
    cycles = [component for component in _strongly_connected(graph) if len(component) > 1]
    assert [c for c in cycles if c not in ALLOWED_CYCLES] == []


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's components of a directed graph, iteratively."""
    index, low, on_stack, stack, components, counter = {}, {}, set(), [], [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                components.append(component)
    return components
