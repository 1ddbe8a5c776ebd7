"""`raylight report RUN_DIR`: a finished (or running) run's time, cost and adaptive decisions.

It owns reading a run directory for people: ``status.json``, ``cost.json`` and the
decision and resize rows of ``adaptive.jsonl``, and rendering them as rich tables. The
files are the recorder's; this module only reads them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from raylight.base.cost import Prices, format_cost
from raylight.base.exceptions import ConfigError
from raylight.driver.recorder import CONFIG_FILE, COST_FILE, METRICS_FILE, STATUS_FILE, TRACE_FILE
from raylight.storage.run_dir import RunStorage


@dataclass
class RunReport:
    path: str
    status: dict[str, Any] = field(default_factory=dict)
    cost: dict[str, Any] | None = None
    decisions: list[dict[str, Any]] = field(default_factory=list)  # decision and resized rows
    start: float | None = None  # wall time of the trace's first row: decisions count from it
    num_reports: int = 0


def load_report(path: str) -> RunReport:
    """Read the run directory at ``path`` (a local directory or fsspec URI).

    Raises ConfigError when ``path`` is not a run directory."""
    storage = RunStorage(path.rstrip("/") or path)
    try:
        names = set(storage.entries()) if storage.exists() else set()
    except (OSError, NotADirectoryError):
        names = set()
    if not names & {CONFIG_FILE, STATUS_FILE, METRICS_FILE}:
        raise ConfigError(
            f"{path!r} is not a run directory (no {CONFIG_FILE} or {STATUS_FILE} in it); pass the "
            "directory a run wrote: <storage_path>/<name> (raylight.fit, Result.path) or "
            "--output-directory (raylight train)"
        )
    report = RunReport(path=storage.uri)
    report.status = _json(storage, STATUS_FILE) or {}
    report.cost = _json(storage, COST_FILE)
    if TRACE_FILE in names:
        batch = None  # the global batch that ran up to each row
        undecided: list[dict[str, Any]] = []  # decision rows waiting for the batch they chose
        for line in storage.read_text(TRACE_FILE).splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a torn last line of a run that died mid-write
            if not isinstance(row, dict):
                continue
            if report.start is None and isinstance(row.get("time"), int | float):
                report.start = float(row["time"])
            if row.get("global_batch") is not None:
                batch = row["global_batch"]
                for waiting in undecided:  # a trace written before decided_batch: the next plan's
                    waiting["decided_batch"] = batch
                undecided.clear()
            if row.get("decision") or row.get("event") in ("resized", "notice", "autoscale_request", "allocation"):
                # A decision row's global_batch is the plan that ran up to it; the batch it
                # chose is its decided_batch (the next row's global_batch in older traces).
                entry = {**row, "batch_before": batch}
                report.decisions.append(entry)
                if row.get("decision") == "batch" and row.get("decided_batch") is None:
                    undecided.append(entry)
            elif row.get("event") == "cost" and report.cost is None:
                report.cost = {k: v for k, v in row.items() if k not in ("event", "time")}
    if METRICS_FILE in names:
        report.num_reports = sum(1 for ln in storage.read_text(METRICS_FILE).splitlines() if ln.strip())
    return report


def _json(storage: RunStorage, name: str) -> dict[str, Any] | None:
    if not storage.exists(name):
        return None
    try:
        value = json.loads(storage.read_text(name))
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def reprice(cost: dict[str, Any], prices: Prices) -> dict[str, Any]:
    """``cost`` priced again with ``prices`` (``raylight report --price``)."""
    usd, unpriced = prices.cost(cost.get("node_seconds") or {})
    return {**cost, "prices": dict(prices.usd_per_hour), "cost_usd": usd, "unpriced": unpriced}


def render_report(report: RunReport, console: Console) -> None:
    status = report.status
    state = status.get("state", "unknown")
    console.print(f"[bold]run[/] {report.path}", highlight=False)
    line = f"state: {state}; {report.num_reports} reports"
    if status.get("error"):
        line += f"; error: {status['error']}"
    console.print(line, highlight=False, markup=False)
    console.print(_cost_table(report.cost))
    if report.cost is not None:
        console.print(format_cost(report.cost), highlight=False, markup=False)
    console.print(_decisions_table(report.decisions, report.start))


def _cost_table(cost: dict[str, Any] | None) -> Table | str:
    if cost is None:
        return "cost: no cost.json (the run is still running, or a raylight before cost accounting wrote it)"
    table = Table(title=f"time and cost (wall {cost.get('wall_s', 0.0):.1f} s)", title_justify="left")
    for col in ("what", "kind", "seconds", "hours", "USD/h", "USD"):
        table.add_column(col, justify="left" if col in ("what", "kind") else "right")
    prices = Prices(cost.get("prices") or {})
    for shape, seconds in (cost.get("worker_seconds") or {}).items():
        table.add_row("workers", shape, f"{seconds:.1f}", f"{seconds / 3600:.4f}", "", "")
    for node_type, seconds in (cost.get("node_seconds") or {}).items():
        price = prices.price_of(node_type)
        usd = "" if price is None else f"{seconds / 3600 * price:.4f}"
        table.add_row("nodes", node_type, f"{seconds:.1f}", f"{seconds / 3600:.4f}", "" if price is None else f"{price:g}", usd)
    total = cost.get("cost_usd")
    if total is not None:
        table.add_row("total", "", "", "", "", f"{total:.4f}")
    elif cost.get("unpriced") and cost.get("prices"):
        table.add_row("total", "unknown", "", "", "", f"no price for {', '.join(cost['unpriced'])}")
    else:
        table.add_row("total", "", "", "", "", "no prices given")
    return table


def _decisions_table(rows: list[dict[str, Any]], start: float | None) -> Table | str:
    """Time (since the trace's first row), decision, workers (from->to), global batch
    (from->to), reason."""
    if not rows:
        return "adaptive decisions: none (a fixed-size run, or no decision was made)"
    t0 = start if start is not None else min(float(r.get("time", 0.0)) for r in rows)
    table = Table(title="adaptive decisions", title_justify="left")
    for col in ("time", "decision", "workers", "batch", "reason"):
        table.add_column(col, justify="right" if col in ("time", "workers", "batch") else "left")
    for r in rows:
        when = f"+{float(r.get('time', t0)) - t0:.1f}s"
        before = r.get("batch_before")
        if r.get("event") == "notice":
            left = r.get("deadline")
            due = f", {float(left) - float(r.get('time', 0.0)):.0f}s to its deadline" if left else ""
            node = str(r.get("node", "?"))[:12]
            table.add_row(when, "notice", str(r.get("ranks", "")), "", f"node {node} ({r.get('source')}: {r.get('reason', '')}{due})")
            continue
        if r.get("event") == "allocation":  # the cluster scheduler's answer (driver/controller/cluster_share.py)
            nodes = len(set(r.get("nodes") or []))
            why = str(r.get("waiting") or f"the raylight scheduler's share, on {nodes} node(s), speedup {float(r.get('speedup', 0.0)):.2f}")
            table.add_row(when, "allocation", str(r.get("workers", "")), "", why)
            continue
        if r.get("event") == "autoscale_request":
            table.add_row(when, "autoscale", f"ask {r.get('workers')}", "", str(r.get("reason", "")))
            continue
        if r.get("event") == "resized":
            extra = f" ({r['kind']}, first step {float(r['first_step_s']):.2f}s)" if "first_step_s" in r else ""
            workers = f"{r.get('from', '?')}->{r.get('to', '?')}"
            table.add_row(when, "resize", workers, "" if before is None else str(before), f"{r.get('reason', '')}{extra}")
            continue
        new = r.get("decided_batch")  # None: the run ended before another row said what ran
        if before is not None and new is not None and new != before:
            shown = f"{before}->{new}"
        else:
            shown = str(next((b for b in (new, before) if b is not None), ""))
        table.add_row(when, str(r.get("decision")), str(r.get("workers", "")), shown, str(r.get("reason", "")))
    return table
