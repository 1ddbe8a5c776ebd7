"""The Makefile's install stamps: `make run` installs the demo extra alone, and a later
`make test` still installs dev (make's dry run in a copy, with a fake venv)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.unit


def _dry(cwd, target: str) -> list[str]:
    out = subprocess.run(["make", "-n", target], cwd=cwd, capture_output=True, text=True, timeout=60, check=True)
    return [line for line in out.stdout.splitlines() if "pip install" in line and "-e " in line]


def test_make_run_installs_the_demo_extra_and_make_test_still_installs_dev(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    for name in ("Makefile", "pyproject.toml", "constraints.txt"):
        shutil.copy(os.path.join(REPO, name), tmp_path / name)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").touch()
    assert [line.split()[-1] for line in _dry(tmp_path, "run")] == ['".[demo]"']
    later = os.path.getmtime(tmp_path / "pyproject.toml") + 10
    (tmp_path / ".venv" / ".installed-demo").touch()
    os.utime(tmp_path / ".venv" / ".installed-demo", (later, later))  # make run has installed
    assert _dry(tmp_path, "run") == []
    assert [line.split()[-1] for line in _dry(tmp_path, "test")] == ['".[dev]"'], "the demo's install is not dev's"
    (tmp_path / ".venv" / ".installed").touch()
    os.utime(tmp_path / ".venv" / ".installed", (later, later))
    assert _dry(tmp_path, "test") == []
