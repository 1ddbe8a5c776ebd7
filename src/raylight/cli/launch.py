"""`raylight run`: a thin command over ``raylight.launch.driver.launch``.

Everything after the script (or after ``-m MODULE``) goes to the script unchanged, options
that start with ``-`` included. Exit codes: the script's (0, or the failing rank's), 2 for
usage errors (flags, a missing script or module, the address, resources the cluster does
not have), 1 for other failures (a rank that never initialises its process group, a worker
that died), 130 for Ctrl-C.
"""

from __future__ import annotations

from typing import Annotated, NoReturn

import typer
from rich.console import Console

from raylight.base.exceptions import (
    ClusterConnectionError,
    ConfigError,
    InsufficientResourcesError,
    RaylightError,
)
from raylight.cli.options import NO_VALUE, finite_float
from raylight.config.schema import WORKER_CPUS
from raylight.launch.agent import CHANNEL_TIMEOUT_S
from raylight.launch.driver import INIT_TIMEOUT_S, launch, parse_size

console = Console(stderr=True)
USAGE_ERRORS = (ConfigError, ClusterConnectionError, InsufficientResourcesError)
# Options end at the script: `raylight run -n 2 train.py --lr 0.1` gives --lr to the script.
CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": False}


def _error(exc: BaseException, code: int) -> NoReturn:
    console.print("[bold red]error:[/] ", end="", highlight=False)
    console.print(str(exc), highlight=False, soft_wrap=True, markup=False)
    raise typer.Exit(code)


def run(
    ctx: typer.Context,
    nproc: Annotated[str, typer.Option("--nproc", "-n", help="Workers: N, or MIN:MAX for an elastic run.", metavar="N|MIN:MAX")] = "1",
    module: Annotated[str | None, typer.Option("--module", "-m", help="Run a module as `python -m MODULE` does.")] = None,
    cpus: Annotated[float, typer.Option(help="CPUs per worker.", parser=finite_float, metavar="N")] = WORKER_CPUS,
    gpus: Annotated[float, typer.Option(help="GPUs per worker (NCCL where the script asks for it).", parser=finite_float, metavar="N")] = 0.0,
    address: Annotated[str | None, typer.Option(help="A Ray cluster's address; default: RAY_ADDRESS, else an embedded local Ray.")] = None,
    max_failures: Annotated[int, typer.Option(help="Restart the whole group this many times after a rank fails (-1: always), as torchrun's --max-restarts.", metavar="N")] = 0,
    init_timeout: Annotated[float, typer.Option(help="Seconds every rank has to call init_process_group after the first did.", parser=finite_float, metavar="SECONDS")] = INIT_TIMEOUT_S,
    channel_timeout: Annotated[float, typer.Option(help="Seconds a connection to a rank's agent channel (run_context()) has to authenticate, and each part of a request to arrive.", parser=finite_float, metavar="SECONDS")] = CHANNEL_TIMEOUT_S,
    resize_interval: Annotated[float | None, typer.Option(help="An elastic run (-n MIN:MAX): seconds between looks for room to grow (default: ScalingConfig.resize_interval_s, 5).", parser=finite_float, metavar="SECONDS")] = None,
    name: Annotated[str | None, typer.Option(help="The run's name (its directory under the storage path).")] = None,
    storage_path: Annotated[str | None, typer.Option(help="Where run directories go (reports and checkpoints of raylight.run_context()).", metavar="DIR")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue run --name from its last committed checkpoint (raylight.run_context().load_checkpoint() returns it); without one it starts from scratch.", metavar=NO_VALUE)] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="Show Ray's own logs too.", metavar=NO_VALUE)] = False,
) -> None:
    """Run SCRIPT [ARGS...] (or -m MODULE [ARGS...]) on N Ray workers, as torchrun would.

    Each rank runs the script as __main__ in its own process with RANK, LOCAL_RANK,
    WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set; its output comes back
    prefixed with \\[rank N]. Exit code: the failing rank's; 2 for usage errors. See
    docs/launch.md.
    """
    args = list(ctx.args)
    try:
        if module is None:
            if not args:
                raise ConfigError("give a script (raylight run -n 2 train.py ARGS) or a module (-m pkg.mod ARGS)")
            if args[0].startswith("-"):
                raise ConfigError(f"no such option {args[0]!r} before the script; see raylight run --help")
            target, args = args[0], args[1:]
        else:
            target = module
        code = launch(
            target, args, module=module is not None, num_workers=parse_size(nproc), cpus=cpus, gpus=gpus,
            address=address, max_failures=max_failures, init_timeout_s=init_timeout, name=name,
            storage_path=storage_path, verbose=True if verbose else None, resize_interval_s=resize_interval,
            channel_timeout_s=channel_timeout,
            resume=resume,
        )
    except USAGE_ERRORS as exc:
        _error(exc, 2)
    except RaylightError as exc:
        _error(exc, 1)
    raise typer.Exit(code)
