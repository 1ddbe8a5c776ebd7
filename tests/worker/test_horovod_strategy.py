"""The horovod strategy's settings (no Ray, no processes): its options, what it refuses,
which Horovod ``auto`` picks, and Horovod's host allocation plan for a group."""

import pytest

from raylight.base.exceptions import ConfigError
from raylight.config import AdaptiveConfig, Horovod, ScalingConfig, TrainerConfig, validate
from raylight.worker.hvd import compat
from raylight.worker.hvd.real import Slot, host_plan
from raylight.worker.strategies import HorovodStrategy, build_strategy

INSTALLED = compat.horovod_installed()


def test_names_and_options_build_the_strategy():
    strategy = build_strategy("horovod")
    assert isinstance(strategy, HorovodStrategy) and strategy.options == Horovod()
    assert strategy.implementation == ("horovod" if INSTALLED else "raylight")
    assert strategy.reuses_process is (not INSTALLED)  # real Horovod's process starts the next run fresh
    ours = build_strategy(Horovod(implementation="raylight", init_timeout_s=5))
    assert ours.implementation == "raylight" and ours.reuses_process and ours.checkpoint_format(2) == "full"
    assert validate(ScalingConfig, {"strategy": {"name": "horovod", "implementation": "raylight"}}).strategy_name == "horovod"


@pytest.mark.parametrize(
    ("strategy", "message"),
    [
        ({"name": "horovod", "implementation": "mpi"}, r"scaling\.strategy\.horovod\.implementation"),
        ({"name": "horovod", "init_timeout_s": 0}, r"scaling\.strategy\.horovod\.init_timeout_s"),
        ({"name": "horovod", "fusion_threshold": 1}, r"scaling\.strategy\.horovod\.fusion_threshold"),
        ("horovods", r"must be one of \['ddp', 'fsdp', 'deepspeed', 'horovod'\]"),
    ],
)
def test_bad_options_name_the_key(strategy, message):
    with pytest.raises(ConfigError, match=message):
        validate(TrainerConfig, {"scaling": {"strategy": strategy}})


def test_adaptive_training_is_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"'horovod' cannot run adaptive training.*use strategy 'ddp'"):
        TrainerConfig(scaling=ScalingConfig(num_workers=2, strategy="horovod"), adaptive=AdaptiveConfig())
    TrainerConfig(scaling=ScalingConfig(num_workers=2, strategy="horovod"))  # fixed batch: fine
    with pytest.raises(ConfigError, match="cannot run adaptive training"):
        build_strategy(Horovod(implementation="raylight")).wrap_optimizer(None, adaptive=True)  # type: ignore[arg-type]


@pytest.mark.skipif(INSTALLED, reason="real Horovod is installed")
def test_real_horovod_asked_for_but_absent_says_how_to_install():
    with pytest.raises(ConfigError, match=r"scaling\.strategy\.implementation.*docs/horovod\.md.*implementation='raylight'"):
        build_strategy(Horovod(implementation="horovod"))


def test_host_plan_numbers_local_and_cross_ranks_as_horovod():
    plan = host_plan(["a", "a", "b", "a", "b"])
    assert plan[0] == Slot("a", 0, 0, 0, 5, 3, 2)
    assert [(s.local_rank, s.local_size) for s in plan] == [(0, 3), (1, 3), (0, 2), (2, 3), (1, 2)]
    # local rank 2 exists only on host a: a cross group of one
    assert [(s.cross_rank, s.cross_size) for s in plan] == [(0, 2), (0, 2), (1, 2), (0, 1), (1, 2)]
    assert host_plan(["solo"]) == [Slot("solo", 0, 0, 0, 1, 1, 1)]


def test_real_horovod_finds_its_gloo_interface_on_a_machine_other_than_rank_zeros(monkeypatch):
    """Under an external launcher no GLOO_SOCKET_IFNAME is set, and rank 0's address is on
    rank 0's machine only: another machine takes the interface of its own address toward it."""
    from raylight.base.net import loopback_interface
    from raylight.worker.hvd import real

    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setattr(real, "route_address", lambda peer: {"10.1.2.3": "127.0.0.1"}[peer])  # this host's side of the route
    assert real._interface(False, "10.1.2.3") == loopback_interface()
    monkeypatch.setattr(real, "route_address", lambda peer: "203.0.113.77")  # an address no interface here holds
    with pytest.raises(ConfigError, match=r"no network interface of this node holds 203.0.113.77, its address toward rank 0 at 10.1.2.3.*GLOO_SOCKET_IFNAME"):
        real._interface(False, "10.1.2.3")
