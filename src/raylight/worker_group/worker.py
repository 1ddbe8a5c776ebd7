"""The worker actor: runs the user's loop in a thread and answers health polls.

The loop runs in its own thread so the actor's main thread stays free to answer
``poll`` even while the loop is blocked in a collective or a long step.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import socket
import sys
import threading
import traceback
import warnings
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from raylight.adaptive.plan import AdaptiveSpec, BatchPlan
from raylight.base import verbosity
from raylight.base.clock import monotonic, wall
from raylight.base.net import interface_for, listen_socket, loopback_interface
from raylight.storage.checkpoint import Checkpoint
from raylight.storage.reach import unseen
from raylight.worker import session
from raylight.worker.protocol import (
    ErrorInfo,
    NodeNotice,
    Progress,
    Report,
    WorkerPoll,
    WorkerState,
)
from raylight.worker.session import RankInfo
from raylight.worker_group.gpus import cuda_index
from raylight.worker_group.reuse import ProcessReuse, freeze_long_lived
from raylight.worker_group.user_code import use_driver_sys_path


@dataclass(frozen=True)
class StartSpec:
    entry: Any  # runs the loop on this worker (context.run_worker_loop): "finished" | "paused"
    master_addr: str
    master_port: int
    backend: str
    threads: int
    use_gpu: bool
    collective_timeout_s: float
    cuda_visible_devices: str | None
    loopback: bool
    checkpoint_path: str | None
    checkpoint_meta: dict[str, Any] | None
    strategy: Any = "ddp"  # ScalingConfig.strategy: a name or its options object
    adaptive: AdaptiveSpec | None = None
    elastic: bool = False
    broadcast_state: bool = False  # take the state from rank 0's memory (in-place resize)
    checkpoint_dir: str | None = None  # where sharded checkpoints go (the run's checkpoints/)
    next_checkpoint: int | None = None  # the index the driver commits next


# The node type the autoscaler (v2, the fake multi-node provider, KubeRay) gave a node's raylet.
NODE_TYPE_ENV = "RAY_NODE_TYPE_NAME"
NOTICE_POLL_S = 5.0  # how often a worker reads its node's preemption notices (AWS advises 5 s)
TEARDOWN_WAIT_S = 30.0  # set_rank's wait for an ended loop's process group to be torn down
# Reports with checkpoints a worker holds for the driver before ``ctx.report`` waits for it
# to take them (its next poll): the driver commits each, and a loop that reports faster
# than that would otherwise grow the backlog (and this process's memory) without bound,
# while the run's control decisions (resizes) wait behind it. Either limit stops it.
MAX_PENDING_CHECKPOINTS = 16
MAX_PENDING_CHECKPOINT_BYTES = 256 * 1024**2


def _carries_checkpoint(report: Report) -> bool:
    """Rank 0's report with its checkpoint's bytes, or another rank's copy of one."""
    return report.checkpoint is not None or report.has_checkpoint


def error_info(exc: BaseException) -> ErrorInfo:
    """What the driver learns of ``exc``. The exception itself travels only through Ray's
    own serialisation (an object in the store the group fetches), never as a second
    pickle channel; one that Ray cannot serialise arrives as its type, text and traceback."""
    exception = None
    try:
        import ray

        if ray.is_initialized():
            exception = ray.put(exc)
    except Exception:  # not serialisable: the text is enough
        exception = None
    exc_type = type(exc)
    name = exc_type.__qualname__
    if exc_type.__module__ not in ("builtins", "__main__"):
        name = f"{exc_type.__module__}.{name}"
    return ErrorInfo(
        exc_type=name,
        message=str(exc),
        traceback="".join(traceback.format_exception(exc)),
        exception=exception,
        time=wall(),
    )


@dataclass(frozen=True)
class WorkerSetup:
    """What a worker process is given when it starts and when it joins a run from the pool."""

    sigterm_grace_s: float = 30.0  # FailureConfig.preemption_grace_s
    notice_sources: tuple[str, ...] = ()  # FailureConfig.preemption_notices
    driver_sys_path: tuple[str, ...] = ()  # the embedded cluster's: raylight.worker_group.user_code
    driver_modules: tuple[tuple[str, str], ...] = ()  # the driver's own modules (name, file): user_code.user_modules
    quiet: bool = True  # raylight.base.verbosity: not verbose

    def apply(self) -> None:
        use_driver_sys_path(self.driver_sys_path)
        verbosity.worker_loggers(not self.quiet)


class RaylightWorker:
    """One data-parallel worker. Created by the worker group, one per bundle."""

    def __init__(self, rank_info: RankInfo, run_name: str, setup: WorkerSetup = WorkerSetup()) -> None:
        setup.apply()  # before any call's arguments are unpickled
        self.info = rank_info
        self.run_name = run_name
        self._lock = threading.Lock()
        self._taken = threading.Condition(self._lock)  # the driver took the pending reports
        self._state: WorkerState = "starting"
        self._reports: list[Report] = []
        self._output: list[tuple[str, str]] = []
        self._progress = Progress()
        self._samples = 0
        self._last_progress = monotonic()
        self._joined = False  # the loop's process group is formed (see WorkerPoll.joined)
        self._error: ErrorInfo | None = None
        self._store: Any = None
        self._thread: threading.Thread | None = None
        self._sync: Any = None  # the running context's StepSync
        self._context: Any = None  # the running loop's TrainContext
        self._commit: tuple[int, bytes, int] | None = None  # (index, state, seq) in memory
        self._ip = ""  # this node's address, as Ray knows it
        # An interface the user chose for gloo (runtime_env) wins over raylight's choice.
        self._user_gloo_ifname = os.environ.get("GLOO_SOCKET_IFNAME")
        self._notice: NodeNotice | None = None
        self._sigterm_grace_s = setup.sigterm_grace_s
        self._ray_sigterm: Any = None
        if threading.current_thread() is threading.main_thread():
            self._ray_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._watch_stop = threading.Event()
        self._start_watchers(setup.notice_sources)
        # What a reused process puts back between runs (see ``release``): as it is now.
        self._reuse = ProcessReuse()

    def _start_watchers(self, notice_sources: tuple[str, ...]) -> None:
        self._watch_stop.set()
        self._watch_stop = threading.Event()
        if notice_sources:
            from raylight.worker.notices import build_watchers

            watchers = build_watchers(notice_sources)
            threading.Thread(
                target=self._watch, args=(watchers, self._watch_stop), name="raylight-notices", daemon=True
            ).start()

    def _watch(self, watchers: list[Any], stop: threading.Event) -> None:
        """Poll this node's preemption notices (cloud metadata, a notice file) every
        NOTICE_POLL_S until one comes (or the run ends); the driver hears it with the next poll."""
        while self._notice is None and not stop.is_set():
            for watcher in watchers:
                found = watcher.check()
                if found is not None and self._notice is None and not stop.is_set():
                    self._notice = NodeNotice(
                        node_id=self._node_id(), source=found.source,
                        reason=f"{found.reason} {found.detail}".strip(), deadline=found.deadline_wall,
                    )
                    return
            stop.wait(NOTICE_POLL_S)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        """A SIGTERM (a pod or a spot agent ending this node) is a notice: the driver
        checkpoints and lets this worker go before the grace period ends; a second one,
        or the end of the grace period, exits the way Ray's own handler does; so does one
        that comes when the loop is not running (Ray ending the process)."""
        if self._notice is not None or self._state != "running":
            previous = self._ray_sigterm
            if callable(previous):
                previous(signum, frame)
            raise SystemExit(1)
        self._notice = NodeNotice(
            node_id=self._node_id(),
            source="sigterm",
            reason=f"worker process {os.getpid()} got SIGTERM",
            deadline=wall() + self._sigterm_grace_s,
        )
        logging.getLogger("raylight").warning(
            "rank %d got SIGTERM: telling the driver; exiting in %gs", self.info.rank, self._sigterm_grace_s
        )
        timer = threading.Timer(self._sigterm_grace_s, os.kill, (os.getpid(), signal.SIGTERM))
        timer.daemon = True
        timer.start()

    @staticmethod
    def _node_id() -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def __repr__(self) -> str:  # Ray prefixes this actor's log lines with it
        return f"raylight {self.run_name} rank={self.info.rank}"

    # -- called by the worker group ---------------------------------------------------
    def node_info(self) -> dict[str, Any]:
        import ray

        self._ip = ray.util.get_node_ip_address()
        node_id = self._node_id()
        return {
            "ip": self._ip,
            "node_id": node_id,
            "pid": os.getpid(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "node_type": _node_type(node_id),
        }

    def storage_unseen(self, path: str, token: str, timeout_s: float = 60.0) -> tuple[str, str | None]:
        """This host's name, and None where it sees the driver's marker of the run's
        storage at ``path`` (``raylight.storage.reach``; an object store's read bounded by
        ``timeout_s``), else what it found."""
        return socket.gethostname(), unseen(path, token, timeout_s)

    # -- reuse by the next run (raylight.worker_group.pool) ---------------------------
    def release(self) -> str | None:
        """This worker's run ended. None: the process can serve another run (its state is
        put back as a new process has it, in the background); else why it cannot."""
        if self._thread is not None and self._thread.is_alive():
            return "its training loop is still running"
        if self._state not in ("finished", "starting") or self._error is not None:
            return f"its loop ended {self._state}"
        why = self._reuse.refusal()
        if why is not None:
            return why
        self._watch_stop.set()
        self._state = "starting"
        self._reuse.tidy()  # notes the imports before the driver returns: the user may edit them next
        return None

    def begin_run(self, rank_info: RankInfo, run_name: str, setup: WorkerSetup) -> dict[str, Any] | str:
        """A pooled worker joins a new run with the state a new worker has. Returns its
        ``node_info``, or why it cannot serve (a module it imported changed on disk, or
        the driver now has that module from another file)."""
        setup.apply()
        why = self._reuse.refusal_to_join(dict(setup.driver_modules))
        if why is not None:
            return why
        self.info = rank_info
        self.run_name = run_name
        with self._lock:
            self._state = "starting"
            self._reports = []
            self._output = []
            self._progress = Progress()
            self._samples = 0
            self._error = None
            self._joined = False
            self._commit = None
            self._notice = None
            self._last_progress = monotonic()
        self._store = None
        self._thread = None
        self._sync = None
        self._context = None
        self._sigterm_grace_s = setup.sigterm_grace_s
        self._start_watchers(setup.notice_sources)
        return self.node_info()

    def set_rank(self, rank_info: RankInfo) -> int:
        """Take a new place in a resized group; returns the checkpoint index held. A loop
        that has ended (errored: said at once) may still be tearing its process group down:
        wait for that, up to ``TEARDOWN_WAIT_S``."""
        if self._thread is not None and self._thread.is_alive():
            if self._state == "running":
                raise RuntimeError("cannot change rank while the training loop runs")
            self._thread.join(TEARDOWN_WAIT_S)
            if self._thread.is_alive():
                raise RuntimeError(f"the ended training loop's process group was not torn down within {TEARDOWN_WAIT_S:g} s")
        self.info = rank_info
        self._store = None
        return self._commit[0] if self._commit is not None else -1

    def loaded_modules(self) -> list[str]:
        """Names of the modules this process has imported (a survivor's, for ``warm``)."""
        return [
            name
            for name, module in list(sys.modules.items())
            if module is not None and not name.startswith(("__main__", "__mp_main__"))
        ]

    def warm(self, loop: Any, modules: list[str]) -> float:
        """Before joining a running group: import what a running worker has imported
        (torch, the user's libraries) so the training pause does not pay for it. ``loop``
        (the loop and its config) is unpickled on the way in, importing what it refers to.
        A module that fails to import here is skipped; the loop imports it itself. A
        prestarted worker's run checks these modules as a pooled worker's (``begin_run``).
        Returns seconds."""
        began = monotonic()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name in modules:
                if name not in sys.modules:
                    try:
                        importlib.import_module(name)
                    except Exception:  # best effort, see above
                        continue
        self._reuse.note_imports()
        return monotonic() - began

    def held_commit(self) -> tuple[int, bytes, int] | None:
        """The checkpoint this worker holds in memory, for the driver to adopt."""
        return self._commit

    def open_store(self, host: str, world_size: int, timeout_s: float) -> int:
        """Rank 0: start the rendezvous store listening on ``host`` alone (loopback in a
        one-node group, this node's cluster address otherwise; ``TCPStore(host, ...)``
        itself would listen on every interface) and return the port the system chose."""
        import torch.distributed as dist

        sock = listen_socket(host)
        try:
            self._store = dist.TCPStore(
                host, sock.getsockname()[1], world_size, True, timedelta(seconds=timeout_s),
                wait_for_workers=False, master_listen_fd=sock.fileno(),
            )
        except BaseException:
            sock.close()
            raise
        sock.detach()  # the store owns the descriptor now and closes it
        return int(self._store.port)

    def _gloo_interface(self, loopback: bool) -> None:
        """Bind gloo's sockets to one interface: loopback in a one-node group, else the
        one holding this node's cluster address."""
        if self._user_gloo_ifname is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = self._user_gloo_ifname
            return
        name = loopback_interface() if loopback else interface_for(self._ip)
        if name is None:
            os.environ.pop("GLOO_SOCKET_IFNAME", None)
            logging.getLogger("raylight").warning(
                "no network interface holds this node's address %s; gloo chooses its own "
                "(set GLOO_SOCKET_IFNAME in the workers' runtime_env to choose)", self._ip
            )
            return
        os.environ["GLOO_SOCKET_IFNAME"] = name

    def start(self, loop: tuple[Any, dict[str, Any] | None], spec: StartSpec, ckpt: bytes | None) -> None:
        """Run ``spec.entry(fn, config, ...)`` in the loop thread, ``loop`` being ``(fn,
        config)``: the entry (raylight's ``context.run_worker_loop``) builds the
        TrainContext and calls the user's loop."""
        fn, config = loop
        self._last_progress = monotonic()
        self._error = None
        self._progress = replace(self._progress, batches_since_start=0, first_batch_wall=None)
        self._sync = None
        self._context = None
        self._thread = threading.Thread(
            target=self._run, args=(fn, config, spec, ckpt), name="raylight-train-loop", daemon=True
        )
        self._state = "running"
        self._joined = False
        self._thread.start()

    def set_plan(self, plan: BatchPlan) -> None:
        if self._sync is not None:
            self._sync.set_plan(plan)

    def interrupt(self, snapshot: bool = False) -> None:
        """Stop the loop at the next step boundary (all ranks agree which); ``snapshot``:
        every rank checkpoints there first (see ``TrainContext._request_stop``)."""
        if self._context is not None:
            self._context._request_stop(snapshot=snapshot)

    def poll(self) -> WorkerPoll:
        sync = self._sync
        stats = sync.drain_stats() if sync is not None and sync.ready and self.info.rank == 0 else None
        with self._lock:
            reports, self._reports = self._reports, []
            self._taken.notify_all()
            output, self._output = self._output, []
            return WorkerPoll(
                rank=self.info.rank,
                state=self._state,
                reports=reports,
                progress=self._progress,
                seconds_since_progress=monotonic() - self._last_progress,
                joined=self._joined,
                error=self._error,
                adaptive=stats,
                commit=self._commit[0] if self._commit is not None else -1,
                notice=self._notice,
                output=output,
            )

    # -- ReportSink for the TrainContext ---------------------------------------------
    def report(self, report: Report) -> None:
        with self._lock:
            if _carries_checkpoint(report):
                self._taken.wait_for(lambda: self._room_for(len(report.checkpoint or b"")))
            self._reports.append(report)
            self._last_progress = monotonic()

    def _room_for(self, size: int) -> bool:
        """Whether a checkpoint of ``size`` bytes fits beside those held (one always does)."""
        held = [r for r in self._reports if _carries_checkpoint(r)]
        total = size + sum(len(r.checkpoint) for r in held if r.checkpoint is not None)
        return not held or (len(held) < MAX_PENDING_CHECKPOINTS and total <= MAX_PENDING_CHECKPOINT_BYTES)

    def output(self, stream: str, text: str) -> None:
        with self._lock:
            self._output.append((stream, text))

    def progress(self, epoch: int, step: int, steps_per_epoch: int, samples: int) -> None:
        freeze_long_lived("first batch")
        with self._lock:
            self._samples += samples
            since = self._progress.batches_since_start + 1
            first = wall() if since == 1 else self._progress.first_batch_wall
            self._progress = Progress(epoch, step + 1, steps_per_epoch, self._samples, since, first)
            self._last_progress = monotonic()

    def heartbeat(self) -> None:
        freeze_long_lived("first batch")
        self._last_progress = monotonic()

    def keep_commit(self, index: int, data: bytes, seq: int) -> None:
        self._commit = (index, data, seq)

    # -- the training thread ------------------------------------------------------------
    def _broadcast_state(self) -> bytes:
        """Rank 0 sends the checkpoint it holds in memory to every rank."""
        import torch
        import torch.distributed as dist

        data = self._commit[1] if self.info.rank == 0 and self._commit is not None else b""
        size = torch.tensor([len(data)], dtype=torch.int64)
        dist.broadcast(size, src=0)
        buf = torch.empty(int(size.item()), dtype=torch.uint8)
        if self.info.rank == 0:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        dist.broadcast(buf, src=0)
        return buf.numpy().tobytes()

    def _loop_starts(self, ctx: Any) -> None:
        """The entry built this worker's context: the process group is formed and the
        user's loop begins; from here on, silence counts against hang_timeout_s."""
        self._sync = ctx.sync
        self._context = ctx
        freeze_long_lived("start")
        with self._lock:
            self._joined = True
            self._last_progress = monotonic()

    def _run(self, fn: Any, config: dict[str, Any] | None, spec: StartSpec, ckpt: bytes | None) -> None:
        import torch
        import torch.distributed as dist

        info = self.info
        os.environ.update(
            MASTER_ADDR=spec.master_addr,
            MASTER_PORT=str(spec.master_port),
            RANK=str(info.rank),
            LOCAL_RANK=str(info.local_rank),
            WORLD_SIZE=str(info.world_size),
            LOCAL_WORLD_SIZE=str(info.local_world_size),
            NODE_RANK=str(info.node_rank),
        )
        timeout = timedelta(seconds=spec.collective_timeout_s)

        def form_group(strategy: Any) -> None:
            store = self._store or dist.TCPStore(spec.master_addr, spec.master_port, info.world_size, False, timeout)
            dist.init_process_group(spec.backend, store=store, rank=info.rank, world_size=info.world_size, timeout=timeout)

        def start() -> dict[str, Any]:
            data = (self._broadcast_state() or None) if spec.broadcast_state else ckpt
            if data is None:
                return {"checkpoint": None}
            return {"checkpoint": Checkpoint(spec.checkpoint_path, metadata=spec.checkpoint_meta, data=data)}

        def on_error(exc: BaseException, joining: bool) -> None:
            # Said at once: the driver restarts or resizes on it, and tearing down a group a
            # dead peer broke may take long (NCCL's can block).
            with self._lock:
                self._error = replace(error_info(exc), rendezvous=joining and isinstance(exc, Exception))
                self._state = "errored"

        ended: WorkerState | None = None
        try:
            self._gloo_interface(spec.loopback)
            if spec.cuda_visible_devices is not None and not torch.cuda.is_initialized():
                os.environ["CUDA_VISIBLE_DEVICES"] = spec.cuda_visible_devices  # CUDA reads it when it starts
            torch.set_num_threads(spec.threads)
            index = None
            if spec.use_gpu:
                import ray

                index = cuda_index(os.environ.get("CUDA_VISIBLE_DEVICES"), [str(g) for g in ray.get_gpu_ids()])
            ended = session.run(  # type: ignore[assignment]
                fn,
                config,
                place=info,
                device=session.choose_device(spec.use_gpu, index),
                sink=self,
                strategy=spec.strategy,
                form_group=form_group,
                start=start,
                on_error=on_error,
                entry=spec.entry,
                adaptive=spec.adaptive,
                elastic=spec.elastic,
                threads=spec.threads,
                checkpoint_dir=spec.checkpoint_dir,
                next_checkpoint=spec.next_checkpoint,
                on_start=self._loop_starts,
            )
        except BaseException as exc:  # choosing the device, before the session
            on_error(exc, False)
        finally:
            self._store = None
            # Only now: a resize that sees it paused gives this process a new rank next, and
            # must find the old group gone. Said while it was still being torn down,
            # set_rank refused ("the training loop runs": seen under load).
            if ended is not None:
                with self._lock:
                    self._state = ended  # "finished", or "paused" by an in-place resize


def _node_type(node_id: str) -> str:
    """This node's type, for the run's cost: the autoscaler's name for it (the raylet's
    ``RAY_NODE_TYPE_NAME``, which its workers inherit, or Ray's node-group label), "head"
    or its shape (``raylight.base.cost.node_type_of``)."""
    import ray

    from raylight.base.cost import node_type_of

    if os.environ.get(NODE_TYPE_ENV):
        return os.environ[NODE_TYPE_ENV]

    try:
        node: dict[str, Any] = next((n for n in ray.nodes() if n.get("NodeID") == node_id), {})
    except Exception:  # the GCS is unreachable: the type is only for accounting
        node = {}
    return node_type_of(node.get("Labels") or {}, node.get("Resources") or {})
