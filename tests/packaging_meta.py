"""What pyproject.toml's dependencies and extras install, read from this venv's installed
metadata (each requirement's own dependencies and extras followed): for the tests that
check an install needs no more than it names (tests/cli/test_cli_extras.py,
tests/project/test_examples_extras.py)."""

from __future__ import annotations

import functools
import importlib.metadata
import pathlib

import tomllib
from packaging.requirements import Requirement

REPO = pathlib.Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def norm(name: str) -> str:
    return name.lower().replace("_", "-")


def _requires(dist: str, extra: str | None) -> list[Requirement]:
    """The installed ``dist``'s requirements that apply with ``extra`` (None: the plain install)."""
    out = []
    for raw in importlib.metadata.requires(dist) or []:
        req = Requirement(raw)
        applies = req.marker is None or req.marker.evaluate({"extra": extra or ""})
        extra_only = req.marker is not None and not req.marker.evaluate({"extra": ""})
        if applies and (extra is None or extra_only):
            out.append(req)
    return out


def closure(raw: list[str]) -> set[str]:
    return set(_closure(tuple(raw)))


@functools.cache
def _closure(raw: tuple[str, ...]) -> frozenset[str]:
    """Every ``dist`` and ``dist[extra]`` the requirements ``raw`` install, their own
    dependencies and extras followed; names normalised."""
    seen: set[str] = set()
    reqs = [Requirement(r) for r in raw]
    todo = [(r.name, None) for r in reqs] + [(r.name, e) for r in reqs for e in r.extras]
    while todo:
        dist, extra = todo.pop()
        key = norm(dist) + (f"[{extra}]" if extra else "")
        if key in seen:
            continue
        seen.add(key)
        if norm(dist) == "raylight":  # an extra naming another (demo: raylight[declarative]): from pyproject.toml
            found = [Requirement(r) for r in (PYPROJECT["optional-dependencies"][extra] if extra else PYPROJECT["dependencies"])]
        else:
            try:
                found = _requires(dist, extra)
            except importlib.metadata.PackageNotFoundError:
                continue
        todo += [(r.name, None) for r in found] + [(r.name, e) for r in found for e in r.extras]
    return frozenset(k for k in seen if k.split("[")[0] != "raylight")


def dists(keys: set[str]) -> set[str]:
    return {k.split("[")[0] for k in keys}


def core() -> set[str]:
    return closure(PYPROJECT["dependencies"])


def extra(name: str) -> set[str]:
    """What ``raylight[name]`` installs beyond the core."""
    return closure(PYPROJECT["optional-dependencies"][name]) - core()


def modules_of(names: set[str]) -> set[str]:
    """The top-level import names of the distributions ``names``."""
    by_module = _packages_distributions()
    return {m for m, ds in by_module.items() if any(norm(d) in names for d in ds)}


def distributions_of(module: str) -> set[str]:
    """The distributions that install top-level module ``module`` (empty: none here)."""
    return {norm(d) for d in _packages_distributions().get(module, [])}


@functools.cache
def _packages_distributions() -> dict[str, list[str]]:
    return dict(importlib.metadata.packages_distributions())
