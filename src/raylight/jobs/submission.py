"""Runs on a remote Ray cluster as Ray Jobs: submit (with retries), list, status, logs, stop.

A product beside the CLI, built on ``ray.job_submission.JobSubmissionClient``: Ray
schedules, uploads the working directory, installs the runtime environment and keeps
the logs; raylight adds the run's bounds and name (as the environment ``job_env``
reads), and resubmits a job that was preempted so that it resumes its run by name.

Attempts of one run are Ray Jobs named ``NAME``, ``NAME-retry1``, ``NAME-retry2``...,
each with metadata naming its run, its attempt and the attempt before it.
The pure parts (addresses, arguments, the runtime environment, what is retried) import
no Ray and are unit-tested; ``JobsClient`` is the one place that talks to the cluster.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from raylight.base import ray_token, verbosity
from raylight.base.clock import monotonic
from raylight.base.exceptions import ClusterConnectionError, ConfigError
from raylight.base.exit_codes import KILLED_EXIT_CODE, PREEMPTED_EXIT_CODE, TERMINATED_EXIT_CODE
from raylight.config.schema import CONNECT_TIMEOUT_S
from raylight.driver.job_env import (
    CPUS_ENV,
    GPUS_ENV,
    JOB_ENV_VARS,
    MAX_WORKERS_ENV,
    RESUME_ENV,
    RUN_NAME_ENV,
)

log = logging.getLogger("raylight")

DASHBOARD_PORT = 8265  # Ray's default port of the dashboard, which serves the Jobs API
ADDRESS_ENVS = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")  # what `ray job submit` reads, in order
RUN_KEY, ATTEMPT_KEY, PREVIOUS_KEY = "raylight_run", "raylight_attempt", "raylight_previous"
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}\Z")
# A driver ended by a signal nobody asked for (`jobs stop` ends as STOPPED): its node is
# going away (spot preemption, scale-down), which sends SIGTERM and, after a grace
# period, SIGKILL. Ray reports -N when the entrypoint was the driver itself, 128 + N when
# a shell ran it; raylight's own driver exits 143 after an orderly stop.
_SIGNAL_CODES = {-15: "SIGTERM", TERMINATED_EXIT_CODE: "SIGTERM", -9: "SIGKILL", KILLED_EXIT_CODE: "SIGKILL"}
_RETRIED_ERRORS = {"JOB_SUPERVISOR_ACTOR_DIED": "the driver's node died"}
# What Ray writes in a job's message when the driver's node died (the GCS's actor death
# cause, GcsActorManager::GenNodeDiedCause): "The actor died because its node has died.
# Node Id: ..." then "\tthe actor's node was preempted: <the drain's message>" (or
# "terminated expectedly: ...", "terminated unexpectedly: <why>").
_NODE_DIED, _NODE_REASON, _PREEMPTED = "its node has died", "the actor's node was ", "the actor's node was preempted"
_ENTRYPOINT_ERROR = "JOB_ENTRYPOINT_COMMAND_ERROR"  # the driver's own exit code; its message holds its logs
# The Jobs API's answer (500) while the head has no job agent to give the job to yet: the
# head's dashboard answers before its node's agent has registered (seen right after `ray
# start --head`, and 30 s after it on a loaded machine). Ray waits 10 s for one before it
# answers; raylight asks again, AGENT_RETRY_S doubling to AGENT_RETRY_MAX_S between
# requests, for --connect-timeout from the first such answer.
NO_AGENT = "No available agent to submit job"
AGENT_RETRY_S, AGENT_RETRY_MAX_S = 0.5, 5.0


def jobs_address(given: str | None, environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The Jobs API URL for ``--address`` (or RAY_API_SERVER_ADDRESS, then RAY_ADDRESS),
    and where it came from. ``ray://host:port`` (a Ray Client address, AdaptDL's ``-u``)
    means the same head's dashboard, ``http://host:8265``; ``host[:port]`` means http;
    ``http(s)://`` URLs are kept."""
    env = os.environ if environ is None else environ
    source = "--address"
    if not given:
        for key in ADDRESS_ENVS:
            if env.get(key):
                given, source = env[key], key
                break
    if not given:
        raise ConfigError(
            "no cluster to submit to: pass --address http://HEAD:8265 (the head's dashboard; "
            "-u ray://HEAD:10001 works too) or set RAY_API_SERVER_ADDRESS"
        )
    address = given.strip().rstrip("/")
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "http", address
    if scheme == "ray":  # the client server's port says nothing of the dashboard's
        rest = rest.split("/", 1)[0]
        host = rest[: rest.index("]") + 1] if rest.startswith("[") else rest.split(":", 1)[0]
        return f"http://{host}:{DASHBOARD_PORT}", source
    if scheme not in ("http", "https") or not rest or rest == "auto":
        raise ConfigError(
            f"{source}={given!r} is not a Ray Jobs address: use http://HEAD:8265, HEAD:8265 or "
            "ray://HEAD:10001"
        )
    return f"{scheme}://{rest}", source


def _host_port(url: str) -> tuple[str, int]:
    scheme, _, rest = url.partition("://")
    rest = rest.split("/", 1)[0]
    host, sep, port = rest.rpartition(":")
    if sep and port.isdigit() and not host.endswith(":"):
        return host.strip("[]"), int(port)
    return rest.strip("[]"), 443 if scheme == "https" else 80


def parse_env(items: Sequence[str]) -> dict[str, str]:
    """``--env K=V`` pairs; raylight's own variables are set by their flags."""
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not _ENV_KEY.match(key):
            raise ConfigError(f"--env {item!r}: expected KEY=VALUE with KEY a variable name, e.g. --env SEED=1")
        if key in JOB_ENV_VARS:
            raise ConfigError(
                f"--env {key}: raylight sets it from --max-workers, --cpus, --gpus, --name or --resume; use those"
            )
        env[key] = value
    return env


def entrypoint(
    command: Sequence[str], script: str | None, *, num_workers: int | tuple[int, int] | None = None,
    max_failures: int | None = None,
) -> str:
    """The shell command the job runs. One argument is taken as a shell line as is (so
    ``-- "cd src && python t.py"`` works); several are quoted as an argument vector;
    ``-f script.py`` runs the script as ``raylight run`` does (``python -m raylight.cli run
    -n N script.py``, the AdaptDL import hook installed), the command as its arguments:
    ``num_workers`` is ``-n`` (N, or (MIN, MAX) for an elastic run; default 1, as
    ``raylight run``'s), ``max_failures`` its ``--max-failures``."""
    if script is not None:
        run = ["python", "-m", "raylight.cli", "run", "-n", _size(num_workers if num_workers is not None else 1)]
        if max_failures is not None:
            run += ["--max-failures", str(max_failures)]
        return shlex.join([*run, script, *command])
    if num_workers is not None or max_failures is not None:
        flag = "--nproc" if num_workers is not None else "--max-failures"
        raise ConfigError(
            f"{flag} is for -f FILE (FILE runs under raylight run); with a command after --, give it there: "
            "raylight submit -- raylight run -n 2 --max-failures 1 train.py"
        )
    if not command:
        raise ConfigError("no command to run: put it after --, e.g. raylight submit -- python train.py (or -f train.py)")
    return command[0] if len(command) == 1 else shlex.join(command)


def _size(size: int | tuple[int, int]) -> str:
    return f"{size[0]}:{size[1]}" if isinstance(size, tuple) else str(size)


@dataclass(frozen=True)
class Submission:
    """Everything one ``raylight submit`` sends, checked."""

    name: str
    entrypoint: str
    runtime_env: dict[str, Any]
    retries: int = 0
    resume: bool = False


def build_submission(
    command: Sequence[str],
    *,
    name: str,
    script: str | None = None,
    working_dir: str | None = None,
    requirements: str | None = None,
    pip: Sequence[str] = (),
    env: Sequence[str] = (),
    max_workers: int | None = None,
    cpus: float | None = None,
    gpus: float | None = None,
    retries: int = 0,
    resume: bool = False,
    num_workers: int | tuple[int, int] | None = None,
    max_failures: int | None = None,
) -> Submission:
    """Check the flags and build what is sent; ConfigError names the flag at fault.
    ``num_workers`` and ``max_failures`` are ``raylight run``'s ``-n`` and
    ``--max-failures`` for ``-f`` FILE; without ``num_workers``, ``max_workers`` M makes it
    the elastic ``1:M`` (AdaptDL's job grows up to its maximum), else 1."""
    if not _NAME.match(name):
        raise ConfigError(f"--name {name!r}: use letters, digits, '.', '_' and '-' (at most 100, starting with a letter or digit)")
    if script is not None and working_dir is None:
        working_dir = os.path.dirname(os.path.abspath(script))  # AdaptDL's -f alone: its directory
    if working_dir is not None:
        if not os.path.isdir(working_dir):
            raise ConfigError(f"--working-dir {working_dir!r} is not a directory; give the directory to upload")
        working_dir = os.path.abspath(working_dir)
    if script is not None:
        script = _script_in(script, working_dir or "")
    if requirements is not None and pip:
        raise ConfigError("--requirements and --pip both given: list the packages in one of them")
    if requirements is not None and not os.path.isfile(requirements):
        raise ConfigError(f"--requirements {requirements!r} is not a file; give a pip requirements.txt")
    if max_failures is not None and max_failures < -1:
        raise ConfigError(f"--max-failures {max_failures}: must be -1 (always restart) or at least 0")
    for flag, value, least in (("--max-workers", max_workers, 1), ("--cpus", cpus, 0), ("--gpus", gpus, 0), ("--retries", retries, 0)):
        if value is not None and value < least:
            raise ConfigError(f"{flag} {value}: must be at least {least}")
    if script is not None and num_workers is None and max_workers is not None:
        num_workers = (1, max_workers)
    runtime_env: dict[str, Any] = {}
    if working_dir is not None:
        runtime_env["working_dir"] = working_dir
    if requirements is not None:
        runtime_env["pip"] = os.path.abspath(requirements)
    elif pip:
        runtime_env["pip"] = list(pip)
    job_env = {RUN_NAME_ENV: name}
    for key, value in ((MAX_WORKERS_ENV, max_workers), (CPUS_ENV, cpus), (GPUS_ENV, gpus)):
        if value is not None:
            job_env[key] = f"{value:g}" if isinstance(value, float) else str(value)
    runtime_env["env_vars"] = {**parse_env(env), **job_env}
    command_line = entrypoint(command, script, num_workers=num_workers, max_failures=max_failures)
    return Submission(name, command_line, runtime_env, retries=retries, resume=resume)


def _script_in(script: str, working_dir: str) -> str:
    """``-f`` FILE as a path inside the uploaded directory: a local file there, or a path
    relative to it."""
    if os.path.isfile(script):
        inside = os.path.relpath(os.path.abspath(script), working_dir)
        if inside.startswith(".."):
            raise ConfigError(
                f"--file {script!r} is outside --working-dir {working_dir!r}, so it would not be uploaded; "
                "move it there or upload its directory"
            )
        return inside
    if os.path.isfile(os.path.join(working_dir, script)):
        return script
    raise ConfigError(f"--file {script!r}: no such file here or in --working-dir {working_dir!r}; give the training script")


def default_name() -> str:
    import datetime
    import uuid

    return f"run-{datetime.datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"


def attempt_id(name: str, attempt: int) -> str:
    return name if attempt == 0 else f"{name}-retry{attempt}"


def attempt_metadata(name: str, attempt: int) -> dict[str, str]:
    meta = {RUN_KEY: name, ATTEMPT_KEY: str(attempt)}
    if attempt:
        meta[PREVIOUS_KEY] = attempt_id(name, attempt - 1)
    return meta


def retry_reason(status: str, error_type: str | None, exit_code: int | None, message: str | None = None) -> str | None:
    """Why an ended attempt is resubmitted, or None. Preempted: the driver exited with
    PREEMPTED_EXIT_CODE, or was ended by SIGTERM or SIGKILL that nobody asked for (a
    node's shutdown sends them; raylight's driver exits 143 after an orderly stop), or
    Ray says the driver's node died (its error type, or the node-death reason in its
    message). Success, a stop (STOPPED) and every other failure (a user's error: exit 1)
    are not retried."""
    if status != "FAILED":
        return None
    if exit_code == PREEMPTED_EXIT_CODE:
        return f"the run was preempted (exit code {PREEMPTED_EXIT_CODE})"
    if exit_code in _SIGNAL_CODES:
        name = _SIGNAL_CODES[exit_code]
        return f"the driver was terminated ({name}; exit code {exit_code}), as on a node being preempted"
    if error_type != _ENTRYPOINT_ERROR and message:  # Ray's own account, not the driver's logs
        death = _node_death(message)
        if death is not None:
            return death
    return _RETRIED_ERRORS.get(error_type or "")


def _node_death(message: str) -> str | None:
    """The reason for retrying that Ray's node-death cause in ``message`` gives, or None."""
    lines = [line.strip() for line in message.splitlines()]
    if not any(_NODE_DIED in line for line in lines):
        return None
    detail = next((line for line in lines if line.startswith(_NODE_REASON)), None)
    what = "was preempted" if detail is not None and detail.startswith(_PREEMPTED) else "died"
    return f"the driver's node {what} (Ray: {detail or next(line for line in lines if _NODE_DIED in line)})"


def exit_code(status: str, driver_exit_code: int | None) -> int:
    """The exit code of ``raylight submit`` for an ended job: the driver's (a signal N
    as 128 + N, as a shell says it); 0 on success; 1 when it ended without one."""
    if driver_exit_code is not None:
        return 128 - driver_exit_code if driver_exit_code < 0 else driver_exit_code
    return 0 if status == "SUCCEEDED" else 1


def probe(url: str, source: str, timeout_s: float) -> None:
    """Fail now, naming the setting, when nothing answers at the Jobs API's address."""
    try:
        socket.create_connection(_host_port(url), timeout=timeout_s).close()
    except OSError as exc:
        raise ClusterConnectionError(
            f"could not reach the Ray Jobs API at {url} (from {source}) within "
            f"--connect-timeout={timeout_s:g}s: {exc}. Check the head's dashboard address "
            f"(default port {DASHBOARD_PORT}) and that it runs with the dashboard (ray[default])"
        ) from None


class JobsClient:
    """The one place that talks to Ray Jobs, over ``JobSubmissionClient``."""

    def __init__(
        self, url: str, *, source: str = "--address", connect_timeout_s: float = CONNECT_TIMEOUT_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        probe(url, source, connect_timeout_s)
        ray_token.warn_if_readable_by_others()  # Ray's Jobs client sends it, where token auth is on
        self.connect_timeout_s, self.sleep = connect_timeout_s, sleep
        try:
            from ray.job_submission import JobSubmissionClient
        except ImportError as exc:
            raise ImportError("raylight submit needs Ray's Jobs client: pip install 'raylight[cluster]'") from exc
        # Quiet unless verbose: the client's INFO lines (the working directory packaged,
        # uploaded, or found already there) are not made. After importing Ray, which sets
        # its logger's level at import.
        verbosity.apply(verbosity.is_verbose())
        try:
            self.client = JobSubmissionClient(url)
        except Exception as exc:
            hint = ""
            if "uthentication" in str(exc) and os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
                hint = (
                    " The cluster uses Ray token authentication: set RAY_AUTH_MODE=token and give "
                    "its token (RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token where the head wrote it)."
                )
            raise ClusterConnectionError(f"could not use the Ray Jobs API at {url} (from {source}): {exc}{hint}") from None
        self.url = url

    def attempts(self, name: str) -> list[Any]:
        """The Ray Jobs of run ``name``, first attempt first (or the job with that
        submission id, when raylight did not submit it)."""
        found = [j for j in self.client.list_jobs() if (j.metadata or {}).get(RUN_KEY) == name]
        found.sort(key=lambda j: int((j.metadata or {}).get(ATTEMPT_KEY, "0")))
        if not found:
            found = [j for j in self.client.list_jobs() if j.submission_id == name]
        if not found:
            raise ConfigError(f"no job named {name!r} at {self.url}; `raylight jobs list` shows them")
        return found

    def list(self) -> list[Any]:
        return sorted(self.client.list_jobs(), key=lambda j: j.start_time or 0)

    def submit(self, sub: Submission, attempt: int) -> str:
        runtime_env = sub.runtime_env
        if attempt > 0 or sub.resume:
            runtime_env = {**runtime_env, "env_vars": {**runtime_env["env_vars"], RESUME_ENV: "1"}}
        job_id = attempt_id(sub.name, attempt)
        began, no_agent_since, answers = monotonic(), None, 0
        delay = AGENT_RETRY_S
        while True:
            try:
                return str(self.client.submit_job(
                    entrypoint=sub.entrypoint,
                    submission_id=job_id,
                    runtime_env=runtime_env,
                    metadata=attempt_metadata(sub.name, attempt),
                ))
            except (RuntimeError, ValueError) as exc:
                if NO_AGENT not in str(exc):
                    raise ConfigError(f"Ray Jobs refused the job {job_id!r}: {exc}") from None
                now, answers = monotonic(), answers + 1
                no_agent_since = now if no_agent_since is None else no_agent_since
                left = self.connect_timeout_s - (now - no_agent_since)
                if left <= 0:
                    raise ClusterConnectionError(self._no_agent(job_id, answers, now - began)) from None
                log.warning("the Ray Jobs API at %s has no job agent yet (%s); asking again", self.url, NO_AGENT)
                self.sleep(min(delay, left))
                delay = min(2 * delay, AGENT_RETRY_MAX_S)

    def _no_agent(self, job_id: str, answers: int, waited_s: float) -> str:
        return (
            f"could not submit {job_id!r}: the Ray Jobs API at {self.url} answered '500 {NO_AGENT}' "
            f"{answers} time(s) in {waited_s:.0f}s (asked again for --connect-timeout={self.connect_timeout_s:g}s "
            "after the first). "
            "The head's job agent (part of its dashboard agent) has not started or has died: right "
            "after `ray start --head` wait and submit again, or give it longer with --connect-timeout; "
            "otherwise see the head's dashboard_agent.log (in its session's logs directory)"
        )

    def first_attempt(self, sub: Submission) -> int:
        """0 for a new name; with --resume, the attempt after those the cluster holds."""
        try:
            earlier = self.attempts(sub.name)
        except ConfigError:
            return 0
        live = [j.submission_id for j in earlier if not j.status.is_terminal()]
        if live or not sub.resume:
            raise ConfigError(
                f"--name {sub.name}: the cluster already has this run's job {earlier[-1].submission_id} "
                f"({earlier[-1].status.value}); "
                + ("stop it first (raylight jobs stop) or choose another --name" if live else
                   "pass --resume to continue that run, or choose another --name")
            )
        return int((earlier[-1].metadata or {}).get(ATTEMPT_KEY, "0")) + 1

    def follow(self, job_id: str, write: Callable[[str], None]) -> Any:
        """Stream the job's logs until it ends (no timeout: Ctrl-C interrupts), then
        return its JobInfo."""
        import asyncio
        import time

        async def tail() -> None:
            async for chunk in self.client.tail_job_logs(job_id):
                write(chunk)

        asyncio.run(tail())
        while not (info := self.client.get_job_info(job_id)).status.is_terminal():
            time.sleep(0.2)  # the log stream ends as the job does; its status follows
        return info

    def stop(self, job_id: str) -> bool:
        return bool(self.client.stop_job(job_id))

    def logs(self, job_id: str) -> str:
        return str(self.client.get_job_logs(job_id))


def run(client: JobsClient, sub: Submission, *, wait: bool, write: Callable[[str], None], say: Callable[[str], None]) -> int:
    """Submit ``sub``; waiting, stream each attempt's logs, resubmit a preempted one
    (up to ``sub.retries`` times) and return the last attempt's exit code."""
    attempt = client.first_attempt(sub)
    for retry in range(sub.retries + 1):
        job_id = client.submit(sub, attempt)
        say(f"submitted {job_id} to {client.url}" + (f" (retry {retry} of {sub.retries})" if retry else ""))
        if not wait:
            say(f"follow it with: raylight jobs logs {sub.name} --follow --address {client.url}")
            return 0
        info = client.follow(job_id, write)
        status = info.status.value
        code = exit_code(status, info.driver_exit_code)
        error = getattr(info.error_type, "value", info.error_type)
        reason = retry_reason(status, error, info.driver_exit_code, info.message)
        say(f"{job_id}: {status}" + (f", exit code {code}" if status != "SUCCEEDED" else ""))
        if reason is None:
            return code
        if retry == sub.retries:
            say(f"{job_id}: {reason}; no retries left (--retries {sub.retries})")
            return code
        say(f"{job_id}: {reason}; resubmitting to resume run {sub.name} from its last checkpoint")
        attempt += 1
    raise AssertionError("unreachable")
