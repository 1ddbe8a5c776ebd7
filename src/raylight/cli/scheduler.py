"""`raylight scheduler start|status|stop`: the cluster's goodput scheduler (issue 58).

The scheduler is one detached Ray actor on a running cluster (``raylight.scheduler.actor``),
so these commands connect to a cluster as a driver does (``--address`` HEAD:6379, else
RAY_ADDRESS, else a cluster launcher's head), never to an embedded local Ray: a scheduler
there would die with the command. Exit codes: 0 done, 2 for what the user can fix (no
cluster, an unreachable address, no scheduler running), 1 for a failure at run time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from raylight.base.exceptions import ClusterConnectionError, ConfigError
from raylight.cli.options import NO_VALUE, Command, Group, finite_float
from raylight.cli.prices import PriceOpt, PricesOpt, price_table
from raylight.config.schema import CONNECT_TIMEOUT_S

console = Console(stderr=True)
scheduler_app = typer.Typer(
    cls=Group, no_args_is_help=True,
    help="The cluster's goodput scheduler: one actor that shares the cluster among the runs on it.",
)

# status: how long to wait for the scheduler's answer (it answers in milliseconds).
STATUS_TIMEOUT_S = 30.0

AddressOpt = Annotated[
    str | None,
    typer.Option(
        "--address", "-u",
        help="The cluster's GCS: HEAD:6379 (or ray://HEAD:10001). Default: RAY_ADDRESS, then the cluster launcher's head.",
        metavar="ADDRESS",
    ),
]
TimeoutOpt = Annotated[
    float, typer.Option("--connect-timeout", help="Seconds to wait for the address to answer.", parser=finite_float, metavar="SECONDS")
]


def _usage(message: str) -> NoReturn:
    console.print("[bold red]error:[/] ", end="", highlight=False)
    console.print(message, highlight=False, soft_wrap=True, markup=False)
    raise typer.Exit(2)


def _connect(address: str | None, connect_timeout_s: float) -> None:
    """Connect to the cluster the scheduler serves; refuse to start an embedded Ray."""
    from raylight.driver import runtime

    if runtime.would_start_embedded(address):
        raise ConfigError(
            "no Ray cluster to schedule: the scheduler lives on a running cluster. Give its "
            "address (--address HEAD:6379) or set RAY_ADDRESS; start one with `ray start --head`"
        )
    runtime.connect(address, connect_timeout_s=connect_timeout_s)


def _running() -> Any:
    from raylight.scheduler import actor

    handle = actor.find()
    if handle is None:
        raise ConfigError(
            f"no raylight scheduler runs on this cluster (no actor {actor.SCHEDULER_NAME!r} in namespace "
            f"{actor.NAMESPACE!r}): start one with `raylight scheduler start --address ...`"
        )
    return handle


@scheduler_app.command(cls=Command)
def start(
    address: AddressOpt = None, connect_timeout: TimeoutOpt = CONNECT_TIMEOUT_S,
    cloud: Annotated[bool, typer.Option("--cloud", help="Cloud mode: ask Ray's autoscaler for the nodes the runs' goodput is worth, let idle ones go (docs/scheduler.md).", metavar=NO_VALUE)] = False,
    autoscaling_config: Annotated[str | None, typer.Option("--autoscaling-config", help="Cloud mode: the cluster's autoscaling config (YAML/JSON), for its node types and max_workers.", metavar="FILE")] = None,
    price: PriceOpt = None, prices_file: PricesOpt = None,
    gain_per_usd_h: Annotated[float | None, typer.Option("--gain-per-usd-h", help="Cloud mode: job-speedup a node must add per USD per hour of its price (default 0.25).", parser=finite_float, metavar="SPEEDUP")] = None,
    max_nodes: Annotated[int | None, typer.Option("--max-nodes", help="Cloud mode: the most nodes, the head included (default: the config's max_workers + 1).", metavar="N")] = None,
    release_after_s: Annotated[float | None, typer.Option("--release-after", help="Cloud mode: seconds a node stays unused before it is let go (default 60).", parser=finite_float, metavar="SECONDS")] = None,
    cloud_interval_s: Annotated[float | None, typer.Option("--cloud-interval", help="Cloud mode: seconds between two plans (default 5).", parser=finite_float, metavar="SECONDS")] = None,
) -> None:
    """Start the scheduler on the cluster (nothing changes when it runs already)."""
    from raylight.scheduler import actor

    try:
        settings = _cloud_settings(
            cloud, autoscaling_config, price_table(price, prices_file), gain_per_usd_h=gain_per_usd_h, max_nodes=max_nodes,
            release_after_s=release_after_s, interval_s=cloud_interval_s,
        )
        _connect(address, connect_timeout)
        existed = actor.find() is not None
        actor.start(cloud=settings)
    except (ConfigError, ClusterConnectionError) as exc:
        _usage(str(exc))
    except TimeoutError as exc:
        console.print(f"error: {exc}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1) from None
    mode = " in cloud mode" if settings else ""
    console.print(
        ("the raylight scheduler runs already; its mode and settings stay as they are (stop it, then start it again"
         f"{mode} to change them)") if existed else f"started the raylight scheduler{mode}",
        highlight=False, markup=False,
    )


def _cloud_settings(cloud: bool, config: str | None, prices: dict[str, float] | None, **knobs: Any) -> dict[str, Any] | None:
    """Cloud mode's settings for ``actor.start(cloud=)``; None without --cloud (a cloud
    option without it is refused, not ignored)."""
    given = [k for k, v in knobs.items() if v is not None] + (["--autoscaling-config"] if config else []) + (["--price"] if prices else [])
    if not cloud:
        if given:
            raise ConfigError(f"{', '.join(given)}: cloud mode's settings, given without --cloud; add --cloud or leave them out")
        return None
    if not config:
        raise ConfigError("--cloud needs the node types the autoscaler can add: --autoscaling-config cluster.yaml (the file `ray start --autoscaling-config` or `ray up` takes)")
    from raylight.scheduler.cloud import CloudConfig, load_node_types

    types, most = load_node_types(config)
    settings = {"node_types": types, "prices": prices or {}, **knobs}
    if settings.get("max_nodes") is None:
        settings["max_nodes"] = most
    CloudConfig.of(settings)  # refused here, with the message, not by the actor
    return settings


@scheduler_app.command(cls=Command)
def status(
    address: AddressOpt = None, connect_timeout: TimeoutOpt = CONNECT_TIMEOUT_S,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", help="Also draw the workers per run over time (the scheduler's allocation history) into this PNG.", metavar="PNG"),
    ] = None,
) -> None:
    """The runs the scheduler shares the cluster among: allocation, weight, goodput, speedup, why a run waits."""
    import ray
    import ray.exceptions

    try:
        _connect(address, connect_timeout)
        handle = _running()
    except (ConfigError, ClusterConnectionError) as exc:
        _usage(str(exc))
    try:
        answer = ray.get(handle.status.remote(), timeout=STATUS_TIMEOUT_S)
        history = ray.get(handle.allocation_history.remote(), timeout=STATUS_TIMEOUT_S) if plot else []
    except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as exc:
        console.print(
            f"error: the raylight scheduler did not answer within STATUS_TIMEOUT_S={STATUS_TIMEOUT_S:g} s "
            f"({type(exc).__name__}); check the cluster's health (ray status)",
            highlight=False, markup=False, soft_wrap=True,
        )
        raise typer.Exit(1) from None
    Console().print(status_table(answer))
    if answer.get("cloud"):
        Console().print(cloud_table(answer["cloud"]))
    if plot is not None:
        write_plot(plot, history)


def write_plot(path: Path, history: list[dict[str, Any]]) -> None:
    """The allocation history as a PNG; a path that cannot be written, or no history yet, exits 2."""
    from raylight.scheduler import plot as plotting

    if path.suffix.lower() != ".png":
        _usage(f"--plot {path}: give a .png file name (the plot is a PNG)")
    try:
        plotting.plot_workers(path, plotting.from_history(history), title="workers per run (raylight scheduler)")
    except ValueError as exc:
        _usage(f"--plot {path}: {exc}")
    except OSError as exc:
        _usage(f"--plot {path}: cannot write it ({exc.strerror}); give a path in a folder that exists and you can write")
    console.print(f"wrote {path}", highlight=False, markup=False)


@scheduler_app.command(cls=Command)
def stop(address: AddressOpt = None, connect_timeout: TimeoutOpt = CONNECT_TIMEOUT_S) -> None:
    """Stop the scheduler; the runs keep their last allocation."""
    from raylight.scheduler import actor

    try:
        _connect(address, connect_timeout)
        _running()
        actor.stop()
    except (ConfigError, ClusterConnectionError) as exc:
        _usage(str(exc))
    console.print("stopped the raylight scheduler; the runs keep their last allocation", highlight=False, markup=False)


def _nodes(ids: list[str]) -> str:
    counts: dict[str, int] = {}
    for node in ids:
        counts[node[:8]] = counts.get(node[:8], 0) + 1
    return ", ".join(f"{n}x{c}" if c > 1 else n for n, c in counts.items()) or "-"


def status_table(answer: dict[str, Any]) -> Table:
    """The scheduler's ``status()`` answer as a table: one row per job, in arrival order."""
    slots = answer.get("nodes", {})
    caption = (
        ("(no runs); " if not answer.get("jobs") else "")
        + f"fitness {answer.get('fitness', 0.0):.3f}; {len(slots)} node(s), {sum(slots.values())} slot(s)"
        + (f"; dropped (silent): {', '.join(answer['dropped'])}" if answer.get("dropped") else "")
    )
    table = Table(title="raylight scheduler", caption=caption, caption_justify="left")
    right = ("weight", "workers", "goodput", "speedup", "last report")
    for column in ("job", "kind", "weight", "workers", "nodes", "goodput", "speedup", "last report", "waiting"):
        # a job's id whole, on one line, whatever the terminal's width (the others wrap)
        table.add_column(column, justify="right" if column in right else "left", no_wrap=column == "job")
    for job in answer.get("jobs", []):
        bounds = str(job["min_workers"]) if job["fixed"] else f"{job['min_workers']}-{job['max_workers']}"
        goodput = job.get("goodput")
        target = job.get("target", job["workers"])
        workers = f"{job['workers']} ({bounds})" + (f" -> {target}" if target != job["workers"] else "")
        table.add_row(
            job["job_id"], "fixed" if job["fixed"] else "adaptive", f"{job.get('weight', 1.0):g}", workers,
            _nodes(job.get("nodes", [])), "-" if goodput is None else f"{goodput:.4g}",
            f"{job.get('speedup', 0.0):.2f}", f"{job.get('seconds_since_report', 0.0):.0f} s ago",
            job.get("waiting") or job.get("pending") or "",
        )
    return table


def cloud_table(cloud: dict[str, Any]) -> Table:
    """Cloud mode's part of the status: nodes there and asked for per type, price, why, cost."""
    cost = cloud.get("cost") or {}
    usd = cost.get("cost_usd")
    money = f"${usd:.4f}" if usd is not None else (
        f"unknown (no price for {', '.join(cost.get('unpriced', []))})" if cost.get("unpriced") else "no prices given")
    hours = ", ".join(f"{k} {v / 3600:.3g} h" for k, v in (cost.get("node_seconds") or {}).items()) or "none"
    settings = cloud.get("settings") or {}
    caption = (
        f"cost so far: {money} (node-hours: {hours}); gain_per_usd_h {settings.get('gain_per_usd_h')}, "
        f"max_nodes {settings.get('max_nodes')}, release after {settings.get('release_after_s')} s"
        + (f"; last plan failed: {cloud['error']}" if cloud.get("error") else "")
        + "".join(f"\nwhy: {reason}" for row in (cloud.get("history") or [])[-5:] for reason in row.get("reasons", []))
    )
    table = Table(title="cloud mode", caption=caption, caption_justify="left")
    for column in ("node type", "nodes", "asked for", "slots", "USD/h", "max"):
        table.add_column(column, justify="left" if column == "node type" else "right")
    types = cloud.get("node_types") or {}
    for name in sorted(set(types) | set(cloud.get("nodes") or {})):
        spec = types.get(name, {})
        price = spec.get("price_per_hour")
        table.add_row(
            name, str((cloud.get("nodes") or {}).get(name, 0)),
            str((cloud.get("asked") or {}).get(name, 0)) if name in types else "-",
            str(spec.get("slots", "-")), "-" if price is None else f"{price:g}",
            "-" if spec.get("max") is None else str(spec["max"]),
        )
    return table
