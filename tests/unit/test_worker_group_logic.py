"""Pure parts of the Ray worker group: feasibility and rank assignment."""

from raylight.worker_group.ray_group import assign_ranks, check_feasible


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
