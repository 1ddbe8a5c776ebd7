"""``import adaptdl.torch as adl`` served by ``raylight.adaptdl`` where AdaptDL is absent.

``install_import_hook()`` puts a finder on ``sys.meta_path`` that answers ``adaptdl`` and
its submodules (``adaptdl.torch``, ``adaptdl.env``, ``adaptdl.checkpoint``,
``adaptdl.collective``, ...) with raylight's modules. Off in a plain ``python``; `raylight
run` installs it in every script's process (its bootstrap, see ``launch/bootstrap.py``).
When real AdaptDL is installed the hook steps aside and real AdaptDL wins, unless asked
(``RAYLIGHT_ADAPTDL=1``, or ``force=True``): real AdaptDL's ``init_process_group`` finds
its replicas through AdaptDL's scheduler or its own ``ADAPTDL_*`` variables, not through
raylight run's group. ``RAYLIGHT_ADAPTDL=0`` keeps the hook off.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
import warnings
from typing import Any

COMPAT_ENV = "RAYLIGHT_ADAPTDL"
PRODUCT = "raylight.adaptdl"  # where the served modules live (named, not imported: the worker wing is below it)
NAMES = ("adaptdl", "adaptdl.env", "adaptdl.checkpoint", "adaptdl.collective", "adaptdl.torch",
         "adaptdl.torch.data", "adaptdl.torch.parallel", "adaptdl.torch.epoch", "adaptdl.torch.accumulator",
         "adaptdl.torch.scaling_rules")
# torchrun's variables (what `raylight run` sets) behind each ADAPTDL_* one a script may read itself
TORCHRUN_NAMES = {
    "ADAPTDL_REPLICA_RANK": "RANK",
    "ADAPTDL_NUM_REPLICAS": "WORLD_SIZE",
    "ADAPTDL_NUM_RESTARTS": "TORCHELASTIC_RESTART_COUNT",
    "ADAPTDL_JOB_ID": "TORCHELASTIC_RUN_ID",
    "ADAPTDL_MASTER_ADDR": "MASTER_ADDR",
}


def _served(fullname: str) -> str:
    return PRODUCT + fullname[len("adaptdl"):]


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname in NAMES:
            return importlib.util.spec_from_loader(fullname, self, is_package=fullname in ("adaptdl", "adaptdl.torch"))
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return importlib.import_module(_served(spec.name))

    def exec_module(self, module: types.ModuleType) -> None:
        pass


_finder = _Finder()


def find_served_spec(fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
    """The hook's answer for ``fullname`` (for a finder that installed it mid-import)."""
    return _finder.find_spec(fullname, path, target)


def adaptdl_installed() -> bool:
    """True when a real AdaptDL (on ``sys.path``, not this hook) provides ``adaptdl.torch``."""
    spec = importlib.machinery.PathFinder.find_spec("adaptdl")
    if spec is None or not spec.submodule_search_locations:
        return False
    return importlib.machinery.PathFinder.find_spec("adaptdl.torch", list(spec.submodule_search_locations)) is not None


def install_import_hook(*, force: bool = False) -> bool:
    """Let ``import adaptdl.torch`` give ``raylight.adaptdl.torch``. True when the hook is
    installed (or already was); False when real AdaptDL is installed (nothing changes,
    with a warning saying so). ``force``: in front of an installed AdaptDL too."""
    if _finder in sys.meta_path:
        return True
    if force:
        real = [name for name in NAMES if name in sys.modules]
        if real:
            raise RuntimeError(
                f"raylight.adaptdl.install_import_hook(force=True): {real[0]} is already imported (real AdaptDL); "
                "install the hook before anything imports AdaptDL"
            )
    elif adaptdl_installed():
        warnings.warn(
            "raylight.adaptdl.install_import_hook(): AdaptDL is installed, so `import adaptdl` stays real AdaptDL; "
            f"set {COMPAT_ENV}=1 to serve raylight.adaptdl instead",
            stacklevel=2,
        )
        return False
    sys.meta_path.insert(0, _finder)
    return True


def uninstall_import_hook() -> None:
    """Remove the hook and forget the modules it served."""
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    for name in NAMES:
        module = sys.modules.get(name)
        if module is not None and module.__name__.startswith(PRODUCT):
            del sys.modules[name]


def compat_setting(environ: Any = None) -> str:
    """``RAYLIGHT_ADAPTDL``: "" (serve where AdaptDL is absent), "1" (serve, even in front of
    an installed AdaptDL) or "0" (never serve)."""
    raw = (os.environ if environ is None else environ).get(COMPAT_ENV, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"{COMPAT_ENV}={raw!r}: expected 1 (serve `import adaptdl` with raylight.adaptdl), 0 (never) or unset")
    return raw


def export_adaptdl_env(environ: Any = None) -> None:
    """Give a script that reads ``ADAPTDL_*`` variables itself (``os.environ["ADAPTDL_REPLICA_RANK"]``)
    the values of the torchrun variables `raylight run` set, where it did not set them."""
    env = os.environ if environ is None else environ
    for adl_name, torchrun_name in TORCHRUN_NAMES.items():
        if torchrun_name in env and adl_name not in env:
            env[adl_name] = env[torchrun_name]
    if "ADAPTDL_MASTER_PORT" not in env and "MASTER_PORT" in env:
        env["ADAPTDL_MASTER_PORT"] = env["MASTER_PORT"]


def install_from_env(environ: Any = None) -> bool:
    """What `raylight run`'s bootstrap calls before a script: the hook per ``RAYLIGHT_ADAPTDL``
    (quietly stepping aside for an installed AdaptDL when unset). True when installed."""
    setting = compat_setting(environ)
    if setting == "0" or (setting == "" and adaptdl_installed()):
        return False
    export_adaptdl_env(environ)
    return install_import_hook(force=setting == "1")
