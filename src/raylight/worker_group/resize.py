"""The in-place resize: commit/restore at a step boundary, as in Horovod Elastic.

``InPlaceResize.run`` is the sequence, one named step each:

1. ``grow``: new workers start (and import torch) while the others still train;
2. ``stop``: every live worker stops at its next control step (``snapshot``: each
   checkpoints there first);
3. ``count_stopped``: the checkpoints rank 0 reported while stopping move the commit on;
   a snapshot is committed now (as soon as rank 0 reports it), while a node given notice
   is still up;
4. ``choose``: the dead and the leaving go, the state to restore (the driver's latest
   commit, or a newer one a survivor holds), the survivors and the reserves (live workers
   beyond the new size that could stand in for a lost survivor);
5. ``relaunch``: re-form the group with survivors and new workers, broadcast the state
   from a holder; a survivor lost on the way is left out.

A step that cannot go on ends the resize with its outcome: "unchanged" (nothing to grow
into), "finished" (the loop ended meanwhile) or "fallback" (restart from storage). The
steps work on a ``RayWorkerGroup``'s members, through its start and poll methods.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import ray

from raylight.adaptive.plan import BatchPlan
from raylight.base.clock import monotonic, wall
from raylight.base.exceptions import InsufficientResourcesError, WorkerStartError
from raylight.config import FailureConfig
from raylight.worker.protocol import CheckpointTarget, GroupPoll, Report, ResizeOutcome
from raylight.worker_group.placement import ELASTIC_PLACEMENT_WAIT_S
from raylight.worker_group.pool import kill_quietly

if TYPE_CHECKING:
    from raylight.worker_group.ray_group import RayWorkerGroup, _Member

log = logging.getLogger("raylight")

STOP_POLL_S = 0.02  # how often a resize checks whether every worker has stopped


def stop_wait_s(failure: FailureConfig, poll: GroupPoll) -> float:
    """How long the workers get to stop for a resize, after the first poll ``poll``: a
    health-check period with a dead peer; with a silent one, its peers' collective timeout
    and a health check (at most ``worker_start_timeout_s``); else ``worker_start_timeout_s``."""
    if any(f.kind == "died" for f in poll.failures):
        return failure.health_check_timeout_s
    if any(f.kind == "hang" and not f.answered for f in poll.failures):
        return min(failure.worker_start_timeout_s, failure.collective_timeout_s + failure.health_check_timeout_s)
    return failure.worker_start_timeout_s


class MembersLostError(WorkerStartError):
    """Workers of a group being formed died before it met (``members``: those lost)."""

    def __init__(self, message: str, members: list[_Member]) -> None:
        super().__init__(message)
        self.members = members


class InPlaceResize:
    """One in-place resize of ``group`` (``RayWorkerGroup.resize`` says what it does)."""

    def __init__(
        self,
        group: RayWorkerGroup,
        *,
        num_workers: int,
        threads: int | None,
        plan: BatchPlan | None,
        commit: int,
        target: CheckpointTarget | None,
        leaving: frozenset[int],
        snapshot: bool,
        on_stopped: Callable[[list[Report]], None] | None = None,
    ) -> None:
        self.group = group
        self.num_workers = num_workers
        self.threads = threads
        self.plan = plan
        self.commit = commit  # the checkpoint the survivors restore
        self.target = target
        self.leaving = leaving
        self.snapshot = snapshot
        self.on_stopped = on_stopped
        self.added: list[_Member] = []
        self.reports: list[Report] = []
        self.shadow: list[Report] = []
        self.adopted: tuple[int, bytes, int] | None = None
        self.stopped_at = 0.0
        self.stopped_wall = 0.0
        self.phases: dict[str, Any] = {}

    def run(self) -> ResizeOutcome:
        began = monotonic()
        if not self.grow():  # nothing to grow into: no pause
            return ResizeOutcome("unchanged", reason="the cluster placed no new worker")
        warm_s = self.warm()
        self.stopped_at, self.stopped_wall = monotonic(), wall()
        self.phases = {"spawn_s": self.stopped_at - began - warm_s, "warm_s": warm_s, "spares": sum(m.warm for m in self.added)}
        poll = self.stop()
        if poll is None:
            return ResizeOutcome("finished", self.reports, shadow=self.shadow)
        self.count_stopped()
        chosen = self.choose(poll)
        if isinstance(chosen, ResizeOutcome):
            return chosen
        return self.relaunch(*chosen)

    def fallback(self, reason: str) -> ResizeOutcome:
        return ResizeOutcome(
            "fallback", self.reports, reason, self.shadow, self.adopted, self.stopped_at, self.stopped_wall, self.phases
        )

    def grow_wait_s(self) -> float:
        """How long a resize waits for a new placement group before going on with what
        it has (the run asks again at its next resize interval)."""
        return min(self.group._failure.placement_timeout_s, ELASTIC_PLACEMENT_WAIT_S)

    def grow(self) -> bool:
        """Start the new workers while the others still train; False when the group was
        to grow, got none, and no worker leaves."""
        group = self.group
        grow = self.num_workers - len(group._members)
        try:
            self.added = group._spawn(grow, wait_s=self.grow_wait_s()) if grow > 0 else []
        except (InsufficientResourcesError, WorkerStartError) as exc:
            log.warning("could not add workers (%s); keeping %d", exc, len(group._members))
            self.added = []
        return not (grow > 0 and not self.added and not self.leaving)

    def warm(self) -> float:
        """New workers import what a running one has imported, while training goes on."""
        group = self.group
        added = [m for m in self.added if not m.warm]
        if not added or not group._members:
            return 0.0
        began = monotonic()
        try:
            group._get(group._warm_refs([m.actor for m in added]), group._failure.worker_start_timeout_s, "warm up")
        except WorkerStartError as exc:  # only slower: the loop imports what it needs
            log.warning("warming new workers failed (%s); continuing", exc)
        return monotonic() - began

    def stop(self) -> GroupPoll | None:
        """Ask every worker to stop and poll until none runs; the last poll, or None when
        a worker finished its loop meanwhile (the new workers are killed)."""
        group = self.group
        for m in group._members:
            m.actor.interrupt.remote(self.snapshot)
        # Live workers stop at their next control step. With a dead peer, one may instead
        # sit in a collective that never completes: past a health-check period it is
        # treated as hung and replaced. A silent peer (cut off) closes no connection: the
        # collective ends at collective_timeout_s, and the worker answers a poll after it.
        deadline = None
        while True:
            poll = group.poll()
            if deadline is None:
                deadline = self.stopped_at + stop_wait_s(group._failure, poll)
            self.reports.extend(poll.reports)
            self.shadow.extend(poll.shadow_reports)
            if self.on_stopped is not None and any(r.snapshot and r.checkpoint is not None for r in poll.reports):
                # Rank 0's part of the snapshot came last (a sharded one's shards are
                # written before it): committed now, before the others' loops (or
                # `raylight run`'s scripts) have ended.
                self.count_stopped()
            if any(p.state == "finished" for p in poll.polls):
                for m in self.added:
                    ray.kill(m.actor, no_restart=True)
                return None
            if all(p.state != "running" for p in poll.polls) or monotonic() > deadline:
                break
            time.sleep(min(group._failure.poll_interval_s, STOP_POLL_S))  # training is paused
        self.phases["stop_s"] = monotonic() - self.stopped_at
        return poll

    def count_stopped(self) -> None:
        """Checkpoints rank 0 reported while stopping are committed by the driver after
        the resize; the state to restore is the newest of them. ``on_stopped`` commits
        them now instead (the leaving workers are still up)."""
        stopped_with = sum(1 for r in self.reports if r.checkpoint is not None)
        self.commit += stopped_with
        if self.target is not None:
            self.target = replace(self.target, next_index=self.target.next_index + stopped_with)
        if self.on_stopped is not None and self.reports:
            delivered, self.reports = self.reports, []
            self.on_stopped(delivered)
            self.phases["committed_s"] = monotonic() - self.stopped_at

    def choose(self, poll: GroupPoll) -> tuple[list[int], list[int], list[int]] | ResizeOutcome:
        """Kill the dead, the leaving and those beyond use; returns the ranks kept (a
        holder of the state first), the reserves and the holders, or a fallback."""
        group = self.group
        dead = {f.rank for f in poll.failures if f.kind in ("died", "hang")}
        # Workers on a node given notice stop like the others (and deliver their part of
        # the snapshot), then go.
        dead |= set(self.leaving)
        live = {p.rank: p for p in poll.polls if p.rank not in dead and p.state in ("paused", "errored")}
        log.info(
            "resize: workers %s; dead %s; holding %s",
            {p.rank: p.state for p in poll.polls}, sorted(dead), {r: p.commit for r, p in live.items()},
        )
        for rank in dead | {p.rank for p in poll.polls if p.rank not in live}:
            ray.kill(group._members[rank].actor, no_restart=True)
        newest = max((p.commit for p in live.values()), default=-1)
        if newest > self.commit:  # rank 0 died between keeping a checkpoint and reporting it
            holder = next(r for r, p in live.items() if p.commit == newest)
            self.adopted = group._get([group._members[holder].actor.held_commit.remote()], group._failure.worker_start_timeout_s, "hand over their checkpoint")[0]
            self.commit = newest
            if self.target is not None:  # the driver commits it next
                self.target = replace(self.target, next_index=newest + 1)
        holders = [r for r, p in live.items() if p.commit == self.commit]
        if self.commit >= 0 and not holders:
            return self.fallback(f"no live worker holds checkpoint {self.commit}")
        keep_ranks = ([holders[0]] if holders else []) + [r for r in sorted(live) if r not in holders[:1]]
        if not keep_ranks:
            return self.fallback("no live worker left")
        # Live workers beyond the new size that could stand in for a kept one (they hold
        # the state, where there is one) go only once the group has re-formed: a kept one
        # can still die before taking its rank.
        reserve_ranks = [r for r in keep_ranks[self.num_workers :] if self.commit < 0 or r in holders]
        keep_ranks = keep_ranks[: self.num_workers]
        for rank in sorted(live):
            if rank not in keep_ranks and rank not in reserve_ranks:
                ray.kill(group._members[rank].actor, no_restart=True)
        return keep_ranks, reserve_ranks, holders

    def relaunch(self, keep_ranks: list[int], reserve_ranks: list[int], holders: list[int]) -> ResizeOutcome:
        """The new group: survivors, then new workers (replacing those lost or hung while
        stopping, in their free bundles), launched from the state a holder broadcasts."""
        group = self.group
        reserves = [group._members[r] for r in reserve_ranks]
        with self._killed_unless_members(list(reserves)):
            survivors = [group._members[r] for r in keep_ranks]
            holding = {id(group._members[r]) for r in holders}  # each rank of an elastic run keeps its copy
            room = max(0, self.num_workers - len(survivors))
            for extra in self.added[room:]:
                ray.kill(extra.actor, no_restart=True)
            added = self.added[:room]
            short = self.num_workers - len(survivors) - len(added)
            group._members = survivors + added  # the bundles of those removed are free again
            if short > 0:  # replace workers lost or hung while stopping (their bundles are free)
                try:
                    added += group._spawn(short, wait_s=self.grow_wait_s())
                except (InsufficientResourcesError, WorkerStartError) as exc:
                    log.warning("could not replace %d worker(s) (%s); continuing with %d", short, exc, len(survivors) + len(added))
            launch_began = monotonic()
            failed = self.launch(survivors + added, reserves, holding)
            if failed is not None:
                return failed
            self.phases["launch_s"] = monotonic() - launch_began
            group._release_unused_groups()
            return ResizeOutcome(
                "in_place", self.reports, shadow=self.shadow, adopted=self.adopted,
                stopped_at=self.stopped_at, stopped_wall=self.stopped_wall, phases=self.phases,
            )

    def launch(self, members: list[_Member], reserves: list[_Member], holding: set[int]) -> ResizeOutcome | None:
        """Launch ``members``, going on without any that die before taking their ranks (a
        reserve takes a lost one's place); None once launched, else a fallback."""
        group = self.group
        while True:
            try:
                group._launch(members, broadcast=self.commit if self.commit >= 0 else None, threads=self.threads, plan=self.plan, target=self.target)
                return None
            except MembersLostError as exc:
                # A survivor that was paused a moment ago can still die (its node went
                # too): go on without it, from another that holds the state if it held it.
                wanted = len(members)
                members = [m for m in members if m not in exc.members]
                while reserves and len(members) < wanted:  # a reserve takes a lost one's place
                    members.append(reserves.pop(0))
                members.sort(key=lambda m: id(m) not in holding)  # stable: a holder first
                if not members or (self.commit >= 0 and id(members[0]) not in holding):
                    return self.fallback(str(exc))
                log.warning("%s; resizing in place without them", exc)
                for m in exc.members:
                    kill_quietly(m.actor)
            except WorkerStartError as exc:
                return self.fallback(str(exc))

    @contextlib.contextmanager
    def _killed_unless_members(self, workers: list[_Member]) -> Iterator[None]:
        """On the way out, kill those of ``workers`` that did not become members."""
        try:
            yield
        finally:
            kept = {id(m) for m in self.group._members}
            for m in workers:
                if id(m) not in kept:
                    kill_quietly(m.actor)
