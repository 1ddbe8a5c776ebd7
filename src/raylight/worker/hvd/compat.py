"""``import horovod.torch as hvd`` served by ``raylight.horovod`` where Horovod is absent.

Off by default. ``install_import_hook()`` puts a finder on ``sys.meta_path`` that answers
``horovod``, ``horovod.torch``, ``horovod.torch.elastic``,
``horovod.common.exceptions`` and ``horovod.runner.util.threads`` with raylight's modules. When real Horovod is installed it
does nothing and says so: real Horovod wins. The explicit requests, ``python -m
raylight.horovod script.py`` and ``RAYLIGHT_HOROVOD_COMPAT=1`` (read by ``raylight run``'s
scripts), install it even then (``force``): real Horovod's ``hvd.init()`` joins only the
groups horovodrun (or MPI, in an MPI build) forms, so under ``raylight run``, torchrun or
mpirun's environment every rank of a real-Horovod script would train alone.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from typing import Any

COMPAT_ENV = "RAYLIGHT_HOROVOD_COMPAT"
ALIASES = {
    "horovod.torch": "raylight.horovod",
    "horovod.torch.elastic": "raylight.horovod.elastic",
    "horovod.common.exceptions": "raylight.worker.hvd.basics",
    "horovod.runner.util.threads": "raylight.worker.hvd.threads",  # Horovod's test helpers import it
}
_PACKAGES = ("horovod", "horovod.common", "horovod.runner", "horovod.runner.util")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname in ALIASES or fullname in _PACKAGES:
            return importlib.util.spec_from_loader(fullname, self, is_package=fullname in _PACKAGES)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if spec.name in ALIASES:
            return importlib.import_module(ALIASES[spec.name])
        module = types.ModuleType(spec.name, f"raylight.horovod's stand-in for {spec.name}")
        module.__path__ = []  # a package, so its submodules import through this finder
        module.__raylight__ = True  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


_finder = _Finder()


def horovod_installed() -> bool:
    """True when a real Horovod (on ``sys.path``, not this hook) provides ``horovod.torch``."""
    spec = importlib.machinery.PathFinder.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return False
    return importlib.machinery.PathFinder.find_spec("horovod.torch", list(spec.submodule_search_locations)) is not None


def install_import_hook(*, force: bool = False) -> bool:
    """Let ``import horovod.torch`` give ``raylight.horovod``. Returns True when the hook
    is installed (or already was), False when real Horovod is installed (then nothing
    changes). ``force``: install it in front of an installed Horovod too."""
    if _finder in sys.meta_path:
        return True
    if force:
        real = [name for name in ALIASES if name in sys.modules]  # imported, they cannot be served
        if real:
            raise RuntimeError(
                f"raylight.horovod.install_import_hook(force=True): {real[0]} is already imported (real "
                "Horovod); install the hook before anything imports Horovod"
            )
    elif horovod_installed():
        warnings.warn(
            "raylight.horovod.install_import_hook(): Horovod is installed, so `import horovod.torch` "
            "stays real Horovod; the hook was not installed",
            stacklevel=2,
        )
        return False
    sys.meta_path.insert(0, _finder)
    return True


def uninstall_import_hook() -> None:
    """Remove the hook and forget the stand-in modules it served."""
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    for name in [*ALIASES, *_PACKAGES]:
        module = sys.modules.get(name)
        if module is not None and (name in ALIASES or getattr(module, "__raylight__", False)):
            del sys.modules[name]


def install_from_env(environ: Any = None) -> bool:
    """Install the hook when ``RAYLIGHT_HOROVOD_COMPAT=1`` (for a launcher that starts
    scripts, e.g. ``raylight run``), in front of an installed Horovod too, and set
    Horovod's and MPI's rank variables (``set_rank_variables``); True when it is
    installed."""
    import os

    env = os.environ if environ is None else environ
    raw = env.get(COMPAT_ENV, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"{COMPAT_ENV}={raw!r}: expected 1 (serve `import horovod.torch`) or 0")
    if raw != "1":
        return False
    set_rank_variables(env)
    return install_import_hook(force=True)


def set_rank_variables(environ: Any = None) -> dict[str, str]:
    """Under torchrun's variables (``raylight run``, torchrun: ``RANK``, ``WORLD_SIZE``,
    ``TORCHELASTIC_RUN_ID``, ...) also set the ones horovodrun and Open MPI's mpirun set,
    which Horovod scripts and their tests read (``HOROVOD_RANK``, ``OMPI_COMM_WORLD_RANK``,
    ...); nothing when a variable of either is set already or torchrun's are absent.
    Returns what was set."""
    import os

    env = os.environ if environ is None else environ
    if not all(env.get(k, "").strip() for k in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")):
        return {}
    if any(env.get(k, "").strip() for k in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")):
        return {}
    rank, size = env["RANK"], env["WORLD_SIZE"]
    local_rank, local_size = env.get("LOCAL_RANK", "0"), env.get("LOCAL_WORLD_SIZE", size)
    node, nodes = env.get("GROUP_RANK", "0"), env.get("GROUP_WORLD_SIZE", "1")
    added = {
        "HOROVOD_RANK": rank, "HOROVOD_SIZE": size, "HOROVOD_LOCAL_RANK": local_rank,
        "HOROVOD_LOCAL_SIZE": local_size, "HOROVOD_CROSS_RANK": node, "HOROVOD_CROSS_SIZE": nodes,
        "OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_SIZE": size, "OMPI_COMM_WORLD_LOCAL_RANK": local_rank,
        "OMPI_COMM_WORLD_LOCAL_SIZE": local_size,
        "OMPI_COMM_WORLD_NODE_RANK": local_rank,  # Open MPI's: the rank among this node's processes
    }
    env.update(added)
    return added
