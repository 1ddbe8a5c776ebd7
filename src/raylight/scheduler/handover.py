"""Handing slots over between jobs: a job is told only slots no other job holds (no Ray).

The policy (``raylight.adaptive.sharing``) says where the cluster should go, its
*target*; this says what a job may be *told* now. A run follows its allocation's worker
count and Ray places the workers wherever resources are free, so a slot promised to one
job while another still holds it is a growth that cannot happen (the real-run bench saw
it: job b told 4 while a still held 4 of the 6 slots, and b never grew). So:

- shrinking (or keeping its size) is told at once: the holder lets go first;
- growing is told only when the growth fits in the slots no other job *reserves*, a
  job's reservation being the larger of what its last report says it runs on (``held``)
  and what it was last told (``told``: a promise it may be acting on); until then the job
  keeps what it holds and its answer says whose release it waits for;
- a job that holds nothing (new, or waiting) starts at its target where that fits, else
  at its minimum where that fits, else it waits.

A holder's reservation drops when its report shows it released the slots, or when it
leaves (unregisters, or is dropped as silent).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Holding:
    """One job's slots as the scheduler knows them."""

    held: tuple[str, ...]  # node id of each worker its last report says it runs
    told: tuple[str, ...] | None  # the nodes it was last told (None: never told)
    target: tuple[str, ...]  # the policy's allocation for it now
    min_workers: int = 1

    @property
    def reserved(self) -> int:
        return max(len(self.held), len(self.told or ()))


@dataclass(frozen=True)
class Grant:
    """What a job is told: its nodes (empty: it waits) and, when that is short of its
    target, whose slots it waits for."""

    nodes: tuple[str, ...]
    waiting_on: tuple[str, ...] = ()


def grant(job_id: str, jobs: Mapping[str, Holding], total: int) -> Grant:
    """What ``job_id`` may be told now, of ``total`` slots (see the module docstring)."""
    me = jobs[job_id]
    free = total - sum(h.reserved for j, h in jobs.items() if j != job_id)
    want = len(me.target)
    if want <= len(me.held) or want <= free:
        return Grant(me.target)
    holders = _releasing(job_id, jobs)
    if me.held:
        return Grant(me.held, holders)  # it keeps what it runs on until the slots are let go
    if 0 < me.min_workers <= free and me.min_workers <= want:
        return Grant(me.target[: me.min_workers], holders)
    return Grant((), holders)


def _releasing(job_id: str, jobs: Mapping[str, Holding]) -> tuple[str, ...]:
    """The other jobs that reserve more slots than their target: the ones to wait for."""
    return tuple(j for j, h in jobs.items() if j != job_id and h.reserved > len(h.target))


def waiting_reason(need: int, holders: Sequence[str], resource: str) -> str:
    """The answer's ``waiting`` line for a job short of its target."""
    who = ", ".join(holders) or "runs that have not reported since"
    return f"waiting for {need} {resource} slot(s) held by runs {who}, shrinking to their share"
