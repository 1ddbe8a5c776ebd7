import json
import os
from pathlib import Path

import pytest
import torch

from raylight.base.exceptions import ConfigError
from raylight.driver.recorder import RunRecorder
from raylight.storage.checkpoint import Checkpoint, deserialize_state, serialize_state
from raylight.storage.run_dir import RunStorage
from raylight.worker.protocol import Report
from tests.hostile import as_torch_file, hostile_pickles


def _state(v: float) -> bytes:
    return serialize_state({"w": torch.full((3,), v), "epoch": int(v), "name": "x", "nested": {"l": [1, 2]}})


def test_state_round_trip_is_weights_only():
    state = {"model": torch.nn.Linear(2, 2).state_dict(), "opt": {"lr": 0.1}, "tags": ["a"]}
    back = deserialize_state(serialize_state(state))
    assert torch.equal(back["model"]["weight"], state["model"]["weight"])
    assert back["opt"] == {"lr": 0.1} and back["tags"] == ["a"]


def test_unsafe_pickle_is_refused():
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    with pytest.raises(pickle.UnpicklingError, match=r"[Ww]eights only"):
        deserialize_state(pickle.dumps({"x": Evil()}, protocol=2))


def test_checkpoint_must_be_a_dict():
    with pytest.raises(TypeError, match="must be a dict"):
        serialize_state([1, 2])  # type: ignore[arg-type]


@pytest.mark.parametrize("state", [[1, 2], torch.ones(2), 3])
def test_a_state_file_that_is_not_a_dict_is_refused_naming_the_file(tmp_path, state):
    torch.save(state, tmp_path / "state.pt")
    with pytest.raises(ConfigError, match=rf"checkpoint file {tmp_path}/state.pt holds a {type(state).__name__}, not a dict: .*torch.save\(\{{'model'"):
        Checkpoint(str(tmp_path)).load()


@pytest.mark.parametrize("uri_kind", ["local", "memory"])
def test_commit_list_and_keep_last(tmp_path, uri_kind):
    uri = str(tmp_path / "run") if uri_kind == "local" else f"memory://rl-{tmp_path.name}/run"
    storage = RunStorage(uri)
    rec = RunRecorder(storage, checkpoints_to_keep=2)
    rec.open({"a": 1}, resume=False)
    for i in range(4):
        rec.record(Report({"step": i}, _state(float(i)), time=i), num_workers=2)
    kept = storage.list_checkpoints()
    assert [c.index for c in kept] == [2, 3]
    assert Checkpoint(kept[-1].path).load()["epoch"] == 3
    assert rec.latest is not None and rec.latest.load()["epoch"] == 3
    lines = storage.read_text("metrics.jsonl").splitlines()
    assert [json.loads(ln)["step"] for ln in lines] == [0, 1, 2, 3]


def test_partial_checkpoint_is_ignored(tmp_path):
    storage = RunStorage(str(tmp_path))
    storage.commit_checkpoint(0, _state(1.0), {"index": 0, "report": 0})
    # A crash mid-write: state written, commit marker never written.
    partial = tmp_path / "checkpoints" / "checkpoint_000001"
    partial.mkdir()
    (partial / "state.pt").write_bytes(b"\x00garbage")
    # A crash before the rename: the temp directory of a local write.
    (tmp_path / "checkpoints" / ".tmp-checkpoint_000002-abc").mkdir()
    found = storage.list_checkpoints()
    assert [c.index for c in found] == [0]
    assert Checkpoint(found[0].path).load()["epoch"] == 1


@pytest.mark.parametrize("checkpoint", [True, False], ids=["with a checkpoint", "finished without one"])
def test_existing_run_needs_resume(tmp_path, checkpoint):
    storage = RunStorage(str(tmp_path / "r"))
    rec = RunRecorder(storage, checkpoints_to_keep=1)
    rec.open({}, resume=False)
    rec.record(Report({"e": 0}, _state(0.0) if checkpoint else None), num_workers=1)
    rec.close()
    with pytest.raises(ConfigError, match="resume=True"):
        RunRecorder(storage, checkpoints_to_keep=1).open({}, resume=False)


def test_resume_drops_reports_after_last_checkpoint(tmp_path):
    storage = RunStorage(str(tmp_path / "r"))
    rec = RunRecorder(storage, checkpoints_to_keep=3)
    rec.open({}, resume=False)
    rec.record(Report({"e": 0}, _state(0.0)), num_workers=1)
    rec.record(Report({"e": 1}, _state(1.0)), num_workers=1)
    rec.record(Report({"e": 2}), num_workers=1)  # no checkpoint: will be redone
    rec.close(RuntimeError("the driver stopped"))
    again = RunRecorder(storage, checkpoints_to_keep=3)
    ckpt = again.open({}, resume=True)
    assert ckpt is not None and ckpt.load()["epoch"] == 1
    assert again.history == [{"e": 0}, {"e": 1}]
    again.record(Report({"e": 2}, _state(2.0)), num_workers=1)
    rows = [json.loads(x) for x in storage.read_text("metrics.jsonl").splitlines()]
    assert [r["e"] for r in rows] == [0, 1, 2] and [r["_report"] for r in rows] == [0, 1, 2]
    assert [c.index for c in storage.list_checkpoints()] == [0, 1, 2]


def test_rollback_forgets_uncommitted_reports(tmp_path):
    rec = RunRecorder(RunStorage(str(tmp_path)), checkpoints_to_keep=1)
    rec.open({}, resume=False)
    rec.record(Report({"e": 0}), num_workers=1)
    rec.rollback()
    assert rec.history == []
    rec.record(Report({"e": 0}, _state(0.0)), num_workers=1)
    rec.record(Report({"e": 1}), num_workers=1)
    rec.rollback()
    assert rec.history == [{"e": 0}]
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1


def test_atomic_file_write_leaves_no_temp(tmp_path):
    storage = RunStorage(str(tmp_path))
    storage.write_text("a/config.json", "{}")
    storage.write_text("a/config.json", '{"x": 1}')
    assert os.listdir(tmp_path / "a") == ["config.json"]
    assert storage.read_text("a/config.json") == '{"x": 1}'


def test_restart_deserializes_the_checkpoint_once_and_load_returns_fresh_objects(monkeypatch):
    import raylight.storage.checkpoint as ckpt_mod
    from raylight.storage.checkpoint import RAYLIGHT_KEY
    from raylight.worker.checkpoints import raylight_state

    data = serialize_state({"w": torch.ones(2), RAYLIGHT_KEY: {"commit": 3}})
    calls = []
    real = ckpt_mod.deserialize_state
    monkeypatch.setattr(ckpt_mod, "deserialize_state", lambda b, *source: calls.append(1) or real(b, *source))
    ckpt = Checkpoint(None, data=data)
    assert raylight_state(ckpt) == {"commit": 3}  # what a worker's context reads first
    first = ckpt.load()
    assert len(calls) == 1 and set(first) == {"w"}
    first["w"].add_(1)
    second = ckpt.load()
    assert torch.equal(second["w"], torch.ones(2)) and len(calls) == 2


@pytest.mark.parametrize("shape", sorted(hostile_pickles(Path("m"))))
def test_a_hostile_state_file_runs_nothing_and_is_refused_naming_the_file(tmp_path, shape):
    """Issue 53: every place that unpickles bytes from storage, with pickles that would
    run code in several shapes (tests/hostile.py)."""
    import pickle

    marker = tmp_path / "ran"
    ckpt_dir = tmp_path / "checkpoint_000003"
    ckpt_dir.mkdir()
    (ckpt_dir / "state.pt").write_bytes(as_torch_file(hostile_pickles(marker)[shape]))
    ckpt = Checkpoint(str(ckpt_dir))
    for load in (ckpt.load, ckpt.full_state):
        with pytest.raises(pickle.UnpicklingError) as info:
            load()
        message = str(info.value)
        assert f"checkpoint file {ckpt_dir}/state.pt" in message
        assert "unsupported" in message.lower() and "weights_only=False" not in message  # never the advice to load it unsafely
    with pytest.raises(pickle.UnpicklingError, match="in-memory checkpoint"):
        Checkpoint(None, data=as_torch_file(hostile_pickles(marker)[shape])).load()
    assert not marker.exists()
