"""The `raylight` CLI with the core install alone: its help works, and a verb whose extra
is missing says which `pip install` to run (two lines, exit 2), never a traceback
(issue 55). tests/project/test_install.py checks the same from a real core-only venv."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from packaging.requirements import Requirement

from raylight.cli import extras
from tests import packaging_meta as meta

pytestmark = pytest.mark.unit

PYPROJECT = meta.PYPROJECT


def _name(req: str) -> str:
    return meta.norm(Requirement(req).name)


def test_the_console_script_needs_only_core_dependencies():
    assert "typer" in {_name(r) for r in PYPROJECT["dependencies"]}
    assert PYPROJECT["scripts"]["raylight"] == "raylight.cli:main"


@pytest.mark.parametrize("extra", sorted(extras.EXTRA_MODULES))
def test_each_probed_module_comes_with_its_extra_and_not_with_the_core(extra):
    brought = meta.modules_of(meta.dists(meta.extra(extra)))
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
    every: set[str] = set()
    for extra in PYPROJECT["optional-dependencies"]:
        every |= meta.dists(meta.extra(extra))
    return meta.modules_of(every) - meta.modules_of(meta.dists(meta.core()))


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
