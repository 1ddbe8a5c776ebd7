"""The strategy family without processes: names and options, the FSDP block policy, and
the settings that do not combine with a sharded strategy yet."""

import pytest
import torch
from torch import nn

from raylight.config import FSDP, AdaptiveConfig, ScalingConfig, TrainerConfig, validate
from raylight.declarative.config import ModelConfig
from raylight.exceptions import ConfigError
from raylight.strategies import DDPStrategy, FSDPStrategy, build_strategy
from raylight.strategies.fsdp import shard_blocks


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.inner = nn.Linear(width, width)
        self.out = nn.Linear(width, width)

    def forward(self, x):
        return self.out(self.inner(x).relu())


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 64), Block(64), Block(64), nn.Linear(64, 2))


def test_names_and_options_build_their_strategy():
    assert isinstance(build_strategy("ddp"), DDPStrategy)
    assert isinstance(build_strategy("fsdp"), FSDPStrategy)
    fsdp = build_strategy(FSDP(reshard_after_forward=False, blocks=("Block",)))
    assert isinstance(fsdp, FSDPStrategy) and fsdp.options.blocks == ("Block",)
    assert fsdp.options.reshard_after_forward is False
    with pytest.raises(ValueError, match=r"unknown strategy 'zero'; choose one of \['ddp', 'fsdp'\]"):
        build_strategy("zero")


def test_the_strategy_setting_names_the_allowed_values():
    assert ScalingConfig(strategy="fsdp").strategy_name == "fsdp"
    assert ScalingConfig(strategy=FSDP(mixed_precision="bf16")).strategy_name == "fsdp"
    with pytest.raises(ConfigError) as err:
        validate(ScalingConfig, {"strategy": "horovod"})
    assert "strategy" in str(err.value) and "'ddp'" in str(err.value) and "'fsdp'" in str(err.value)
    with pytest.raises(ConfigError, match=r"strategy\.fsdp\.mixed_precision|mixed_precision"):
        validate(ScalingConfig, {"strategy": {"name": "fsdp", "mixed_precision": "fp8"}})
    with pytest.raises(ConfigError, match=r"strategy\.cpu_offload needs use_gpu=True"):
        validate(ScalingConfig, {"strategy": {"name": "fsdp", "cpu_offload": True}})
    assert validate(ScalingConfig, {"use_gpu": True, "strategy": {"cpu_offload": True}}).strategy.cpu_offload
    with pytest.raises(ConfigError, match="min_block_params"):
        validate(ScalingConfig, {"strategy": {"name": "fsdp", "min_block_params": 0}})


def test_fsdp_runs_adaptive_and_elastic():
    TrainerConfig(scaling=ScalingConfig(num_workers=2, strategy="fsdp"), adaptive=AdaptiveConfig())
    TrainerConfig(scaling=ScalingConfig(num_workers=(1, 2), strategy="fsdp"))


def test_which_runs_write_sharded_checkpoints():
    assert ScalingConfig(num_workers=2, strategy="fsdp").sharded_checkpoints
    assert ScalingConfig(num_workers=(1, 2), strategy="fsdp").sharded_checkpoints
    assert not ScalingConfig(num_workers=1, strategy="fsdp").sharded_checkpoints, "one worker holds it all"
    assert not ScalingConfig(num_workers=2, strategy=FSDP(checkpoint="full")).sharded_checkpoints
    assert not ScalingConfig(num_workers=2).sharded_checkpoints
    with pytest.raises(ConfigError, match=r"checkpoint.*'sharded' or 'full'|checkpoint"):
        validate(ScalingConfig, {"strategy": {"name": "fsdp", "checkpoint": "partial"}})


def test_the_default_block_policy_shards_by_size_innermost_first():
    m = model()
    inner = 64 * 64 + 64  # one Linear(64, 64)
    blocks = shard_blocks(m, FSDP(min_block_params=inner))
    linears = [m[1].inner, m[1].out, m[2].inner, m[2].out]
    assert blocks == linears, "each big Linear is a block; its Block holds nothing more"
    blocks = shard_blocks(m, FSDP(min_block_params=2 * inner))
    assert blocks == [m[1], m[2]], "a Block is the smallest module reaching the threshold"
    assert shard_blocks(m, FSDP(min_block_params=10**9)) == [], "only the root is sharded"


def test_named_blocks_are_sharded_children_first():
    m = nn.Sequential(Block(8), nn.Sequential(Block(8)))
    assert shard_blocks(m, FSDP(blocks=("Block", "Sequential"))) == [m[1][0], m[1], m[0]]
    with pytest.raises(ValueError, match=r"\['Layer'\] names no submodule of Sequential; its submodule classes are \['Block', 'Linear'\]"):
        shard_blocks(nn.Sequential(Block(8)), FSDP(blocks=("Layer",)))


def _declarative(**trainer):
    return {
        "input_features": [{"name": "x", "type": "number"}],
        "output_features": [{"name": "y", "type": "binary"}],
        "trainer": trainer,
        "backend": {"trainer": {"strategy": "fsdp"}},
    }


def test_declarative_fsdp_runs_adaptive_and_elastic():
    assert ModelConfig.model_validate(_declarative(batch_size=64)).backend.trainer.strategy == "fsdp"
    assert ModelConfig.model_validate(_declarative(batch_size="auto")).trainer.batch_size == "auto"
    cfg = _declarative()
    cfg["backend"]["trainer"]["max_workers"] = 2
    assert ModelConfig.model_validate(cfg).backend.trainer.max_workers == 2


def test_a_meta_model_needs_reset_parameters_on_every_module_that_owns_tensors():
    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(3))

    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(3, 3), Scale())
    with pytest.raises(ValueError, match=r"\['Scale'\] have no reset_parameters\(\)"):
        DDPStrategy().wrap_model(model, device=torch.device("cpu"), world_size=1)
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(3, 3))
    torch.manual_seed(5)
    state = torch.random.get_rng_state()
    wrapped = FSDPStrategy().wrap_model(model, device=torch.device("cpu"), world_size=1)
    assert wrapped[0].weight.device.type == "cpu" and wrapped[0].weight.abs().sum() > 0
    assert torch.equal(torch.random.get_rng_state(), state), "the caller's random state is untouched"


@pytest.mark.parametrize(
    ("spelled", "expected"),
    [
        ("fsdp", "fsdp"),
        ({"type": "fsdp"}, "fsdp"),  # Ludwig
        ({"type": "ddp"}, "ddp"),
        ({"type": "fsdp", "reshard_after_forward": False}, FSDP(reshard_after_forward=False)),
        ({"name": "fsdp", "blocks": ["Block"], "checkpoint": "full"}, FSDP(blocks=("Block",), checkpoint="full")),
    ],
)
def test_declarative_strategy_takes_ludwig_and_raylight_spellings(spelled, expected):
    cfg = _declarative(batch_size="auto")
    cfg["backend"]["trainer"]["strategy"] = spelled
    assert ModelConfig.model_validate(cfg).backend.trainer.strategy == expected


@pytest.mark.parametrize(
    ("spelled", "message"),
    [
        ("zero3", r"backend\.trainer\.strategy.*must be one of \['ddp', 'fsdp'.*got 'zero3'"),
        ({"type": "zero3"}, r"must be one of .*got 'zero3'"),
        ({"type": "horovod"}, r"horovod is not available"),
        ({"type": "ddp", "bucket_cap_mb": 25}, r"ddp takes no options; got \['bucket_cap_mb'\]"),
        ({"type": "fsdp", "name": "fsdp"}, r"`type:` \(Ludwig's spelling\) or `name:`, not both"),
        ({"type": "fsdp", "sharding": "full"}, r"backend\.trainer\.strategy\.fsdp\.sharding"),
    ],
)
def test_declarative_strategy_errors_name_the_key(spelled, message):
    cfg = _declarative()
    cfg["backend"]["trainer"]["strategy"] = spelled
    with pytest.raises(ConfigError, match=message):
        validate(ModelConfig, cfg)
