"""`raylight` commands. Each parses its options, loads the config and calls the library.

Exit codes: 0 success, 2 usage or configuration errors (bad flags, config, dataset,
cluster address, resources), 1 failures at run time.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, NoReturn

import typer
import yaml
from rich.console import Console

from raylight.base.exceptions import (
    ClusterConnectionError,
    ConfigError,
    InsufficientResourcesError,
    PreemptedError,
    RaylightError,
    RunInUseError,
)
from raylight.cli.extras import require
from raylight.cli.jobs import jobs_app, submit
from raylight.cli.launch import CONTEXT as RUN_CONTEXT
from raylight.cli.launch import run
from raylight.cli.options import NO_VALUE, Command, Group
from raylight.cli.prices import PriceOpt, PricesOpt, price_table
from raylight.cli.scheduler import scheduler_app

# Tracebacks of genuine failures never print local variables (they may hold secrets).
app = typer.Typer(
    cls=Group,
    add_completion=False,
    no_args_is_help=True,
    help="Distributed, adaptive training on Ray.",
    pretty_exceptions_show_locals=False,
)
USAGE_ERRORS = (ConfigError, ClusterConnectionError, InsufficientResourcesError, RunInUseError)
console = Console(stderr=True)

ConfigOpt = Annotated[str, typer.Option("--config", "-c", help="YAML config: local path or fsspec URI.")]
DatasetOpt = Annotated[str, typer.Option("--dataset", "-d", help="CSV, Parquet or JSON-lines file, glob or URI.")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a config key: trainer.epochs=5 (repeatable).", metavar="KEY=VALUE")]
BackendOpt = Annotated[str | None, typer.Option(help="local, ray or launcher (overrides backend.type).")]
QuietOpt = Annotated[bool, typer.Option(help="No progress display.", metavar=NO_VALUE)]
VerboseOpt = Annotated[
    bool, typer.Option("--verbose", help="Show Ray's own logs too (Ray Data's progress, Ray's INFO lines); RAYLIGHT_VERBOSE=1 does the same.", metavar=NO_VALUE)
]
ModelPathOpt = Annotated[str, typer.Option(help="<output-directory>/model of a trained run.", metavar="DIR")]
ResumeOpt = Annotated[
    bool, typer.Option("--resume", help="Continue the unfinished (killed) run in --output-directory from its last checkpoint, with the same config and dataset.", metavar=NO_VALUE)
]


@app.callback()
def _main(
    local_rank: Annotated[int | None, typer.Option("--local_rank", "--local-rank", hidden=True)] = None,
) -> None:
    """Distributed, adaptive training on Ray."""
    # `deepspeed --no_python raylight ...` puts --local_rank=N first unless given
    # --no_local_rank; LOCAL_RANK says the same, and that is what raylight reads.


def _fail(exc: BaseException) -> None:
    """Exit 2 for what the user can fix (config, data, paths, cluster, resources, a run in
    use), 1 for failures at run time; the message, never a traceback."""
    console.print("[bold red]error:[/] ", end="", highlight=False)
    console.print(str(exc), highlight=False, soft_wrap=True, markup=False)  # [x] in text stays
    if isinstance(exc, PreemptedError):  # raylight submit --retries resubmits it
        from raylight.base.exit_codes import PREEMPTED_EXIT_CODE

        raise typer.Exit(PREEMPTED_EXIT_CODE)
    raise typer.Exit(2 if isinstance(exc, USAGE_ERRORS) else 1)


def _verbose(verbose: bool) -> None:
    """--verbose: Ray's output comes back (raylight.base.verbosity), for this process and
    the Ray processes it starts."""
    if verbose:
        import os

        from raylight.base import verbosity

        os.environ[verbosity.ENV] = "1"
        verbosity.apply(True)


def _config(path: str, overrides: list[str] | None):
    from raylight.declarative.loading import load_config

    return load_config(path, overrides or [])


@app.command(cls=Command)
def train(
    config: ConfigOpt,
    dataset: DatasetOpt,
    output_directory: Annotated[str, typer.Option(help="Where the run is written.", metavar="DIR")] = "results/run",
    backend: BackendOpt = None,
    set_: SetOpt = None,
    quiet: QuietOpt = False,
    price: PriceOpt = None,
    prices: PricesOpt = None,
    verbose: VerboseOpt = False,
    resume: ResumeOpt = False,
) -> None:
    """Train a model described by CONFIG on DATASET."""
    require("train", "declarative")
    from raylight.base.cost import format_cost
    from raylight.declarative import api

    _verbose(verbose)
    try:
        table = price_table(price, prices)
        out = api.train(
            _config(config, set_), dataset, output_directory=output_directory, backend=backend,
            progress=not quiet, prices=table, resume=resume,
        )
    except RaylightError as exc:
        _fail(exc)
    if out.get("rank", 0) != 0:  # under a launcher, rank 0 reports for every rank
        return
    console.print_json(json.dumps(out["evaluation"]))
    console.print(f"model: {out['model_path']}", highlight=False, markup=False, soft_wrap=True)
    if out.get("cost"):
        console.print(f"cost: {format_cost(out['cost'])}", highlight=False, markup=False, soft_wrap=True)


@app.command(cls=Command)
def experiment(
    config: ConfigOpt,
    dataset: DatasetOpt,
    output_directory: Annotated[str, typer.Option(help="Where the run is written.", metavar="DIR")] = "results/experiment",
    backend: BackendOpt = None,
    set_: SetOpt = None,
    quiet: QuietOpt = False,
    price: PriceOpt = None,
    prices: PricesOpt = None,
    verbose: VerboseOpt = False,
    resume: ResumeOpt = False,
) -> None:
    """Train, then evaluate on the test split (written to evaluation.json)."""
    require("experiment", "declarative")
    train(config, dataset, output_directory, backend, set_, quiet, price, prices, verbose, resume)


@app.command(cls=Command)
def hyperopt(
    config: ConfigOpt,
    dataset: DatasetOpt,
    output_directory: Annotated[str, typer.Option(help="Where the search is written.", metavar="DIR")] = "results/hyperopt",
    set_: SetOpt = None,
    quiet: Annotated[bool, typer.Option(help="No progress display or results table.", metavar=NO_VALUE)] = False,
    verbose: VerboseOpt = False,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the search in --output-directory that was cut short: finished trials are kept, the others continue from their last checkpoint.", metavar=NO_VALUE)
    ] = False,
) -> None:
    """Search the hyperopt: section's parameters on Ray Tune; each trial trains on raylight workers."""
    require("hyperopt", "declarative")
    _verbose(verbose)
    try:
        from raylight.declarative.hyperopt import hyperopt as run_search

        out = run_search(_config(config, set_), dataset, output_directory=output_directory, progress=not quiet, resume=resume)
    except RaylightError as exc:
        _fail(exc)
    console.print_json(json.dumps({k: out[k] for k in ("best", "best_metric", "metric", "num_trials")}, default=str))
    console.print(f"trials at once: {out['max_concurrent_trials']} ({out['concurrency']})", highlight=False)
    console.print(f"results: {out['results_csv']}; plot: {out['plot']}")
    console.print(f"best config: {out['best_config']}")


@app.command(cls=Command)
def evaluate(
    model_path: ModelPathOpt,
    dataset: DatasetOpt,
    verbose: VerboseOpt = False,
) -> None:
    """Evaluate a trained model on DATASET."""
    require("evaluate", "declarative")
    from raylight.declarative import api

    _verbose(verbose)
    try:
        metrics = api.evaluate(model_path, dataset)
    except RaylightError as exc:
        _fail(exc)
    if metrics is not None:  # None: a launcher's other ranks; rank 0 prints
        print(json.dumps(metrics, indent=2))


@app.command(cls=Command)
def predict(
    model_path: ModelPathOpt,
    dataset: DatasetOpt,
    output: Annotated[str | None, typer.Option(help="predictions.csv, .parquet or .jsonl; default: stdout as CSV.", metavar="FILE")] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Predict one row per input row, in order."""
    require("predict", "declarative")
    from raylight.declarative import api

    _verbose(verbose)
    try:
        frame = api.predict(model_path, dataset, output)
    except RaylightError as exc:
        _fail(exc)
    if output is None and frame is not None:
        api.csv_ready(frame).to_csv(sys.stdout, index=False)


@app.command("init-config", cls=Command)
def init_config(
    dataset: DatasetOpt,
    target: Annotated[str, typer.Option(help="The column to predict.", metavar="COLUMN")],
    output: Annotated[str | None, typer.Option(help="Write the config here; default: stdout.", metavar="FILE")] = None,
) -> None:
    """Infer feature types from DATASET and write a config."""
    require("init-config", "declarative")
    from raylight.declarative import api

    try:
        text = yaml.safe_dump(api.init_config(dataset, target, output), sort_keys=False)
    except RaylightError as exc:
        _fail(exc)
    if output:
        from raylight.storage.run_dir import atomic_write

        atomic_write(output, text)
    else:
        print(text, end="")


@app.command("render-config", cls=Command)
def render_config(config: ConfigOpt, set_: SetOpt = None) -> None:
    """Print the fully resolved config, every default written out."""
    require("render-config", "declarative")
    from raylight.declarative.loading import render_config as render

    try:
        print(render(_config(config, set_)), end="")
    except RaylightError as exc:
        _fail(exc)


@app.command(cls=Command)
def check(config: ConfigOpt, dataset: DatasetOpt, set_: SetOpt = None, verbose: VerboseOpt = False) -> None:
    """Validate CONFIG against DATASET without training."""
    require("check", "declarative")
    from raylight.declarative import api

    _verbose(verbose)
    try:
        cfg = _config(config, set_)
        prepared = api.prepare(cfg, dataset, use_cache=False)
    except RaylightError as exc:
        _fail(exc)
    rows = len(next(iter(prepared.train.values())))
    targets = ", ".join(repr(out.name) for out in cfg.output_features)
    console.print(f"ok: {len(cfg.input_features)} inputs, target{'s' if len(cfg.output_features) > 1 else ''} {targets}, {rows} training rows")


@app.command(cls=Command)
def report(
    run_dir: Annotated[str, typer.Argument(help="A run directory: <storage_path>/<name> or train's --output-directory.")],
    price: PriceOpt = None,
    prices: PricesOpt = None,
) -> None:
    """Print a run's time, cost and adaptive decisions (--price prices it again)."""
    from rich.console import Console as StdoutConsole

    from raylight.base.cost import Prices
    from raylight.driver.report import load_report, render_report, reprice

    try:
        table = price_table(price, prices)
        run = load_report(run_dir)
    except RaylightError as exc:
        _fail(exc)
    if table is not None and run.cost is not None:
        run.cost = reprice(run.cost, Prices(table))
    render_report(run, StdoutConsole())


app.command(cls=Command)(submit)
app.command("run", cls=Command, context_settings=RUN_CONTEXT, options_metavar="[OPTIONS] (SCRIPT | -m MODULE) [ARGS]...")(run)
app.add_typer(jobs_app, name="jobs")
app.add_typer(scheduler_app, name="scheduler")


def main() -> None:
    try:
        app()
    except SystemExit as exc:  # typer always ends this way
        exit_now(exc.code)
    exit_now(0)


def exit_now(code: int | str | None) -> NoReturn:
    """Exit as ``sys.exit(code)`` would, without the interpreter's teardown.

    Everything that matters at exit still runs: the atexit handlers (the embedded Ray's
    shutdown, loggers, ``logging.shutdown``) and the flush of stdout and stderr. What is
    skipped is freeing every module, which with torch and Ray loaded took 0.7-1.0 s of
    every command measured here (torch alone 0.35 s): the run's files are all closed by then.
    A thread Python would wait for (not a daemon) keeps the ordinary exit."""
    import atexit
    import os
    import threading

    main_thread = threading.main_thread()
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not main_thread):
        sys.exit(code)
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): printed, exit status 1
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can reach it
            pass
    os._exit(code)
