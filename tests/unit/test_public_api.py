"""The public surface is frozen; the package's internal boundaries hold."""

import ast
import inspect
import pathlib

import raylight

SRC = pathlib.Path(raylight.__file__).parent

PUBLIC = [
    "AdaptiveConfig", "Checkpoint", "ClusterConnectionError", "ConfigError", "FailureConfig",
    "InsufficientResourcesError", "RaylightError", "Result", "RunConfig", "RunInUseError", "ScalingConfig",
    "TrainContext", "Trainer", "TrainerConfig", "TrainingDivergedError", "TrainingFailedError", "WorkerDiedError",
    "WorkerError", "WorkerHangError", "WorkerStartError", "__version__", "fit", "load_model",
]


def test_public_names_snapshot():
    assert sorted(raylight.__all__) == sorted(PUBLIC)
    for name in PUBLIC:
        assert hasattr(raylight, name)


def test_fit_signature_snapshot():
    params = inspect.signature(raylight.fit).parameters
    assert list(params) == [
        "train_loop", "config", "num_workers", "adaptive", "use_gpu", "resources_per_worker", "placement",
        "storage_path", "name", "max_failures", "resume", "address", "progress",
    ]
    assert all(p.kind is p.KEYWORD_ONLY for n, p in params.items() if n != "train_loop")


def test_context_surface():
    for name in ("rank", "local_rank", "world_size", "node_rank", "device", "logger"):
        assert name in inspect.getsource(raylight.TrainContext.__init__)
    for method in (
        "prepare_model", "prepare_loader", "prepare_optimizer", "report", "get_checkpoint", "barrier",
        "all_reduce", "epochs", "accumulator", "heartbeat", "unwrap_model",
    ):
        assert callable(getattr(raylight.TrainContext, method))


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
    return {d for m, deps in MODULES.items() if m.startswith(prefix) for d in deps}


def test_boundaries():
    # The controller sees data and decisions: no torch, no Ray.
    ctrl = _deps("raylight.controller") | MODULES["raylight.recorder"] | MODULES["raylight.worker_group.protocol"]
    assert not {d for d in ctrl if d.split(".")[0] in ("torch", "ray")}
    # The adaptive math and policies are pure: numpy and scipy only (and threadpoolctl,
    # which keeps the fit's BLAS on one thread).
    adaptive = {d.split(".")[0] for d in _deps("raylight.adaptive")}
    assert adaptive <= {
        "__future__", "numpy", "scipy", "threadpoolctl", "math", "collections", "contextlib", "dataclasses", "typing",
        "raylight",
    }
    # Config is the core's pure data: nothing else of raylight but its error type (the
    # declarative product's config lives in raylight.declarative).
    cfg = {d for d in _deps("raylight.config") if d.startswith("raylight")}
    assert cfg <= {"raylight.config.base", "raylight.config.schema", "raylight.config.validation", "raylight.exceptions"}
    # Tune is a leaf: only the CLI and the Lightning launcher reach it (lazily).
    assert not {m for m, deps in MODULES.items() if not m.startswith("raylight.tune") and any(d.startswith("raylight.tune") for d in deps)}
    # Strategies know torch.distributed, not Ray.
    assert not {d for d in _deps("raylight.strategies") if d.startswith("ray.") or d == "ray"}


def test_nothing_from_a_worker_is_unpickled_outside_ray():
    """Worker exceptions reach the driver through Ray's own deserialisation only, and
    checkpoints load with weights_only: no module of raylight calls a pickle loader."""
    calls = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("loads", "load", "Unpickler"):
                base = node.value
                if isinstance(base, ast.Name) and base.id in ("pickle", "cloudpickle", "dill"):
                    calls.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not calls, calls
