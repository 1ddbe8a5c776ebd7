"""RayWorkerGroup: workers as Ray actors in one placement group.

Start-up: reserve a placement group (fail fast when the cluster can never fit it,
else wait at most ``placement_timeout_s``), or, when this process already runs inside
one (a Ray Tune trial's), use that group's bundles, since a nested group could never be
scheduled beside it; give ranks by node, create one actor per
bundle, open the rendezvous store on rank 0's node, start the loops. Polling: one
``poll`` call per worker, bounded by ``health_check_timeout_s``; dead actors and
workers without progress for ``hang_timeout_s`` become failures. Shutdown kills every
actor and removes the placement group.

This module is the core: the group's members and their start, launch, poll and
shutdown. Its roles live beside it, as Ray Train V2 splits its worker group:
``placement.py`` (placement groups, bundles, nodes), ``warm.py`` (the warm spare, the
pool's hand-off and prestarted workers), ``resize.py`` (the in-place resize, a sequence
of named steps) and ``poll.py`` (judging each worker's answer, node notices).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError
from ray.util.placement_group import (
    PlacementGroup,
    get_current_placement_group,
    placement_group_table,
)

from raylight.adaptive.plan import AdaptiveSpec, BatchPlan
from raylight.base import verbosity
from raylight.base.cost import WorkerPlace
from raylight.base.exceptions import (
    ConfigError,
    InsufficientResourcesError,
    WorkerImportError,
    WorkerStartError,
)
from raylight.config import FailureConfig, ScalingConfig
from raylight.storage.reach import marker, not_reached_error
from raylight.storage.run_dir import checkpoint_name
from raylight.worker.protocol import (
    CheckpointTarget,
    GroupPoll,
    Report,
    ResizeOutcome,
    WorkerPoll,
    with_finished_peers,
)
from raylight.worker.strategies import build_strategy
from raylight.worker_group.gpus import node_visible_devices
from raylight.worker_group.placement import (
    ELASTIC_PLACEMENT_WAIT_S,
    _request_resources,
    assign_ranks,
    bundle_worker,
    driver_node,
    fmt_resources,
    on_cluster,
    pinned_worker,
    remove_group,
    reserve_group,
    slot_nodes,
    worker_bundles,
)
from raylight.worker_group.poll import NoticeWatch, death_reason, judge
from raylight.worker_group.pool import POOL, kill_quietly, pool_key
from raylight.worker_group.resize import InPlaceResize, MembersLostError
from raylight.worker_group.user_code import (
    driver_sys_path,
    import_error_message,
    missing_module,
    unpicklable_message,
    unpicklable_parts,
    user_modules,
)
from raylight.worker_group.warm import (
    RELEASE_WAIT_S,
    Spare,
    WarmSpare,
    hand_to_pool,
    worker_runtime_env,
)
from raylight.worker_group.worker import RankInfo, StartSpec, WorkerSetup

log = logging.getLogger("raylight")


@dataclass
class _Member:
    actor: Any
    node: dict[str, Any]  # ip, node_id, pid, gpu_ids
    pg: PlacementGroup
    bundle: int
    warm: bool = False  # already imported what the running workers have (a spare)
    # The poll whose answer said this worker died: polled again, it says so at once. A new
    # call to a dead worker on a lost machine waits ~2 s for Ray to give up on it (seen in
    # bench/hosts.py: each poll of the group during the resize that followed took that).
    lost: Any = None
    # Its poll went unanswered (a partition: its machine cut off, its node not declared
    # dead): not asked again, each poll would wait health_check_timeout_s for it.
    silent: bool = False


class RayWorkerGroup:
    """Implements the ``WorkerGroup`` protocol on Ray actors."""

    def __init__(
        self,
        train_loop: Any,
        loop_config: dict[str, Any] | None,
        *,
        entry: Any,
        scaling: ScalingConfig,
        failure: FailureConfig,
        run_name: str,
        embedded: bool,
        adaptive: AdaptiveSpec | None = None,
    ) -> None:
        self._fn = train_loop
        self._loop_config = loop_config
        self._loop_ref: Any = None  # (fn, config) in the object store: pickled once per start
        self._entry = entry  # what runs the loop on a worker (context.run_worker_loop)
        self._scaling = scaling
        self._failure = failure
        self._run_name = run_name
        self._embedded = embedded
        self._adaptive = adaptive
        self._members: list[_Member] = []  # index = rank
        self._pgs: list[PlacementGroup] = []
        self._spare = WarmSpare()
        self._last_states: list[str] = []  # each rank's state at the last poll
        self._resizing = False
        self._watch = NoticeWatch()  # the nodes Ray is draining
        # Workers asked of the autoscaler: withdrawn at shutdown (the nodes it brought may
        # go once idle), asked again when the group starts again (a restart).
        self._requested = 0
        # Running inside a placement group (a Tune trial): workers go into its bundles,
        # which this group never removes.
        self._outer = get_current_placement_group() if ray.is_initialized() else None
        self._outer_bundles: list[int] = []
        if self._outer is not None:
            self._outer_bundles = worker_bundles(
                self._outer.bundle_specs, scaling.worker_resources(), scaling.max_workers
            )
            log.info("running inside placement group %s: workers use its bundles %s", self._outer.id.hex(), self._outer_bundles)

    @property
    def num_workers(self) -> int:
        return len(self._members)

    @property
    def _nodes(self) -> list[dict[str, Any]]:
        return [m.node for m in self._members]

    # -- start --------------------------------------------------------------------
    def start(
        self,
        *,
        num_workers: int,
        checkpoint: Any = None,
        threads: int | None = None,
        plan: BatchPlan | None = None,
        target: CheckpointTarget | None = None,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"a worker group needs at least 1 worker, got {num_workers}")
        self._loop()  # a loop or config that cannot be pickled fails before any worker starts
        if self._requested:
            self.request_resources(self._requested)
        try:
            members = self._spawn(num_workers)
            self._launch(members, checkpoint=checkpoint, threads=threads, plan=plan, target=target)
        except BaseException:
            self.shutdown()
            raise

    def reserve(self, num_workers: int, *, at_least: int) -> int:
        """Hold bundles for up to ``num_workers`` workers (this group's free bundles count)
        and return how many it holds. Where the cluster cannot place them all now, fewer,
        down to ``at_least``: each size above that waits ELASTIC_PLACEMENT_WAIT_S (at most
        FailureConfig.placement_timeout_s), then the next size tried is what the cluster's
        free resources fit (a view that can lag: the placement group is the authority);
        ``at_least`` waits placement_timeout_s, then InsufficientResourcesError."""
        at_least = max(1, min(at_least, num_workers))
        if self._outer is not None:  # a trial's bundles are fixed: start() checks them
            return num_workers
        timeout = self._failure.placement_timeout_s
        want = num_workers
        while True:
            need = want - len(self._members) - len(self._free_slots())
            if need <= 0:
                return want
            pg = self._reserve(need) if want <= at_least else self._reserve(
                need, wait_s=min(timeout, ELASTIC_PLACEMENT_WAIT_S), fail_fast=False
            )
            if pg is not None:
                self._pgs.append(pg)
                return want
            log.info("the cluster did not place %d more worker(s) now; trying fewer", need)
            want = max(at_least, min(want - 1, self.capacity()))

    def _reserve(self, num_workers: int, *, wait_s: float | None = None, fail_fast: bool = True) -> PlacementGroup | None:
        return reserve_group(num_workers, self._scaling, self._failure, embedded=self._embedded, wait_s=wait_s, fail_fast=fail_fast)

    def _free_slots(self) -> list[tuple[PlacementGroup, int]]:
        """Bundles this group reserved that no live worker uses and Ray has placed (after
        a shrink, or a lost node's bundles re-placed when the node came back)."""
        used = {(id(m.pg), m.bundle) for m in self._members}
        if self._outer is not None:
            return [(self._outer, b) for b in self._outer_bundles if (id(self._outer), b) not in used]
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")} - set(self._watch.draining)
        slots = []
        for pg in self._pgs:
            placed = placement_group_table(pg).get("bundles_to_node_id", {})
            slots += [
                (pg, b)
                for b in range(pg.bundle_count)
                if (id(pg), b) not in used and placed.get(b) in alive
            ]
        return slots

    def _spawn(self, count: int, *, wait_s: float | None = None) -> list[_Member]:
        """Start ``count`` idle actors: in free bundles of this group first, then in a
        newly reserved placement group. ``wait_s`` (a running group growing): wait that
        long for the new group and start fewer when it is not placed, rather than hold the
        resize for placement_timeout_s (a node that just joined may be taken by this
        group's own lost bundles, which Ray re-places there: they are free slots next time)."""
        if count <= 0:
            return []
        slots = self._free_slots()[:count]
        if len(slots) < count and self._outer is not None:
            raise InsufficientResourcesError(
                f"this runs inside a placement group (e.g. a Ray Tune trial's) whose bundles "
                f"hold {len(self._outer_bundles)} workers x {{{fmt_resources(self._scaling.worker_resources())}}}, "
                f"but {count + len(self._members)} are needed; give the trial one bundle per "
                "worker (raylight.tune.get_tune_resources(num_workers=...)) or lower num_workers"
            )
        if len(slots) < count:
            pg = self._reserve(count - len(slots), wait_s=wait_s, fail_fast=wait_s is None)
            if pg is not None:  # without wait_s it raises instead
                self._pgs.append(pg)
                slots += [(pg, b) for b in range(pg.bundle_count)]
            elif not slots:
                return []
            else:
                log.info("started %d of %d new workers: the cluster placed no more within %gs", len(slots), count, wait_s)
        spare_at, spare = self._spare.take(slots, lambda refs: self._get(refs, self._failure.worker_start_timeout_s, "warm up (the spare)"))
        bundle_nodes: list[str | None] = slot_nodes(slots) if self._pooled else [None] * len(slots)
        actors: list[Any] = []
        reused: list[bool] = []
        refs: list[Any] = []
        rejoin: WorkerSetup | None = None  # what the pooled workers are given (made once)
        for i, (slot, node_id) in enumerate(zip(slots, bundle_nodes, strict=True)):
            info = RankInfo(i, 0, count, 1, 0)
            idle = POOL.take(node_id, self._pool_key) if node_id is not None and i != spare_at else None
            if i == spare_at and spare is not None:
                actor, ref = spare.actor, spare.actor.node_info.remote()
            elif idle is not None:
                rejoin = rejoin or self._setup(rejoining=True)
                actor, ref = idle.actor, idle.actor.begin_run.remote(info, self._run_name, rejoin)
            else:
                actor = self._new_actor(slot, node_id, info)
                ref = actor.node_info.remote()
            actors.append(actor)
            reused.append(idle is not None)
            refs.append(ref)
        try:
            nodes = self._started(actors, refs, reused, slots, bundle_nodes)
        except BaseException:
            for actor in actors:
                ray.kill(actor, no_restart=True)
            raise
        return [
            _Member(a, n, pg, b, warm=i == spare_at or reused[i])
            for i, (a, n, (pg, b)) in enumerate(zip(actors, nodes, slots, strict=True))
        ]

    def _new_actor(self, slot: tuple[PlacementGroup, int], node_id: str | None, info: RankInfo) -> Any:
        """A new worker process for ``slot``: inside the bundle, or (pooled workers, which
        must outlive the placement group) a zero-resource actor on the bundle's node, whose
        reservation the bundle holds."""
        args = (info, self._run_name, self._setup())
        if node_id is not None:
            return pinned_worker(node_id, self._runtime_env(), *args)
        return bundle_worker(slot, self._scaling, self._runtime_env(), *args)

    def _started(
        self,
        actors: list[Any],
        refs: list[Any],
        reused: list[bool],
        slots: list[tuple[PlacementGroup, int]],
        bundle_nodes: list[str | None],
    ) -> list[dict[str, Any]]:
        """Every worker's node_info, once started; a pooled one that cannot serve (dead,
        or its modules changed) is replaced by a new process in ``actors``."""
        timeout = self._failure.worker_start_timeout_s
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        nodes: list[Any] = []
        for i, ref in enumerate(refs):
            try:
                found = ray.get(ref, timeout=0) if ref in ready else None
            except RayActorError as exc:
                if not reused[i]:
                    raise self._start_error(exc, "start") from None
                found = f"it died while idle ({death_reason(exc)})"
            except RayError as exc:
                raise self._start_error(exc, "start") from None
            if isinstance(found, str):  # reused, but it cannot serve: a new one instead
                log.debug("not reusing an idle worker: %s", found)
                ray.kill(actors[i], no_restart=True)
                actors[i] = self._new_actor(slots[i], bundle_nodes[i], RankInfo(i, 0, len(refs), 1, 0))
                found = self._get([actors[i].node_info.remote()], timeout, "start")[0]
            elif found is None:
                self._get([ref], 0, "start")  # raises WorkerStartError naming the setting
            nodes.append(found)
        return nodes

    @property
    def _pooled(self) -> bool:
        """Whether this group's workers go to the pool (and come from it)."""
        return self._scaling.reuse_workers and not self._scaling.use_gpu

    @property
    def _pool_key(self) -> str:
        return pool_key(self._runtime_env(), self._scaling.process_kind)

    def _setup(self, *, rejoining: bool = False) -> WorkerSetup:
        """What a worker of this run is given (``RaylightWorker``'s and ``begin_run``'s last
        argument): what it watches for preemption notices, on the embedded cluster the
        driver's ``sys.path``, to a pooled worker ``rejoining`` (on this node) the driver's
        own modules (it does not serve if it holds one from another file:
        ``raylight.worker_group.user_code``), and quiet or verbose."""
        return WorkerSetup(
            sigterm_grace_s=self._failure.preemption_grace_s,
            notice_sources=tuple(self._failure.preemption_notices),
            driver_sys_path=tuple(driver_sys_path()) if self._embedded else (),
            driver_modules=tuple(user_modules().items()) if rejoining else (),
            quiet=not verbosity.is_verbose(),
        )

    def _runtime_env(self) -> dict[str, Any] | None:
        return worker_runtime_env(self._scaling)

    # -- the warm spare -------------------------------------------------------------------
    def _spare_wanted(self) -> bool:
        s = self._scaling
        return (
            s.warm_spare and s.elastic and s.resizes_in_place and not s.use_gpu
            and self._outer is None and 0 < len(self._members) < s.max_workers
        )

    def _tend_spare(self, polls: list[WorkerPoll]) -> None:
        if self._resizing:
            return
        rank0 = next((p for p in polls if p.rank == 0), None)
        trains = rank0 is not None and rank0.progress.batches_since_start > 0
        self._spare.tend(wanted=self._spare_wanted(), rank0_trains=trains, start=self._start_spare)

    def _start_spare(self) -> Spare:
        """A new process on rank 0's node, warming with rank 0's modules."""
        node_id = self._members[0].node["node_id"]
        actor = pinned_worker(node_id, self._runtime_env(), RankInfo(0, 0, 1, 1, 0), self._run_name, self._setup())
        return Spare(actor, node_id, [actor.node_info.remote(), *self._warm_refs([actor])])

    def _launch(
        self,
        members: list[_Member],
        *,
        checkpoint: Any = None,
        broadcast: int | None = None,
        threads: int | None = None,
        plan: BatchPlan | None = None,
        target: CheckpointTarget | None = None,
    ) -> None:
        """Give ``members`` ranks (``members[0]`` becomes rank 0; the others are ordered
        so ranks are contiguous per node), rendezvous and start the loop: from
        ``checkpoint``, or (``broadcast``, an index) from the checkpoint rank 0 holds."""
        first = members[0]
        rest = sorted(members[1:], key=lambda m: (m.node["node_id"] != first.node["node_id"], m.node["node_id"]))
        ordered = [first, *rest]
        infos = assign_ranks([m.node["node_id"] for m in ordered])
        self._members = ordered
        timeout = self._failure.worker_start_timeout_s
        refs = [m.actor.set_rank.remote(info) for m, info in zip(ordered, infos, strict=True)]
        lost = [m for m, error in zip(ordered, self._errors(refs, timeout, "take their ranks"), strict=True) if isinstance(error, RayActorError)]
        if lost:  # nothing has met yet: the caller may go on without them
            raise MembersLostError(f"{len(lost)} worker(s) died before taking their ranks", lost)
        if target is not None and self._scaling.sharded_checkpoints:
            self._check_reach(ordered, target.directory)
        ips = {m.node["ip"] for m in ordered}
        loopback = len(ips) == 1
        master = "127.0.0.1" if loopback else first.node["ip"]
        port = self._get([first.actor.open_store.remote(master, len(ordered), timeout)], timeout, "open the rendezvous store")[0]
        visible = self._cuda_visible_devices()
        backend = build_strategy(self._scaling.strategy).backend(self._scaling.use_gpu)
        ckpt_ref = ray.put(checkpoint.to_bytes()) if checkpoint is not None and broadcast is None else None
        ckpt_path = checkpoint.path if checkpoint is not None else None
        if broadcast is not None and target is not None:  # a sharded one's tensors are there
            ckpt_path = f"{target.directory}/{checkpoint_name(broadcast)}"
        adaptive = self._adaptive
        if adaptive is not None:
            adaptive = replace(adaptive, plan=plan, num_nodes=len({m.node["node_id"] for m in ordered}))
        starts = []
        for rank, member in enumerate(ordered):
            spec = StartSpec(
                entry=self._entry,
                master_addr=master,
                master_port=port,
                backend=backend,
                threads=threads or self._scaling.worker_threads(),
                use_gpu=self._scaling.use_gpu,
                collective_timeout_s=self._failure.collective_timeout_s,
                cuda_visible_devices=visible[rank],
                loopback=loopback,
                checkpoint_path=ckpt_path,
                checkpoint_meta=checkpoint.metadata if checkpoint is not None else None,
                strategy=self._scaling.strategy,
                adaptive=adaptive,
                elastic=self._scaling.elastic,
                broadcast_state=broadcast is not None,
                checkpoint_dir=target.directory if target is not None else None,
                next_checkpoint=target.next_index if target is not None else None,
            )
            starts.append(member.actor.start.remote(self._loop(), spec, ckpt_ref))
        self._get(starts, timeout, "start the training loop")

    def _check_reach(self, members: list[_Member], uri: str) -> None:
        """Every worker sees the run's storage (``storage/reach.py``), before any loop
        starts: a ConfigError naming the hosts that do not (not retried), else nothing."""
        timeout = self._failure.worker_start_timeout_s
        with marker(uri) as mark:  # each worker's read of an object store: half of the wait
            refs = [m.actor.storage_unseen.remote(mark.path, mark.token, timeout / 2) for m in members]
            found = self._get(refs, timeout, "look for the run's storage")
        missing = {f"{host} ({m.node['ip']})": why for m, (host, why) in zip(members, found, strict=True) if why}
        if missing:
            raise not_reached_error(uri, missing)

    def _cuda_visible_devices(self) -> list[str | None]:
        """Workers on one node see all of that node's group GPUs, so NCCL can use
        peer-to-peer links (``gpus.py``)."""
        if not self._scaling.use_gpu:
            return [None] * len(self._members)
        return list(node_visible_devices(self._nodes))  # a list[str | None]

    def _errors(self, refs: list[Any], timeout: float, what: str) -> list[Exception | None]:
        """Each call's error (None if it returned), waiting for all of them like ``_get``."""
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if len(done) < len(refs):
            self._get(refs, 0, what)  # raises WorkerStartError naming the setting
        errors: list[Exception | None] = []
        for ref in refs:
            try:
                ray.get(ref, timeout=0)
                errors.append(None)
            except RayActorError as exc:
                errors.append(exc)
            except RayError as exc:
                raise self._start_error(exc, what) from None
        return errors

    def _get(self, refs: list[Any], timeout: float, what: str) -> list[Any]:
        try:
            return ray.get(refs, timeout=timeout)
        except GetTimeoutError:
            raise WorkerStartError(
                f"workers did not {what} within FailureConfig.worker_start_timeout_s="
                f"{timeout:g}s; raise it if workers are slow to import or the cluster is busy"
            ) from None
        except RayError as exc:
            raise self._start_error(exc, what) from None

    def _start_error(self, exc: RayError, what: str) -> WorkerStartError:
        """A worker call's error as raylight's: a module the workers cannot import (the
        loop's, its config's, raylight) said in one message with its fix; else Ray's."""
        missing = missing_module(exc)
        if missing is None:
            return WorkerStartError(f"a worker failed to {what}: {exc}")
        module, reason = missing
        message = import_error_message(module, embedded=self._embedded, loop=self._fn, reason=reason)
        return WorkerImportError(message, module=module)

    # -- adaptive and elastic -----------------------------------------------------------
    def set_plan(self, plan: BatchPlan) -> None:
        if self._members:
            self._members[0].actor.set_plan.remote(plan)

    def capacity(self) -> int:
        """How many workers could run now: the current ones, free bundles of this group,
        and what the cluster's free resources fit."""
        if self._outer is not None:
            return len(self._members) + len(self._free_slots())
        per_worker = self._scaling.worker_resources()
        free = ray.available_resources()
        extra = min(int(free.get(k, 0.0) // v) for k, v in per_worker.items() if v > 0)
        return len(self._members) + len(self._free_slots()) + max(extra, 0)

    def request_resources(self, num_workers: int) -> None:
        """Ask an autoscaling cluster for room for ``num_workers`` workers (the run's whole
        size: a smaller number gives the rest back; 0 withdraws the request)."""
        bundles = [dict(self._scaling.worker_resources())] * num_workers
        try:
            on_cluster(_request_resources, bundles, timeout_s=self._failure.connect_timeout_s)
        except GetTimeoutError:
            raise TimeoutError(
                f"the cluster did not take the request for {num_workers} workers' resources within "
                f"FailureConfig.connect_timeout_s={self._failure.connect_timeout_s:g}s"
            ) from None
        self._requested = num_workers

    def resize(
        self,
        *,
        num_workers: int,
        threads: int | None,
        plan: BatchPlan | None,
        commit: int,
        target: CheckpointTarget | None = None,
        leaving: frozenset[int] = frozenset(),
        snapshot: bool = False,
        on_stopped: Callable[[list[Report]], None] | None = None,
    ) -> ResizeOutcome:
        """Resize in place: stop live workers at a step boundary (``snapshot``: each
        checkpoints there first, and that checkpoint is the one restored), keep those holding
        checkpoint ``commit`` in memory, add or remove workers, re-form the process group
        and restart the loop from that state, broadcast from a survivor (a sharded
        checkpoint's tensors are read from ``target``'s directory, resharded).
        ``on_stopped``: given rank 0's reports once every worker has stopped, before any
        worker goes (the driver commits a snapshot there, while the node given notice is
        still up); those reports are then not in the outcome."""
        self._resizing = True
        try:
            return InPlaceResize(
                self, num_workers=num_workers, threads=threads, plan=plan, commit=commit, target=target,
                leaving=leaving, snapshot=snapshot, on_stopped=on_stopped,
            ).run()
        finally:
            self._resizing = False

    def _warm_refs(self, actors: list[Any]) -> list[Any]:
        """Start ``actors`` importing what rank 0 has imported (its module list is passed
        as a reference, resolved by Ray); one result per actor."""
        modules = self._members[0].actor.loaded_modules.remote()
        return [a.warm.remote(self._loop(), modules) for a in actors]

    def _loop(self) -> Any:
        """The loop and its config, put in the object store once per start for all its
        workers and a spare's warm-up (each ``.remote`` call pickled them again, per worker)."""
        if self._loop_ref is None:
            from ray import cloudpickle

            try:
                self._loop_ref = ray.put((self._fn, self._loop_config))
            except RayError:
                raise
            except Exception as exc:  # Ray's TypeError carries its serializability report
                root = exc.__cause__ or exc
                parts = unpicklable_parts(self._fn, self._loop_config, cloudpickle.dumps)
                raise ConfigError(unpicklable_message(f"{type(root).__name__}: {root}", parts)) from None
        return self._loop_ref

    def _release_unused_groups(self) -> None:
        """Remove placement groups none of whose bundles holds a worker any more."""
        used = {id(m.pg) for m in self._members}
        for pg in self._pgs:  # never the outer group: it is not in self._pgs
            if id(pg) not in used:
                with contextlib.suppress(Exception):
                    remove_group(pg)
        self._pgs = [pg for pg in self._pgs if id(pg) in used]

    # -- poll -----------------------------------------------------------------------
    def poll(self) -> GroupPoll:
        refs = [None if m.silent else m.actor.poll.remote() if m.lost is None else m.lost for m in self._members]
        polls, failures = judge(refs, self._nodes, self._failure)
        for f in failures:
            if f.kind == "died" and 0 <= f.rank < len(self._members):
                self._members[f.rank].lost = refs[f.rank]
            elif not f.answered and 0 <= f.rank < len(self._members):
                self._members[f.rank].silent = True
        failures = with_finished_peers(failures, polls)
        self._last_states = [p.state for p in polls] if not failures else []
        if not failures:
            self._tend_spare(polls)
        spare_ready = self._spare.ready
        placement = self._placement()
        ranks_on = {p.node_id for p in placement}
        return GroupPoll(
            polls, GroupPoll.root_cause_first(failures), spare_ready=spare_ready,
            notices=self._watch.notices(polls, ranks_on), placement=placement,
        )

    def _placement(self) -> tuple[WorkerPlace, ...]:
        resources = self._scaling.worker_resources()
        return tuple(
            WorkerPlace(rank, str(m.node.get("node_id", "?")), m.node.get("node_type", "unknown"), resources)
            for rank, m in enumerate(self._members)
        )

    # -- shutdown -------------------------------------------------------------------
    def shutdown(self) -> None:
        if self._requested:
            from ray.autoscaler.sdk import request_resources

            with contextlib.suppress(Exception):
                request_resources(bundles=[])
        if self._spare.spare is not None and not self._spare.ready:
            self._spare.created(timeout=RELEASE_WAIT_S)  # a spare is seconds from ready
        pooled = self._pool_members()
        self._spare.drop()
        pgs = self._pgs
        for m in self._members:
            if id(m.actor) not in pooled:
                kill_quietly(m.actor)
        self._members = []
        self._pgs = []
        self._loop_ref = None
        for pg in pgs:
            with contextlib.suppress(Exception):
                remove_group(pg)

    def _pool_members(self) -> set[int]:
        """Hand the workers whose loops finished (and a ready spare) to the pool, where
        each one says it can serve another run; returns the ids of the actors pooled."""
        if not self._pooled or not ray.is_initialized():
            return set()
        home = driver_node()
        reusable = build_strategy(self._scaling.strategy).reuses_process
        finished = [
            (m.actor, m.node)
            for m, s in zip(self._members, self._last_states, strict=False)
            if reusable and s == "finished" and m.node.get("node_id") == home
        ]
        return hand_to_pool(finished, self._spare, home=home, key=self._pool_key, idle_s=self._scaling.idle_worker_timeout_s)
