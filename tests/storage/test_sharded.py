"""Sharded checkpoints (``raylight.storage.sharded``, ``TrainContext.report`` / ``load_checkpoint``)
on real gloo processes, no Ray: every rank writes its FSDP2 shards with DCP, the driver's
``RunStorage.commit_sharded`` commits them, and the checkpoint loads back resharded into 1
and 3 workers, whole into one process, and under DDP."""

import io
import os
import pathlib
import pickle
from collections import OrderedDict

import pytest
import torch
import torch.distributed as dist
from torch import nn

from raylight.config import FSDP
from raylight.storage import sharded
from raylight.storage.checkpoint import Checkpoint
from raylight.storage.run_dir import META_FILE, RunStorage, ShardsNotFoundError, checkpoint_name
from raylight.worker.context import TrainContext
from raylight.worker.strategies import DDPStrategy, FSDPStrategy
from tests.helpers import Sink, run_gloo_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]

GLOBAL_BATCH, SAVE_AT, STEPS = 24, 3, 6
# fp32 after 3 more Adam steps at another world size: the gradients are reduced in another
# order (1, 2 or 3 ranks), so they differ in the last bits; Adam moves each weight by up to
# lr = 1e-3 a step, and 1e-5 is 1% of one step (see test_fsdp_gloo.py).
TOL = 1e-5


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 33), nn.Tanh(), nn.Sequential(nn.Linear(33, 33), nn.Tanh()), nn.Linear(33, 3))


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    x = torch.randn(GLOBAL_BATCH, 8, generator=gen)
    return x, torch.stack([x.sum(1).sin(), x[:, 0], x[:, 1] * x[:, 2]], 1)


def train(model, opt, rank: int, world: int, steps: range) -> None:
    per = GLOBAL_BATCH // world
    for step in steps:
        x, y = global_batch(step)
        opt.zero_grad()
        ((model(x[rank * per : (rank + 1) * per]) - y[rank * per : (rank + 1) * per]) ** 2).mean().backward()
        opt.step()


def full_params(strategy, model) -> dict[str, list[float]]:
    state = strategy.full_state(strategy.unwrap_model(model).state_dict())
    return {k: v.reshape(-1).tolist() for k, v in state.items()}


def full_adam(strategy, opt) -> list[list[float]]:
    state = strategy.full_state(opt.state_dict())["state"]
    return [state[i]["exp_avg"].reshape(-1).tolist() for i in sorted(state)]


def context(rank, world, sink, strategy, checkpoint=None, directory=None):
    return TrainContext(
        rank=rank, local_rank=rank, world_size=world, local_world_size=world, node_rank=0,
        device=torch.device("cpu"), sink=sink, checkpoint=checkpoint, strategy=strategy,
        checkpoint_dir=directory, next_checkpoint=0,
    )


def writer(rank: int, port: int, directory: str, queue) -> None:
    """World 2, FSDP: train SAVE_AT steps, report a sharded checkpoint, train on."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.TCPStore("127.0.0.1", port, 2, rank == 0), rank=rank, world_size=2)
    try:
        strategy = FSDPStrategy(FSDP(min_block_params=100))
        sink = Sink()
        ctx = context(rank, 2, sink, strategy, directory=directory)
        model = ctx.prepare_model(make_model())
        opt = ctx.prepare_optimizer(torch.optim.Adam(model.parameters(), lr=1e-3))
        train(model, opt, rank, 2, range(SAVE_AT))
        ctx.report(
            {"loss": 1.0},
            checkpoint={"model": model, "opt": opt, "epoch": 2, "extra": torch.arange(5), "raw": model.state_dict()},
        )
        out = {"rank": rank, "saved": full_params(strategy, model), "adam": full_adam(strategy, opt)}
        train(model, opt, rank, 2, range(SAVE_AT, STEPS))
        out["final"] = full_params(strategy, model)
        if rank == 0:
            report = sink.reports[0]
            out["report"] = (report.checkpoint, report.sharded_index)
            out["local_files"] = sorted(os.listdir(f"{directory}/{checkpoint_name(0)}"))
        queue.put(out)
    finally:
        dist.destroy_process_group()


def reader(rank: int, port: int, world: int, kind: str, path: str, data: bytes, queue) -> None:
    """Load the checkpoint at ``world`` workers under ``kind`` and train on to STEPS."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.TCPStore("127.0.0.1", port, world, rank == 0), rank=rank, world_size=world)
    try:
        strategy = FSDPStrategy(FSDP(min_block_params=100)) if kind == "fsdp" else DDPStrategy()
        ckpt = Checkpoint(path, metadata={"index": 0}, data=data)
        ctx = context(rank, world, Sink(), strategy, checkpoint=ckpt)
        model = ctx.prepare_model(make_model())
        opt = ctx.prepare_optimizer(torch.optim.Adam(model.parameters(), lr=1e-3))
        rest = ctx.load_checkpoint({"model": model, "opt": opt})
        out = {
            "rank": rank,
            "rest": {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in rest.items() if k != "raw"},
            "raw_keys": sorted(rest["raw"]),
            "loaded": full_params(strategy, model),
            "adam": full_adam(strategy, opt),
        }
        if kind == "fsdp":
            out["local_rows"] = model[0].weight.to_local().shape[0] if world > 1 else None
        train(model, opt, rank, world, range(SAVE_AT, STEPS))
        out["final"] = full_params(strategy, model)
        if kind == "fsdp" and world == 3:  # a model that does not match is refused by name
            other = ctx.prepare_model(nn.Sequential(nn.Linear(8, 33)))
            try:
                ctx.load_checkpoint({"model": other})
            except ValueError as exc:
                out["mismatch"] = str(exc)
        queue.put(out)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    storage = RunStorage(str(root))
    directory = f"{root}/checkpoints"
    ranks = run_gloo_ranks(writer, directory, timeout_s=150)
    data, index = ranks[0]["report"]
    uri, meta = storage.commit_sharded(index, data, {"index": index})
    assert meta["format"] == "sharded" and meta["index"] == index
    return {"ranks": ranks, "storage": storage, "uri": uri, "data": data, "index": index}


@pytest.fixture(scope="module")
def read(written):
    out = {}
    for world, kind in ((1, "fsdp"), (3, "fsdp"), (2, "fsdp"), (2, "ddp")):
        out[(world, kind)] = run_gloo_ranks(
            reader, world, kind, written["uri"], written["data"], world_size=world, timeout_s=150
        )
    return out


def close(a, b, tol):
    assert a.keys() == b.keys()
    for key in a:
        assert a[key] == pytest.approx(b[key], abs=tol), key


def test_every_rank_writes_its_shards_and_the_driver_commits_them(written):
    files = written["ranks"][0]["local_files"]
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(files)
    assert "state.pt" not in files and META_FILE not in files, "the workers commit nothing"
    committed = written["storage"].list_checkpoints()
    assert [c.index for c in committed] == [0]
    meta = committed[0].meta
    assert meta["format"] == "sharded" and set(meta["files"]) == {"__0_0.distcp", "__1_0.distcp", ".metadata"}
    assert len(written["data"]) < 20_000, "the skeleton holds no tensors"


def test_load_gives_the_whole_state_in_one_process(written):
    state = Checkpoint(written["uri"], data=written["data"]).load()
    assert state["epoch"] == 2 and state["extra"].tolist() == [0, 1, 2, 3, 4]
    saved = written["ranks"][0]["saved"]
    assert {k: v.reshape(-1).tolist() for k, v in state["model"].items()} == saved
    assert type(state["model"]["0.weight"]) is torch.Tensor, "plain tensors, not DTensors"
    assert set(state["opt"]["state"]) == {f"model.{k}" for k in saved}, "optimizer state keyed by name"
    assert state["raw"]["0.weight"].shape == (33, 8)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_a_checkpoint_written_by_two_loads_into_any_world_size(written, read, world):
    ranks = read[(world, "fsdp")]
    saved = written["ranks"][0]
    for rank in range(world):
        assert ranks[rank]["loaded"] == saved["saved"], "model restored bit for bit"
        assert ranks[rank]["adam"] == saved["adam"], "Adam's moments restored bit for bit"
        assert ranks[rank]["rest"] == {"epoch": 2, "extra": [0, 1, 2, 3, 4]}
        assert ranks[rank]["raw_keys"] == sorted(saved["saved"])
    if world == 3:
        assert [ranks[r]["local_rows"] for r in range(3)] == [11, 11, 11], "resharded to thirds"
    close(ranks[0]["final"], saved["final"], 0 if world == 2 else TOL)


def test_a_sharded_checkpoint_resumes_under_ddp(written, read):
    ranks = read[(2, "ddp")]
    assert ranks[0]["loaded"] == written["ranks"][0]["saved"]
    close(ranks[0]["final"], written["ranks"][0]["final"], TOL)


def test_loading_into_a_model_that_does_not_match_names_the_keys(read):
    message = read[(3, "fsdp")][0]["mismatch"]
    assert "only in the checkpoint" in message and "model.2.0.weight" in message


def test_commit_refuses_missing_shards_and_removes_stray_files(tmp_path, written):
    storage = RunStorage(str(tmp_path))
    source = f"{written['storage'].root}/checkpoints/{checkpoint_name(0)}"
    target = tmp_path / "checkpoints" / checkpoint_name(4)
    target.mkdir(parents=True)
    for name in (".metadata", "__0_0.distcp"):  # rank 1's shard never arrived
        (target / name).write_bytes(pathlib.Path(f"{source}/{name}").read_bytes())
    with pytest.raises(ShardsNotFoundError, match=r"__1_0.distcp.*storage_path") as info:
        storage.commit_sharded(4, written["data"], {"index": 4})
    assert "checkpoint='full'" in str(info.value)
    assert storage.list_checkpoints() == [], "nothing committed"
    (target / "__1_0.distcp").write_bytes(pathlib.Path(f"{source}/__1_0.distcp").read_bytes())
    (target / "__2_0.distcp").write_bytes(b"left by an attempt at 3 workers")
    storage.commit_sharded(4, written["data"], {"index": 4})
    assert not (target / "__2_0.distcp").exists()
    committed = storage.list_checkpoints()
    assert [c.index for c in committed] == [4]
    assert storage.check_shards(4, committed[0].meta) is None
    (target / "__1_0.distcp").write_bytes(b"truncated")
    assert "__1_0.distcp has 9 bytes" in storage.check_shards(4, committed[0].meta)


def test_a_worker_that_cannot_see_the_checkpoint_directory_says_what_storage_to_use(tmp_path):
    """A worker on another machine than the driver, with a storage_path on the driver's
    disk: it reads (or cannot write) the shards on its own disk."""
    elsewhere = tmp_path / "on-the-driver" / "checkpoints" / checkpoint_name(0)
    with pytest.raises(RuntimeError, match=rf"cannot load the sharded checkpoint {elsewhere}: .*does not see {elsewhere}\. Sharded checkpoints .*storage_path.*s3://"):
        sharded.load_into({"w": torch.zeros(2)}, str(elsewhere), collective=False)
    (tmp_path / "read-only").mkdir(mode=0o500)
    if os.access(tmp_path / "read-only", os.W_OK):
        return  # root writes anywhere: the failed write below cannot happen here
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match=r"cannot write the sharded checkpoint .*storage_path"):
            sharded.save({"w": torch.zeros(2)}, str(tmp_path / "read-only" / "run" / "checkpoints" / checkpoint_name(0)))
    finally:
        dist.destroy_process_group()


def test_uncommitted_shards_are_cleared_from_the_next_index_on(tmp_path):
    storage = RunStorage(str(tmp_path))
    for index in (1, 2, 3):
        (tmp_path / "checkpoints" / checkpoint_name(index)).mkdir(parents=True)
    (tmp_path / "checkpoints" / checkpoint_name(1) / META_FILE).write_text("{}")
    assert storage.clear_uncommitted(2) == [f"checkpoints/{checkpoint_name(i)}" for i in (2, 3)]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == [checkpoint_name(1)]


class _Payload:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def _str(text: str) -> bytes:
    data = text.encode()
    return b"\x8c" + bytes([len(data)]) + data  # SHORT_BINUNICODE


def _hostile_manifests(marker: pathlib.Path) -> dict[str, bytes]:
    """Manifests that would create ``marker`` if unpickled naively, of several shapes."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata

    command = f"touch {marker}"
    module = "torch.distributed.checkpoint.metadata"  # it imports os
    return {
        # protocol 4 resolves a dotted name through the module's globals: os.system
        "dotted STACK_GLOBAL": b"\x80\x04" + _str(module) + _str("os.system") + b"\x93" + _str(command) + b"\x85R.",
        "dotted GLOBAL": b"\x80\x04c" + module.encode() + b"\nos.system\n" + _str(command) + b"\x85R.",
        "builtins": b"\x80\x04" + _str("builtins") + _str("exec") + b"\x93"
        + _str(f"import os; os.system({command!r})") + b"\x85R.",
        "nested reduce": pickle.dumps(Metadata(state_dict_metadata={"w": _Payload(command)}), protocol=4),
        "a class's dotted attribute": b"\x80\x04" + _str(module) + _str("Metadata.__init__.__globals__") + b"\x93.",
        "not a pickle": b"\x00garbage",
        # only DCP's own classes, but a bytes entry: DCP reads its file with weights_only=False
        "a bytes entry": pickle.dumps(Metadata(state_dict_metadata={"evil": BytesStorageMetadata()}), protocol=4),
        "cut short": pickle.dumps(Metadata(state_dict_metadata={}), protocol=4)[:-3],
        "another type": pickle.dumps(OrderedDict(a=1), protocol=4),
    }


@pytest.mark.parametrize("shape", list(_hostile_manifests(pathlib.Path("x"))))
def test_a_hostile_or_damaged_manifest_is_refused_naming_the_file_and_runs_nothing(tmp_path, shape):
    marker = tmp_path / "pwned"
    (tmp_path / ".metadata").write_bytes(_hostile_manifests(marker)[shape])
    with pytest.raises(sharded.ManifestError, match=rf"manifest {tmp_path}/\.metadata (is refused|holds|records entries that are not tensors)"):
        sharded.read_metadata(str(tmp_path))
    assert not marker.exists(), "the manifest ran code"


def test_a_hostile_manifest_padded_to_the_recorded_size_is_set_aside_and_the_run_resumes_before_it(tmp_path, written):
    import shutil

    from raylight.driver.recorder import RunRecorder
    from raylight.worker.protocol import Report

    source = f"{written['storage'].root}/checkpoints/{checkpoint_name(0)}"
    recorder = RunRecorder(RunStorage(str(tmp_path / "run")), checkpoints_to_keep=2)
    recorder.open({}, resume=False)
    for index in (0, 1):
        target = tmp_path / "run" / "checkpoints" / checkpoint_name(index)
        target.mkdir(parents=True)
        for name in ("__0_0.distcp", "__1_0.distcp", ".metadata"):
            shutil.copy(f"{source}/{name}", target / name)
        recorder.record(Report({"step": index}, written["data"], sharded_index=index), num_workers=2)
    recorder.close()
    marker = tmp_path / "pwned"
    manifest = tmp_path / "run" / "checkpoints" / checkpoint_name(1) / ".metadata"
    hostile = _hostile_manifests(marker)["dotted STACK_GLOBAL"]
    size = manifest.stat().st_size
    assert len(hostile) < size
    manifest.write_bytes(hostile + b" " * (size - len(hostile)))  # the size meta.json records
    tampered = Checkpoint(str(manifest.parent), metadata={"format": "sharded"}, data=written["data"])
    with pytest.raises(sharded.ManifestError, match=r"\.metadata is refused"):
        tampered.load()
    resumed = RunRecorder(RunStorage(str(tmp_path / "run")), checkpoints_to_keep=2)
    latest = resumed.open({}, resume=True)
    try:
        assert latest is not None and latest.metadata["index"] == 0
        assert latest.load()["epoch"] == 2
        assert any(n.startswith("damaged-checkpoint_000001") for n in os.listdir(tmp_path / "run" / "checkpoints"))
    finally:
        resumed.close()
    assert not marker.exists(), "the manifest ran code"


def test_split_and_join_round_trip_and_refuse_colliding_paths():
    state = {"a": {"b": torch.ones(2)}, "l": [torch.zeros(1), 3], "t": (torch.arange(2), "x"), "n": 1}
    skeleton, tensors = sharded.split(state)
    assert sorted(tensors) == ["a.b", "l.0", "t.0"]
    assert set(sharded.tensor_keys(skeleton)) == set(tensors)
    joined = sharded.join(skeleton, tensors)
    assert joined["l"][1] == 3 and joined["t"][1] == "x" and isinstance(joined["t"], tuple)
    assert torch.equal(joined["a"]["b"], state["a"]["b"])
    buf = io.BytesIO()
    torch.save(skeleton, buf)  # the skeleton loads with weights_only
    buf.seek(0)
    assert torch.load(buf, weights_only=True) == skeleton
    with pytest.raises(ValueError, match=r"\['a.b'\] and \['a'\]\['b'\] both flatten to 'a.b'"):
        sharded.split({"a.b": torch.ones(1), "a": {"b": torch.ones(1)}})


def test_a_run_whose_newest_shards_are_damaged_resumes_from_the_one_before(tmp_path, written):
    import shutil

    from raylight.driver.recorder import RunRecorder
    from raylight.worker.protocol import Report

    source = f"{written['storage'].root}/checkpoints/{checkpoint_name(0)}"
    recorder = RunRecorder(RunStorage(str(tmp_path / "run")), checkpoints_to_keep=2)
    recorder.open({}, resume=False)
    for index in (0, 1):
        target = tmp_path / "run" / "checkpoints" / checkpoint_name(index)  # as the workers write them
        target.mkdir(parents=True)
        for name in ("__0_0.distcp", "__1_0.distcp", ".metadata"):
            shutil.copy(f"{source}/{name}", target / name)
        recorder.record(Report({"step": index}, written["data"], sharded_index=index), num_workers=2)
    recorder.close()
    shard = tmp_path / "run" / "checkpoints" / checkpoint_name(1) / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])  # a torn shard on disk
    resumed = RunRecorder(RunStorage(str(tmp_path / "run")), checkpoints_to_keep=2)
    latest = resumed.open({}, resume=True)
    try:
        assert latest is not None and latest.metadata["index"] == 0 and latest.sharded
        assert latest.load()["epoch"] == 2, "the one before loads whole"
        assert any(n.startswith("damaged-checkpoint_000001") for n in os.listdir(tmp_path / "run" / "checkpoints"))
    finally:
        resumed.close()


def test_a_checkpoint_being_gathered_or_written_counts_as_progress(monkeypatch):
    """A large model on slow storage takes minutes to gather and write; the worker beats
    while it does, so hang_timeout_s does not declare it hung. The gathering here waits
    until three beats arrived: without them it would give up."""
    import threading

    from raylight.worker import checkpoints

    monkeypatch.setattr(checkpoints, "CHECKPOINT_BEAT_S", 0.01)
    beats = threading.Semaphore(0)

    class Beating(Sink):
        def heartbeat(self):
            beats.release()

    sink = Beating()
    ctx = TrainContext(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, device=torch.device("cpu"), sink=sink)
    gathered = []

    def slow_full_state(state):
        gathered.append(all(beats.acquire(timeout=10) for _ in range(4)))  # one from the report itself
        return state

    monkeypatch.setattr(ctx._strategy, "full_state", slow_full_state)
    ctx.report({"loss": 1.0}, checkpoint={"w": torch.ones(2)})
    assert gathered == [True] and sink.reports[-1].checkpoint is not None
    assert not [t for t in threading.enumerate() if t.name == "raylight-checkpoint-io"], "the beating thread ended"
