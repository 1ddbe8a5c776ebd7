"""The adversarial catalogue (tests/adversarial.py), each case in-process through the
real command-line app: the exit code, the message, and nothing written."""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from raylight.cli import app
from tests.adversarial import API_CASES, CASES, Workspace, run_api_case, train_reference_model

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def reference_model(tmp_path_factory):
    return train_reference_model(str(tmp_path_factory.mktemp("reference")))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_adversarial_input(case, tmp_path, request):
    if case.root_skips and os.geteuid() == 0:
        pytest.skip("permissions do not stop root")
    model = request.getfixturevalue("reference_model") if case.needs_model else None
    ws = Workspace(str(tmp_path / "ws"), model_source=model)
    if case.setup is not None:
        case.setup(ws)
    before = ws.snapshot()
    result = CliRunner().invoke(app, [ws.fill(a) for a in case.argv])
    text = " ".join(result.output.split())  # the console wraps long lines
    assert result.exit_code == case.code, f"exit {result.exit_code}: {result.output}\n{result.exception!r}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"traceback instead of a message: {result.exception!r}") from result.exception
    for fragment in case.expect:
        assert " ".join(ws.fill(fragment).split()) in text, f"{fragment!r} not in: {result.output}"
    if not case.writes:
        assert ws.snapshot() == before, "the command changed the workspace"
    assert "Traceback" not in result.output


@pytest.mark.parametrize("case", API_CASES, ids=[c.id for c in API_CASES])
def test_adversarial_api_input(case, tmp_path):
    ws = Workspace(str(tmp_path / "ws"))
    before = ws.snapshot()
    error, message = run_api_case(case, ws)
    assert error == case.error, (error, message)
    for fragment in case.expect:
        assert ws.fill(fragment) in message, f"{fragment!r} not in: {message}"
    after = {k: v for k, v in ws.snapshot().items() if k != "afile"}
    assert after == {k: v for k, v in before.items() if k != "afile"}, "the call changed the workspace"
