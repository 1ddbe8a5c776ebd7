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
