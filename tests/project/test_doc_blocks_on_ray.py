"""Every runnable code block of the README and docs/*.md (tests/doc_blocks.py), run as
written in a fresh process: a python block as a script, a bash block of CLI commands with
bash -e. Each runs in its own directory (the repository's examples/ reachable as
./examples, HOME there too, so ~/raylight_results is the test's) and must exit 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_blocks import ROOT, Block, all_blocks

pytestmark = pytest.mark.ray

RUN = [b for b in all_blocks() if b.runnable and b.not_run is None]
TIMEOUT_S = 420


# What the session's own Ray cluster, or the person running the tests, set: a block runs as
# a reader's would, on its own embedded Ray with the default output.
_DROP = ("RAY_ADDRESS", "RAYLIGHT_VERBOSE", "RAYLIGHT_EMBEDDED_CLUSTER", "RAY_DATA_LOGGING_CONFIG", "RAY_DATA_DISABLE_PROGRESS_BARS")


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DROP and not k.startswith("PYTEST_")}
    env["HOME"] = str(home)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
    return env


@pytest.mark.slow
@pytest.mark.parametrize("block", RUN, ids=lambda b: b.id)
def test_a_doc_block_runs_as_written(block: Block, tmp_path):
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    script = tmp_path / ("block.py" if block.lang == "python" else "block.sh")
    script.write_text(block.code)
    cmd = [sys.executable, str(script)] if block.lang == "python" else ["bash", "-euo", "pipefail", str(script)]
    try:
        out = subprocess.run(cmd, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{block.id} ran past {TIMEOUT_S}s:\n{exc.stdout or ''}{exc.stderr or ''}")
    assert out.returncode == 0, f"{block.id} exited {out.returncode}:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"


def test_the_readme_quick_start_is_among_the_blocks_run():
    assert any(b.page.name == "README.md" and b.lang == "python" for b in RUN)
