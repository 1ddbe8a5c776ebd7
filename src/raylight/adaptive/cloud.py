"""Growing and shrinking the cluster the jobs share (cloud mode), pure: no Ray.

Beside the sharing policy (``sharing.py``), which divides the nodes there are, this
decides which nodes there should be: how many nodes of which type to ask the autoscaler
for, and which idle nodes to let go. The cluster's worth is what its allocation gives
the jobs::

    VALUE(nodes) = sum_j w_j * SPEEDUP_j(allocation on nodes)     (a waiting job: 0)

the sharing policy's speedups (its resize penalty included) summed, each job counted by
its weight, so one job at its minimum is worth 1 and a job that waits is worth 0. (The
policy's own p = -1 fitness is 0 while any job waits, so it cannot say what the node
that would start a waiting job is worth; the sum can.) Adding ``k`` nodes of a type is

    worth it when  gain / (k * price_per_hour) >= gain_per_usd_h   and  gain / k >= min_gain

with ``gain = VALUE(with them) - VALUE(without)``: a node must buy at least
``gain_per_usd_h`` job-speedups per USD per hour it costs (``CloudSettings``, the one
home of the threshold). A free node type (price 0) needs only ``min_gain``. The search is
greedy, as the sharing policy's: the candidate (type, k) with the most gain per USD goes
first, looking ahead up to ``lookahead`` nodes of a type at once (a job may gain only
once it spans a second node), cheaper types first at equal gain, until none is worth it
or ``max_nodes`` (and each type's own ``max_count``) is reached.

Letting go: a node that no allocation uses (no replica of any job on it) is released once
it has been unused for ``release_after_s``; a node asked for that has not joined yet is
dropped from the ask at once when unused. A node an allocation uses is never released,
whatever it costs: the threshold is for asking, not for keeping. That is the hysteresis
that keeps it from oscillating: a node is asked for only when its gain pays for it, kept
while any job uses it (a smaller gain keeps it), and let go only after it has stayed idle
for ``release_after_s``; nodes asked for and not yet joined count as present, so an ask
is not repeated while the autoscaler starts them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from raylight.adaptive.sharing import Allocation, JobModel, SharingPolicy

# Job-speedups a node must add per USD per hour of its price to be asked for: a node of
# 2 USD/h must add half a job's minimum's goodput (0.5 speedup), a spot CPU node of
# 0.1 USD/h 0.025. A rough price of goodput; raise it to spend less, lower it to wait less.
GAIN_PER_USD_H = 0.25
# The least gain per node worth asking for, whatever the price (a free node type too).
MIN_GAIN = 0.05
# How long a node stays unused before it is let go (the autoscaler's idle timeout follows).
RELEASE_AFTER_S = 60.0
# Nodes of one type considered at once (a job may gain only once it spans one more node).
LOOKAHEAD = 4


@dataclass(frozen=True)
class CloudSettings:
    """The knobs of cloud mode (see the module docstring for what each does)."""

    gain_per_usd_h: float = GAIN_PER_USD_H
    min_gain: float = MIN_GAIN
    max_nodes: int | None = None  # every node counted, the head included; None: the types' own maxima
    release_after_s: float = RELEASE_AFTER_S
    lookahead: int = LOOKAHEAD

    def __post_init__(self) -> None:
        for name in ("gain_per_usd_h", "min_gain", "release_after_s"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"cloud setting {name} must be a finite number >= 0, got {value!r}")
        if self.max_nodes is not None and self.max_nodes < 1:
            raise ValueError(f"cloud setting max_nodes must be >= 1 (the head counts), got {self.max_nodes}")
        if self.lookahead < 1:
            raise ValueError(f"cloud setting lookahead must be >= 1, got {self.lookahead}")


@dataclass(frozen=True)
class NodeType:
    """A type of node the autoscaler can add: the worker slots one gives, its price (USD
    per hour; None: not priced, never asked for) and how many of it the cluster may hold."""

    name: str
    slots: int
    price_per_hour: float | None
    max_count: int | None = None


@dataclass(frozen=True)
class CloudNode:
    """A node of the cluster now: its id, type and slots; ``releasable`` False for nodes
    the autoscaler does not manage (the head)."""

    name: str
    node_type: str
    slots: int
    releasable: bool = True


@dataclass(frozen=True)
class CloudDecision:
    """What to ask for: ``wanted`` nodes per type (those kept plus ``added``), the nodes to
    let go, the value before and after, and one reason per change."""

    wanted: dict[str, int]
    added: dict[str, int]
    release: tuple[str, ...]
    value: float
    value_before: float
    reasons: tuple[str, ...]
    allocation: Allocation | None = None
    pending: dict[str, int] = field(default_factory=dict)


def cluster_value(allocation: Allocation, weights: Mapping[str, float]) -> float:
    """VALUE: the jobs' speedups, each times its weight (a waiting job counts 0)."""
    return float(sum(weights.get(name, 1.0) * job.speedup for name, job in allocation.jobs.items() if job.nodes))


class CloudPlanner:
    """Decides, decision after decision, the nodes to ask for and those to let go. It
    remembers what it asked for (``asked``: nodes per type) and since when each node has
    been unused; ``decide`` is otherwise a function of its arguments."""

    def __init__(self, policy: SharingPolicy | None = None, settings: CloudSettings | None = None) -> None:
        self.policy = policy or SharingPolicy()
        self.settings = settings or CloudSettings()
        self.asked: dict[str, int] = {}
        self.unused_since: dict[str, float] = {}

    def decide(
        self, now: float, jobs: Sequence[JobModel], nodes: Sequence[CloudNode], types: Sequence[NodeType],
    ) -> CloudDecision:
        """The decision for ``jobs`` (arrival order; ``current`` indexes into ``nodes``) on
        ``nodes`` (those alive now) given the node ``types`` the autoscaler can add."""
        by_type = {t.name: t for t in types}
        weights = {job.name: job.weight for job in jobs}
        have: dict[str, int] = {}
        for node in nodes:
            have[node.node_type] = have.get(node.node_type, 0) + 1
        # Nodes asked for and not joined yet count as present: the ask is not repeated.
        pending = {t: n - have.get(t, 0) for t, n in self.asked.items() if t in by_type and n > have.get(t, 0)}
        cluster = list(nodes) + [
            CloudNode(f"(asked {t} #{i + 1})", t, by_type[t].slots) for t, n in sorted(pending.items()) for i in range(n)
        ]
        alloc = self.policy.allocate(jobs, [n.slots for n in cluster])
        before = cluster_value(alloc, weights)
        used = {i for job in alloc.jobs.values() for i in job.nodes}
        release, dropped, reasons = self._idle(now, cluster, used, len(nodes))
        gone = set(release) | set(dropped)
        kept = [n for n in cluster if n.name not in gone]
        added, value, alloc, why = self._grow(jobs, kept, by_type, weights)
        wanted: dict[str, int] = {}
        for node in kept:
            if node.node_type in by_type:
                wanted[node.node_type] = wanted.get(node.node_type, 0) + 1
        for t, k in added.items():
            wanted[t] = wanted.get(t, 0) + k
        self.asked = {t: n for t, n in wanted.items() if n > 0}
        return CloudDecision(
            wanted=dict(self.asked), added=added, release=tuple(release), value=value, value_before=before,
            reasons=tuple(reasons + why), allocation=alloc, pending=pending,
        )

    # -- letting go --------------------------------------------------------------------
    def _idle(
        self, now: float, cluster: Sequence[CloudNode], used: set[int], alive: int,
    ) -> tuple[list[str], list[str], list[str]]:
        """(alive nodes to release, asked nodes to drop from the ask, reasons)."""
        release: list[str] = []
        dropped: list[str] = []
        reasons: list[str] = []
        seen = set()
        for i, node in enumerate(cluster):
            if i in used or not node.releasable:
                continue
            if i >= alive:  # asked for, not joined: no job needs it now
                dropped.append(node.name)
                continue
            seen.add(node.name)
            since = self.unused_since.setdefault(node.name, now)
            if now - since >= self.settings.release_after_s:
                release.append(node.name)
                reasons.append(
                    f"release {node.node_type} node {node.name[:12]}: no job's allocation has used it for "
                    f"{now - since:.0f} s (release_after_s={self.settings.release_after_s:g})"
                )
        self.unused_since = {k: v for k, v in self.unused_since.items() if k in seen}
        if dropped:
            reasons.append(f"no longer ask for {len(dropped)} node(s) not joined yet: no job's allocation would use them")
        return release, dropped, reasons

    # -- asking ------------------------------------------------------------------------
    def _grow(
        self, jobs: Sequence[JobModel], cluster: list[CloudNode], types: Mapping[str, NodeType],
        weights: Mapping[str, float],
    ) -> tuple[dict[str, int], float, Allocation, list[str]]:
        """Add the most gain per USD first while it is worth it and the bounds allow."""
        s = self.settings
        slots = [n.slots for n in cluster]
        alloc = self.policy.allocate(jobs, slots)
        value = cluster_value(alloc, weights)
        count = {t: sum(1 for n in cluster if n.node_type == t) for t in types}
        added: dict[str, int] = {}
        reasons: list[str] = []
        while True:
            room_total = math.inf if s.max_nodes is None else s.max_nodes - len(slots)
            best: tuple[tuple[float, float, float, str], str, int, float, Allocation] | None = None
            for t in sorted(types.values(), key=lambda t: t.name):
                room = min(room_total, math.inf if t.max_count is None else t.max_count - count[t.name])
                if t.price_per_hour is None or t.slots < 1 or room < 1:
                    continue
                for k in range(1, int(min(room, s.lookahead)) + 1):
                    trial = self.policy.allocate(jobs, slots + [t.slots] * k)
                    gain = cluster_value(trial, weights) - value
                    if gain / k < max(s.min_gain, 1e-9):
                        continue
                    cost = k * t.price_per_hour
                    per_usd = math.inf if cost == 0 else gain / cost
                    if per_usd < s.gain_per_usd_h:
                        continue
                    key = (per_usd, gain / k, -t.price_per_hour, t.name)
                    if best is None or key[:3] > best[0][:3]:
                        best = (key, t.name, k, gain, trial)
            if best is None:
                return added, value, alloc, reasons
            (per_usd, _, _, _), name, k, gain, alloc = best
            slots += [types[name].slots] * k
            count[name] += k
            added[name] = added.get(name, 0) + k
            value += gain
            price = types[name].price_per_hour
            reasons.append(
                f"ask for {k} {name} node(s): +{gain:.2f} job-speedup for {k * (price or 0):g} USD/h"
                + ("" if per_usd == math.inf else f" ({per_usd:.2f} per USD/h >= gain_per_usd_h={s.gain_per_usd_h:g})")
            )
