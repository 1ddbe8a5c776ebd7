"""The `raylight` command exits without the interpreter's teardown (cli.main.exit_now),
and nothing an ordinary exit does for the user is lost by it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.unit


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout buffered, as usual
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, env=env
    )


def test_exit_handlers_run_and_output_is_flushed():
    res = _python(
        """
        import atexit, sys
        # unflushed on purpose: exit_now flushes stdout after the handlers
        atexit.register(lambda: sys.stdout.write("handler ran"))
        sys.argv = ["raylight", "--help"]
        from raylight.cli import main
        main()
        """
    )
    assert res.returncode == 0, res.stderr
    assert "Distributed, adaptive training on Ray." in res.stdout
    assert res.stdout.endswith("handler ran")


def test_usage_error_keeps_exit_code_2_and_its_message(tmp_path):
    missing = tmp_path / "nope.yaml"
    res = _python(
        f"""
        import sys
        sys.argv = ["raylight", "train", "--config", {str(missing)!r}, "--dataset", "x.csv"]
        from raylight.cli import main
        main()
        """
    )
    assert res.returncode == 2, res.stderr
    assert "nope.yaml" in res.stderr


def test_a_message_exits_1_and_is_printed():
    res = _python("from raylight.cli.main import exit_now\nexit_now('went wrong')")
    assert res.returncode == 1
    assert res.stderr.strip() == "went wrong"


def test_a_running_thread_gets_the_ordinary_exit():
    """A thread Python would wait for finishes before the process exits."""
    res = _python(
        """
        import threading, time
        def work():
            time.sleep(0.3)  # still running when main() returns
            print("thread finished", flush=True)
        threading.Thread(target=work).start()
        from raylight.cli.main import exit_now
        exit_now(3)
        """
    )
    assert res.returncode == 3
    assert "thread finished" in res.stdout
