"""`raylight submit` and `raylight jobs ...`: thin commands over ``raylight.jobs.submission``.

Exit codes: ``submit`` that waits exits with the job's (the driver's exit code, 0 on
success); 2 for usage errors (a flag, the address, the working directory); 130 when
Ctrl-C stops the wait (the job keeps running).
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console

from raylight.base.exceptions import ClusterConnectionError, ConfigError
from raylight.cli.extras import require
from raylight.cli.options import NO_VALUE, Command, Group, finite_float
from raylight.cli.prices import PriceOpt, PricesOpt, price_table
from raylight.config.schema import CONNECT_TIMEOUT_S
from raylight.jobs import submission
from raylight.launch.driver import parse_size

console = Console(stderr=True)
jobs_app = typer.Typer(cls=Group, no_args_is_help=True, help="Ray Jobs of raylight runs on a cluster: list, status, logs, stop.")

AddressOpt = Annotated[
    str | None,
    typer.Option(
        "--address", "-u",
        help="The head's Jobs API: http://HEAD:8265 (ray://HEAD:10001 means that too). "
        "Default: RAY_API_SERVER_ADDRESS, then RAY_ADDRESS.",
        metavar="URL",
    ),
]
TimeoutOpt = Annotated[float, typer.Option("--connect-timeout", help="Seconds to wait for the address to answer.", parser=finite_float, metavar="SECONDS")]
NameArg = Annotated[str, typer.Argument(help="The run's name (its jobs: NAME, NAME-retry1, ...).")]


def _say(text: str) -> None:
    console.print(text, highlight=False, markup=False, soft_wrap=True)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _client(address: str | None, timeout_s: float) -> submission.JobsClient:
    url, source = submission.jobs_address(address)
    return submission.JobsClient(url, source=source, connect_timeout_s=timeout_s)


def _usage(exc: Exception) -> None:
    console.print("[bold red]error:[/] ", end="", highlight=False)
    console.print(str(exc), highlight=False, soft_wrap=True, markup=False)
    raise typer.Exit(2)


def submit(
    command: Annotated[list[str] | None, typer.Argument(help="After --: the command, e.g. python train.py --epochs 3.", metavar="COMMAND")] = None,
    address: AddressOpt = None,
    working_dir: Annotated[str | None, typer.Option("--working-dir", help="Directory uploaded and run in.", metavar="DIR")] = None,
    file: Annotated[
        str | None,
        typer.Option(
            "--file", "-f", metavar="FILE",
            help="Run FILE as `raylight run` does (AdaptDL's -f: `import adaptdl` is served, -n replicas); "
            "the command becomes its arguments.",
        ),
    ] = None,
    nproc: Annotated[
        str | None,
        typer.Option(
            "--nproc", "-n", metavar="N|MIN:MAX",
            help="With -f: raylight run's -n, the replicas (default: 1:MAX with --max-workers, else 1).",
        ),
    ] = None,
    max_failures: Annotated[
        int | None,
        typer.Option("--max-failures", help="With -f: raylight run's --max-failures, group restarts after a failed replica (-1: always).", metavar="N"),
    ] = None,
    requirements: Annotated[str | None, typer.Option(help="pip requirements file installed for the job.", metavar="FILE")] = None,
    pip: Annotated[list[str] | None, typer.Option("--pip", help="A pip package for the job (repeatable).", metavar="PACKAGE")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", help="KEY=VALUE for the job's processes (repeatable).", metavar="KEY=VALUE")] = None,
    name: Annotated[str | None, typer.Option(help="The run's name and job id. Default: run-<time>-<hex>.")] = None,
    max_workers: Annotated[int | None, typer.Option("--max-workers", help="Most workers the run may use (an elastic run's max).", metavar="N")] = None,
    cpus: Annotated[float | None, typer.Option(help="CPUs per worker.", parser=finite_float, metavar="N")] = None,
    gpus: Annotated[float | None, typer.Option(help="GPUs per worker.", parser=finite_float, metavar="N")] = None,
    retries: Annotated[int, typer.Option(help="Resubmit a preempted job (or one whose node died) up to this many times.", metavar="N")] = 0,
    resume: Annotated[bool, typer.Option(help="Continue the run NAME from its last committed checkpoint.", metavar=NO_VALUE)] = False,
    no_wait: Annotated[bool, typer.Option("--no-wait", help="Return once submitted.", metavar=NO_VALUE)] = False,
    scheduler: Annotated[
        bool, typer.Option("--scheduler", help="Share the cluster through the raylight scheduler, started by the run where none runs yet.", metavar=NO_VALUE)
    ] = False,
    connect_timeout: TimeoutOpt = CONNECT_TIMEOUT_S,
    price: PriceOpt = None,
    prices: PricesOpt = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", help="Show Ray's own logs too: the Jobs client's (the upload), and the job's (RAYLIGHT_VERBOSE=1 in it).", metavar=NO_VALUE)
    ] = False,
) -> None:
    """Run COMMAND (or -f FILE, under raylight run) on a Ray cluster as a Ray Job; wait, streaming its logs, and exit with its exit code.

    `-f train.py -n 2` runs `raylight run -n 2 train.py` as the job: an AdaptDL script runs
    unchanged (docs/adaptdl.md). `-- COMMAND` runs COMMAND as it is.
    """
    require("submit", "cluster")
    sub: submission.Submission | None = None
    client: submission.JobsClient | None = None
    if verbose:  # this process (raylight.base.verbosity) and the job's raylight runs
        from raylight.base import verbosity

        verbosity.apply(True)
        env = [*(env or []), f"{verbosity.ENV}=1"]
    try:
        if no_wait and retries:
            raise ConfigError("--retries needs a client that waits to resubmit the job: drop --no-wait or --retries")
        if scheduler:  # the job's driver starts it: it connects to the cluster, this client does not
            from raylight.driver.scheduler_link import START_ENV

            env = [*(env or []), f"{START_ENV}=start"]
        table = price_table(price, prices)
        if table is not None:  # the run prices itself from its environment (raylight.base.cost)
            from raylight.base.cost import PRICES_ENV, prices_env_value

            env = [*(env or []), f"{PRICES_ENV}={prices_env_value(table)}"]
        sub = submission.build_submission(
            command or [], name=name or submission.default_name(), script=file, working_dir=working_dir,
            requirements=requirements, pip=pip or [], env=env or [], max_workers=max_workers, cpus=cpus,
            gpus=gpus, retries=retries, resume=resume, num_workers=None if nproc is None else parse_size(nproc),
            max_failures=max_failures,
        )
        client = _client(address, connect_timeout)
        code = submission.run(client, sub, wait=not no_wait, write=_write, say=_say)
    except (ConfigError, ClusterConnectionError) as exc:
        _usage(exc)
    except KeyboardInterrupt:
        if sub is not None and client is not None:
            _say(f"\ninterrupted: the job keeps running. Stop it with: raylight jobs stop {sub.name} --address {client.url}")
        raise typer.Exit(130) from None
    except Exception as exc:  # the Jobs API went away while waiting (head lost, network)
        if sub is None or client is None:
            raise
        _say(
            f"error: lost the Ray Jobs API at {client.url} while waiting: {type(exc).__name__}: {exc}. "
            f"The job may still run: raylight jobs status {sub.name} --address {client.url}"
        )
        raise typer.Exit(1) from None
    raise typer.Exit(code)


@jobs_app.command("list", cls=Command)
def list_jobs(address: AddressOpt = None, connect_timeout: TimeoutOpt = CONNECT_TIMEOUT_S) -> None:
    """Every Ray Job on the cluster, oldest first, with its run and attempt."""
    require("jobs list", "cluster")
    try:
        found = _client(address, connect_timeout).list()
    except (ConfigError, ClusterConnectionError) as exc:
        _usage(exc)
    print(f"{'JOB':32} {'RUN':24} {'ATTEMPT':7} {'STATUS':10} ENTRYPOINT")
    for j in found:
        meta = j.metadata or {}
        print(f"{j.submission_id or j.job_id:32} {meta.get(submission.RUN_KEY, '-'):24} {meta.get(submission.ATTEMPT_KEY, '-'):7} "
              f"{j.status.value:10} {j.entrypoint[:60]}")


@jobs_app.command(cls=Command)
def status(name: NameArg, address: AddressOpt = None, connect_timeout: TimeoutOpt = CONNECT_TIMEOUT_S) -> None:
    """The latest attempt of run NAME: status, exit code, message."""
    require("jobs status", "cluster")
    try:
        attempts = _client(address, connect_timeout).attempts(name)
    except (ConfigError, ClusterConnectionError) as exc:
        _usage(exc)
    last = attempts[-1]
    print(f"job: {last.submission_id}\nstatus: {last.status.value}")
    if last.driver_exit_code is not None:
        print(f"exit code: {last.driver_exit_code}")
    if last.message:
        print(f"message: {last.message.splitlines()[0]}")
    print(f"attempts: {', '.join(f'{j.submission_id} ({j.status.value})' for j in attempts)}")


@jobs_app.command(cls=Command)
def logs(
    name: NameArg,
    follow: Annotated[bool, typer.Option("--follow", help="Stream until the job ends.", metavar=NO_VALUE)] = False,
    address: AddressOpt = None,
    connect_timeout: TimeoutOpt = CONNECT_TIMEOUT_S,
) -> None:
    """The logs of run NAME's latest attempt."""
    require("jobs logs", "cluster")
    try:
        client = _client(address, connect_timeout)
        job_id = client.attempts(name)[-1].submission_id
        if follow:
            client.follow(job_id, _write)
        else:
            _write(client.logs(job_id))
    except (ConfigError, ClusterConnectionError) as exc:
        _usage(exc)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


@jobs_app.command(cls=Command)
def stop(name: NameArg, address: AddressOpt = None, connect_timeout: TimeoutOpt = CONNECT_TIMEOUT_S) -> None:
    """Stop run NAME's latest attempt (it ends as STOPPED and is not retried)."""
    require("jobs stop", "cluster")
    try:
        client = _client(address, connect_timeout)
        last = client.attempts(name)[-1]
        stopped = client.stop(last.submission_id)
    except (ConfigError, ClusterConnectionError) as exc:
        _usage(exc)
    _say(f"stopping {last.submission_id}" if stopped else f"{last.submission_id} already ended ({last.status.value})")
