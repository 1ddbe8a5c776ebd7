"""Which optional extra each `raylight` verb needs, and the message when it is missing.

The console script ships with the core install (`pip install raylight`), so `raylight
--help`, `run` and `report` work with the core alone. The declarative verbs need the
``declarative`` extra (Ray Data, Ray Tune, pandas, pyarrow, ...) and ``submit`` / ``jobs``
the ``cluster`` one (Ray's Jobs client streams logs over aiohttp, from ``ray[default]``).
A verb whose extra is not installed prints two lines, the verb and the ``pip install``
to run, and exits 2: never a traceback. ``--help`` of every verb works without it.

Each extra is probed by the top-level modules of packages it installs that the core
does not (``importlib.util.find_spec``: nothing is imported, so the probe costs no start
time); ``tests/cli/test_cli_extras.py`` checks the modules against pyproject.toml.
"""

from __future__ import annotations

import importlib.util

import typer
from rich.console import Console

# extra -> modules only that extra brings (each the import name of a distribution it lists,
# directly or through ray[data] / ray[tune] / ray[default])
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "declarative": ("pandas", "pyarrow", "psutil", "safetensors"),
    "cluster": ("aiohttp",),
}
USAGE_EXIT_CODE = 2

console = Console(stderr=True)


def missing_module(extra: str) -> str | None:
    """The first module of ``extra`` that is not installed, or None when all are."""
    for module in EXTRA_MODULES[extra]:
        if importlib.util.find_spec(module) is None:
            return module
    return None


def require(verb: str, extra: str) -> None:
    """Exit 2 with the ``pip install`` to run when ``extra`` is not installed."""
    module = missing_module(extra)
    if module is None:
        return
    console.print(f"error: raylight {verb} needs the {extra} extra (no module named {module!r} here).",
                  highlight=False, markup=False, soft_wrap=True)
    console.print(f"Install it with: pip install 'raylight[{extra}]'", highlight=False, markup=False, soft_wrap=True)
    raise typer.Exit(USAGE_EXIT_CODE)
