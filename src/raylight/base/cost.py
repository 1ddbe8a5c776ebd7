"""What a run used and what it cost: worker-seconds, node-seconds and prices.

It owns the cost meter (fed, poll after poll, with where the run's workers are), the
prices table (USD per hour per node type, from ``node_type=USD/h`` strings, a YAML/JSON
file, ``RunConfig.prices`` or the ``RAYLIGHT_PRICES`` environment variable) and the
summary a run leaves in ``Result.cost``, ``cost.json`` and ``adaptive.jsonl``.

The model: between two observations every worker counts ``dt`` seconds against its
resource shape (``CPU:1``, ``CPU:4,GPU:1``) and every node that holds at least one of the
run's workers counts ``dt`` against its node type; cost = node-hours x the node type's
price. A node type with no price (and no ``*`` default) is named, never guessed at.
Pure: no Ray, no torch.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from raylight.base.exceptions import ConfigError

PRICES_ENV = "RAYLIGHT_PRICES"  # JSON object {node_type: USD/h}, set by `raylight submit --price`
DEFAULT_PRICE = "*"  # the price of every node type not named
HEAD_TYPE = "head"
NODE_GROUP_LABEL = "ray.io/node-group"  # Ray's label for the node type (autoscaler, KubeRay)
HEAD_RESOURCE = "node:__internal_head__"
_SHAPE_FIRST = ("CPU", "GPU")


@dataclass(frozen=True)
class WorkerPlace:
    """Where one worker runs: its node and node type, and the resources it holds."""

    rank: int
    node_id: str
    node_type: str
    resources: Mapping[str, float] = field(default_factory=dict)

    @property
    def shape(self) -> str:
        return shape_of(self.resources)


def shape_of(resources: Mapping[str, float]) -> str:
    """``CPU:4,GPU:1``: the amounts held, CPU and GPU first, then the others by name;
    Ray's bookkeeping resources (``node:...``, memory, object store) left out."""
    keep = {
        k: float(v) for k, v in resources.items()
        if v and not k.startswith("node:") and k not in ("memory", "object_store_memory")
        and not k.startswith("accelerator_type:")
    }
    order = [k for k in _SHAPE_FIRST if k in keep] + sorted(k for k in keep if k not in _SHAPE_FIRST)
    return ",".join(f"{k}:{keep[k]:g}" for k in order) or "none"


def node_type_of(labels: Mapping[str, Any], resources: Mapping[str, float]) -> str:
    """A node's type: the autoscaler's (or KubeRay's group) name, from Ray's
    ``ray.io/node-group`` label; else ``head`` for the head node; else its shape."""
    group = labels.get(NODE_GROUP_LABEL)
    if isinstance(group, list | tuple):  # some Ray APIs give label values as lists
        group = group[0] if group else None
    if group:
        return str(group)
    if resources.get(HEAD_RESOURCE):
        return HEAD_TYPE
    return shape_of(resources)


# -- the meter -------------------------------------------------------------------------
class CostMeter:
    """Integrates observations of where the workers are over time. ``observe(now,
    places)`` counts the time since the previous observation against the places seen
    then (the workers ran there until now); ``stop(now)`` closes the last interval.
    ``previous``: the totals of earlier attempts of the same run (a resumed run)."""

    def __init__(self, start: float, *, previous: Mapping[str, Any] | None = None) -> None:
        self.start = start
        self._last: tuple[float, tuple[WorkerPlace, ...]] | None = None
        self._end: float | None = None
        self.worker_seconds: dict[str, float] = {}
        self.node_seconds: dict[str, float] = {}
        self.max_workers = 0
        self._before_s = 0.0  # wall seconds of earlier attempts
        if previous:
            self._before_s = float(previous.get("wall_s", 0.0))
            self.max_workers = int(previous.get("max_workers", 0))
            for key, into in (("worker_seconds", self.worker_seconds), ("node_seconds", self.node_seconds)):
                for name, seconds in dict(previous.get(key) or {}).items():
                    into[str(name)] = float(seconds)

    def observe(self, now: float, places: Iterable[WorkerPlace]) -> None:
        self._advance(now)
        placed = tuple(places)
        self.max_workers = max(self.max_workers, len(placed))
        self._last = (now, placed)

    def stop(self, now: float) -> None:
        """The run ended: count the last interval; later observations are ignored."""
        if self._end is None:
            self._advance(now)
            self._last = None
            self._end = now

    def _advance(self, now: float) -> None:
        if self._end is not None or self._last is None:
            return
        then, placed = self._last
        dt = now - then
        if dt <= 0:
            return
        for place in placed:
            _add(self.worker_seconds, place.shape, dt)
        for node_type in {p.node_id: p.node_type for p in placed}.values():  # a node counts once
            _add(self.node_seconds, node_type, dt)

    def wall_s(self, now: float) -> float:
        return self._before_s + max(0.0, (self._end if self._end is not None else now) - self.start)

    def summary(self, now: float, prices: Prices | None = None) -> dict[str, Any]:
        """``Result.cost``: wall_s, worker_seconds by shape, node_seconds by node type,
        cost_usd (None without a price for every node type used) and the unpriced types."""
        prices = prices or Prices({})
        usd, unpriced = prices.cost(self.node_seconds)
        return {
            "wall_s": round(self.wall_s(now), 3),
            "worker_seconds": {k: round(v, 3) for k, v in sorted(self.worker_seconds.items())},
            "node_seconds": {k: round(v, 3) for k, v in sorted(self.node_seconds.items())},
            "max_workers": self.max_workers,
            "prices": dict(prices.usd_per_hour),
            "cost_usd": usd,
            "unpriced": unpriced,
        }


def _add(into: dict[str, float], key: str, seconds: float) -> None:
    into[key] = into.get(key, 0.0) + seconds


# -- prices ----------------------------------------------------------------------------
class PriceError(ConfigError):
    """A price entry that cannot be read; the message names it and the expected form."""


@dataclass(frozen=True)
class Prices:
    """USD per hour per node type; ``*`` prices every node type not named."""

    usd_per_hour: Mapping[str, float]

    def __post_init__(self) -> None:
        for name, price in self.usd_per_hour.items():
            _check_entry(name, price, source="prices")

    def price_of(self, node_type: str) -> float | None:
        found = self.usd_per_hour.get(node_type, self.usd_per_hour.get(DEFAULT_PRICE))
        return None if found is None else float(found)

    def cost(self, node_seconds: Mapping[str, float]) -> tuple[float | None, list[str]]:
        """(USD, node types without a price). USD is None when any node type used has
        no price, or no prices were given at all."""
        total, unpriced = 0.0, []
        for node_type, seconds in sorted(node_seconds.items()):
            price = self.price_of(node_type)
            if price is None:
                unpriced.append(node_type)
            else:
                total += seconds / 3600.0 * price
        return (None if unpriced or not self.usd_per_hour else total), unpriced


def _check_entry(name: Any, price: Any, *, source: str) -> float:
    if not isinstance(name, str) or not name.strip():
        raise PriceError(f"{source}: node type {name!r} must be a non-empty string (e.g. m5.xlarge=0.192)")
    if isinstance(price, bool) or not isinstance(price, int | float) or not math.isfinite(price) or price < 0:
        raise PriceError(
            f"{source}: the price of {name!r} must be a finite number of USD per hour >= 0, got {price!r}"
        )
    return float(price)


def parse_price(text: str) -> tuple[str, float]:
    """``node_type=USD/h`` (``m5.xlarge=0.192``, ``gpu=$2.5/h``) -> (node type, USD/h)."""
    name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not sep or not name or not value:
        raise PriceError(f"price {text!r}: expected node_type=USD/h, e.g. m5.xlarge=0.192 or '*=0.1' for every other type")
    number = value.removesuffix("/h").removesuffix("/hr").strip().removeprefix("$").strip()
    try:
        price = float(number)
    except ValueError:
        raise PriceError(f"price {text!r}: {value!r} is not a number of USD per hour (e.g. {name}=0.192)") from None
    return name, _check_entry(name, price, source=f"price {text!r}")


def parse_prices(items: Sequence[str]) -> dict[str, float]:
    """Several ``node_type=USD/h`` strings (``--price``, repeatable) -> the table."""
    table: dict[str, float] = {}
    for text in items:
        name, price = parse_price(text)
        if name in table and table[name] != price:
            raise PriceError(f"price {text!r}: {name!r} was already given {table[name]:g} USD/h")
        table[name] = price
    return table


def load_prices(path: str, text: str | None = None) -> dict[str, float]:
    """A YAML or JSON file ``{node_type: USD/h}`` (``--prices FILE``) -> the table.
    ``text``: the file's content, where the caller has read it already."""
    import yaml

    if text is None:
        try:
            with open(os.path.expanduser(path), encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise PriceError(f"prices file {path!r} cannot be read: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError as exc:
        raise PriceError(f"prices file {path!r} is not YAML or JSON: {exc}") from None
    if isinstance(data, dict) and set(data) == {"prices"}:  # a file with one `prices:` section
        data = data["prices"]
    if not isinstance(data, dict):
        raise PriceError(
            f"prices file {path!r} must map node types to USD per hour, e.g. 'm5.xlarge: 0.192', "
            f"got {type(data).__name__}"
        )
    return {str(k): _check_entry(k, v, source=f"prices file {path!r}") for k, v in data.items()}


def prices_env_value(table: Mapping[str, float]) -> str:
    """The value of ``RAYLIGHT_PRICES`` for a run started elsewhere (``raylight submit``)."""
    return json.dumps({k: _check_entry(k, v, source=PRICES_ENV) for k, v in table.items()}, sort_keys=True)


def prices_from_env(environ: Mapping[str, str]) -> dict[str, float] | None:
    """The table ``RAYLIGHT_PRICES`` holds (JSON, or ``a=1,b=2``); None when unset."""
    raw = environ.get(PRICES_ENV, "").strip()
    if not raw:
        return None
    if raw.startswith("{"):
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise PriceError(f"{PRICES_ENV} is not a JSON object of USD per hour: {exc}") from None
        if not isinstance(data, dict):
            raise PriceError(f"{PRICES_ENV} must be a JSON object {{node_type: USD/h}}")
        return {str(k): _check_entry(k, v, source=PRICES_ENV) for k, v in data.items()}
    return parse_prices([p for p in raw.split(",") if p.strip()])


def format_cost(cost: Mapping[str, Any]) -> str:
    """One line for a summary: time, worker- and node-hours, USD."""
    workers = ", ".join(f"{k} {v / 3600:.3g} h" for k, v in cost.get("worker_seconds", {}).items()) or "none"
    nodes = ", ".join(f"{k} {v / 3600:.3g} h" for k, v in cost.get("node_seconds", {}).items()) or "none"
    usd = cost.get("cost_usd")
    if usd is not None:
        money = f"${usd:.4f}"
    elif cost.get("prices"):
        money = f"unknown (no price for {', '.join(cost.get('unpriced', []))})"
    else:
        money = "no prices given"
    return f"{cost.get('wall_s', 0.0):.1f} s wall; workers: {workers}; nodes: {nodes}; cost: {money}"
