"""Ray Jobs submission, without Ray: addresses, flags, the job's environment and the
rule that applies it to a run, what is retried, exit codes."""

from __future__ import annotations

import json
import logging
import os

import pytest

from raylight.base.exceptions import ClusterConnectionError, ConfigError
from raylight.base.exit_codes import PREEMPTED_EXIT_CODE
from raylight.config import RunConfig, ScalingConfig, TrainerConfig
from raylight.driver import runtime
from raylight.driver.job_env import apply_job_env
from raylight.jobs import submission


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("ray://head:10001", "http://head:8265"),  # AdaptDL's -u: the same head's dashboard
        ("ray://10.0.0.5:10001", "http://10.0.0.5:8265"),
        ("ray://[::1]:10001", "http://[::1]:8265"),
        ("ray://head", "http://head:8265"),
        ("head:8265", "http://head:8265"),
        ("http://127.0.0.1:48265/", "http://127.0.0.1:48265"),
        ("https://submission.example.com", "https://submission.example.com"),
    ],
)
def test_addresses_map_to_the_jobs_api(given, url):
    assert submission.jobs_address(given, {}) == (url, "--address")


def test_address_defaults_like_ray_job_submit():
    env = {"RAY_ADDRESS": "http://a:1", "RAY_API_SERVER_ADDRESS": "http://b:2"}
    assert submission.jobs_address(None, env) == ("http://b:2", "RAY_API_SERVER_ADDRESS")
    assert submission.jobs_address(None, {"RAY_ADDRESS": "ray://c:10001"}) == ("http://c:8265", "RAY_ADDRESS")
    with pytest.raises(ConfigError, match="--address"):
        submission.jobs_address(None, {})
    with pytest.raises(ConfigError, match="RAY_ADDRESS='auto' is not a Ray Jobs address"):
        submission.jobs_address(None, {"RAY_ADDRESS": "auto"})
    with pytest.raises(ConfigError, match="--address='s3://x'"):
        submission.jobs_address("s3://x", {})


def test_unreachable_address_fails_fast_naming_the_timeout():
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ClusterConnectionError) as info:
        submission.probe(f"http://127.0.0.1:{port}", "--address", 2.0)
    assert "--connect-timeout=2s" in str(info.value) and f"127.0.0.1:{port}" in str(info.value)


def test_env_pairs_are_checked():
    assert submission.parse_env(["A=1", "B_2=x=y", "EMPTY="]) == {"A": "1", "B_2": "x=y", "EMPTY": ""}
    for bad in ("NOEQUALS", "1A=x", "=x", "A B=1"):
        with pytest.raises(ConfigError, match="--env"):
            submission.parse_env([bad])
    with pytest.raises(ConfigError, match="--max-workers"):
        submission.parse_env(["RAYLIGHT_MAX_WORKERS=3"])


def test_entrypoint_quotes_argv_and_keeps_a_shell_line():
    assert submission.entrypoint(["python", "t.py", "--msg", "a b"], None) == "python t.py --msg 'a b'"
    assert submission.entrypoint(["cd src && python t.py"], None) == "cd src && python t.py"
    with pytest.raises(ConfigError, match="no command to run"):
        submission.entrypoint([], None)


def test_a_file_runs_under_raylight_run_with_its_replicas_and_restarts():
    """-f FILE is `raylight run`'s FILE (AdaptDL's import hook, -n replicas), not plain python."""
    run = "python -m raylight.cli run"
    assert submission.entrypoint(["--epochs", "3"], "t.py") == f"{run} -n 1 t.py --epochs 3"
    assert submission.entrypoint(["--n", "a b"], "t.py", num_workers=2, max_failures=1) == f"{run} -n 2 --max-failures 1 t.py --n 'a b'"
    assert submission.entrypoint([], "t.py", num_workers=(1, 4)) == f"{run} -n 1:4 t.py"
    for kwargs, flag in (({"num_workers": 2}, "--nproc"), ({"max_failures": 1}, "--max-failures")):
        with pytest.raises(ConfigError, match=f"{flag} is for -f FILE.*raylight submit -- raylight run -n 2"):
            submission.entrypoint(["python", "t.py"], None, **kwargs)


def test_submission_from_adaptdl_flags(tmp_path, monkeypatch):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    sub = submission.build_submission(
        [], name="r1", script="code/train.py", working_dir="code", max_workers=4, cpus=2, gpus=0.5,
        env=["SEED=1"], pip=["rich"],
    )
    assert sub.entrypoint == "python -m raylight.cli run -n 1:4 train.py"  # relative to the upload; up to --max-workers
    assert sub.runtime_env == {
        "working_dir": str(code),
        "pip": ["rich"],
        "env_vars": {
            "SEED": "1", "RAYLIGHT_RUN_NAME": "r1", "RAYLIGHT_MAX_WORKERS": "4",
            "RAYLIGHT_CPUS_PER_WORKER": "2", "RAYLIGHT_GPUS_PER_WORKER": "0.5",
        },
    }
    alone = submission.build_submission([], name="r2", script=str(code / "train.py"))
    assert alone.runtime_env["working_dir"] == str(code) and alone.entrypoint == "python -m raylight.cli run -n 1 train.py"
    monkeypatch.chdir(tmp_path / "code")
    relative = submission.build_submission(["--epochs", "2"], name="r3", script="train.py", working_dir=str(code))
    assert relative.entrypoint == "python -m raylight.cli run -n 1 train.py --epochs 2"
    monkeypatch.chdir(tmp_path)
    inside = submission.build_submission([], name="r4", script="train.py", working_dir="code")  # a path in DIR
    assert inside.entrypoint == "python -m raylight.cli run -n 1 train.py"
    fixed = submission.build_submission([], name="r7", script="train.py", working_dir="code", max_workers=4, num_workers=2)
    assert fixed.entrypoint == "python -m raylight.cli run -n 2 train.py"  # -n given: kept (the job caps it at 4)
    with pytest.raises(ConfigError, match=r"--file 'missing\.py': no such file"):
        submission.build_submission([], name="r5", script="missing.py", working_dir="code")
    (tmp_path / "other.py").write_text("")
    with pytest.raises(ConfigError, match=r"--file 'other\.py' is outside --working-dir"):
        submission.build_submission([], name="r6", script="other.py", working_dir="code")


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"working_dir": "/no/such/dir"}, "--working-dir"),
        ({"requirements": "/no/such/requirements.txt"}, "--requirements"),
        ({"requirements": __file__, "pip": ["x"]}, "--requirements and --pip"),
        ({"max_workers": 0}, "--max-workers"),
        ({"cpus": -1.0}, "--cpus"),
        ({"retries": -1}, "--retries"),
        ({"name": "a/b"}, "--name"),
        ({"env": ["oops"]}, "--env"),
    ],
)
def test_bad_flags_name_the_flag(kwargs, flag):
    with pytest.raises(ConfigError, match=flag):
        submission.build_submission(["python", "t.py"], **{"name": "r", **kwargs})


def test_attempts_are_named_and_linked():
    assert [submission.attempt_id("r", i) for i in range(3)] == ["r", "r-retry1", "r-retry2"]
    assert submission.attempt_metadata("r", 0) == {"raylight_run": "r", "raylight_attempt": "0"}
    assert submission.attempt_metadata("r", 2) == {"raylight_run": "r", "raylight_attempt": "2", "raylight_previous": "r-retry1"}
    assert all(isinstance(v, str) for v in submission.attempt_metadata("r", 5).values())  # Ray's metadata is str -> str


def test_what_is_retried():
    assert "preempted" in submission.retry_reason("FAILED", "JOB_ENTRYPOINT_COMMAND_ERROR", PREEMPTED_EXIT_CODE)
    assert "SIGTERM" in submission.retry_reason("FAILED", "JOB_ENTRYPOINT_COMMAND_ERROR", -15)
    assert "SIGTERM" in submission.retry_reason("FAILED", "JOB_ENTRYPOINT_COMMAND_ERROR", 143)
    assert "node died" in submission.retry_reason("FAILED", "JOB_SUPERVISOR_ACTOR_DIED", None)
    assert submission.retry_reason("FAILED", "JOB_ENTRYPOINT_COMMAND_ERROR", 1) is None  # a normal failure
    assert submission.retry_reason("FAILED", "RUNTIME_ENV_SETUP_FAILURE", None) is None
    assert submission.retry_reason("STOPPED", None, -15) is None  # the user stopped it
    assert submission.retry_reason("SUCCEEDED", None, 0) is None


# What Ray 2.60's job manager writes when the driver's node dies (GenNodeDiedCause).
NODE_DIED = (
    "Job supervisor actor died: The actor died unexpectedly before finishing this task.\n"
    "\tclass_name: JobSupervisor\n\tactor_id: 7bc4\n\tpid: 4242\n\tip: 127.0.0.1\n"
    "The actor died because its node has died. Node Id: 0a1b\n"
    "\tthe actor's node was {how}: {what}"
)


def test_a_driver_ended_by_a_signal_or_its_node_s_death_is_preempted_and_a_user_error_is_not():
    # raylight's own driver after an orderly stop (143); a plain one SIGTERMed (-15, or
    # 143 through a shell); SIGKILL after the grace period (-9, 137)
    for code, name in ((143, "SIGTERM"), (-15, "SIGTERM"), (-9, "SIGKILL"), (137, "SIGKILL")):
        reason = submission.retry_reason("FAILED", "JOB_ENTRYPOINT_COMMAND_ERROR", code)
        assert reason is not None and name in reason and str(code) in reason, (code, reason)
    preempted = NODE_DIED.format(how="preempted", what="spot instance reclaimed")
    reason = submission.retry_reason("FAILED", "JOB_SUPERVISOR_ACTOR_UNKNOWN_FAILURE", None, preempted)
    assert reason is not None and "node was preempted" in reason and "spot instance reclaimed" in reason
    lost = NODE_DIED.format(how="terminated unexpectedly", what="health check failed due to missing too many heartbeats")
    reason = submission.retry_reason("FAILED", "JOB_SUPERVISOR_ACTOR_DIED", None, lost)
    assert reason is not None and "node died" in reason and "missing too many heartbeats" in reason
    # a user's error: exit 1, whatever its logs (which Ray puts in the message) say
    assert submission.retry_reason("FAILED", "JOB_ENTRYPOINT_COMMAND_ERROR", 1, f"failed with exit code 1\n{lost}") is None
    assert submission.retry_reason("FAILED", "JOB_ENTRYPOINT_COMMAND_ERROR", 2) is None
    assert submission.retry_reason("FAILED", "RUNTIME_ENV_SETUP_FAILURE", None, "pip install failed") is None
    assert submission.retry_reason("STOPPED", None, 143) is None  # the user stopped it


def test_exit_codes():
    assert submission.exit_code("SUCCEEDED", 0) == 0
    assert submission.exit_code("FAILED", 3) == 3
    assert submission.exit_code("FAILED", -15) == 143
    assert submission.exit_code("FAILED", None) == 1
    assert submission.exit_code("STOPPED", None) == 1


def _config(num_workers, **run):
    return TrainerConfig(scaling=ScalingConfig(num_workers=num_workers), run=RunConfig(**run))


def test_job_env_bounds_an_elastic_run_and_caps_a_fixed_one(caplog):
    assert apply_job_env(_config((1, 8)), {"RAYLIGHT_MAX_WORKERS": "4"}).scaling.num_workers == (1, 4)
    assert apply_job_env(_config((1, 2)), {"RAYLIGHT_MAX_WORKERS": "4"}).scaling.num_workers == (1, 4)
    with caplog.at_level(logging.WARNING, logger="raylight"):
        assert apply_job_env(_config((3, 8)), {"RAYLIGHT_MAX_WORKERS": "2"}).scaling.num_workers == (2, 2)
        assert apply_job_env(_config(2), {"RAYLIGHT_MAX_WORKERS": "4"}).scaling.num_workers == 2
        assert not any("capped" in r.message for r in caplog.records)
        assert apply_job_env(_config(6), {"RAYLIGHT_MAX_WORKERS": "4"}).scaling.num_workers == 4
    assert any("capped at 4" in r.message for r in caplog.records)
    assert apply_job_env(_config(0), {"RAYLIGHT_MAX_WORKERS": "4"}).scaling.num_workers == 0
    config = _config(2)
    assert apply_job_env(config, {}) is config


def test_job_env_sets_resources_and_gpus():
    scaling = apply_job_env(_config(2), {"RAYLIGHT_CPUS_PER_WORKER": "3", "RAYLIGHT_GPUS_PER_WORKER": "1"}).scaling
    assert scaling.resources_per_worker == {"CPU": 3.0, "GPU": 1.0} and scaling.use_gpu
    with pytest.raises(ConfigError, match="RAYLIGHT_CPUS_PER_WORKER='lots'"):
        apply_job_env(_config(2), {"RAYLIGHT_CPUS_PER_WORKER": "lots"})
    with pytest.raises(ConfigError, match="RAYLIGHT_MAX_WORKERS='0'"):
        apply_job_env(_config(2), {"RAYLIGHT_MAX_WORKERS": "0"})


def test_job_env_names_the_run_and_resumes_only_a_run_with_a_checkpoint(tmp_path, caplog):
    env = {"RAYLIGHT_RUN_NAME": "job1", "RAYLIGHT_RESUME": "1"}
    run = apply_job_env(_config(1, storage_path=str(tmp_path)), env).run
    assert run.name == "job1" and not run.resume  # nothing to resume yet
    ckpt = tmp_path / "job1" / "checkpoints" / "checkpoint_000000"
    ckpt.mkdir(parents=True)
    (ckpt / "state.pt").write_bytes(b"x")
    (ckpt / "meta.json").write_text(json.dumps({"files": {"state.pt": {"size": 1}}}))  # committed
    run = apply_job_env(_config(1, storage_path=str(tmp_path)), env).run
    assert run.name == "job1" and run.resume
    with caplog.at_level(logging.WARNING, logger="raylight"):
        own = apply_job_env(_config(1, storage_path=str(tmp_path), name="job1"), env).run
    assert own.name == "job1" and own.resume and not caplog.text  # the same name: nothing to say


def test_the_jobs_name_wins_over_a_name_in_the_script(tmp_path, caplog):
    """A script that names its run (examples/digits.py: name="digits") submitted with
    --name r1 --retries: every attempt must use r1, or a retry (RAYLIGHT_RESUME=1) does not
    find the run it should resume."""
    ckpt = tmp_path / "r1" / "checkpoints" / "checkpoint_000000"
    ckpt.mkdir(parents=True)
    (ckpt / "state.pt").write_bytes(b"x")
    (ckpt / "meta.json").write_text(json.dumps({"files": {"state.pt": {"size": 1}}}))  # committed
    scripted = _config(2, storage_path=str(tmp_path), name="digits")
    with caplog.at_level(logging.WARNING, logger="raylight"):
        run = apply_job_env(scripted, {"RAYLIGHT_RUN_NAME": "r1"}).run
    assert run.name == "r1" and not run.resume
    assert "script names its run 'digits'" in caplog.text and "'r1'" in caplog.text
    retried = apply_job_env(scripted, {"RAYLIGHT_RUN_NAME": "r1", "RAYLIGHT_RESUME": "1"}).run
    assert retried.name == "r1" and retried.resume
    assert apply_job_env(scripted, {}).run.name == "digits"  # not a job: the script's name


def test_run_name_resolution_for_raylight_run(caplog):
    """`raylight run` resolves its run's name with the same rule (launch.driver.launch)."""
    from raylight.driver.job_env import run_name

    assert run_name(None, {}) is None and run_name("mine", {}) == "mine"
    assert run_name(None, {"RAYLIGHT_RUN_NAME": "r1"}) == "r1"
    with caplog.at_level(logging.WARNING, logger="raylight"):
        assert run_name("r1", {"RAYLIGHT_RUN_NAME": "r1"}) == "r1"
        assert not caplog.text
        assert run_name("mine", {"RAYLIGHT_RUN_NAME": "r1"}) == "r1"
    assert "'mine'" in caplog.text and "job's name is used" in caplog.text


def test_a_run_in_a_ray_actor_keeps_its_name(monkeypatch):
    """Tune trials run in Ray actors of the job, each naming its run (tune/trial.py): the
    job's name would give every trial one run directory."""
    from raylight.driver import job_env

    monkeypatch.setattr(job_env, "_in_ray_actor", lambda: True)
    env = {"RAYLIGHT_RUN_NAME": "r1"}
    assert job_env.run_name("raylight-0a1b2c3d", env) == "raylight-0a1b2c3d"
    assert apply_job_env(_config(2, name="raylight-0a1b2c3d"), env).run.name == "raylight-0a1b2c3d"
    assert job_env.run_name(None, env) == "r1"  # nothing named: the job's name still



def test_a_cluster_launcher_head_uses_its_cluster(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(runtime, "LAUNCHER_HEAD_FILE", str(tmp_path / "ray_bootstrap_config.yaml"))
    assert runtime.default_address() == (None, "address")  # a stray local cluster is not used
    (tmp_path / "ray_bootstrap_config.yaml").write_text("cluster_name: x\n")
    address, source = runtime.default_address()
    assert address == "auto" and "cluster launcher" in source
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # a Ray Job's driver
    assert runtime.default_address() == ("127.0.0.1:6379", "RAY_ADDRESS")
    assert os.environ["RAY_ADDRESS"] == "127.0.0.1:6379"


def _submit(*args: str):
    from typer.testing import CliRunner

    from raylight.cli.main import app

    return CliRunner().invoke(app, ["submit", *args])


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--address", "http://127.0.0.1:1"], "no command to run"),
        (["--address", "http://127.0.0.1:1", "--env", "bad", "--", "python", "t.py"], "--env 'bad'"),
        (["--address", "http://127.0.0.1:1", "--working-dir", "/no/such/dir", "--", "python", "t.py"], "--working-dir"),
        (["--address", "http://127.0.0.1:1", "--no-wait", "--retries", "1", "--", "python", "t.py"], "--no-wait"),
        (["--", "python", "t.py"], "no cluster to submit to"),
        (["--address", "http://127.0.0.1:1", "--price", "spot=cheap", "--", "python", "t.py"], "spot=cheap"),
        (["--address", "http://127.0.0.1:1", "-n", "2", "--", "python", "t.py"], "--nproc is for -f FILE"),
        (["--address", "http://127.0.0.1:1", "-n", "3:2", "-f", __file__], "-n/--nproc must be"),
        (["--address", "http://127.0.0.1:1", "--max-failures", "-2", "-f", __file__], "--max-failures -2"),
    ],
)
def test_submit_usage_errors_exit_2_naming_the_flag(args, message, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    out = _submit(*args)
    assert out.exit_code == 2, out.output
    assert message in " ".join(out.output.split())


def test_submit_to_an_unreachable_address_exits_2_naming_the_timeout():
    out = _submit("-u", f"127.0.0.1:{_closed_port()}", "--connect-timeout", "1.5", "--", "python", "t.py")
    assert out.exit_code == 2, out.output
    assert "--connect-timeout=1.5s" in " ".join(out.output.split())


class _JobsAPI:
    """A Jobs API on 127.0.0.1 that answers Ray's client as a head does right after `ray
    start --head`: its version, then '500 No available agent...' to the first ``refusals``
    submissions (every one, with None), then the submission id."""

    def __init__(self, refusals: int | None) -> None:
        import http.server
        import threading

        api = self
        self.refusals, self.posts = refusals, 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, code: int, body: bytes, kind: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path == "/api/version":
                    self._answer(200, json.dumps({"version": "4", "ray_version": "2.60.0", "ray_commit": "x"}).encode())
                elif self.path == "/api/jobs/":
                    self._answer(200, b"[]")  # no jobs yet
                else:
                    self._answer(404, b"{}")

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                api.posts += 1
                if api.refusals is None or api.posts <= api.refusals:
                    self._answer(500, b"No available agent to submit job, please try again later.", "text/plain")
                else:
                    sid = body["submission_id"]
                    self._answer(200, json.dumps({"job_id": sid, "submission_id": sid}).encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="fake-jobs-api", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def jobs_api(request):
    api = _JobsAPI(request.param)
    yield api
    api.close()


@pytest.mark.parametrize("jobs_api", [3], indirect=True)
def test_no_available_agent_is_asked_again_within_the_connect_timeout(jobs_api, monkeypatch):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    slept: list[float] = []
    client = submission.JobsClient(jobs_api.url, connect_timeout_s=30, sleep=slept.append)
    sub = submission.build_submission(["python", "t.py"], name="agent1")
    assert client.submit(sub, 0) == "agent1"
    assert jobs_api.posts == 4 and slept == [0.5, 1.0, 2.0]  # backing off between the answers


@pytest.mark.parametrize("jobs_api", [None], indirect=True)
def test_no_available_agent_until_the_connect_timeout_says_what_is_wrong(jobs_api, monkeypatch):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    out = _submit("-u", jobs_api.url, "--connect-timeout", "1.5", "--name", "agent2", "--", "python", "t.py")
    text = " ".join(out.output.split())
    assert out.exit_code == 2, out.output
    assert "No available agent to submit job" in text and "--connect-timeout=1.5s" in text, text
    assert "dashboard_agent.log" in text and jobs_api.posts >= 2, text


class _Status:
    def __init__(self, value: str) -> None:
        self.value = value


class _Info:
    def __init__(self, status: str, code: int | None, error: str | None = None) -> None:
        self.status, self.driver_exit_code, self.error_type = _Status(status), code, error
        self.message: str | None = None


class _FakeClient:
    """JobsClient's surface that ``submission.run`` uses, with scripted attempt outcomes."""

    url = "http://head:8265"

    def __init__(self, outcomes: list[_Info]) -> None:
        self.outcomes, self.submitted = list(outcomes), []

    def first_attempt(self, sub):
        return 0

    def submit(self, sub, attempt):
        self.submitted.append((submission.attempt_id(sub.name, attempt), attempt > 0 or sub.resume))
        return submission.attempt_id(sub.name, attempt)

    def follow(self, job_id, write):
        write(f"logs of {job_id}\n")
        return self.outcomes.pop(0)


def _run(outcomes, retries):
    client, lines, said = _FakeClient(outcomes), [], []
    sub = submission.build_submission(["python", "t.py"], name="r", retries=retries)
    code = submission.run(client, sub, wait=True, write=lines.append, say=said.append)
    return code, client.submitted, lines, said


def test_run_resubmits_preempted_attempts_with_resume_until_retries_run_out():
    preempted = _Info("FAILED", PREEMPTED_EXIT_CODE, "JOB_ENTRYPOINT_COMMAND_ERROR")
    code, submitted, lines, _ = _run([preempted, _Info("SUCCEEDED", 0)], retries=2)
    assert code == 0 and submitted == [("r", False), ("r-retry1", True)]
    assert lines == ["logs of r\n", "logs of r-retry1\n"]
    code, submitted, _, said = _run([preempted, preempted], retries=1)
    assert code == PREEMPTED_EXIT_CODE and [s for s, _ in submitted] == ["r", "r-retry1"]
    assert "no retries left (--retries 1)" in said[-1]
    code, submitted, _, _ = _run([_Info("FAILED", 2, "JOB_ENTRYPOINT_COMMAND_ERROR")], retries=3)
    assert code == 2 and len(submitted) == 1  # a normal failure is not retried
    code, submitted, _, _ = _run([_Info("FAILED", None, "JOB_SUPERVISOR_ACTOR_DIED"), _Info("SUCCEEDED", 0)], retries=1)
    assert code == 0 and len(submitted) == 2  # the driver's node died


@pytest.mark.parametrize("jobs_api", [0], indirect=True)
@pytest.mark.parametrize("verbose", [False, True])
def test_the_jobs_client_makes_no_ray_info_lines_unless_verbose(jobs_api, monkeypatch, verbose):
    """`raylight submit` is quiet as raylight is: Ray's Jobs client logs the working
    directory's packaging and upload at INFO ("Uploading package gcs://..."); quiet, those
    lines are not made, verbose (--verbose, RAYLIGHT_VERBOSE=1) they are."""
    import logging

    from raylight.base import verbosity

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setattr(verbosity, "_current", [verbose])
    ray_logger = logging.getLogger("ray")
    level = ray_logger.level
    try:
        submission.JobsClient(jobs_api.url, connect_timeout_s=30)
        for name in ("ray.dashboard.modules.dashboard_sdk", "ray._private.runtime_env.packaging"):
            assert logging.getLogger(name).isEnabledFor(logging.INFO) is verbose, name
    finally:
        ray_logger.setLevel(level)


def test_submit_verbose_makes_the_job_verbose_too(monkeypatch):
    """--verbose reaches the job: RAYLIGHT_VERBOSE=1 in its environment."""
    from raylight.base import verbosity

    seen = {}

    def fake_run(client, sub, **kwargs):
        seen["env"] = sub.runtime_env["env_vars"]
        return 0

    monkeypatch.setattr(verbosity, "_current", [])
    monkeypatch.setattr(submission, "JobsClient", lambda *a, **k: object())
    monkeypatch.setattr(submission, "run", fake_run)
    out = _submit("--address", "http://127.0.0.1:1", "--verbose", "--name", "v1", "--", "python", "t.py")
    assert out.exit_code == 0, out.output
    assert seen["env"]["RAYLIGHT_VERBOSE"] == "1"
    monkeypatch.setenv(verbosity.ENV, "")  # what apply(True) set stays in this test's process only
