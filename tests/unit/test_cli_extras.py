"""The `raylight` CLI with the core install alone: its help works, and a verb whose extra
is missing says which `pip install` to run (two lines, exit 2), never a traceback
(issue 55). tests/unit/test_install.py checks the same from a real core-only venv."""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import tomllib
from packaging.requirements import Requirement

from raylight.cli import extras

pytestmark = pytest.mark.unit

REPO = pathlib.Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _name(req: str) -> str:
    return Requirement(req).name.lower().replace("_", "-")


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


def _closure(reqs: list[Requirement]) -> set[str]:
    """Every distribution ``reqs`` install, their extras and dependencies followed (the
    installed metadata of this venv)."""
    seen: set[str] = set()
    todo = [(r.name, None) for r in reqs] + [(r.name, e) for r in reqs for e in r.extras]
    while todo:
        dist, extra = todo.pop()
        key = f"{dist.lower().replace('_', '-')}[{extra or ''}]"
        if key in seen:
            continue
        seen.add(key)
        try:
            found = _requires(dist, extra)
        except importlib.metadata.PackageNotFoundError:
            continue
        todo += [(r.name, None) for r in found] + [(r.name, e) for r in found for e in r.extras]
    return {k.split("[")[0] for k in seen}


def _modules_of(dists: set[str]) -> set[str]:
    by_module = importlib.metadata.packages_distributions()
    return {m for m, ds in by_module.items() if any(d.lower().replace("_", "-") in dists for d in ds)}


CORE = _closure([Requirement(r) for r in PYPROJECT["dependencies"]])


def _extra_dists(extra: str) -> set[str]:
    return _closure([Requirement(r) for r in PYPROJECT["optional-dependencies"][extra]]) - CORE


def test_the_console_script_needs_only_core_dependencies():
    assert "typer" in {_name(r) for r in PYPROJECT["dependencies"]}
    assert PYPROJECT["scripts"]["raylight"] == "raylight.cli:main"


@pytest.mark.parametrize("extra", sorted(extras.EXTRA_MODULES))
def test_each_probed_module_comes_with_its_extra_and_not_with_the_core(extra):
    brought = _modules_of(_extra_dists(extra))
    for module in extras.EXTRA_MODULES[extra]:
        assert module in brought, f"{module!r} is not installed by raylight[{extra}] (pyproject.toml)"


def _cli(args: list[str], blocked: set[str]) -> subprocess.CompletedProcess[str]:
    """`raylight ARGS` in a fresh interpreter where ``blocked`` modules cannot be imported
    or found, as in an install without the extras that bring them."""
    code = textwrap.dedent(
        f"""
        import sys
        for name in {sorted(blocked)!r}:
            sys.modules[name] = None  # import raises ModuleNotFoundError; find_spec gives None
        sys.argv = ["raylight", *{args!r}]
        from raylight.cli import main
        main()
        """
    )
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def _not_core() -> set[str]:
    every = set()
    for extra in PYPROJECT["optional-dependencies"]:
        every |= _extra_dists(extra)
    return _modules_of(every) - _modules_of(CORE)


def test_help_works_with_the_core_alone():
    blocked = _not_core()
    assert {"pandas", "aiohttp", "sklearn", "lightning"} <= blocked
    top = _cli(["--help"], blocked)
    assert top.returncode == 0, top.stderr
    assert "train" in top.stdout and "submit" in top.stdout and "Traceback" not in top.stderr
    for verb in (["train", "--help"], ["submit", "--help"], ["jobs", "list", "--help"], ["run", "--help"]):
        res = _cli(verb, blocked)
        assert res.returncode == 0 and "Usage" in res.stdout, (verb, res.stderr)


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (["train", "-c", "model.yaml", "-d", "data.csv"], "declarative"),
        (["hyperopt", "-c", "model.yaml", "-d", "data.csv"], "declarative"),
        (["init-config", "-d", "data.csv", "--target", "y"], "declarative"),
        (["submit", "-u", "http://127.0.0.1:9", "--", "python", "train.py"], "cluster"),
        (["jobs", "list", "-u", "http://127.0.0.1:9"], "cluster"),
    ],
)
def test_a_verb_without_its_extra_says_what_to_install(args, extra):
    res = _cli(args, _not_core())
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    verb = " ".join(args[:2] if args[0] == "jobs" else args[:1])
    assert len(lines) == 2, res.stderr
    assert lines[0].startswith(f"error: raylight {verb} needs the {extra} extra")
    assert lines[1] == f"Install it with: pip install 'raylight[{extra}]'"


def test_a_verb_with_its_extra_installed_goes_on():
    res = _cli(["render-config", "-c", "/nonexistent/model.yaml"], set())
    assert res.returncode == 2 and "extra" not in res.stderr and "model.yaml" in res.stderr, res.stderr
