"""Elastic and adaptive training on a real local Ray cluster (2 CPUs)."""

from __future__ import annotations

import os
import threading

import pytest
import ray

import raylight
from raylight import AdaptiveConfig, RunConfig, ScalingConfig, TrainerConfig
from tests.helpers import read_trace, wait_until
from tests.support import loops

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

N = 240
GROW_N = 960  # test_grows_when_resources_free_up_with_exact_data_coverage's samples


def _committed(run_dir):
    ckpts = os.path.join(run_dir, "checkpoints")
    return os.path.isdir(ckpts) and any(
        os.path.exists(os.path.join(ckpts, d, "meta.json")) for d in os.listdir(ckpts)
    )


def assert_exact_coverage(history, n=N):
    epochs = [m for m in history if m.get("kind") == "epoch"]
    assert epochs, "no epoch finished"
    for m in epochs:
        assert m["count"] == n, m
        assert m["sum"] == n * (n - 1) / 2, m
        assert m["sq"] == sum(i * i for i in range(n)), m
        assert m["epoch_count"] == n, ("the epoch's own accumulator, made in it, resumes its own sums", m)
    assert [m["epoch"] for m in epochs] == list(range(len(epochs)))
    return epochs


@ray.remote(num_cpus=1)
class Blocker:
    def ready(self):
        return True


def _run_in_thread(trainer):
    out: dict = {}

    def target():
        try:
            out["result"] = trainer.fit()
        except BaseException as exc:  # surfaced by the test below
            out["error"] = exc

    thread = threading.Thread(target=target, name="fit")
    thread.start()
    return thread, out


def _fit_until_resized(trainer, run_dir, stop, *, resizes: int, what: str):
    """Run ``trainer`` until its trace shows ``resizes`` resizes, then stop it (at an
    epoch end, by ``stop``) and return its Result."""
    thread, out = _run_in_thread(trainer)
    try:
        wait_until(
            lambda: sum(r.get("event") == "resized" for r in read_trace(run_dir)) >= resizes or not thread.is_alive(),
            150, what,
        )
    finally:
        stop.touch()
        thread.join(180)
    assert "error" not in out, out.get("error")
    return out["result"]


@pytest.mark.parametrize("kind", ["in_place_spare", "in_place_cold", "from_checkpoint"])
def test_grows_when_resources_free_up_with_exact_data_coverage(ray_cluster, tmp_path, kind):
    """in_place_spare: the CPU comes back once the warm spare is ready and the spare joins;
    in_place_cold: no spare (warm_spare=False) and no reused process (reuse_workers=False),
    a new process starts and warms."""
    in_place, spare = kind != "from_checkpoint", kind == "in_place_spare"
    blocker = Blocker.remote()
    ray.get(blocker.ready.remote())
    run_dir = str(tmp_path / "grow")
    stop = tmp_path / "stop"
    # Epochs of 60 steps and a checkpoint at each epoch's end only: 240 samples with a
    # checkpoint every 5 steps made about 400 reports a second on one worker, and under
    # the full suite's load the driver then took minutes to get to the resize.
    trainer = raylight.Trainer(
        loops.elastic_loop,
        train_loop_config={"batch_size": 16, "epochs": 10_000, "stop_file": str(stop), "n": GROW_N, "checkpoint_every": 10**9},
        config=TrainerConfig(
            scaling=ScalingConfig(
                num_workers=(1, 2), scaling_policy="max", resize_interval_s=0.3, resize_in_place=in_place, warm_spare=spare,
                reuse_workers=kind != "in_place_cold",  # cold: no process from an earlier test's run either
            ),
            run=RunConfig(storage_path=str(tmp_path), name="grow", progress=False),
        ),
    )
    thread, out = _run_in_thread(trainer)
    try:
        wait_until(lambda: _committed(run_dir) or not thread.is_alive(), 120, "a first checkpoint")
        if spare:
            wait_until(
                lambda: any(r.get("event") == "spare_ready" for r in read_trace(run_dir)) or not thread.is_alive(),
                120,
                "the warm spare",
            )
        ray.kill(blocker)
        wait_until(lambda: any(r.get("event") == "resized" for r in read_trace(run_dir)) or not thread.is_alive(), 120, "a resize")
    finally:
        stop.touch()
        thread.join(180)
    assert "error" not in out, out.get("error")
    result = out["result"]
    epochs = assert_exact_coverage(result.metrics_history, GROW_N)
    assert {m["workers"] for m in epochs} == {1, 2}
    resize = result.resizes[0]
    assert (resize["from"], resize["to"]) == (1, 2)
    assert resize["kind"] == ("in_place" if in_place else "checkpoint")
    assert 0 < resize["pause_s"] <= resize["first_step_s"]
    if in_place:  # where the time went: start and warm the new worker, agree the stop, launch
        phases = resize["phases"]
        # committed_s: when the stop delivered reports (committed before the group re-forms)
        assert set(phases) - {"committed_s"} == {"spawn_s", "warm_s", "stop_s", "launch_s", "spares"}
        if spare:  # the spare joined: nothing to start or import
            assert phases["spares"] == 1 and phases["warm_s"] == 0
        else:
            assert phases["spares"] == 0 and phases["warm_s"] > 0
    assert os.path.exists(os.path.join(run_dir, "adaptive.jsonl"))


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "deepspeed"])
def test_adaptive_batch_size_grows_on_noisy_gradients(ray_cluster, tmp_path, strategy):
    if strategy == "deepspeed":
        pytest.importorskip("deepspeed")
    options = {"fsdp": raylight.FSDP(min_block_params=1), "ddp": "ddp"}.get(strategy) or raylight.DeepSpeed(stage=2)
    result = raylight.fit(
        loops.elastic_loop,
        config={"batch_size": 8, "epochs": 20, "noise": 3.0, "lr": 0.01, "checkpoint_every": 10, "float32": strategy == "deepspeed"},
        num_workers=2,
        adaptive=AdaptiveConfig(max_batch_size=128, local_batch_bounds=(2, 32), decision_interval_s=0.3, min_profile_steps=3, lr_rule="adascale"),
        strategy=options,
        storage_path=str(tmp_path),
        name="adapt",
        progress=False,
    )
    epochs = assert_exact_coverage(result.metrics_history)
    assert max(m["batch"] for m in epochs) > 8, "the batch size should grow"
    trace = read_trace(os.path.join(str(tmp_path), "adapt"))
    decisions = [r for r in trace if r.get("decision") == "batch"]
    assert decisions and "predicted goodput" in decisions[0]["reason"]
    assert any(r.get("noise_scale", 0) > 0 for r in trace)
    assert any(r.get("lr_factor", 1.0) > 1.0 for r in trace), "adascale raises the LR with the batch"
    assert os.path.exists(os.path.join(str(tmp_path), "adapt", "adaptive.png"))
    assert epochs[-1]["sse"] < epochs[0]["sse"]


def fit_killed_and_regrown(tmp_path, strategy, *, resize_interval_s=0.3, **loop_config):
    """An elastic run of 1 to 2 workers under ``strategy`` whose rank 1 is SIGKILLed at
    step 8, run until it has shrunk and grown back. Returns its Result and its epochs,
    checked: the kill happened, every epoch saw every sample once, at 1 and 2 workers.
    ``resize_interval_s``: how often the run looks for room to grow; a strategy that
    resizes by restarting needs it longer than that restart plus an epoch at one worker,
    or it grows back before one worker has finished an epoch."""
    run_dir, stop = str(tmp_path / "shrink"), tmp_path / "stop"
    trainer = raylight.Trainer(
        loops.elastic_loop,
        train_loop_config={
            "batch_size": 16, "epochs": 10_000, "objects": True, "checkpoint_every": 3,
            "kills": [[1, 8]], "marker": str(tmp_path / "killed"), "stop_file": str(stop), **loop_config,
        },
        config=TrainerConfig(
            scaling=ScalingConfig(
                num_workers=(1, 2), strategy=strategy, scaling_policy="max",
                resize_interval_s=resize_interval_s, warm_spare=False,
            ),
            run=RunConfig(storage_path=str(tmp_path), name="shrink", progress=False),
        ),
    )
    result = _fit_until_resized(trainer, run_dir, stop, resizes=2, what="a shrink and a grow")
    assert (tmp_path / "killed0").exists()
    epochs = assert_exact_coverage(result.metrics_history)
    assert {m["workers"] for m in epochs} == {1, 2} or len(epochs) == 1
    return result, epochs


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed"])
def test_a_sharded_run_shrinks_when_a_worker_dies_and_grows_back(ray_cluster, tmp_path, strategy):
    """Elastic FSDP: rank 1 is SIGKILLed; rank 0 keeps the skeleton of the last sharded
    checkpoint in memory, the group re-forms at 1 worker in place and reads the shards
    from the run's storage, resharded; when the CPU is free again it grows back to 2.
    Elastic DeepSpeed does the same by restarting from the sharded checkpoint (its engine
    is bound to its process group). Every epoch still sees every sample exactly once."""
    if strategy == "deepspeed":
        pytest.importorskip("deepspeed")
    options = raylight.FSDP(min_block_params=1) if strategy == "fsdp" else raylight.DeepSpeed(stage=2)
    kind = "in_place" if strategy == "fsdp" else "checkpoint"
    # DeepSpeed's restart at one worker (a new process, its engine, the shards) takes
    # seconds: 0.3 s between looks grew it back before it finished an epoch (2 of 4 runs)
    result, epochs = fit_killed_and_regrown(
        tmp_path, options, resize_interval_s=10.0 if strategy == "deepspeed" else 0.3, float32=strategy == "deepspeed"
    )
    assert result.num_failures == 0
    moves = [(r["from"], r["to"], r["kind"]) for r in result.resizes]
    assert moves[:2] == [(2, 1, kind), (1, 2, kind)], moves
    # after the shrink, one worker resumed from shards two had written
    assert any(m["resumed_sharded"] and m["workers"] == 1 for m in epochs), epochs


def _dead(actor) -> bool:
    try:
        ray.get(actor.loaded_modules.remote(), timeout=10)
    except ray.exceptions.RayActorError:
        return True
    return False


def _shrunk_in_place_to_one(tmp_path, monkeypatch, name, victim, **loop_config):
    """A 3-worker elastic run (half a CPU each, no regrowth) whose resize loses a
    survivor after it paused and before it took its new rank: ``victim(members)`` (the
    members about to be launched, the one to broadcast the state first) is killed then.
    Runs until that resize and checks it went on in place with one worker, every epoch
    seeing every sample once; returns the Result."""
    from raylight.worker_group.ray_group import RayWorkerGroup

    launch, lost = RayWorkerGroup._launch, []

    def launch_losing_a_survivor(self, members, **kwargs):
        if kwargs.get("broadcast") is not None and not lost:  # the resize's launch
            gone = victim(members)
            lost.append(gone.node["pid"])
            ray.kill(gone.actor, no_restart=True)
            wait_until(lambda: _dead(gone.actor), 30, "the survivor's death")
        return launch(self, members, **kwargs)

    monkeypatch.setattr(RayWorkerGroup, "_launch", launch_losing_a_survivor)
    run_dir, stop = str(tmp_path / name), tmp_path / "stop"
    trainer = raylight.Trainer(
        loops.elastic_loop,
        train_loop_config={"batch_size": 16, "epochs": 10_000, "objects": True, "checkpoint_every": 3, "stop_file": str(stop), **loop_config},
        config=TrainerConfig(
            scaling=ScalingConfig(
                num_workers=(1, 3), resources_per_worker={"CPU": 0.5}, scaling_policy="max",
                resize_interval_s=3600, warm_spare=False,
            ),
            run=RunConfig(storage_path=str(tmp_path), name=name, progress=False),
        ),
    )
    result = _fit_until_resized(trainer, run_dir, stop, resizes=1, what="the shrink")
    assert len(lost) == 1 and result.num_failures == 0
    resize = result.resizes[0]
    assert (resize["from"], resize["to"], resize["kind"]) == (3, 1, "in_place"), resize
    epochs = assert_exact_coverage(result.metrics_history)
    assert {m["workers"] for m in epochs} <= {3, 1} and epochs[-1]["workers"] == 1, epochs
    return result


@pytest.mark.beside  # no deadline a slower CPU could trip (tests/conftest.py)
@pytest.mark.parametrize("victim", ["the_one_to_restore_from", "another"])
def test_a_survivor_lost_while_the_group_re_forms_is_left_out_and_the_resize_stays_in_place(ray_cluster, tmp_path, monkeypatch, victim):
    """Rank 2 of 3 is SIGKILLed; while the others re-form in place, one of the two
    survivors dies too (its node went as well, say) after pausing and before taking its
    new rank: the one chosen to broadcast the state, or the other. The resize goes on in
    place with the one left (every rank of an elastic run keeps its copy of the state)
    instead of restarting everyone from the checkpoint; every epoch still sees every
    sample exactly once."""
    _shrunk_in_place_to_one(
        tmp_path, monkeypatch, "lost", lambda members: members[0 if victim == "the_one_to_restore_from" else -1],
        kills=[[2, 8]], marker=str(tmp_path / "killed"),
    )
    assert (tmp_path / "killed0").exists()


@pytest.mark.beside  # no deadline a slower CPU could trip (tests/conftest.py)
def test_a_shrink_keeps_a_reserve_until_the_group_re_forms(ray_cluster, tmp_path, monkeypatch):
    """The scaling policy shrinks 3 workers to 1 in place; the one kept dies after pausing
    and before taking its rank. Another of the three, which holds the state too and was
    kept aside until the group re-formed, takes its place: the resize stays in place
    instead of restarting from the checkpoint. Every epoch still sees every sample once."""
    from raylight.driver.controller.decisions import Resize
    from raylight.driver.controller.scaling import GoodputScalingPolicy

    decide, asked = GoodputScalingPolicy.decide, []

    def shrink_once(self, view):
        out = decide(self, view)
        trained = view.poll.polls and all(p.progress.batches_since_start >= 8 for p in view.poll.polls)
        if view.num_workers == 3 and trained and not asked:
            asked.append(view.now)
            return [*out, Resize(1, "the test asks for one worker")]
        return out

    monkeypatch.setattr(GoodputScalingPolicy, "decide", shrink_once)
    _shrunk_in_place_to_one(tmp_path, monkeypatch, "reserve", lambda members: members[0])
    assert asked


def test_elastic_reserve_places_fewer_when_the_cluster_cannot_place_all(ray_cluster):
    """What an elastic start does when free resources read a moment earlier are gone:
    it asks for 2, Ray cannot place them (a blocker holds 1 of the 2 CPUs), and it takes
    the 1 that fits instead of failing after placement_timeout_s. With at_least=2 it
    fails, naming the setting."""
    from raylight.base.exceptions import InsufficientResourcesError
    from raylight.config import FailureConfig
    from raylight.worker_group.ray_group import RayWorkerGroup

    blocker = Blocker.remote()
    ray.get(blocker.ready.remote())
    group = RayWorkerGroup(
        loops.elastic_loop,
        {},
        entry=None,  # never started here
        scaling=ScalingConfig(num_workers=(1, 2)),
        failure=FailureConfig(placement_timeout_s=1.0),
        run_name="reserve",
        embedded=True,
    )
    try:
        assert group.reserve(2, at_least=1) == 1
        assert len(group._free_slots()) == 1  # held for start()
        with pytest.raises(InsufficientResourcesError, match="placement_timeout_s=1s"):
            group.reserve(2, at_least=2)
    finally:
        group.shutdown()
        ray.kill(blocker)


def read_positions(path) -> list[tuple[int, int]]:
    with open(path) as f:
        return [tuple(int(v) for v in line.split()) for line in f if line.strip()]


def repeated_steps(positions) -> int:
    """Steps run twice: a position (epoch, samples consumed) seen before."""
    return len(positions) - len(set(positions))


@pytest.mark.parametrize("how", ["sigterm", "file"])
def test_a_notice_makes_the_run_checkpoint_where_it_stops_and_lose_no_step(ray_cluster, tmp_path, how):
    """Mid-epoch, rank 1 gets SIGTERM (a pod being ended), or a notice file appears (what
    a spot agent or a preStop hook writes; the cloud watchers read the same way). Its node
    (here the only one, holding both ranks) is given notice: every rank checkpoints at the
    step boundary they agree on, and the run restarts from that snapshot on what is left,
    without counting a failure. The epoch's checkpoint was steps back: none runs again."""
    positions, run_dir, stop = tmp_path / "positions", str(tmp_path / "notice"), tmp_path / "stop"
    source = "sigterm" if how == "sigterm" else f"file:{tmp_path / 'notice.json'}"
    trainer = raylight.Trainer(
        loops.elastic_loop,
        train_loop_config={
            "batch_size": 16, "epochs": 10_000, "objects": True, "checkpoint_every": 1000,
            "notice": [1, 20, source], "notice_marker": str(tmp_path / "noticed"), "positions": str(positions),
            "stop_file": str(stop),
        },
        config=TrainerConfig(
            scaling=ScalingConfig(num_workers=(1, 2), scaling_policy="max", resize_interval_s=0.3, warm_spare=False),
            run=RunConfig(storage_path=str(tmp_path), name="notice", progress=False),
            failure=raylight.FailureConfig(
                max_failures=0, preemption_grace_s=60, preemption_notices=[] if how == "sigterm" else [source]
            ),
        ),
    )
    result = _fit_until_resized(trainer, run_dir, stop, resizes=1, what="the restart after the notice")
    assert (tmp_path / "noticed").exists()
    assert result.num_failures == 0 and result.num_preemptions == 1
    epochs = assert_exact_coverage(result.metrics_history)
    steps = read_positions(positions)
    assert repeated_steps(steps) == 0, steps
    assert len(steps) == len(epochs) * N // 16, "every step of every epoch ran once"
    notices = [r for r in read_trace(run_dir) if r.get("event") == "notice"]
    assert len(notices) == 1 and notices[0]["source"] == how, notices
    moves = [(r["from"], r["kind"], r["reason"]) for r in result.resizes]
    assert moves[0][:2] == (2, "checkpoint") and "preemption notice" in moves[0][2], moves
