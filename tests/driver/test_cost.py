"""Cost accounting: the meter, prices, the telemetry that feeds it and `raylight report`."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from raylight.base.cost import (
    CostMeter,
    PriceError,
    Prices,
    WorkerPlace,
    format_cost,
    load_prices,
    node_type_of,
    parse_price,
    parse_prices,
    prices_env_value,
    prices_from_env,
    shape_of,
)
from raylight.base.exceptions import ConfigError


def _places(*where: tuple[str, str], resources: dict[str, float] | None = None) -> list[WorkerPlace]:
    return [WorkerPlace(rank, node, kind, resources or {"CPU": 1.0}) for rank, (node, kind) in enumerate(where)]


def test_shape_and_node_type():
    assert shape_of({"CPU": 1.0}) == "CPU:1"
    assert shape_of({"GPU": 1, "CPU": 4, "memory": 1e9, "node:1.2.3.4": 1, "TPU": 0}) == "CPU:4,GPU:1"
    assert shape_of({}) == "none"
    assert node_type_of({"ray.io/node-group": "gpu_spot"}, {"CPU": 8}) == "gpu_spot"
    assert node_type_of({"ray.io/node-group": ["cpu"]}, {}) == "cpu"
    assert node_type_of({}, {"CPU": 2, "node:__internal_head__": 1.0}) == "head"
    assert node_type_of({}, {"CPU": 2, "object_store_memory": 1e8}) == "CPU:2"


def test_meter_counts_workers_by_shape_and_nodes_once():
    meter = CostMeter(0.0)
    meter.observe(1.0, _places(("n1", "cpu"), ("n1", "cpu")))  # two workers, one node
    meter.observe(3.0, _places(("n1", "cpu"), ("n1", "cpu"), ("n2", "gpu")))
    meter.observe(4.0, _places(("n2", "gpu"), resources={"CPU": 4, "GPU": 1}))
    meter.stop(6.0)
    meter.observe(9.0, _places(("n1", "cpu")))  # after stop: ignored
    # 1->3: 2 workers on n1; 3->4: 3 workers on n1, n2; 4->6: 1 GPU worker on n2.
    assert meter.worker_seconds == pytest.approx({"CPU:1": 2 * 2 + 3 * 1, "CPU:4,GPU:1": 2})
    assert meter.node_seconds == pytest.approx({"cpu": 3, "gpu": 1 + 2})
    summary = meter.summary(10.0, Prices({"cpu": 3.6, "gpu": 36.0}))
    assert summary["wall_s"] == pytest.approx(6.0)
    assert summary["max_workers"] == 3
    assert summary["cost_usd"] == pytest.approx(3 / 3600 * 3.6 + 3 / 3600 * 36.0)
    assert summary["unpriced"] == []


def test_meter_without_prices_names_unpriced_types():
    meter = CostMeter(0.0)
    meter.observe(0.0, _places(("a", "head"), ("b", "spot")))
    meter.stop(10.0)
    assert meter.summary(10.0)["cost_usd"] is None  # no prices at all
    partial = meter.summary(10.0, Prices({"spot": 1.0}))
    assert partial["cost_usd"] is None and partial["unpriced"] == ["head"]
    default = meter.summary(10.0, Prices({"spot": 1.0, "*": 0.5}))
    assert default["cost_usd"] == pytest.approx(10 / 3600 * 1.5) and default["unpriced"] == []
    assert "no price for head" in format_cost(partial)
    assert "$0.0042" in format_cost(default)


def test_meter_carries_a_resumed_runs_earlier_attempts():
    first = CostMeter(0.0)
    first.observe(0.0, _places(("a", "cpu")))
    first.stop(5.0)
    before = first.summary(5.0)
    second = CostMeter(100.0, previous=json.loads(json.dumps(before)))
    second.observe(100.0, _places(("a", "cpu")))
    second.stop(102.0)
    assert second.summary(102.0)["worker_seconds"] == {"CPU:1": pytest.approx(7.0)}
    assert second.summary(102.0)["wall_s"] == pytest.approx(7.0)


def test_parse_prices():
    assert parse_price("m5.xlarge=0.192") == ("m5.xlarge", 0.192)
    assert parse_price(" gpu = $2.5/h ") == ("gpu", 2.5)
    assert parse_prices(["a=1", "*=0.1", "a=1"]) == {"a": 1.0, "*": 0.1}
    for bad, says in [
        ("m5.xlarge", "expected node_type=USD/h"),
        ("=1", "expected node_type=USD/h"),
        ("a=cheap", "'cheap' is not a number"),
        ("a=-1", "finite number of USD per hour >= 0"),
        ("a=nan", "finite number"),
    ]:
        with pytest.raises(PriceError, match=says) as info:
            parse_price(bad)
        assert repr(bad) in str(info.value) and isinstance(info.value, ConfigError)
    with pytest.raises(PriceError, match="'a' was already given 1"):
        parse_prices(["a=1", "a=2"])


def test_load_prices_yaml_json_and_errors(tmp_path):
    (tmp_path / "p.yaml").write_text("cpu_spot: 0.05\nhead: 0.2\n")
    (tmp_path / "p.json").write_text(json.dumps({"prices": {"gpu": 2}}))
    assert load_prices(str(tmp_path / "p.yaml")) == {"cpu_spot": 0.05, "head": 0.2}
    assert load_prices(str(tmp_path / "p.json")) == {"gpu": 2.0}
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "bad.yaml").write_text("gpu: two\n")
    with pytest.raises(PriceError, match="must map node types to USD per hour"):
        load_prices(str(tmp_path / "list.yaml"))
    with pytest.raises(PriceError, match=r"price of 'gpu' must be a finite number.*'two'"):
        load_prices(str(tmp_path / "bad.yaml"))
    with pytest.raises(PriceError, match="cannot be read"):
        load_prices(str(tmp_path / "absent.yaml"))


def test_prices_env_round_trip():
    table = {"cpu": 0.1, "*": 0.05}
    assert prices_from_env({"RAYLIGHT_PRICES": prices_env_value(table)}) == table
    assert prices_from_env({"RAYLIGHT_PRICES": "cpu=0.1,gpu=2"}) == {"cpu": 0.1, "gpu": 2.0}
    assert prices_from_env({}) is None
    with pytest.raises(PriceError, match="RAYLIGHT_PRICES"):
        prices_from_env({"RAYLIGHT_PRICES": "{not json"})
    with pytest.raises(PriceError, match="RAYLIGHT_PRICES"):
        prices_from_env({"RAYLIGHT_PRICES": '{"a": -3}'})


def test_prices_table_rejects_bad_entries():
    with pytest.raises(PriceError, match="node type '' must be a non-empty string"):
        Prices({"": 1.0})
    assert Prices({"a": 1.0}).price_of("b") is None
    assert Prices({"a": 1.0, "*": 2.0}).price_of("b") == 2.0


def test_run_config_prices():
    from raylight.config import RunConfig
    from raylight.config.validation import validate

    assert validate(RunConfig, {"prices": {"head": 0.2}}).prices == {"head": 0.2}
    with pytest.raises(ConfigError, match="prices: the price of 'a' must be >= 0"):
        validate(RunConfig, {"prices": {"a": -1}})


def test_telemetry_feeds_the_meter_from_polls():
    from raylight.driver.controller.telemetry import RunTelemetry
    from raylight.worker.protocol import GroupPoll, WorkerPoll

    now = [0.0]
    telemetry = RunTelemetry(clock=lambda: now[0])
    placed = tuple(_places(("n1", "head"), ("n1", "head")))
    for t in (1.0, 1.2, 1.4):
        now[0] = t
        telemetry.observe(GroupPoll([WorkerPoll(0, "running"), WorkerPoll(1, "running")], placement=placed), 2)
    telemetry.cost.stop(1.6)
    assert telemetry.cost.worker_seconds == {"CPU:1": pytest.approx(2 * 0.6)}
    assert telemetry.cost.node_seconds == {"head": pytest.approx(0.6)}


# -- raylight report ---------------------------------------------------------------------
def _fake_run(path, *, cost: bool = True) -> None:
    path.mkdir()
    (path / "config.json").write_text("{}")
    (path / "status.json").write_text(json.dumps({"state": "finished", "time": 0}))
    (path / "metrics.jsonl").write_text('{"_report": 0, "loss": 1}\n{"_report": 1, "loss": 0.5}\n')
    rows = [
        {"time": 100.0, "workers": 2, "global_batch": 64},
        {"time": 103.0, "workers": 2, "global_batch": 64, "decision": "batch", "reason": "noise scale grew",
         "decided_batch": 128},
        {"time": 110.5, "event": "resized", "kind": "in_place", "from": 2, "to": 3, "reason": "goodput +12%",
         "first_step_s": 0.04},
        {"time": 111.0, "event": "spare_ready", "workers": 3},
        {"time": 112.0, "event": "autoscale_request", "workers": 4, "reason": "goodput +9% (3 fit now)"},
        {"time": 115.0, "event": "notice", "node": "abcdef0123456789", "source": "drain", "reason": "spot",
         "deadline": 125.0, "ranks": [2]},
        {"time": 120.0, "event": "cost", "wall_s": 20.0, "worker_seconds": {"CPU:1": 50.0},
         "node_seconds": {"head": 20.0}, "prices": {"head": 0.36}, "cost_usd": 0.002, "unpriced": []},
    ]
    (path / "adaptive.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"torn')
    if cost:
        (path / "cost.json").write_text(json.dumps({
            "wall_s": 20.0, "worker_seconds": {"CPU:1": 50.0}, "node_seconds": {"head": 20.0, "spot": 7200.0},
            "prices": {"head": 0.36}, "cost_usd": None, "unpriced": ["spot"],
        }))


def _render(run) -> str:
    from raylight.driver.report import render_report

    console = Console(record=True, width=160)
    render_report(run, console)
    return console.export_text()


def test_report_renders_time_cost_and_decisions(tmp_path):
    from raylight.driver.report import load_report, reprice

    _fake_run(tmp_path / "run")
    run = load_report(str(tmp_path / "run"))
    assert [r.get("decision") or r.get("event") for r in run.decisions] == [
        "batch", "resized", "autoscale_request", "notice",
    ]
    text = _render(run)
    assert "state: finished; 2 reports" in text
    assert "wall 20.0 s" in text and "CPU:1" in text and "50.0" in text
    assert "no price for spot" in text
    assert "+3.0s" in text and "64->128" in text and "noise scale grew" in text
    assert "+10.5s" in text and "2->3" in text and "goodput +12%" in text and "in_place" in text
    assert "ask 4" in text and "goodput +9% (3 fit now)" in text
    assert "node abcdef012345 (drain: spot, 10s to its deadline)" in text
    priced = reprice(run.cost or {}, Prices({"head": 0.36, "spot": 1.0}))
    assert priced["cost_usd"] == pytest.approx(20 / 3600 * 0.36 + 2.0)
    run.cost = priced
    assert "2.0020" in _render(run)


def _decision_rows(text: str) -> list[tuple[str, str]]:
    """(batch column, reason column) of each batch decision in a rendered report."""
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("\u2502")]
        if len(cells) > 5 and cells[2] == "batch":
            out.append((cells[4], cells[5]))
    return out


@pytest.mark.parametrize("recorded", [True, False], ids=["decided_batch", "older-trace"])
def test_report_batch_column_is_the_change_its_reason_names(tmp_path, recorded):
    """The trace rows of a real demo run (adaptive.jsonl): a decision row's global_batch is
    the plan that ran up to it, and the batch it chose runs from the next row on. The
    batch column shows that change on the decision's own row, as its reason says it,
    also for a trace written before decision rows carried decided_batch."""
    path = tmp_path / "run"
    path.mkdir()
    (path / "status.json").write_text(json.dumps({"state": "finished"}))
    chosen = {64: 164, 164: 374, 374: 1320}
    rows = [{"time": 0.0, "workers": 2, "lr_factor": 1.0}]
    for t, batch in ((7.4, 64), (9.4, 164), (12.6, 164), (15.7, 374), (16.4, 1320)):
        row: dict = {"time": t, "workers": 2, "global_batch": batch}
        if t in (7.4, 12.6, 15.7):
            row.update(decision="batch", reason=f"global batch {batch} -> {chosen[batch]}: predicted goodput")
            if recorded:
                row["decided_batch"] = chosen[batch]
        rows.append(row)
    (path / "adaptive.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    from raylight.driver.report import load_report

    shown = _decision_rows(_render(load_report(str(path))))
    assert [batch for batch, _ in shown] == ["64->164", "164->374", "374->1320"]
    for batch, reason in shown:
        assert reason.startswith("global batch " + batch.replace("->", " -> ")), (batch, reason)


def test_report_falls_back_to_the_trace_cost_row(tmp_path):
    from raylight.driver.report import load_report

    _fake_run(tmp_path / "run", cost=False)
    run = load_report(str(tmp_path / "run"))
    assert run.cost is not None and run.cost["cost_usd"] == 0.002
    assert "0.0020" in _render(run)


def test_report_of_a_run_without_cost_or_trace(tmp_path):
    from raylight.driver.report import load_report

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "status.json").write_text('{"state": "running"}')
    text = _render(load_report(str(tmp_path / "run")))
    assert "no cost.json" in text and "adaptive decisions: none" in text


def test_report_cli(tmp_path):
    from typer.testing import CliRunner

    from raylight.cli.main import app

    _fake_run(tmp_path / "run")
    runner = CliRunner()
    ok = runner.invoke(app, ["report", str(tmp_path / "run"), "--price", "spot=1", "--price", "head=0.36"])
    assert ok.exit_code == 0, ok.output
    assert "2.0020" in ok.output and "64->128" in ok.output
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    for bad in (tmp_path / "other", tmp_path / "absent", tmp_path / "other" / "notes.txt"):
        res = runner.invoke(app, ["report", str(bad)])
        assert res.exit_code == 2, res.output
        assert "is not a run directory" in res.output
    res = runner.invoke(app, ["report", str(tmp_path / "run"), "--price", "spot"])
    assert res.exit_code == 2 and "expected node_type=USD/h" in res.output
