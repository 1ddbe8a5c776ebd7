"""The user's training loop and its config on their way to the workers: where the workers
find the loop's code, and what a user reads when the loop cannot get there.

Ray sends a training loop to its workers by reference when it lives in a module (the
module's name and the function's), and each worker imports that module again. Ray adds
the driver's script directory and working directory to the workers' ``sys.path``, and no
more, so a loop in a module the driver found elsewhere (a ``sys.path.insert`` in the
script, a notebook's ``sys.path.append``) failed in every worker with a page of Ray's
deserialization traceback.

- On the embedded cluster (this machine, these files), the workers search the driver's
  ``sys.path`` as it is when their run starts, in the driver's order and ahead of their
  own entries, as a process that ``multiprocessing`` spawns does.
- Anywhere else the workers' environment is the cluster's: a module they cannot import
  ends the run at its start with a ``WorkerImportError`` that names the module, where the
  driver found it and the ways to ship it (installing it, Ray's ``runtime_env``
  ``py_modules``/``working_dir``, ``raylight submit --working-dir``). It is not retried:
  a restart would fail the same way.
- A pooled worker (``raylight.worker_group.pool``) keeps the modules it imported. It
  serves a later run only if every one of them the driver also has is the same file:
  after the driver's ``sys.path`` changed (a notebook pointed at another checkout), a
  module of the same name from elsewhere means new processes, not the old code.
- The loop and its config are pickled once per start (the worker group puts them in Ray's
  object store and every worker of that start reads them from there). What cannot be pickled (a lock,
  an open file, a connection the loop closes over or the config holds) is a
  ``ConfigError`` that says where it is (``config['db']``, the loop's closure variable
  ``lock``) instead of Ray's serializability report.

Pure: no Ray (the pickler is passed in).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_NO_MODULE = re.compile(r"No module named '([\w.]+)'")


def driver_sys_path() -> list[str]:
    """This process's ``sys.path`` with its relative entries made absolute (``''`` is
    the working directory of an interactive session or ``python -c``)."""
    return [os.path.abspath(p or os.curdir) for p in sys.path]


def merged_sys_path(driver: Sequence[str], own: Sequence[str]) -> list[str]:
    """The driver's entries in its order, then the worker's own entries it lacks (Ray's,
    a ``runtime_env``'s)."""
    first = list(dict.fromkeys(driver))
    seen = set(first)
    return first + [p for p in own if p not in seen]


def use_driver_sys_path(driver: Sequence[str]) -> None:
    """Make this (worker) process search ``driver`` first; no entries: leave it as is."""
    if driver:
        sys.path[:] = merged_sys_path(driver, sys.path)


def library_dirs() -> tuple[str, ...]:
    """Where this interpreter's installed libraries and standard library live."""
    import site
    import sysconfig

    dirs = {sys.prefix, sys.base_prefix, sysconfig.get_paths()["stdlib"], *site.getsitepackages()}
    return tuple(os.path.realpath(d) for d in dirs if d)


def user_modules(modules: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Name -> real path of the imported modules (``sys.modules`` unless given) that are
    source files outside the installed libraries: the user's own code, editable checkouts
    included."""
    libraries = library_dirs()
    found: dict[str, str] = {}
    for name, module in list((sys.modules if modules is None else modules).items()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or not os.path.isabs(path) or not path.endswith(".py") or path.startswith(libraries):
            continue
        real = os.path.realpath(path)
        if not real.startswith(libraries):
            found[name] = real
    return found


def moved_modules(held: Mapping[str, str], driver: Mapping[str, str]) -> list[str]:
    """The modules a pooled worker ``held`` (name -> file) that the driver now has from
    another file, each as ``name (worker's file -> driver's file)``."""
    return [f"{name} ({path} -> {driver[name]})" for name, path in held.items() if driver.get(name, path) != path]


def missing_module(exc: BaseException) -> tuple[str, str] | None:
    """The module whose import failed somewhere in ``exc``, and the import's own message
    (Ray's errors wrap the worker's ``ImportError`` in ``cause``/``client_exc``, or carry
    it only as text); None where no import failed."""
    seen: set[int] = set()
    todo: list[Any] = [exc]
    while todo:
        err = todo.pop()
        if err is None or id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, ImportError):
            name = err.name or _module_in(str(err))
            if name:
                return name, str(err)
        todo += [getattr(err, "cause", None), getattr(err, "client_exc", None), err.__cause__, err.__context__]
    name = _module_in(str(exc))
    return (name, f"No module named {name!r}") if name else None


def _module_in(text: str) -> str | None:
    found = _NO_MODULE.search(text)
    return found.group(1) if found else None


def import_error_message(module: str, *, embedded: bool, loop: Any, reason: str) -> str:
    """What a user reads when the workers cannot import ``module``: what failed, where
    the driver has it, and how to make the workers find it."""
    top = module.split(".")[0]
    if top == "raylight":
        return (
            f"the workers cannot import raylight ({reason}): install raylight where they run, "
            "the same version as the driver's (the cluster's image or setup commands, or "
            "ray.init(address=..., runtime_env={'pip': ['raylight==<version>']}) before raylight.fit)"
        )
    here = sys.modules.get(module) or sys.modules.get(top)
    origin = getattr(here, "__file__", None)
    found = f"; the driver imported it from {origin}" if origin else ""
    name = f"{getattr(loop, '__module__', '?')}.{getattr(loop, '__qualname__', '?')}"
    head = (
        f"the workers cannot import module {module!r}, which the training loop ({name}) or its "
        f"config refers to ({reason}){found}. Ray's workers import a function's module by name, "
        "as the driver did"
    )
    if embedded:
        return head + (
            ". On the embedded local cluster they search the driver's sys.path as it is when "
            "the run starts: keep the module's directory on sys.path until then, or install the "
            "module (a module made at run time, not read from a file, cannot be imported by "
            "another process: define the loop in a file or in the script itself)"
        )
    return head + (
        ". Install it where the workers run (`pip install -e .` for a project of your own), or "
        "ship it with the job: ray.init(address=..., runtime_env={'py_modules': [<the module>]}) "
        "or runtime_env={'working_dir': '.'} before raylight.fit, or `raylight submit "
        "--working-dir DIR`"
    )


_MAX_DEPTH = 4  # how deep into the config's dicts and lists the search for the culprit goes
_MAX_FOUND = 5


def unpicklable_parts(loop: Any, config: Any, dumps: Callable[[Any], bytes]) -> list[str]:
    """Where pickling the loop and its config with ``dumps`` fails: the config's key paths
    (``config['db']['conn']``), the loop's closure variables, the globals it uses (a loop
    defined in a script is pickled with them), a bound method's object. The innermost
    failing parts; empty where no single part fails alone."""
    found: list[str] = []
    _search(config, "config", dumps, found, 0)
    for where, value in _loop_parts(loop):
        _search(value, where, dumps, found, 1)
    return found[:_MAX_FOUND]


def _fails(value: Any, dumps: Callable[[Any], bytes]) -> bool:
    try:
        dumps(value)
    except Exception:
        return True
    return False


def _search(value: Any, where: str, dumps: Callable[[Any], bytes], found: list[str], depth: int) -> None:
    if len(found) >= _MAX_FOUND or not _fails(value, dumps):
        return
    children: list[tuple[str, Any]] = []
    if depth < _MAX_DEPTH:
        if isinstance(value, dict):
            children = [(f"{where}[{k!r}]", v) for k, v in value.items()]
        elif isinstance(value, (list, tuple)):
            children = [(f"{where}[{i}]", v) for i, v in enumerate(value)]
    before = len(found)
    for child_where, child in children:
        _search(child, child_where, dumps, found, depth + 1)
    if len(found) == before:  # no single child fails alone: this is the culprit
        found.append(f"{where} ({type(value).__module__}.{type(value).__qualname__})")


def _loop_parts(loop: Any) -> list[tuple[str, Any]]:
    """The values pickled with the loop: a bound method's object, a callable object's
    attributes, a function's closure variables and the globals its code names."""
    parts: list[tuple[str, Any]] = []
    owner = getattr(loop, "__self__", None)
    if owner is not None and not isinstance(owner, type(sys)):
        parts.append(("the loop's object (its self)", owner))
    func = getattr(loop, "__func__", loop)
    code = getattr(func, "__code__", None)
    if code is None:  # a callable object
        parts += [(f"the loop object's attribute {k!r}", v) for k, v in getattr(loop, "__dict__", {}).items()]
        return parts
    for name, cell in zip(code.co_freevars, getattr(func, "__closure__", None) or (), strict=False):
        try:
            parts.append((f"the loop's closure variable {name!r}", cell.cell_contents))
        except ValueError:  # an empty cell
            continue
    names: set[str] = set()
    todo = [code]
    while todo:
        c = todo.pop()
        names.update(c.co_names)
        todo += [k for k in c.co_consts if hasattr(k, "co_names")]
    by_value = getattr(func, "__module__", None) == "__main__" or "<" in getattr(func, "__qualname__", "<")
    glob = getattr(func, "__globals__", {}) if by_value else {}  # by reference: its module's, not pickled
    parts += [
        (f"the loop's global {n!r}", glob[n])
        for n in sorted(names)
        if n in glob and not isinstance(glob[n], type(sys))
    ]
    return parts


def unpicklable_message(reason: str, parts: Sequence[str]) -> str:
    """What a user reads when the loop or its config cannot be pickled."""
    where = f" Found in: {', '.join(parts)}." if parts else ""
    return (
        f"the training loop or its config cannot be sent to the workers: {reason}.{where} "
        "Each worker gets a pickled copy of both (cloudpickle): make such an object inside the "
        "loop (each worker its own: a lock, an open file, a connection, a DataLoader with "
        "worker processes), or pass what it is made from (a path, a seed, settings) in the config"
    )
