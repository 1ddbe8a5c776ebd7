"""The public surface is frozen; the package's internal boundaries hold."""

import ast
import inspect
import pathlib
import sys

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


def test_short_flags_mean_one_thing_snapshot():
    """A short flag means the same in every command that has it (issue 55): ``-m`` is
    ``--module`` (``raylight run -m pkg.mod``, as ``python -m``), ``-d`` is ``--dataset``;
    ``submit`` spells out ``--working-dir`` and ``--max-workers``."""
    import typer

    from raylight.cli import app

    meaning: dict[str, set[str]] = {}

    def walk(cmd):
        for p in cmd.params:
            for short in (o for o in p.opts if o.startswith("-") and not o.startswith("--")):
                meaning.setdefault(short, set()).update(o for o in p.opts if o.startswith("--"))
        for sub in getattr(cmd, "commands", {}).values():
            walk(sub)

    root = typer.main.get_command(app)
    walk(root)
    assert meaning == {"-c": {"--config"}, "-d": {"--dataset"}, "-n": {"--nproc"}, "-m": {"--module"},
                       "-u": {"--address"}, "-f": {"--file"}}
    submit = [o for p in root.commands["submit"].params for o in p.opts]
    assert submit == ["command", "--address", "-u", "--working-dir", "--file", "-f", "--nproc", "-n", "--max-failures", "--requirements", "--pip", "--env",
                      "--name", "--max-workers", "--cpus", "--gpus", "--retries", "--resume", "--no-wait", "--scheduler", "--connect-timeout",
                      "--price", "--prices", "--verbose"]


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
    # Tune's integration is used by products only (see PRODUCT_USES).
    users = {m for m, deps in MODULES.items() if not m.startswith("raylight.tune") and any(d.startswith("raylight.tune") for d in deps)}
    assert all(m.startswith(("raylight.declarative", "raylight.lightning", "raylight.cli")) for m in users), users
    # Horovod's API is a library on torch.distributed and the launcher's environment: no Ray,
    # and of raylight only the launcher's environment, the error types, (hvd.elastic's
    # persistence) the core's run_context() and (real Horovod's rendezvous server) where
    # listeners bind, which is the standard library alone, and the optimizer wrapper its
    # DistributedOptimizer shares with raylight's own (torch alone).
    hvd_files = [*(SRC / "horovod").rglob("*.py"), *(SRC / "worker" / "hvd").rglob("*.py")]
    hvd = {d for path in hvd_files for d in _all_imports(path)}
    assert not {d for d in hvd if d.split(".")[0] == "ray"}, hvd
    assert {d for d in hvd if d.startswith("raylight.") and not d.startswith(("raylight.horovod", "raylight.worker.hvd"))} <= {
        "raylight.worker.process_group", "raylight.base.exceptions", "raylight.worker.run_channel", "raylight.base.net",
        "raylight.worker.wrapped_optimizer",
    }, hvd
    wrapper = {d.split(".")[0] for d in _all_imports(SRC / "worker" / "wrapped_optimizer.py")}
    assert wrapper <= {"__future__", "typing", "torch"}, wrapper
    # Preemption notice watchers are the standard library alone: no raylight, Ray or torch.
    notices = {d.split(".")[0] for d in _all_imports(SRC / "worker" / "notices.py")}
    assert not notices & {"raylight", "ray", "torch", "requests", "urllib3"}, notices
    # The agent channel's wire is the standard library alone: launch/bootstrap.py (the child's
    # first code, run by its path) loads it by its path, and imports nothing else but the
    # standard library before the script (torch and raylight's Horovod hook inside functions).
    wire = {d.split(".")[0] for d in _all_imports(SRC / "worker" / "run_wire.py")}
    assert wire <= set(sys.stdlib_module_names), wire
    boot = {d.split(".")[0] for d in _imports(SRC / "launch" / "bootstrap.py")}
    assert boot <= set(sys.stdlib_module_names), boot
    # Strategies know torch.distributed, not Ray.
    assert not {d for d in _deps("raylight.worker.strategies") if d.startswith("ray.") or d == "ray"}


def test_nothing_from_a_worker_is_unpickled_outside_ray():
    """Worker exceptions reach the driver through Ray's own deserialisation only, and
    checkpoints load with weights_only: no module of raylight calls a pickle loader."""
    calls = []
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        # The one exception: sharded.py subclasses pickle.Unpickler with an allow-list
        # (find_class) to read DCP's manifest (tests/storage/test_sharded.py feeds it a payload).
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


# The wings, bottom first: the package's folders by where their code runs. A module
# imports its own wing and those below, never above, wherever the import statement is
# (module level, inside a function, for type checking).
WINGS = [
    ("base", "raylight.base"),
    ("config", "raylight.config"),
    ("adaptive", "raylight.adaptive"),
    ("storage", "raylight.storage"),
    ("worker", "raylight.worker"),
    ("worker_group", "raylight.worker_group"),
    ("scheduler", "raylight.scheduler"),
    ("driver", "raylight.driver"),
]
# The products stand side by side on the core (every wing): none imports another, but the
# declarative and Lightning products use Tune's integration.
PRODUCTS = [
    ("declarative", "raylight.declarative"),
    ("lightning", "raylight.lightning"),
    ("tune", "raylight.tune"),
    ("launch", "raylight.launch"),
    ("jobs", "raylight.jobs"),
    ("horovod", "raylight.horovod"),
    ("ray_train", "raylight.ray_train"),
    ("adaptdl", "raylight.adaptdl"),
]
PRODUCT_USES = {("declarative", "tune"), ("lightning", "tune")}
# The faces, above the products: the package's __init__ (the public surface) and the CLI
# (a command for each product) may use every product.
FACES = [("facade", "raylight"), ("cli", "raylight.cli")]


def _folder(module: str) -> tuple[str, int] | None:
    """The wing, product or face a module's folder is (its name and level: a wing's
    place, the products' above the wings, the faces' above those); None for no such folder."""
    parts = module.split(".")
    if parts[0] != "raylight":
        return None
    if len(parts) == 1:
        return "facade", len(WINGS) + 1
    for level, places in ((None, WINGS), (len(WINGS), PRODUCTS), (len(WINGS) + 1, FACES)):
        for i, (name, package) in enumerate(places):
            if package == ".".join(parts[:2]):
                return name, i if level is None else level
    return None


def layer_violations(imports: dict[str, set[str]]) -> list[str]:
    """What breaks the floor plan in ``imports`` (a module -> the modules it imports): an
    import up the wings (a product or face from the core included), one product importing
    another (but PRODUCT_USES), and a module whose folder is no wing, product or face."""
    found = []
    for module, deps in sorted(imports.items()):
        mine = _folder(module)
        if mine is None:
            found.append(f"{module} is in no wing, product or face: add its folder to WINGS, PRODUCTS or FACES")
            continue
        for dep in sorted(d for d in deps if d.split(".")[0] == "raylight"):
            theirs = _folder(dep)
            if theirs is None:
                found.append(f"{module} ({mine[0]}) imports {dep}, which is in no wing, product or face")
            elif theirs[0] == mine[0]:
                continue
            elif theirs[1] > mine[1] or (theirs[1] == mine[1] == len(WINGS) and (mine[0], theirs[0]) not in PRODUCT_USES):
                found.append(f"{module} ({mine[0]}) imports {dep} ({theirs[0]})")
    return found


def test_no_wing_imports_upward_and_products_stand_side_by_side():
    # The checker reads absolute imports; the package has no others.
    relative = [
        f"{p.relative_to(SRC)}:{n.lineno}" for p in SRC.rglob("*.py") for n in ast.walk(ast.parse(p.read_text()))
        if isinstance(n, ast.ImportFrom) and n.level
    ]
    assert not relative, relative
    imports = {_module_name(p): _all_imports(p) for p in SRC.rglob("*.py")}
    assert imports.keys() == MODULES.keys()
    assert not layer_violations(imports), "\n".join(layer_violations(imports))


def test_the_layer_check_catches_what_breaks_the_floor_plan(tmp_path):
    """The same checker, on imports made up for it: each kind of crossing is named, and
    what the floor plan allows is not."""
    assert layer_violations({"raylight.storage.run_dir": {"raylight.driver.plots"}}) == [
        "raylight.storage.run_dir (storage) imports raylight.driver.plots (driver)"
    ]
    for module, dep in [
        ("raylight.worker_group.ray_group", "raylight.driver.runtime"),  # a wing above
        ("raylight.driver.trainer", "raylight.tune.trial"),  # core -> product
        ("raylight.worker.context", "raylight"),  # core -> the facade
        ("raylight.horovod.elastic", "raylight.launch.driver"),  # product -> product
        ("raylight.launch.bootstrap", "raylight.horovod"),
        ("raylight.lightning.horovod", "raylight.horovod.elastic"),
        ("raylight.tune.trial", "raylight.declarative.api"),  # the allowed uses go one way
        ("raylight.jobs.submission", "raylight.cli.main"),  # product -> face
        ("raylight.driver.trainer", "raylight.elsewhere.x"),  # a folder of no wing
        ("raylight.elsewhere.x", "raylight.base.clock"),
    ]:
        assert len(layer_violations({module: {dep}})) == 1, (module, dep)
    assert not layer_violations({
        "raylight.declarative.hyperopt": {"raylight.tune.trial", "raylight.driver.trainer", "raylight.base.clock", "torch"},
        "raylight.lightning._launcher": {"raylight.tune.trial", "raylight.worker.hvd.basics"},
        "raylight.horovod.elastic": {"raylight.worker.run_channel"},
        "raylight.cli.main": {"raylight.declarative.api", "raylight.launch.driver", "raylight.jobs.submission", "raylight"},
        "raylight": {"raylight.cli", "raylight.declarative.train"},
        "raylight.worker_group.ray_group": {"raylight.worker.session", "raylight.config", "raylight.worker_group.pool"},
    })
    # ... and it reads imports wherever they are: for type checking, inside a function.
    module = tmp_path / "fake.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from raylight.driver.recorder import RunRecorder\n"
        "def f():\n    import raylight.tune.trial\n"
    )
    assert layer_violations({"raylight.storage.fake": _all_imports(module)}) == [
        "raylight.storage.fake (storage) imports raylight.driver.recorder (driver)",
        "raylight.storage.fake (storage) imports raylight.tune.trial (tune)",
    ]


def test_the_driver_s_path_to_a_run_does_not_import_the_fitter():
    """scipy's optimizer (0.3-0.6 s to import here) is needed only when an adaptive run
    fits its performance model; every run's driver imports the controller before it asks
    for workers."""
    import subprocess

    code = (
        "import sys, raylight.driver.trainer, raylight.driver.controller, raylight.worker_group.ray_group; "
        "print('scipy.optimize' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
