"""bench/scheduler_sim (issue 58's simulator) on hand-made traces: JCTs known by hand,
the same inputs give the same outcome, and no policy gives a job more than the cluster."""

from collections import Counter

import numpy as np
import pytest
from bench.scheduler_sim import policies
from bench.scheduler_sim.cluster import SimJob, no_contention_s, simulate
from bench.scheduler_sim.traces import Application, Arrival


def placement_table(placement: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step and all-reduce seconds at atomic batch 16 and 64: compute 0.1 s + 0.01 s per
    sample, all-reduce 0.02 s within a node, 0.1 s across nodes, none on one GPU."""
    sizes = np.array([16.0, 64.0])
    sync = 0.0 if sum(placement) == 1 else (0.02 if len(placement) == 1 else 0.1)
    return sizes, 0.1 + 0.01 * sizes + sync, np.full(2, sync)


def app(*, epochs: int = 2, progress: float = 10.0, var: float = 0.0, step_s: float | None = None) -> Application:
    """An application whose epochs each take ``progress`` steps at M0 = 16. With ``step_s``
    every step takes that long on any placement with no all-reduce part (the hand-made
    JCTs), else placement_table's times. ``var`` 0: a larger batch makes no progress faster."""
    cols = {
        "progress": progress * np.arange(1, epochs + 1),
        "grad_sqr": np.ones(epochs),
        "grad_var": np.full(epochs, var),
    }
    layouts = [(1,), (2,), (1, 1), (1, 2), (2, 2)]
    if step_s is None:
        exact = {p: placement_table(p) for p in layouts}
    else:
        exact = {p: (np.array([16.0, 64.0]), np.full(2, step_s), np.zeros(2)) for p in layouts}
    grouped = {(len(p), sum(p)): t for p, t in exact.items()}
    return Application(
        name="hand", max_epochs=epochs, validation={16: cols, 256: dict(cols)},
        exact=exact, grouped=grouped, min_local_bsz=16, max_local_bsz=64,
    )


def arrive(name: str, time: float = 0.0, gpus: int = 1, batch: int = 16) -> Arrival:
    return Arrival(name, time, "hand", gpus, batch)


def test_fifo_jcts_are_the_hand_computed_ones():
    # One GPU; 20 steps of 1 s each, after a 30 s (re)start. a: 0 + 30 + 20 = 50. b waits
    # for the next interval after a ends (60 s): 60 + 30 + 20 = 110.
    apps = {"hand": app(step_s=1.0)}
    out = simulate(
        [arrive("a"), arrive("b")], apps, policies.fifo(), adaptive=False,
        nodes=1, gpus_per_node=1, interval_s=60.0, restart_s=30.0,
    )
    assert out.jcts == {"a": pytest.approx(50.0), "b": pytest.approx(110.0)}
    assert out.makespan == pytest.approx(110.0) and out.avg_jct == pytest.approx(80.0)
    assert out.restarts == 0


def test_fair_halves_the_gpus_and_fifo_runs_the_head_whole():
    # Two GPUs on one node, two jobs tuned to 2 GPUs and batch 32. Fair: one GPU each, batch
    # 32 on one GPU, a 1 s step: both done at 30 + 20 = 50. FIFO: a on both GPUs (16 each)
    # is done at 50, b starts at 60 and is done at 110.
    apps = {"hand": app(step_s=1.0)}
    jobs = [arrive("a", gpus=2, batch=32), arrive("b", gpus=2, batch=32)]
    run = dict(adaptive=False, nodes=1, gpus_per_node=2, interval_s=60.0, restart_s=30.0)
    fair = simulate(jobs, apps, policies.fair(), **run)
    fifo = simulate(jobs, apps, policies.fifo(), **run)
    assert fair.jcts == {"a": pytest.approx(50.0), "b": pytest.approx(50.0)}
    assert fifo.jcts == {"a": pytest.approx(50.0), "b": pytest.approx(110.0)}


def test_a_larger_batch_progresses_faster_by_the_gradient_noise_gain():
    # var 1, sqr 1: at batch 32 (S = 2) a step is worth (1 + 1) / (1/2 + 1) = 4/3 steps at
    # M0, so 20 steps at M0 take 15 s of 1 s steps: 30 + 15 = 45.
    apps = {"hand": app(step_s=1.0, var=1.0)}
    out = simulate(
        [arrive("a", gpus=1, batch=32)], apps, policies.fifo(), adaptive=False,
        nodes=1, gpus_per_node=1, interval_s=60.0, restart_s=30.0,
    )
    assert out.jcts["a"] == pytest.approx(45.0)
    assert no_contention_s(arrive("a", gpus=1, batch=32), apps["hand"]) == pytest.approx(15.0)


def test_tiresias_preempts_a_job_past_its_threshold_for_a_new_one():
    # Threshold 60 GPU-s: a (alone until 60 s: 30 s restart, 30 of its 40 steps) has 60
    # GPU-s by then and drops to the lower queue; b, arriving at 60 s, takes the GPU. At
    # 120 s b has 60 GPU-s too and queues behind a, which entered the queue first: a
    # restarts, its last 10 steps end at 120 + 30 + 10 = 160; b resumes at 180 and ends at
    # 180 + 30 + 10 = 220 (JCT 160). Two restarts.
    apps = {"hand": app(step_s=1.0, progress=20.0)}
    out = simulate(
        [arrive("a"), arrive("b", time=60.0)], apps, policies.tiresias((60.0,)), adaptive=False,
        nodes=1, gpus_per_node=1, interval_s=60.0, restart_s=30.0,
    )
    assert out.jcts == {"a": pytest.approx(160.0), "b": pytest.approx(160.0)}
    assert out.restarts == 2


def trace(n: int = 8) -> list[Arrival]:
    """n arrivals over 6,000 s: sometimes alone on the cluster, sometimes not."""
    rng = np.random.default_rng(0)
    times = np.sort(rng.uniform(0, 6000, n))
    return [arrive(f"j{i}", float(t), gpus=int(rng.integers(1, 5)), batch=32) for i, t in enumerate(times)]


def bounded(policy: policies.Policy, total: int, per_node: int, seen: list[dict[str, int]]) -> policies.Policy:
    def decide(now: float, jobs: list[SimJob], slots: list[int]) -> dict[str, tuple[int, ...]]:
        placed = policy(now, jobs, slots)
        used = Counter(n for nodes in placed.values() for n in nodes)
        assert all(0 <= n < len(slots) and c <= per_node for n, c in used.items()), used
        assert sum(used.values()) <= total
        seen.append({name: len(nodes) for name, nodes in placed.items()})
        return placed

    return decide


@pytest.mark.parametrize("name", ["sharing", "tiresias", "fair", "fifo"])
def test_no_policy_gives_a_job_more_than_the_cluster_and_every_job_ends(name):
    apps = {"hand": app(epochs=3, progress=1000.0, var=50.0)}
    adaptive = name == "sharing"
    policy = policies.sharing(horizon_s=600.0)[0] if adaptive else getattr(policies, name)()
    seen: list[dict[str, int]] = []
    out = simulate(
        trace(), apps, bounded(policy, 4, 2, seen), adaptive=adaptive,
        nodes=2, gpus_per_node=2, interval_s=60.0, restart_s=30.0,
    )
    assert sorted(out.jcts) == [f"j{i}" for i in range(8)]
    assert all(v > 0 for v in out.jcts.values())
    assert out.max_gpus_used <= 4 and max(max(d.values(), default=0) for d in seen) <= 4
    if adaptive:  # the adaptive jobs do grow past one GPU when the cluster is free
        assert max(max(d.values(), default=0) for d in seen) > 1


def test_the_same_inputs_give_the_same_outcome():
    apps = {"hand": app(epochs=3, progress=1000.0, var=50.0)}

    def once() -> tuple:
        out = simulate(
            trace(), apps, policies.sharing(horizon_s=600.0)[0], adaptive=True,
            nodes=2, gpus_per_node=2, interval_s=60.0, restart_s=30.0,
        )
        return out.jcts, out.completion, out.restarts, out.gpu_utilisation

    assert once() == once()
