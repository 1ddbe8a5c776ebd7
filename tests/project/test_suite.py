"""`make test`'s runner (tests/suite.py): what it does before the two pytest runs."""

from __future__ import annotations

import importlib.util
import os
import sys

from tests import suite


def test_sources_are_compiled_once_even_where_python_writes_no_bytecode(monkeypatch, tmp_path):
    for directory in ("src", "tests", "examples"):
        (tmp_path / directory / "pkg").mkdir(parents=True)
        (tmp_path / directory / "pkg" / "mod.py").write_text("X = 1\n")
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # PYTHONDONTWRITEBYTECODE=1
    monkeypatch.setattr(suite, "REPO", str(tmp_path))
    suite._compile_sources()
    for directory in ("src", "tests", "examples"):
        cached = importlib.util.cache_from_source(str(tmp_path / directory / "pkg" / "mod.py"))
        assert os.path.exists(cached), cached


def test_a_test_that_starts_gloo_ranks_or_a_launcher_unmarked_fails_saying_how_to_mark_it():
    """The distributed tier (tests/conftest.py) is marked where its processes start: this
    test, unmarked, may not start gloo ranks, torchrun's or mpirun's processes (none starts)."""
    import pytest

    from tests.helpers import mpirun_command, run_gloo_ranks, torchrun_command

    for start in (lambda: run_gloo_ranks(print), torchrun_command, lambda: mpirun_command(2)):
        with pytest.raises(AssertionError, match=r"test_suite\.py::\S+ starts .* without Ray, the distributed tier: mark it"):
            start()


def test_make_test_leaves_the_extended_tier_out_of_both_runs(monkeypatch):
    """The peers' whole programs (marker ``extended``) run in `make test-extended` only."""
    started: list[list[str]] = []

    class Done:
        returncode = 0

        def __init__(self, args, **kwargs):
            started.append(args)

        def wait(self, timeout=None):
            return 0

        def poll(self):
            return 0

    monkeypatch.setattr(suite.subprocess, "Popen", Done)
    monkeypatch.setattr(suite, "_compile_sources", lambda: None)
    monkeypatch.setattr(suite, "_prebuild", lambda: None)
    assert suite.main([]) == 0
    marks = [args[len(args) - 1 - args[::-1].index("-m") + 1] for args in started if "pytest" in args]
    assert sorted(marks) == ["beside and not extended", "not beside and not extended"]
