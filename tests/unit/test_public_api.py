"""The public surface is frozen; the package's internal boundaries hold."""

import ast
import inspect
import pathlib

import raylight

SRC = pathlib.Path(raylight.__file__).parent

PUBLIC = [
    "AdaptiveConfig", "Checkpoint", "ClusterConnectionError", "ConfigError", "DDP", "DeepSpeed", "FSDP", "FailureConfig", "Horovod",
    "InsufficientResourcesError", "PreemptedError", "RaylightError", "Result", "RunConfig", "RunInUseError", "ScalingConfig",
    "TrainContext", "Trainer", "TrainerConfig", "TrainingDivergedError", "TrainingFailedError", "WorkerDiedError",
    "WorkerError", "WorkerHangError", "WorkerImportError", "WorkerStartError", "__version__", "fit", "load_model",
    "prestart_workers", "release_workers", "run_context",
]


def test_public_names_snapshot():
    assert sorted(raylight.__all__) == sorted(PUBLIC)
    for name in PUBLIC:
        assert hasattr(raylight, name)


def test_fit_signature_snapshot():
    params = inspect.signature(raylight.fit).parameters
    assert list(params) == [
        "train_loop", "config", "num_workers", "adaptive", "use_gpu", "resources_per_worker", "placement",
        "strategy",
        "storage_path", "name", "max_failures", "resume", "address", "progress", "verbose", "loggers", "prices",
    ]
    assert all(p.kind is p.KEYWORD_ONLY for n, p in params.items() if n != "train_loop")


def test_cli_flags_of_the_commands_that_resume_snapshot():
    """The flags of the commands that train (``--resume``: issue 53, a killed run continues)."""
    import typer

    from raylight.cli import app

    commands = typer.main.get_command(app).commands
    flags = {name: [o for p in commands[name].params for o in p.opts] for name in ("train", "experiment", "hyperopt", "run")}
    declarative = ["--config", "-c", "--dataset", "-d", "--output-directory", "--backend", "--set", "--quiet", "--price",
                   "--prices", "--verbose", "--resume"]
    assert flags["train"] == declarative and flags["experiment"] == declarative
    assert flags["hyperopt"] == ["--config", "-c", "--dataset", "-d", "--output-directory", "--set", "--quiet", "--verbose", "--resume"]
    assert flags["run"] == ["--nproc", "-n", "--module", "-m", "--cpus", "--gpus", "--address", "--max-failures", "--init-timeout", "--channel-timeout",
                            "--resize-interval", "--name", "--storage-path", "--resume", "--verbose"]


def test_horovod_surface():
    """Horovod's torch API names raylight.horovod serves (docs/horovod.md lists them)."""
    import raylight.horovod as hvd

    for name in (
        "init", "shutdown", "is_initialized", "size", "rank", "local_rank", "local_size", "cross_rank", "cross_size",
        "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "allgather", "allgather_async",
        "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async",
        "synchronize", "poll", "join", "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
        "allgather_object", "DistributedOptimizer", "Compression", "Average", "Sum", "Min", "Max", "Product",
        "Adasum", "HorovodInternalError", "HostsUpdatedInterrupt", "elastic", "install_import_hook",
    ):
        assert name in hvd.__all__ and hasattr(hvd, name), name
    for name in ("TorchState", "ObjectState", "State", "ElasticSampler", "run"):
        assert hasattr(hvd.elastic, name), name


def test_context_surface():
    for name in ("rank", "local_rank", "world_size", "node_rank", "device", "logger"):
        assert name in inspect.getsource(raylight.TrainContext.__init__)
    for method in (
        "prepare_model", "prepare_loader", "prepare_optimizer", "report", "get_checkpoint", "barrier",
        "all_reduce", "epochs", "accumulator", "heartbeat", "unwrap_model", "load_checkpoint",
    ):
        assert callable(getattr(raylight.TrainContext, method))


def _all_imports(path: pathlib.Path) -> set[str]:
    """Every module a file imports, at module level, inside functions or for type checking."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from raylight import runtime`` imports the submodule, not the facade's names.
            subs = {f"{node.module}.{a.name}" for a in node.names}
            found |= (subs & MODULE_NAMES) or {node.module}
    return found


def _imports(path: pathlib.Path) -> set[str]:
    """Modules imported at module level (not inside functions or TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): _imports(p) for p in SRC.rglob("*.py")}
MODULE_NAMES = set(MODULES)


def test_no_import_cycles():
    graph = {m: {d for d in deps if d in MODULES and d != m} for m, deps in MODULES.items()}
    # Importing a package runs its __init__: depend on the parents too.
    for m in list(graph):
        graph[m] |= {p for d in list(graph[m]) for p in _parents(d) if p in MODULES and p != m and not m.startswith(p + ".")}
    state: dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for d in graph[m]:
            if state.get(d) == 1:
                raise AssertionError(f"import cycle: {' -> '.join([*stack, m, d])}")
            if d not in state:
                visit(d, [*stack, m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _deps(prefix: str) -> set[str]:
    return {d for m, deps in MODULES.items() if m == prefix or m.startswith(prefix + ".") for d in deps}


def test_boundaries():
    # The controller sees data and decisions: no torch, no Ray.
    ctrl = _deps("raylight.driver.controller") | MODULES["raylight.driver.recorder"] | MODULES["raylight.worker.protocol"]
    assert not {d for d in ctrl if d.split(".")[0] in ("torch", "ray")}
    # The adaptive math and policies are pure: numpy and scipy only (and threadpoolctl,
    # which keeps the fit's BLAS on one thread).
    adaptive = {d.split(".")[0] for d in _deps("raylight.adaptive")}
    assert adaptive <= {
        "__future__", "numpy", "scipy", "threadpoolctl", "math", "collections", "contextlib", "dataclasses", "typing",
        "raylight",
    }
    # ... and of raylight they know only themselves and the config's names of LR rules.
    pure = {d for d in _deps("raylight.adaptive") if d.startswith("raylight")}
    assert {d for d in pure if not d.startswith("raylight.adaptive.")} <= {"raylight.config.schema"}, pure
    # Config is the core's pure data: nothing else of raylight but its error type (the
    # declarative product's config lives in raylight.declarative).
    cfg = {d for d in _deps("raylight.config") if d.startswith("raylight") and not d.startswith("raylight.config.")}
    assert cfg <= {"raylight.base.exceptions"}, cfg
    # Tune's integration is used by products only (see test_products_stand_side_by_side).
    users = {m for m, deps in MODULES.items() if not m.startswith("raylight.tune") and any(d.startswith("raylight.tune") for d in deps)}
    assert all(m.startswith(("raylight.declarative", "raylight.lightning", "raylight.cli")) for m in users), users
    # Horovod's API is a library on torch.distributed and the launcher's environment: no Ray,
    # and of raylight only the launcher's environment, the error types, (hvd.elastic's
    # persistence) raylight run's context and (real Horovod's rendezvous server) where
    # listeners bind, which is the standard library alone, and the optimizer wrapper its
    # DistributedOptimizer shares with raylight's own (torch alone).
    hvd_files = [*(SRC / "horovod").rglob("*.py"), *(SRC / "worker" / "hvd").rglob("*.py")]
    hvd = {d for path in hvd_files for d in _all_imports(path)}
    assert not {d for d in hvd if d.split(".")[0] == "ray"}, hvd
    assert {d for d in hvd if d.startswith("raylight.") and not d.startswith(("raylight.horovod", "raylight.worker.hvd"))} <= {
        "raylight.worker.process_group", "raylight.base.exceptions", "raylight.launch.client", "raylight.base.net",
        "raylight.worker.wrapped_optimizer",
    }, hvd
    wrapper = {d.split(".")[0] for d in _all_imports(SRC / "worker" / "wrapped_optimizer.py")}
    assert wrapper <= {"__future__", "typing", "torch"}, wrapper
    # Preemption notice watchers are the standard library alone: no raylight, Ray or torch.
    notices = {d.split(".")[0] for d in _all_imports(SRC / "worker" / "notices.py")}
    assert not notices & {"raylight", "ray", "torch", "requests", "urllib3"}, notices
    # Strategies know torch.distributed, not Ray.
    assert not {d for d in _deps("raylight.worker.strategies") if d.startswith("ray.") or d == "ray"}


def test_nothing_from_a_worker_is_unpickled_outside_ray():
    """Worker exceptions reach the driver through Ray's own deserialisation only, and
    checkpoints load with weights_only: no module of raylight calls a pickle loader."""
    calls = []
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        # The one exception: sharded.py subclasses pickle.Unpickler with an allow-list
        # (find_class) to read DCP's manifest (tests/unit/test_sharded.py feeds it a payload).
        allowed = {
            id(base)
            for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef)
            and any(isinstance(f, ast.FunctionDef) and f.name == "find_class" for f in node.body)
            for base in node.bases
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("loads", "load", "Unpickler"):
                base = node.value
                if isinstance(base, ast.Name) and base.id in ("pickle", "cloudpickle", "dill") and id(node) not in allowed:
                    calls.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not calls, calls


# The layers, bottom first. A module imports its own layer and those below, never above,
# wherever the import statement is (module level, inside a function, for type checking).
LAYERS = [
    ("base", [
        "raylight.base.clock", "raylight.base.exceptions", "raylight.base.exit_codes", "raylight.config", "raylight.base.verbosity",
        "raylight.driver._embedded_agent",  # a script Ray's raylet runs; it imports no raylight module
        "raylight.driver._reaper",  # a script the embedded cluster starts; it imports no raylight module
        "raylight.driver.termination",
        # the wings' packages: their __init__ only says what the wing owns
        "raylight.base", "raylight.storage", "raylight.worker", "raylight.worker.hvd", "raylight.driver",
    ]),
    ("pure and storage", [
        "raylight.adaptive", "raylight.storage.run_dir", "raylight.storage.checkpoint", "raylight.storage.sharded", "raylight.storage.lease",
        "raylight.driver.plots", "raylight.worker.notices", "raylight.base.cost",
    ]),
    ("worker pieces and records", [
        "raylight.worker.protocol", "raylight.base.net", "raylight.worker.strategies", "raylight.worker.data",
        "raylight.worker.adaptive", "raylight.driver.recorder", "raylight.driver.loggers", "raylight.driver.progress", "raylight.driver.runtime",
        "raylight.driver.report", "raylight.worker.process_group", "raylight.worker.wrapped_optimizer",
        # raylight.horovod's API on torch.distributed and real Horovod's start in a group:
        # libraries the horovod strategy uses (its script runner and elastic stay products)
        "raylight.worker.hvd.basics", "raylight.worker.hvd.ops", "raylight.worker.hvd.optimizer",
        "raylight.worker.hvd.compat", "raylight.worker.hvd.real",
    ]),
    ("context and control", ["raylight.worker.context", "raylight.driver.controller", "raylight.worker.session"]),
    ("worker group", ["raylight.worker_group"]),
    ("trainer", ["raylight.driver.trainer", "raylight.driver.job_env"]),
    ("products", [
        "raylight.declarative", "raylight.declarative.models", "raylight.lightning", "raylight.tune", "raylight.jobs",
        "raylight.launch", "raylight.cli", "raylight.horovod",
    ]),
]
FACADE = "raylight"  # the package's __init__: the public surface over every layer
# Products stand side by side on the core; Ray Tune's integration is a library any may use.
PRODUCTS = {
    "declarative": ["raylight.declarative", "raylight.declarative.models"],
    "lightning": ["raylight.lightning"],
    "tune": ["raylight.tune"],
    "horovod": ["raylight.horovod"],
    "jobs": ["raylight.jobs"],
    "launch": ["raylight.launch"],
    "cli": ["raylight.cli"],
}
PRODUCT_USES = {
    "declarative": {"tune"}, "lightning": {"tune", "horovod"}, "cli": {"declarative", "tune", "jobs", "launch"},
    "tune": set(), "jobs": set(),
    "launch": {"horovod"},  # the scripts' bootstrap installs the `import horovod` hook when asked
    "horovod": {"launch"},  # hvd.elastic: raylight run's client
}


def _owner(name: str, groups: list[tuple[str, list[str]]]) -> int | None:
    best = None
    for i, (_, prefixes) in enumerate(groups):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (i, len(prefix))
    return None if best is None else best[0]


def test_no_layer_imports_upward():
    upward = []
    for path in SRC.rglob("*.py"):
        module = _module_name(path)
        if module == FACADE:
            continue
        mine = _owner(module, LAYERS)
        assert mine is not None, f"{module} belongs to no layer: add it to LAYERS"
        for dep in _all_imports(path):
            theirs = _owner(dep, LAYERS) if dep.startswith("raylight") else None
            if dep == FACADE:
                theirs = len(LAYERS)  # the facade is above everything
            if theirs is not None and theirs > mine:
                upward.append(f"{module} ({LAYERS[mine][0]}) imports {dep} ({LAYERS[theirs][0] if theirs < len(LAYERS) else 'facade'})")
    assert not upward, "\n".join(upward)


def test_products_stand_side_by_side():
    groups = list(PRODUCTS.items())
    crossing = []
    for path in SRC.rglob("*.py"):
        module = _module_name(path)
        mine = _owner(module, groups)
        if mine is None:
            continue
        name = groups[mine][0]
        for dep in _all_imports(path):
            theirs = _owner(dep, groups)
            if theirs is not None and theirs != mine and groups[theirs][0] not in PRODUCT_USES[name]:
                crossing.append(f"{module} ({name}) imports {dep} ({groups[theirs][0]})")
    assert not crossing, "\n".join(crossing)


def test_the_driver_s_path_to_a_run_does_not_import_the_fitter():
    """scipy's optimizer (0.3-0.6 s to import here) is needed only when an adaptive run
    fits its performance model; every run's driver imports the controller before it asks
    for workers."""
    import subprocess
    import sys

    code = (
        "import sys, raylight.driver.trainer, raylight.driver.controller, raylight.worker_group.ray_group; "
        "print('scipy.optimize' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
