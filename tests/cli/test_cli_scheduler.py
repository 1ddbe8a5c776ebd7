"""`raylight scheduler start|status|stop` without Ray: its table, and its usage errors
(no cluster, an unreachable address, no scheduler running) exit 2 with the fix named."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from typer.testing import CliRunner

pytestmark = pytest.mark.unit

STATUS = {
    "jobs": [
        {"job_id": "bert", "fixed": False, "min_workers": 1, "max_workers": 4, "weight": 1.0, "resources": {"CPU": 1.0},
         "workers": 3, "nodes": ["aaaaaaaaaaaa1", "aaaaaaaaaaaa1", "bbbbbbbbbbbb2"], "speedup": 2.41, "goodput": 123.456,
         "waiting": "", "seconds_since_report": 4.2},
        {"job_id": "resnet", "fixed": True, "min_workers": 2, "max_workers": 2, "weight": 1.0, "resources": {"CPU": 1.0},
         "workers": 0, "nodes": [], "speedup": 0.0, "goodput": None,
         "waiting": "waiting for 2 CPU slot(s): 1 of 4 free, held by runs bert", "seconds_since_report": 1.0},
    ],
    "fitness": 0.0, "nodes": {"aaaaaaaaaaaa1": 2, "bbbbbbbbbbbb2": 2}, "dropped": ["gone"],
}


def _text(renderable, width: int = 200) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(renderable)
    return out.getvalue()


def test_the_status_table_shows_allocation_goodput_speedup_and_why_a_run_waits():
    from raylight.cli.scheduler import status_table

    text = _text(status_table(STATUS))
    bert = next(line for line in text.splitlines() if "bert" in line and "adaptive" in line)
    assert "3 (1-4)" in bert and "aaaaaaaax2, bbbbbbbb" in bert and "123.5" in bert and "2.41" in bert
    resnet = next(line for line in text.splitlines() if "resnet" in line)
    assert "fixed" in resnet and "0 (2)" in resnet
    assert "waiting for 2 CPU slot(s): 1 of 4 free, held by runs bert" in " ".join(text.split())
    assert "2 node(s), 4 slot(s)" in text and "dropped (silent): gone" in text
    assert "(no runs)" in _text(status_table({"jobs": [], "fitness": 0.0, "nodes": {}}))
    # a pipe's 80 columns (CI's, a script's): the empty table still says so, a job's id stays whole
    assert "(no runs)" in _text(status_table({"jobs": [], "fitness": 0.0, "nodes": {"n": 2}}), width=80)
    narrow = _text(status_table(STATUS), width=80)
    assert "bert" in narrow and "resnet" in narrow, narrow


def _invoke(*args: str):
    from raylight.cli import app

    return CliRunner().invoke(app, ["scheduler", *args])


@pytest.fixture
def no_ray(monkeypatch, tmp_path):
    """This process as a fresh shell: no Ray connected, no RAY_ADDRESS, no launcher head file."""
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


@pytest.mark.parametrize("verb", ["start", "status", "stop"])
def test_no_cluster_is_a_usage_error_that_names_the_address(no_ray, verb):
    res = _invoke(verb)
    assert res.exit_code == 2, res.output
    assert "no Ray cluster to schedule" in res.output and "--address HEAD:6379" in res.output
    local = _invoke(verb, "--address", "local")  # an embedded Ray would die with the command
    assert local.exit_code == 2 and "no Ray cluster to schedule" in local.output


def test_an_unreachable_address_is_a_usage_error_within_the_connect_timeout(no_ray):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = _invoke("status", "--address", f"127.0.0.1:{port}", "--connect-timeout", "2")
    assert res.exit_code == 2, res.output
    assert f"127.0.0.1:{port}" in res.output and "connect_timeout_s=2" in res.output


@pytest.mark.parametrize("verb", ["status", "stop"])
def test_no_scheduler_running_is_a_usage_error_that_says_how_to_start_one(monkeypatch, verb):
    from raylight.cli import scheduler
    from raylight.scheduler import actor

    monkeypatch.setattr(scheduler, "_connect", lambda address, timeout: None)
    monkeypatch.setattr(actor, "find", lambda: None)
    res = _invoke(verb, "--address", "127.0.0.1:6379")
    assert res.exit_code == 2, res.output
    assert "no raylight scheduler runs on this cluster" in res.output
    assert "raylight scheduler start --address" in res.output


def test_submit_with_scheduler_has_the_job_start_one_where_none_runs(monkeypatch):
    """`raylight submit --scheduler`: the job's driver (on the cluster) starts the
    scheduler; this client only asks it to (RAYLIGHT_SCHEDULER=start in the job's env)."""
    from raylight.cli import jobs
    from raylight.driver.scheduler_link import START_ENV
    from raylight.jobs import submission

    sent = []
    monkeypatch.setattr(jobs, "_client", lambda address, timeout: object())
    monkeypatch.setattr(submission, "run", lambda client, sub, **kw: sent.append(sub) or 0)
    res = _invoke_root("submit", "--scheduler", "--no-wait", "--address", "http://127.0.0.1:8265", "--", "python", "t.py")
    plain = _invoke_root("submit", "--no-wait", "--address", "http://127.0.0.1:8265", "--", "python", "t.py")
    assert res.exit_code == 0 and plain.exit_code == 0, res.output + plain.output
    envs = [sub.runtime_env.get("env_vars", {}) for sub in sent]
    assert envs[0].get(START_ENV) == "start" and START_ENV not in envs[1]


def _invoke_root(*args: str):
    from raylight.cli import app

    return CliRunner().invoke(app, list(args))


def test_a_run_asked_to_starts_the_scheduler_where_none_runs(monkeypatch):
    import ray.util

    from raylight.driver import scheduler_link
    from raylight.scheduler import actor

    started = []
    monkeypatch.setattr(ray.util, "get_current_placement_group", lambda: None)
    monkeypatch.setattr(actor, "find", lambda: None)
    monkeypatch.setattr(actor, "start", lambda: started.append(1) or "handle")
    monkeypatch.delenv(scheduler_link.START_ENV, raising=False)
    assert scheduler_link.find_link() is None and not started  # not asked: none, nothing started
    monkeypatch.setenv(scheduler_link.START_ENV, "start")
    link = scheduler_link.find_link()
    assert link is not None and link.handle == "handle" and started == [1]


def test_the_table_renders_what_the_scheduler_s_status_answers():
    """The real bookkeeping's answer, not one written for the test: a job with a fitted
    model, and one that waits."""
    from raylight.cli.scheduler import status_table
    from raylight.scheduler.state import SchedulerState
    from tests.scheduler.test_state import MODEL

    state = SchedulerState(lambda: {"n1": {"CPU": 2.0}}, clock=lambda: 0.0)
    state.register("fitted", min_workers=1, max_workers=2)
    state.report("fitted", {**MODEL, "nodes": ["n1"]})
    state.register("queued", fixed=True, min_workers=2, max_workers=2)
    text = _text(status_table(state.status()))
    rows = {cells[0]: cells for line in text.splitlines() if (cells := [c.strip() for c in line.strip("│┃ ").split("│")])}
    assert rows["fitted"][1:5] == ["adaptive", "1", "2 (1-2)", "n1x2"] and rows["fitted"][5] != "-"  # its goodput
    assert rows["queued"][1:4] == ["fixed", "1", "0 (2)"] and "held by runs" in rows["queued"][8]
    assert "held by runs fitted" in " ".join(text.split())


def test_the_status_table_shows_each_run_s_weight_and_the_target_it_grows_to():
    from raylight.cli.scheduler import status_table

    jobs = [{**STATUS["jobs"][0], "weight": 2.5, "target": 4, "pending": "growing to 4 when runs resnet let go of their slots"}]
    text = " ".join(_text(status_table({**STATUS, "jobs": jobs})).split())
    assert "2.5" in text and "3 (1-4) -> 4" in text and "growing to 4 when runs resnet let go" in text


def test_status_plot_draws_the_scheduler_s_history_and_refuses_a_bad_path(monkeypatch, tmp_path):
    import ray

    from raylight.cli import scheduler

    history = [{"t": 0.0, "job_id": "a", "workers": 1}, {"t": 5.0, "job_id": "a", "workers": 4},
               {"t": 9.0, "job_id": "b", "workers": 2}, {"t": 9.5, "job_id": "a", "workers": 2}]

    class Remote:
        def __init__(self, value):
            self.value = value

        def remote(self):
            return self.value

    class Handle:
        status = Remote(STATUS)
        allocation_history = Remote(history)

    monkeypatch.setattr(scheduler, "_connect", lambda address, timeout: None)
    monkeypatch.setattr(scheduler, "_running", lambda: Handle())
    monkeypatch.setattr(ray, "get", lambda ref, timeout: ref)
    out = tmp_path / "workers.png"
    res = _invoke("status", "--plot", str(out))
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {out}" in res.output
    bad = _invoke("status", "--plot", str(tmp_path / "no-such-folder" / "w.png"))
    assert bad.exit_code == 2 and "cannot write it" in bad.output
    assert _invoke("status", "--plot", str(tmp_path / "w.jpg")).exit_code == 2
    history.clear()
    empty = _invoke("status", "--plot", str(tmp_path / "e.png"))
    assert empty.exit_code == 2 and "no allocation rows" in empty.output
