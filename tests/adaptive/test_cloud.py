"""Cloud mode's pure math (raylight.adaptive.cloud): which nodes to ask for and which to
let go, over random job models."""

import numpy as np
import pytest

from raylight.adaptive.cloud import CloudNode, CloudPlanner, CloudSettings, NodeType, cluster_value
from raylight.adaptive.goodput import GoodputFunction, GradParams, PerfParams
from raylight.adaptive.sharing import JobModel
from tests.adaptive.test_sharing import random_job

HEAD = CloudNode("head", "head", 1, releasable=False)
CHEAP = NodeType("cheap", 2, 0.1, max_count=8)


def scaling_job(name: str, **kw) -> JobModel:
    """Compute-bound, cheap all-reduce, noisy gradients: it gains from every replica."""
    perf = PerfParams(0.01, 0.01, 0.001, 0.0, 0.001, 0.0, 1.0)
    kw.setdefault("max_replicas", 8)
    return JobModel(name, GoodputFunction(perf, GradParams(1.0, 100.0), 32), max_batch_size=1024,
                    atomic_bsz_range=(8, 256), **kw)


def planner(**kw) -> CloudPlanner:
    return CloudPlanner(settings=CloudSettings(**kw))


@pytest.mark.parametrize("seed", range(6))
def test_it_never_asks_beyond_max_nodes_nor_a_type_s_own_maximum(seed):
    rng = np.random.default_rng(seed)
    jobs = [random_job(rng, f"j{i}", max_replicas=int(rng.integers(1, 12))) for i in range(int(rng.integers(1, 6)))]
    max_nodes = int(rng.integers(1, 7))
    types = [NodeType("a", int(rng.integers(1, 5)), float(rng.uniform(0, 1)), max_count=int(rng.integers(0, 4))),
             NodeType("b", int(rng.integers(1, 5)), float(rng.uniform(0, 1)), max_count=None)]
    p = planner(max_nodes=max_nodes, gain_per_usd_h=0.0, min_gain=0.0)
    decision = p.decide(0.0, jobs, [HEAD], types)
    assert 1 + sum(decision.wanted.values()) <= max(max_nodes, 1)
    assert decision.wanted.get("a", 0) <= types[0].max_count
    assert decision.allocation is not None
    assert sum(a.replicas for a in decision.allocation.jobs.values()) <= 1 + sum(
        t.slots * decision.wanted.get(t.name, 0) for t in types)


@pytest.mark.parametrize("seed", range(4))
def test_it_asks_nothing_when_no_job_gains(seed):
    """Fixed jobs that fit, and adaptive jobs already at their maximum, gain nothing from a node."""
    rng = np.random.default_rng(seed)
    jobs = [JobModel("fixed", None, min_replicas=1, current=(0,))]
    jobs += [random_job(rng, f"j{i}", max_replicas=1, current=(1,)) for i in range(2)]
    nodes = [HEAD, CloudNode("n1", "cheap", 2)]
    decision = planner(gain_per_usd_h=0.0, min_gain=1e-6).decide(0.0, jobs, nodes, [CHEAP, NodeType("free", 4, 0.0)])
    assert decision.added == {} and decision.wanted == {"cheap": 1}, decision.reasons


def test_no_jobs_asks_nothing_and_idle_nodes_go_after_release_after_s():
    p = planner(release_after_s=30)
    nodes = [HEAD, CloudNode("n1", "cheap", 2), CloudNode("n2", "cheap", 2)]
    first = p.decide(0.0, [], nodes, [CHEAP])
    assert first.added == {} and first.release == () and first.wanted == {"cheap": 2}  # not idle long enough yet
    later = p.decide(31.0, [], nodes, [CHEAP])
    assert set(later.release) == {"n1", "n2"} and later.wanted == {}
    assert all("release" in r for r in later.reasons)


def test_a_node_a_job_uses_is_kept_whatever_it_costs():
    jobs = [scaling_job("a", current=(1, 1))]
    nodes = [HEAD, CloudNode("n1", "dear", 2)]
    p = planner(release_after_s=0, gain_per_usd_h=1e6)
    decision = p.decide(100.0, jobs, nodes, [NodeType("dear", 2, 50.0)])
    assert decision.release == () and decision.wanted == {"dear": 1} and decision.added == {}


def test_a_job_that_gains_gets_nodes_and_the_ask_is_not_repeated_while_they_join():
    jobs = [scaling_job("a", current=(0,))]
    p = planner(max_nodes=4)
    first = p.decide(0.0, jobs, [HEAD], [CHEAP])
    assert first.added == {"cheap": 3} and first.wanted == {"cheap": 3}, first.reasons
    assert first.value > first.value_before and "ask for" in first.reasons[0]
    again = p.decide(1.0, jobs, [HEAD], [CHEAP])  # none joined yet: they count as asked for
    assert again.added == {} and again.wanted == {"cheap": 3} and again.pending == {"cheap": 3}
    joined = [HEAD, CloudNode("n1", "cheap", 2)]
    part = p.decide(2.0, jobs, joined, [CHEAP])
    assert part.added == {} and part.wanted == {"cheap": 3} and part.pending == {"cheap": 2}


def test_asked_nodes_are_dropped_at_once_when_the_job_that_wanted_them_ends():
    p = planner(max_nodes=3)
    assert p.decide(0.0, [scaling_job("a", current=(0,))], [HEAD], [CHEAP]).wanted == {"cheap": 2}
    after = p.decide(1.0, [], [HEAD], [CHEAP])
    assert after.wanted == {} and after.release == () and "no longer ask" in after.reasons[0]


def test_the_threshold_weighs_the_gain_against_the_price():
    jobs = [scaling_job("a", current=(0,))]
    cheap = planner(max_nodes=2).decide(0.0, jobs, [HEAD], [NodeType("t", 2, 0.1)])
    dear = planner(max_nodes=2).decide(0.0, jobs, [HEAD], [NodeType("t", 2, 1000.0)])
    unpriced = planner(max_nodes=2).decide(0.0, jobs, [HEAD], [NodeType("t", 2, None)])
    assert cheap.added == {"t": 1} and dear.added == {} and unpriced.added == {}
    # at exactly the gain the node buys, the threshold decides
    gain = cheap.value - cheap.value_before
    at = planner(max_nodes=2, gain_per_usd_h=gain / 0.1 * 0.999).decide(0.0, jobs, [HEAD], [NodeType("t", 2, 0.1)])
    over = planner(max_nodes=2, gain_per_usd_h=gain / 0.1 * 1.001).decide(0.0, jobs, [HEAD], [NodeType("t", 2, 0.1)])
    assert at.added == {"t": 1} and over.added == {}


@pytest.mark.parametrize("seed", range(4))
def test_the_cheaper_type_is_preferred_at_equal_gain(seed):
    rng = np.random.default_rng(seed)
    jobs = [random_job(rng, "a", current=(0,), max_replicas=3), scaling_job("b")]
    slots = int(rng.integers(1, 4))
    price = float(rng.uniform(0.01, 0.5))
    types = [NodeType("dear", slots, price * 2, max_count=1), NodeType("cheap", slots, price, max_count=1)]
    decision = planner(max_nodes=2, gain_per_usd_h=0.0).decide(0.0, jobs, [CloudNode("head", "head", 2, False)], types)
    assert decision.added in ({"cheap": 1}, {}), decision.added
    free = planner(max_nodes=2, gain_per_usd_h=0.0).decide(
        0.0, jobs, [CloudNode("head", "head", 2, False)], [NodeType("z", slots, 0.0, 1), NodeType("a", slots, 0.0, 1)])
    assert free.added in ({"a": 1}, {}), free.added  # equal price too: the first by name


def test_a_waiting_job_is_worth_the_node_that_starts_it():
    jobs = [JobModel("a", None, min_replicas=1, current=(0,)), JobModel("b", None, min_replicas=2)]
    decision = planner().decide(0.0, jobs, [HEAD], [CHEAP])
    assert decision.added == {"cheap": 1}
    assert decision.allocation is not None and decision.allocation.jobs["b"].replicas == 2
    assert cluster_value(decision.allocation, {"a": 1, "b": 1}) == pytest.approx(2.0)


def test_deciding_again_on_the_same_cluster_does_not_oscillate():
    rng = np.random.default_rng(7)
    jobs = [random_job(rng, f"j{i}") for i in range(3)]
    p = planner(max_nodes=5, release_after_s=10)
    nodes = [HEAD]
    wanted = []
    for t in range(6):  # the asked nodes join one decision later
        d = p.decide(float(t * 20), jobs, nodes, [CHEAP])
        wanted.append(d.wanted.get("cheap", 0))
        nodes = [HEAD] + [CloudNode(f"n{i}", "cheap", 2) for i in range(d.wanted.get("cheap", 0))]
        jobs = [j if d.allocation is None or not d.allocation.jobs[j.name].nodes else
                JobModel(j.name, j.goodput, max_replicas=j.max_replicas, max_batch_size=j.max_batch_size,
                         atomic_bsz_range=j.atomic_bsz_range, accumulation=j.accumulation,
                         current=d.allocation.jobs[j.name].nodes) for j in jobs]
    assert wanted[1:] == [wanted[1]] * 5, wanted  # asked once, then held


@pytest.mark.parametrize("field, value", [("gain_per_usd_h", -1), ("min_gain", float("nan")), ("max_nodes", 0),
                                          ("release_after_s", -5), ("lookahead", 0)])
def test_bad_settings_name_the_setting(field, value):
    with pytest.raises(ValueError, match=field):
        CloudSettings(**{field: value})
