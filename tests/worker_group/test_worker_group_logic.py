"""Pure parts of the Ray worker group (feasibility, rank assignment), and the worker's own
state handling, driven directly in this process."""

import signal
import threading

import pytest

from raylight.worker.protocol import (
    ErrorInfo,
    Report,
    WorkerFailure,
    WorkerPoll,
    with_finished_peers,
)
from raylight.worker_group import reuse
from raylight.worker_group import worker as worker_module
from raylight.worker_group.placement import assign_ranks, check_feasible
from raylight.worker_group.worker import RankInfo, RaylightWorker, StartSpec
from tests.helpers import wait_until


@pytest.fixture
def worker():
    """A worker object of a run of one, as a Ray actor would hold it; this process's
    SIGTERM handler, which it replaces, is put back after."""
    handler = signal.getsignal(signal.SIGTERM)
    yield RaylightWorker(RankInfo(0, 0, 1, 1, 0), "states")
    signal.signal(signal.SIGTERM, handler)


def test_too_many_workers_is_infeasible_with_numbers():
    why = check_feasible(3, {"CPU": 1.0}, "PACK", [{"CPU": 2.0}])
    assert why == "3 workers x {CPU: 1} need {CPU: 3}; the cluster has {CPU: 2} in all"


def test_feasible_and_node_constraints():
    nodes = [{"CPU": 2.0}, {"CPU": 2.0}]
    assert check_feasible(4, {"CPU": 1.0}, "PACK", nodes) is None
    assert "STRICT_PACK" in check_feasible(3, {"CPU": 1.0}, "STRICT_PACK", nodes)
    assert "STRICT_SPREAD" in check_feasible(3, {"CPU": 1.0}, "STRICT_SPREAD", nodes)
    assert "no node can hold" in check_feasible(1, {"CPU": 3.0}, "PACK", [{"CPU": 2.0}, {"CPU": 2.0}])
    assert "GPU" in check_feasible(1, {"CPU": 1.0, "GPU": 1.0}, "PACK", nodes)


def test_ranks_are_contiguous_per_node():
    infos = assign_ranks(["a", "b", "a", "b", "c"])
    by_bundle = [(i.rank, i.local_rank, i.node_rank, i.local_world_size) for i in infos]
    assert by_bundle == [(0, 0, 0, 2), (2, 0, 1, 2), (1, 1, 0, 2), (3, 1, 1, 2), (4, 0, 2, 1)]
    assert all(i.world_size == 5 for i in infos)


@pytest.fixture
def held_teardown(monkeypatch, worker):
    """``start(entry)``: run ``entry`` as ``worker``'s loop in a real gloo group of one
    whose teardown is held back until ``release`` is set; returns once it is held."""
    import torch
    import torch.distributed as dist

    from raylight.worker_group.worker import StartSpec

    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GLOO_SOCKET_IFNAME"):
        monkeypatch.setenv(key, "")  # the worker sets them for its loop; put back after
    tearing, release, destroy = threading.Event(), threading.Event(), dist.destroy_process_group

    def held_back_teardown(*args, **kwargs):
        tearing.set()
        release.wait(30)
        return destroy(*args, **kwargs)

    monkeypatch.setattr(dist, "destroy_process_group", held_back_teardown)
    threads = torch.get_num_threads()

    def start(entry):
        port = worker.open_store("127.0.0.1", 1, 10.0)
        worker.start((None, None), StartSpec(
            entry=entry, master_addr="127.0.0.1", master_port=port, backend="gloo",
            threads=threads, use_gpu=False, collective_timeout_s=30, cuda_visible_devices=None, loopback=True,
            checkpoint_path=None, checkpoint_meta=None,
        ), None)
        wait_until(tearing.is_set, 30, "the old group's teardown")

    try:
        yield start, release
    finally:
        release.set()
        if worker._thread is not None:
            worker._thread.join(30)
        torch.set_num_threads(threads)


def test_an_errored_worker_says_so_at_once_and_set_rank_waits_for_its_teardown(worker, held_teardown):
    """An errored loop (a peer died under its collective) is said at once, for the driver
    to act on; a resize that then gives the process a new rank waits for the old group's
    teardown (held back here) instead of failing."""
    import torch.distributed as dist

    def peer_died(fn, config, **kw):
        raise RuntimeError("a peer died")

    start, release = held_teardown
    ranked = threading.Event()
    start(peer_died)
    poll = worker.poll()
    assert poll.state == "errored" and "a peer died" in str(poll.error), "said before the teardown"
    setter = threading.Thread(target=lambda: (worker.set_rank(RankInfo(0, 0, 1, 1, 0)), ranked.set()), daemon=True)
    setter.start()
    setter.join(0.5)
    assert not ranked.is_set(), "set_rank waits for the teardown"
    release.set()
    wait_until(ranked.is_set, 30, "set_rank after the teardown")
    assert not dist.is_initialized()


def test_an_error_while_joining_the_group_is_marked_as_one_and_the_loops_own_is_not(worker, held_teardown, monkeypatch):
    """The driver forms the group again after a worker fails to join it
    (FailureConfig.rendezvous_retries): the worker says which of its errors came then.
    Here rank 1 of 2 finds no store where rank 0's should be."""
    import socket

    def peer_died(fn, config, **kw):
        raise RuntimeError("a peer died")

    start, release = held_teardown
    start(peer_died)
    assert worker.poll().error is not None and not worker.poll().error.rendezvous
    release.set()
    worker._thread.join(30)

    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    joining = RaylightWorker(RankInfo(1, 1, 2, 2, 0), "states")
    joining.start((None, None), StartSpec(
        entry=peer_died, master_addr="127.0.0.1", master_port=port, backend="gloo", threads=1, use_gpu=False,
        collective_timeout_s=1, cuda_visible_devices=None, loopback=True, checkpoint_path=None, checkpoint_meta=None,
    ), None)
    joining._thread.join(60)
    poll = joining.poll()
    assert poll.state == "errored" and poll.error is not None and poll.error.rendezvous, poll.error


def test_a_paused_worker_says_so_only_once_its_process_group_is_gone(worker, held_teardown):
    """An in-place resize gives a worker a new rank as soon as it sees it paused: the
    state changes after the old process group is torn down (held back here), so set_rank
    then never finds the loop still running."""
    import torch.distributed as dist

    start, release = held_teardown
    start(lambda fn, config, **kw: "paused")
    assert worker.poll().state == "running", "paused while its process group still exists"
    release.set()
    wait_until(lambda: worker.poll().state == "paused", 30, "the paused state")
    assert not dist.is_initialized()
    worker.set_rank(RankInfo(0, 0, 1, 1, 0))  # refused while the loop's thread ran


def _report_in_a_thread(worker, reports):
    done: list[int] = []

    def loop():
        for i, report in enumerate(reports):
            worker.report(report)
            done.append(i)

    thread = threading.Thread(target=loop, name="loop", daemon=True)
    thread.start()
    return thread, done


def test_report_waits_for_the_driver_while_it_holds_too_many_checkpoints(worker):
    """A loop that reports checkpoints faster than the driver takes them waits at
    ctx.report once MAX_PENDING_CHECKPOINTS are held (the backlog, and this process's
    memory, stay bounded), and goes on when the driver polls; reports without a
    checkpoint never wait."""
    held = worker_module.MAX_PENDING_CHECKPOINTS
    thread, done = _report_in_a_thread(worker, [Report({"i": i}, checkpoint=b"state", seq=i) for i in range(held + 1)])
    wait_until(lambda: len(done) == held, 10, f"{held} reports")
    thread.join(0.5)
    assert thread.is_alive() and len(done) == held, "the report after them waits"
    worker.report(Report({"plain": True}))  # no checkpoint: returns at once
    assert [r.metrics for r in worker.poll().reports] == [{"i": i} for i in range(held)] + [{"plain": True}]
    thread.join(10)
    assert not thread.is_alive()
    assert [r.metrics for r in worker.poll().reports] == [{"i": held}]


def test_report_waits_while_the_checkpoints_held_are_too_large(worker, monkeypatch):
    monkeypatch.setattr(worker_module, "MAX_PENDING_CHECKPOINT_BYTES", 10)
    thread, done = _report_in_a_thread(worker, [Report({"i": i}, checkpoint=b"12345678", seq=i) for i in range(2)])
    wait_until(lambda: len(done) == 1, 10, "the first report")
    thread.join(0.5)
    assert thread.is_alive() and len(done) == 1, "8 bytes held, 8 more would pass the limit of 10"
    assert len(worker.poll().reports) == 1
    thread.join(10)
    assert not thread.is_alive() and len(worker.poll().reports) == 1


def test_a_released_process_sets_deterministic_mode_back_only_where_the_loop_changed_it(monkeypatch):
    """torch's setter of deterministic mode imports its compiler stack (about a CPU-second):
    a pooled process calls it only to undo what the loop changed, both flags."""
    import torch

    setter = torch.use_deterministic_algorithms
    setter(False)  # as a new process has it
    state = reuse.ProcessState.now()
    calls: list[tuple] = []
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda *a, **kw: (calls.append((a, kw)), setter(*a, **kw))[1])
    state.restore()
    assert calls == []
    try:
        setter(True, warn_only=True)  # what a loop may leave behind
        state.restore()
        assert calls == [((False,), {"warn_only": False})]
        assert not torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        setter(False)


def test_a_spare_no_longer_wanted_is_killed_only_once_ray_has_created_it(monkeypatch):
    """Killing an actor Ray is still creating makes Ray's GCS log "Failed to kill actor
    NIL_ID" on the driver's console; a spare no longer wanted waits for its first call to
    answer (or fail), then goes. ``ray.wait`` and the kill are replaced: the decision only."""
    from raylight.worker_group import warm

    killed, created = [], {"yes": False}
    monkeypatch.setattr(warm, "kill_quietly", killed.append)
    monkeypatch.setattr(warm.ray, "wait", lambda refs, timeout=None, **kw: (list(refs), []) if created["yes"] else ([], list(refs)))
    spare = warm.WarmSpare()
    spare.spare = warm.Spare("spare-actor", "node-1", ["node_info-ref", "warm-ref"])

    def unwanted() -> None:
        spare.tend(wanted=False, rank0_trains=True, start=lambda: pytest.fail("no spare is started when none is wanted"))

    unwanted()
    assert killed == [] and spare.spare is not None, "kept while Ray creates it"
    created["yes"] = True
    unwanted()
    assert killed == ["spare-actor"] and spare.spare is None
    unwanted()  # nothing left to drop
    assert killed == ["spare-actor"]


def test_a_worker_s_setup_gives_it_the_driver_s_path_and_ray_s_unpickling_log_only_when_verbose(monkeypatch):
    """A call argument a worker cannot unpickle is logged by Ray there with its traceback
    (a page per rank) and also returned to the driver, which says it once
    (``WorkerImportError``): quiet, the worker's copy is not logged."""
    import logging
    import sys

    from raylight.worker_group.worker import WorkerSetup

    monkeypatch.setattr(sys, "path", ["/ray/workers"])
    ray_log = logging.getLogger("ray._private.serialization")
    level = ray_log.level
    try:
        WorkerSetup(driver_sys_path=("/proj/lib",)).apply()
        assert sys.path == ["/proj/lib", "/ray/workers"]
        assert not ray_log.isEnabledFor(logging.ERROR)
        WorkerSetup(quiet=False).apply()
        assert sys.path == ["/proj/lib", "/ray/workers"] and ray_log.isEnabledFor(logging.ERROR)
    finally:
        ray_log.setLevel(level)


@pytest.mark.parametrize("embedded", [True, False])
def test_only_the_embedded_cluster_s_workers_get_the_driver_s_path(embedded):
    """A cluster's other nodes have other files: there the workers' path stays the
    cluster's (a module they lack is a WorkerImportError with the ways to ship it)."""
    from raylight.config import FailureConfig
    from raylight.worker_group import ray_group
    from raylight.worker_group.user_code import driver_sys_path

    group = ray_group.RayWorkerGroup.__new__(ray_group.RayWorkerGroup)
    group._embedded, group._failure = embedded, FailureConfig(preemption_grace_s=7)
    setup = group._setup()
    assert setup.sigterm_grace_s == 7
    assert setup.driver_sys_path == (tuple(driver_sys_path()) if embedded else ())
    assert not embedded or setup.driver_sys_path


def _error(exc_type: str, message: str) -> ErrorInfo:
    return ErrorInfo(exc_type=exc_type, message=message, traceback="", exception=None, time=0.0)


def test_a_hang_or_a_lost_peer_beside_finished_ranks_says_so_and_nothing_else_does():
    polls = [WorkerPoll(0, "running"), WorkerPoll(1, "finished"), WorkerPoll(2, "finished")]
    gone = _error("RuntimeError", "[pair.cc:553] Connection closed by peer [127.0.0.1]:5")
    failures = [
        WorkerFailure(0, "hang", "made no progress for 9s"),
        WorkerFailure(0, "error", "raised RuntimeError: closed", error=gone),
        WorkerFailure(0, "error", "raised ValueError: bad", error=_error("ValueError", "bad")),
        WorkerFailure(0, "died", "was killed"),
        WorkerFailure(-1, "hang", "the group did not start"),
    ]
    told = with_finished_peers(failures, polls)
    hint = " (ranks 1, 2 had finished the loop: a collective that only some ranks call"
    assert [hint in f.message for f in told] == [True, True, False, False, False]
    assert told[0].message.startswith("made no progress for 9s (") and told[0].message.endswith("call it on every rank)")
    assert with_finished_peers(failures, [WorkerPoll(0, "running"), WorkerPoll(1, "running")]) == failures


def test_a_worker_that_died_is_not_polled_again(monkeypatch):
    """The poll that said a worker died answers for it from then on: a new call to a dead
    actor on a lost machine waits ~2 s for Ray (bench/hosts.py), every poll of a resize."""
    from types import SimpleNamespace

    from raylight.worker_group import ray_group

    sent: list[int] = []

    def actor(rank):
        return SimpleNamespace(poll=SimpleNamespace(remote=lambda: sent.append(rank) or f"poll-{rank}-{len(sent)}"))

    seen: list[list[str]] = []

    def judge(refs, nodes, failure):  # rank 1's answer: it died
        seen.append(list(refs))
        return [WorkerPoll(rank=0, state="running")], [WorkerFailure(1, "died", "its node is gone")]

    monkeypatch.setattr(ray_group, "judge", judge)
    group = ray_group.RayWorkerGroup.__new__(ray_group.RayWorkerGroup)
    group._members = [ray_group._Member(actor(r), {"ip": "x", "node_id": f"n{r}"}, None, r) for r in range(2)]  # type: ignore[arg-type]
    group._failure = None
    group._spare = SimpleNamespace(ready=False)
    group._watch = SimpleNamespace(notices=lambda polls, nodes: [])
    monkeypatch.setattr(ray_group.RayWorkerGroup, "_placement", lambda self: ())
    for _ in range(3):
        assert [f.kind for f in group.poll().failures] == ["died"]
    assert sent == [0, 1, 0, 0], "rank 1 is asked once, rank 0 every poll"
    assert [refs[1] for refs in seen] == ["poll-1-2"] * 3, "its first answer stands for it"


def test_a_silent_worker_is_not_polled_again_and_a_resize_waits_out_its_peers_collective(monkeypatch):
    """Issue 57: a poll unanswered within health_check_timeout_s marks the worker silent: later
    polls do not wait for it again (each would take the whole timeout during a resize) and still
    report it; a resize stops its peers for their collective timeout and a health check."""
    from types import SimpleNamespace

    from raylight.config import FailureConfig
    from raylight.worker.protocol import GroupPoll
    from raylight.worker_group import poll as poll_module
    from raylight.worker_group import ray_group
    from raylight.worker_group.resize import stop_wait_s

    sent: list[int] = []

    def actor(rank):
        return SimpleNamespace(poll=SimpleNamespace(remote=lambda: sent.append(rank) or f"poll-{rank}"))

    waited: list[list[str]] = []

    def wait(refs, num_returns, timeout):  # rank 1 never answers
        waited.append(list(refs))
        return [r for r in refs if r != "poll-1"], [r for r in refs if r == "poll-1"]

    monkeypatch.setattr(poll_module.ray, "wait", wait)
    monkeypatch.setattr(poll_module.ray, "get", lambda ref: WorkerPoll(rank=0, state="running"))
    failure = FailureConfig(health_check_timeout_s=3, collective_timeout_s=6, worker_start_timeout_s=120)
    group = ray_group.RayWorkerGroup.__new__(ray_group.RayWorkerGroup)
    group._members = [ray_group._Member(actor(r), {"ip": "x", "node_id": f"n{r}"}, None, r) for r in range(2)]  # type: ignore[arg-type]
    group._failure = failure
    group._spare = SimpleNamespace(ready=False)
    group._watch = SimpleNamespace(notices=lambda polls, nodes: [])
    monkeypatch.setattr(ray_group.RayWorkerGroup, "_placement", lambda self: ())
    polls = [group.poll() for _ in range(3)]
    for p in polls:
        assert [(f.rank, f.kind, f.answered) for f in p.failures] == [(1, "hang", False)]
        assert "health_check_timeout_s=3s" in p.failures[0].message
    assert sent == [0, 1, 0, 0], "rank 1 is asked once, rank 0 every poll"
    assert waited == [["poll-0", "poll-1"], ["poll-0"], ["poll-0"]]
    assert stop_wait_s(failure, polls[0]) == 9
    assert stop_wait_s(failure.model_copy(update={"collective_timeout_s": 1800}), polls[0]) == 120
    died = GroupPoll([], [WorkerFailure(1, "died", "gone")])
    assert stop_wait_s(failure, died) == 3 and stop_wait_s(failure, GroupPoll([], [])) == 120
