"""Cloud mode: the scheduler grows and shrinks the cluster through Ray's autoscaler.

Off by default (``raylight scheduler start --cloud``). Every ``interval_s`` the scheduler
plans on the nodes there are and the node types the autoscaler can add
(``raylight.adaptive.cloud``: a node is asked for when the job-speedup it adds per USD per
hour of its price reaches ``gain_per_usd_h``; a node no allocation has used for
``release_after_s`` is let go) and applies the plan with one call::

    ray.autoscaler.sdk.request_resources(bundles=[shape of every node wanted])

the shapes of the nodes it keeps (the head's included) and one bundle per node type
asked for: the autoscaler starts what the bundles do not fit on, and a smaller request
lets the nodes left out go after its idle timeout (``idle_timeout_minutes``). The request
is the whole cluster's (Ray keeps one): runs that take part in the scheduler never make
their own (their allocation comes first, ``driver/controller/scaling.py``). It stays
after the scheduler stops; ``stop`` withdraws it.

The node types come from the cluster's autoscaling config (its ``available_node_types``:
resources and ``max_workers`` each; ``node_types_from_config``), their prices from the
price table ``raylight submit --price`` uses (``raylight.base.cost.Prices``; a type with
no price is never asked for). What the cluster cost since the scheduler started (every
node counted, node-hours x price) is in its status.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from raylight.adaptive.cloud import CloudDecision, CloudNode, CloudPlanner, CloudSettings, NodeType
from raylight.base.clock import monotonic, wall
from raylight.base.cost import CostMeter, Prices, WorkerPlace
from raylight.base.exceptions import ConfigError
from raylight.scheduler.nodes import NodeInfo, bundle_of, cluster_nodes
from raylight.scheduler.state import SchedulerState

log = logging.getLogger("raylight")

# How often cloud mode re-plans the cluster (a plan takes milliseconds for a few jobs;
# the autoscaler itself acts every few seconds).
CLOUD_INTERVAL_S = 5.0
_HISTORY = 20  # the plan changes kept for the status


@dataclass(frozen=True)
class CloudConfig:
    """Cloud mode's settings, as plain data from the CLI: the node types the autoscaler can
    add (name -> resources of one node, and the most of it), the prices, the knobs."""

    node_types: dict[str, dict[str, Any]]
    prices: dict[str, float] = field(default_factory=dict)
    settings: CloudSettings = field(default_factory=CloudSettings)
    interval_s: float = CLOUD_INTERVAL_S

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> CloudConfig:
        """From ``{"node_types", "prices", "gain_per_usd_h", "max_nodes", "release_after_s",
        "interval_s"}`` (what ``start(cloud=...)`` sends the actor)."""
        types = data.get("node_types") or {}
        if not types:
            raise ConfigError(
                "cloud mode needs the node types the autoscaler can add: give the cluster's autoscaling "
                "config (raylight scheduler start --cloud --autoscaling-config cluster.yaml)"
            )
        for name, spec in types.items():
            resources = spec.get("resources") if isinstance(spec, Mapping) else None
            if not isinstance(resources, Mapping) or not resources:
                raise ConfigError(f"node type {name!r}: expected resources of one node, e.g. resources: {{CPU: 4}}, got {spec!r}")
        keys = ("gain_per_usd_h", "min_gain", "max_nodes", "release_after_s", "lookahead")
        try:
            settings = CloudSettings(**{k: data[k] for k in keys if data.get(k) is not None})
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        interval = float(data.get("interval_s") or CLOUD_INTERVAL_S)
        if not interval > 0:
            raise ConfigError(f"cloud setting interval_s must be > 0, got {interval}")
        return cls({str(k): dict(v) for k, v in types.items()}, dict(data.get("prices") or {}), settings, interval)


def node_types_from_config(config: Mapping[str, Any], source: str) -> tuple[dict[str, dict[str, Any]], int | None]:
    """(the worker node types of an autoscaling config, its max nodes with the head) from
    the cluster YAML's ``available_node_types`` / ``head_node_type`` / ``max_workers``."""
    types = config.get("available_node_types")
    if not isinstance(types, Mapping) or not types:
        raise ConfigError(f"{source}: expected available_node_types, a map of node types to their resources and max_workers")
    head = config.get("head_node_type")
    out: dict[str, dict[str, Any]] = {}
    for name, spec in types.items():
        if name == head:
            continue
        if not isinstance(spec, Mapping) or not isinstance(spec.get("resources"), Mapping):
            raise ConfigError(f"{source}: available_node_types.{name}.resources: expected the resources of one node, e.g. {{CPU: 4}}")
        out[str(name)] = {"resources": {str(k): float(v) for k, v in spec["resources"].items()},
                          "max_workers": spec.get("max_workers")}
    top = config.get("max_workers")
    return out, (int(top) + 1 if isinstance(top, int) else None)


def load_node_types(path: str) -> tuple[dict[str, dict[str, Any]], int | None]:
    """``node_types_from_config`` of a YAML or JSON file."""
    import yaml

    try:
        with open(os.path.expanduser(path), encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise ConfigError(f"autoscaling config {path!r} cannot be read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"autoscaling config {path!r} is not YAML or JSON: {exc}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"autoscaling config {path!r}: expected a map with available_node_types")
    return node_types_from_config(data, f"autoscaling config {path!r}")


def request_resources(bundles: list[dict[str, float]]) -> None:
    from ray.autoscaler.sdk import request_resources as ask

    ask(bundles=bundles)


def typed(infos: list[NodeInfo], node_types: Mapping[str, Mapping[str, Any]]) -> list[NodeInfo]:
    """``infos`` with each node that carries no node-type label (its type its shape: Ray's
    fake multi-node provider starts raylets without ``ray.io/node-group``) named after the
    one configured type of exactly its resources; the head, labelled nodes, and shapes that
    match no type or several keep theirs."""
    shapes: dict[tuple[tuple[str, float], ...], list[str]] = {}
    for name, spec in node_types.items():
        shapes.setdefault(tuple(sorted(bundle_of(spec["resources"]).items())), []).append(name)
    out = []
    for node in infos:
        names = [] if node.head or node.node_type in node_types else shapes.get(tuple(sorted(node.shape().items())), [])
        out.append(replace(node, node_type=names[0]) if len(names) == 1 else node)
    return out


class CloudScaler:
    """Plans the cluster for ``state``'s jobs and asks the autoscaler for it (``step``)."""

    def __init__(
        self, state: SchedulerState, config: CloudConfig, *,
        nodes: Callable[[], list[NodeInfo]] = cluster_nodes,
        request: Callable[[list[dict[str, float]]], None] = request_resources,
        clock: Callable[[], float] = monotonic,
    ) -> None:
        self.state = state
        self.config = config
        self.planner = CloudPlanner(state.policy, config.settings)
        self.prices = Prices(config.prices)
        self._nodes = lambda: typed(nodes(), config.node_types)
        self._request, self._clock = request, clock
        self.meter = CostMeter(clock())
        self.bundles: list[dict[str, float]] | None = None  # the request made last
        self.last: CloudDecision | None = None
        self.history: list[dict[str, Any]] = []
        self.error = ""

    def _types(self) -> list[NodeType]:
        return [
            NodeType(name, self.state.slots_of(spec["resources"]), self.prices.price_of(name), spec.get("max_workers"))
            for name, spec in sorted(self.config.node_types.items())
        ]

    def step(self) -> CloudDecision:
        """One plan: observe the nodes (and their cost), decide, request what changed."""
        now = self._clock()
        infos = self._nodes()
        self.meter.observe(now, [WorkerPlace(i, n.node_id, n.node_type) for i, n in enumerate(infos)])
        types = self._types()
        managed = {t.name for t in types}
        nodes = [CloudNode(n.node_id, n.node_type, self.state.slots_of(dict(n.resources)),
                           releasable=n.node_type in managed and not n.head) for n in infos]
        decision = self.planner.decide(now, self.state.job_models([n.node_id for n in infos]), nodes, types)
        kept = [n for n in infos if n.node_id not in decision.release]
        bundles = [n.shape() for n in kept]
        for name, count in sorted(decision.wanted.items()):
            have = sum(1 for n in kept if n.node_type == name)
            bundles += [bundle_of(self.config.node_types[name]["resources"])] * max(count - have, 0)
        if not decision.wanted:
            bundles = []  # nothing of the autoscaler's wanted: withdraw the request
        if bundles != self.bundles:
            self._request(bundles)
            self.bundles = bundles
        if decision.added or decision.release or decision.reasons or (self.last and self.last.wanted != decision.wanted):
            self.history = [*self.history, {
                "time": wall(), "wanted": dict(decision.wanted), "added": dict(decision.added),
                "release": list(decision.release), "reasons": list(decision.reasons),
            }][-_HISTORY:]
        self.last = decision
        return decision

    def withdraw(self) -> None:
        """Withdraw the request (the scheduler stops): the autoscaler goes back to its own demand."""
        self._request([])
        self.bundles = []

    def status(self) -> dict[str, Any]:
        now = self._clock()
        counts: dict[str, int] = {}
        for node in self._nodes():
            counts[node.node_type] = counts.get(node.node_type, 0) + 1
        last = self.last
        return {
            "nodes": counts,
            "asked": dict(last.wanted) if last else {},
            "pending": dict(last.pending) if last else {},
            "value": last.value if last else 0.0,
            "node_types": {t.name: {"slots": t.slots, "price_per_hour": t.price_per_hour, "max": t.max_count} for t in self._types()},
            "bundles": len(self.bundles or []),
            "history": list(self.history),
            "cost": self.meter.summary(now, self.prices),
            "settings": {"gain_per_usd_h": self.config.settings.gain_per_usd_h, "max_nodes": self.config.settings.max_nodes,
                         "release_after_s": self.config.settings.release_after_s, "interval_s": self.config.interval_s},
            "error": self.error,
        }
