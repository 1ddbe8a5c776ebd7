"""The strategy family without processes: names and options, the FSDP block policy, and
the settings that do not combine with a sharded strategy yet."""

import os

import pytest
import torch
from torch import nn

from raylight.base.exceptions import ConfigError
from raylight.config import (
    DDP,
    FSDP,
    AdaptiveConfig,
    DeepSpeed,
    Horovod,
    ScalingConfig,
    TrainerConfig,
    validate,
)
from raylight.declarative.config.model import ModelConfig
from raylight.worker.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy, build_strategy
from raylight.worker.strategies.fsdp import check_shardable, shard_blocks
from tests.helpers import run_gloo_ranks


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
    deepspeed = build_strategy(DeepSpeed(stage=3, offload_params=True))
    assert isinstance(deepspeed, DeepSpeedStrategy) and deepspeed.options.offload_params
    assert isinstance(build_strategy("deepspeed"), DeepSpeedStrategy)
    assert build_strategy("deepspeed").options == DeepSpeed(stage=2)
    with pytest.raises(ValueError, match=r"unknown strategy 'zero'; choose one of \['ddp', 'deepspeed', 'fsdp', 'horovod'\]"):
        build_strategy("zero")


@pytest.mark.parametrize("name", ["ddp", "fsdp", "deepspeed", "horovod"])
def test_gpu_workers_reduce_cuda_tensors_over_nccl_and_cpu_tensors_over_gloo(name):
    """A GPU group of "nccl" alone fails every collective on a CPU tensor: an accumulator's
    sums, a resize's checkpoint broadcast, a loop's own. (NCCL is not in this CPU build of
    torch, so the group itself is formed only in tests/worker_group/test_gpu.py.)"""
    import torch.distributed as dist

    strategy = build_strategy(name)
    assert dist.BackendConfig(strategy.backend(use_gpu=True)).get_device_backend_map() == {"cpu": "gloo", "cuda": "nccl"}
    assert strategy.backend(use_gpu=False) == "gloo"


def test_the_strategy_setting_names_the_allowed_values():
    assert ScalingConfig(strategy="fsdp").strategy_name == "fsdp"
    assert ScalingConfig(strategy=FSDP(mixed_precision="bf16")).strategy_name == "fsdp"
    with pytest.raises(ConfigError) as err:
        validate(ScalingConfig, {"strategy": "horovods"})
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


class Gate(nn.Module):
    """A layer with a learnt scalar gain: a 0-dim parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.gain = nn.Parameter(torch.tensor(1.0))


class NoReset(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3))


def test_sharded_model_mistakes_are_config_errors_found_on_the_meta_device_without_allocating():
    """check_shardable: what stops fully_shard or the materialisation after it, named with
    the setting and the fix, from the module tree alone (a meta model stays on meta)."""
    with torch.device("meta"):
        big = nn.Sequential(Block(4096), Block(4096))  # 4 x 16 M parameters, never allocated
    check_shardable(big, FSDP(blocks=("Block", "Other")))  # one match is enough
    with pytest.raises(ConfigError, match=r"backend.trainer.strategy.blocks \['Layer'\] names no submodule of Sequential; its submodule classes are \['Block', 'Linear'\]\. Name the class"):
        check_shardable(big, FSDP(blocks=("Layer",)), setting="backend.trainer.strategy")
    assert all(p.is_meta for p in big.parameters())

    with torch.device("meta"):
        unresettable = nn.Sequential(nn.Linear(3, 3), NoReset())
    with pytest.raises(ConfigError, match=r"\['NoReset'\] have no reset_parameters\(\) .*\(modules 1 \(NoReset\)\); give them one"):
        check_shardable(unresettable, FSDP())
    check_shardable(nn.Sequential(nn.Linear(3, 3), NoReset()), FSDP())  # real tensors: nothing to reset

    gated = nn.Sequential(Gate(), Gate())
    with pytest.raises(ConfigError, match=r"parameters 0.gain, 1.gain are 0-dim .*cannot shard .*nn.Parameter\(torch.ones\(1\)\)"):
        check_shardable(gated, FSDP())
    check_shardable(gated, FSDP(), sharded=False)  # one worker without mixed precision: not sharded


def test_fsdp_refuses_a_0_dim_parameter_before_it_shards_anything():
    """On a worker, before the device mesh and fully_shard (which failed with torch's
    "Shard dim 0 is invalid for 0D tensor"), and as a ConfigError, which the controller
    does not retry (DETERMINISTIC_ERRORS)."""
    with pytest.raises(ConfigError, match=r"scaling.strategy is FSDP, but the model's parameters 0.gain, 1.gain are 0-dim"):
        FSDPStrategy().wrap_model(nn.Sequential(Gate(), Gate()), device=torch.device("cpu"), world_size=2)
    with pytest.raises(ConfigError, match=r"names no submodule of Gate"):
        FSDPStrategy(FSDP(blocks=("Block",))).wrap_model(Gate(), device=torch.device("cpu"), world_size=1)


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
        ({"type": "ddp", "shared_memory": False}, DDP(shared_memory=False)),
        ({"type": "horovod"}, "horovod"),  # Ludwig's Horovod strategy: raylight's
        ({"type": "horovod", "implementation": "raylight"}, Horovod(implementation="raylight")),
        ({"type": "fsdp", "reshard_after_forward": False}, FSDP(reshard_after_forward=False)),
        ({"name": "fsdp", "blocks": ["Block"], "checkpoint": "full"}, FSDP(blocks=("Block",), checkpoint="full")),
    ],
)
def test_declarative_strategy_takes_ludwig_and_raylight_spellings(spelled, expected):
    cfg = _declarative(batch_size="auto")
    cfg["backend"]["trainer"]["strategy"] = spelled
    assert ModelConfig.model_validate(cfg).backend.trainer.strategy == expected


def test_ddp_options_reach_the_strategy():
    assert build_strategy("ddp").options.shared_memory is True
    assert build_strategy(DDP(shared_memory=False)).options.shared_memory is False
    assert _scaling({"name": "ddp", "shared_memory": False}).strategy == DDP(shared_memory=False)
    with pytest.raises(ConfigError, match=r"strategy\.ddp\.bucket_cap_mb"):
        _scaling({"name": "ddp", "bucket_cap_mb": 25})


@pytest.mark.parametrize(
    ("spelled", "message"),
    [
        ("zero3", r"backend\.trainer\.strategy.*must be one of \['ddp', 'fsdp'.*got 'zero3'"),
        ({"type": "zero3"}, r"must be one of .*got 'zero3'"),
        ({"type": "horovod", "fusion": 1}, r"backend\.trainer\.strategy\.fusion: unknown key"),
        ({"type": "ddp", "bucket_cap_mb": 25}, r"backend\.trainer\.strategy\.bucket_cap_mb: unknown key"),
        ({"type": "fsdp", "name": "fsdp"}, r"`type:` \(Ludwig's spelling\) or `name:`, not both"),
        ({"type": "fsdp", "sharding": "full"}, r"backend\.trainer\.strategy\.sharding: unknown key"),
    ],
)
def test_declarative_strategy_errors_name_the_key(spelled, message):
    cfg = _declarative()
    cfg["backend"]["trainer"]["strategy"] = spelled
    with pytest.raises(ConfigError, match=message):
        validate(ModelConfig, cfg)
# -- DeepSpeed's options and its JSON config --------------------------------------------
def _scaling(strategy, **kwargs):
    return validate(ScalingConfig, {"num_workers": 2, "strategy": strategy, **kwargs})


def test_deepspeed_names_and_options():
    assert ScalingConfig(strategy="deepspeed").strategy_name == "deepspeed"
    options = _scaling({"name": "deepspeed", "stage": 3, "offload_params": True}).strategy
    assert isinstance(options, DeepSpeed) and options.stage == 3
    assert _scaling(DeepSpeed(stage=1)).strategy == DeepSpeed(stage=1)
    assert DeepSpeed().stage == 2 and DeepSpeed().checkpoint == "sharded"
    with pytest.raises(ConfigError) as err:
        validate(ScalingConfig, {"strategy": "zero3"})
    assert "'deepspeed'" in str(err.value) and "raylight.DeepSpeed(...)" in str(err.value)
    with pytest.raises(ConfigError, match=r"strategy\.deepspeed\.stage"):
        _scaling({"name": "deepspeed", "stage": 4})
    with pytest.raises(ConfigError, match=r"offload_params needs stage=3.*got stage=2"):
        _scaling({"name": "deepspeed", "offload_params": True})
    with pytest.raises(ConfigError, match=r"strategy\.deepspeed\.offload: unknown key"):
        _scaling({"name": "deepspeed", "offload": True})
    with pytest.raises(ConfigError, match=r"num_workers=0 runs the loop in this process.*num_workers >= 1"):
        validate(ScalingConfig, {"num_workers": 0, "strategy": "deepspeed"})


def test_deepspeed_json_fills_the_options_left_unset_and_must_agree_with_the_rest(tmp_path):
    zero3 = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}
    options = DeepSpeed(config=zero3)
    assert (options.stage, options.offload_optimizer, options.offload_params) == (3, True, False)
    path = tmp_path / "ds.json"
    path.write_text('{"zero_optimization": {"stage": 1}, "gradient_clipping": 1.0}')
    from_file = _scaling({"name": "deepspeed", "config": str(path)}).strategy
    assert from_file.stage == 1 and from_file.config == {"zero_optimization": {"stage": 1}, "gradient_clipping": 1.0}
    assert validate(ScalingConfig, ScalingConfig(num_workers=2, strategy=from_file).model_dump()).strategy == from_file
    with pytest.raises(ConfigError, match=r"stage=2 but config zero_optimization\.stage gives 3"):
        _scaling({"name": "deepspeed", "stage": 2, "config": zero3})
    with pytest.raises(ConfigError, match=r"offload_optimizer=False but config zero_optimization\.offload_optimizer\.device gives True"):
        _scaling({"name": "deepspeed", "offload_optimizer": False, "config": zero3})
    with pytest.raises(ConfigError, match=r"offload_params needs stage=3"):
        _scaling({"name": "deepspeed", "config": {"zero_optimization": {"offload_param": {"device": "cpu"}}}})
    with pytest.raises(ConfigError, match=r"cannot read the DeepSpeed config file '.*missing\.json'"):
        _scaling({"name": "deepspeed", "config": str(tmp_path / "missing.json")})
    (tmp_path / "bad.json").write_text("{stage: 2}")
    with pytest.raises(ConfigError, match=r"bad\.json' is not valid JSON"):
        _scaling({"name": "deepspeed", "config": str(tmp_path / "bad.json")})


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"optimizer": {"type": "AdamW"}}, r"config optimizer: raylight's loop builds the optimizer"),
        ({"scheduler": {"type": "WarmupLR"}}, r"remove the 'scheduler' section"),
        ({"train_batch_size": 0}, r"config train_batch_size must be 'auto' or a positive integer, got 0"),
        ({"gradient_accumulation_steps": "2"}, r"gradient_accumulation_steps must be 'auto' or a positive integer"),
        ({"zero_optimization": {"stage": 0}}, r"zero_optimization\.stage must be 1, 2 or 3, got 0 \(stage 0 is plain data parallelism: use strategy 'ddp'\)"),
        ({"zero_optimization": {"offload_optimizer": {"device": "gpu"}}}, r"offload_optimizer\.device must be one of \['none', 'cpu', 'nvme'\]"),
        ({"zero_optimization": {"stage3_param_persistence_threshold": "auto"}}, r"config zero_optimization\.stage3_param_persistence_threshold is 'auto': raylight fills only"),
        ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 8}, r"train_batch_size=30, train_micro_batch_size_per_gpu=8.*num_workers=2"),
        ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1}, r"does not fit num_workers=2"),
    ],
)
def test_deepspeed_json_errors_name_the_key(config, message):
    with pytest.raises(ConfigError, match=message):
        _scaling({"name": "deepspeed", "config": config})


def test_deepspeed_json_batch_fields_that_fit_pass():
    for config in (
        {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"},
        {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8},  # 2 accumulation steps
        {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2},
        {"train_micro_batch_size_per_gpu": 8},
    ):
        assert _scaling({"name": "deepspeed", "config": config}).strategy.config == config


def test_deepspeed_sharded_checkpoints_and_refused_combinations():
    assert _scaling("deepspeed").sharded_checkpoints
    assert not _scaling(DeepSpeed(checkpoint="full")).sharded_checkpoints
    assert not validate(ScalingConfig, {"num_workers": 1, "strategy": "deepspeed"}).sharded_checkpoints
    assert TrainerConfig(scaling=ScalingConfig(num_workers=2, strategy="deepspeed"), adaptive=AdaptiveConfig()).adaptive
    auto = DeepSpeed(config={"train_batch_size": "auto", "gradient_accumulation_steps": "auto"})
    assert TrainerConfig(scaling=ScalingConfig(num_workers=2, strategy=auto), adaptive=AdaptiveConfig()).adaptive
    fixed = DeepSpeed(config={"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": "auto"})
    with pytest.raises(ValueError, match=r"deepspeed config gives \{'train_micro_batch_size_per_gpu': 8\}, but adaptive=\.\.\. chooses"):
        TrainerConfig(scaling=ScalingConfig(num_workers=2, strategy=fixed), adaptive=AdaptiveConfig())
    elastic = TrainerConfig(scaling=ScalingConfig(num_workers=(1, 2), strategy=DeepSpeed())).scaling
    assert elastic.elastic and not elastic.resizes_in_place, "DeepSpeed resizes by a restart"
    assert ScalingConfig(num_workers=(1, 2), strategy="fsdp").resizes_in_place
    assert not ScalingConfig(num_workers=(1, 2), strategy="fsdp", resize_in_place=False).resizes_in_place
    cfg = _declarative(batch_size="auto")
    cfg["backend"]["trainer"]["strategy"] = {"type": "deepspeed", "stage": 2}
    assert ModelConfig.model_validate(cfg).trainer.batch_size == "auto", "adaptive DeepSpeed"
    cfg["backend"]["trainer"]["strategy"] = {"type": "deepspeed", "stage": 3}
    cfg["trainer"]["batch_size"] = 64
    with pytest.raises(ValueError, match=r"deepspeed stage 3 is not available in declarative configs.*stage 1 or 2"):
        ModelConfig.model_validate(cfg)
    cfg["backend"]["trainer"]["strategy"] = {"type": "deepspeed", "stage": 2}
    assert ModelConfig.model_validate(cfg).backend.trainer.strategy == DeepSpeed(stage=2)
    cfg["backend"]["trainer"]["max_workers"] = 2  # elastic: resizes restart from the checkpoint
    assert ModelConfig.model_validate(cfg).backend.trainer.max_workers == 2


def test_deepspeed_batch_fields_are_filled_from_the_loader_or_checked_against_it():
    from raylight.worker.strategies.deepspeed_config import accumulation_steps, resolve_batch

    auto = {"train_batch_size": "auto"}
    assert accumulation_steps(auto, world_size=2) == 1
    assert accumulation_steps({"gradient_accumulation_steps": 4}, world_size=2) == 4
    assert accumulation_steps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8}, world_size=2) == 4
    # before the loader: a placeholder micro-batch, or what the config implies
    assert resolve_batch(auto, world_size=2, steps=1, micro_batch=None) == {
        "train_batch_size": 2, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1}
    assert resolve_batch({"train_batch_size": 64}, world_size=2, steps=1, micro_batch=None)["train_micro_batch_size_per_gpu"] == 32
    # prepare_loader(batch_size=64) over 2 workers: 32 samples a worker a batch
    assert resolve_batch(auto, world_size=2, steps=1, micro_batch=32) == {
        "train_batch_size": 64, "train_micro_batch_size_per_gpu": 32, "gradient_accumulation_steps": 1}
    # DeepSpeed's own accumulation: the loader's batch is one micro-step
    assert resolve_batch({"train_batch_size": 64, "gradient_accumulation_steps": 2}, world_size=2, steps=2, micro_batch=16)["train_batch_size"] == 64
    with pytest.raises(ValueError, match=r"train_micro_batch_size_per_gpu=8, but the training loader \(prepare_loader\(batch_size=64\) over 2 workers\) gives each worker 32 samples"):
        resolve_batch({"train_micro_batch_size_per_gpu": 8}, world_size=2, steps=1, micro_batch=32)
    with pytest.raises(ValueError, match=r"train_batch_size=64, but 16 samples a batch x 1 accumulation steps x 2 workers make 32.*batch_size=64"):
        resolve_batch({"train_batch_size": 64}, world_size=2, steps=1, micro_batch=16)
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps is 1, but .* accumulates 3 of them"):
        resolve_batch(auto, world_size=2, steps=1, micro_batch=4, accumulation=3)
    with pytest.raises(ValueError, match=r"train_batch_size=30 is not a multiple of train_micro_batch_size_per_gpu=8 x 2 workers"):
        accumulation_steps({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 8}, world_size=2)


def test_deepspeed_engine_config_takes_the_user_json_and_raylight_fields():
    from raylight.worker.strategies.deepspeed_config import engine_config

    options = DeepSpeed(config={"zero_optimization": {"stage": 3, "overlap_comm": True}, "gradient_clipping": 1.0}, offload_params=True)
    batch = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 32, "gradient_accumulation_steps": 1}
    config = engine_config(options, batch, client_cpu_optimizer=False)
    assert config["zero_optimization"] == {"stage": 3, "overlap_comm": True, "offload_param": {"device": "cpu"}}
    assert config["gradient_clipping"] == 1.0 and config["train_batch_size"] == 64
    assert engine_config(DeepSpeed(), batch, client_cpu_optimizer=False)["gradient_clipping"] == 0.0, (
        "DeepSpeed's default (1.0) would make the loop train differently than under DDP")
    assert "zero_force_ds_cpu_optimizer" not in config, "nothing offloaded to step on the CPU"
    assert options.config == {"zero_optimization": {"stage": 3, "overlap_comm": True}, "gradient_clipping": 1.0}, "not mutated"
    offload = engine_config(DeepSpeed(offload_optimizer=True), batch, client_cpu_optimizer=False)
    assert offload["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}
    assert offload["zero_force_ds_cpu_optimizer"] is False, "torch's optimizers are allowed on offloaded state"
    assert "zero_force_ds_cpu_optimizer" not in engine_config(DeepSpeed(offload_optimizer=True), batch, client_cpu_optimizer=True)
    assert engine_config(DeepSpeed(), batch, client_cpu_optimizer=False, elementwise=True)["zero_allow_untested_optimizer"]
    assert "zero_allow_untested_optimizer" not in engine_config(DeepSpeed(), batch, client_cpu_optimizer=False)
    own = DeepSpeed(config={"zero_allow_untested_optimizer": False})
    assert not engine_config(own, batch, client_cpu_optimizer=False, elementwise=True)["zero_allow_untested_optimizer"]


def test_max_grad_norm_is_deepspeeds_gradient_clipping_and_must_agree_with_the_config():
    from raylight.worker.strategies.deepspeed_config import engine_config

    batch = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 32, "gradient_accumulation_steps": 1}
    assert engine_config(DeepSpeed(), batch, client_cpu_optimizer=False, max_grad_norm=0.5)["gradient_clipping"] == 0.5
    same = DeepSpeed(config={"gradient_clipping": 0.5})
    assert engine_config(same, batch, client_cpu_optimizer=False, max_grad_norm=0.5)["gradient_clipping"] == 0.5
    off = DeepSpeed(config={"gradient_clipping": 0.0})
    assert engine_config(off, batch, client_cpu_optimizer=False, max_grad_norm=0.5)["gradient_clipping"] == 0.5
    with pytest.raises(ConfigError, match=r"max_grad_norm=0.5\) and the DeepSpeed config's gradient_clipping=1.0 disagree"):
        engine_config(DeepSpeed(config={"gradient_clipping": 1.0}), batch, client_cpu_optimizer=False, max_grad_norm=0.5)


def test_horovod_refuses_max_grad_norm_and_says_how_horovod_clips():
    from raylight.worker.strategies import HorovodStrategy

    model = nn.Linear(2, 1)
    with pytest.raises(ConfigError, match=r"opt.synchronize\(\).*skip_synchronize"):
        HorovodStrategy().wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), max_grad_norm=1.0)


def test_zero3_sizes_follow_the_model_and_never_exceed_deepspeeds_defaults():
    from raylight.worker.strategies.deepspeed_config import ZERO_SIZES, engine_config, zero_sizes

    batch = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1}
    blocks = [4_000_000] * 12 + [100]  # the largest parameter is the block
    zero = engine_config(DeepSpeed(stage=3), batch, client_cpu_optimizer=False, numels=blocks)["zero_optimization"]
    assert zero["reduce_bucket_size"] == zero["stage3_prefetch_bucket_size"] == zero["sub_group_size"] == 4_000_000
    assert zero["stage3_max_live_parameters"] == zero["stage3_max_reuse_distance"] == 8_000_000
    many = [10_000] * 1600  # small parameters: a 16th of the model is the block
    assert zero_sizes(many, {}, stage=3)["reduce_bucket_size"] == 1_000_000
    huge = [2_000_000_000]
    assert zero_sizes(huge, {}, stage=3) == {k: default for k, (default, _) in ZERO_SIZES.items()}, "DeepSpeed's defaults cap"
    given = {"reduce_bucket_size": 123, "sub_group_size": "auto"}
    assert zero_sizes(blocks, given, stage=3)["sub_group_size"] == 4_000_000 and "reduce_bucket_size" not in zero_sizes(blocks, given, stage=3), (
        "a number the user gives is kept; 'auto' is filled")
    assert zero_sizes(blocks, {}, stage=2) == {}, "stages 1 and 2 keep DeepSpeed's defaults"
    assert zero_sizes(blocks, {"reduce_bucket_size": "auto"}, stage=2) == {"reduce_bucket_size": 4_000_000}
    assert zero_sizes([], {}, stage=3) == {}
    hf = DeepSpeed(config={"zero_optimization": {"reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto"}})
    assert engine_config(hf, batch, client_cpu_optimizer=False, numels=blocks)["zero_optimization"]["reduce_bucket_size"] == 4_000_000, (
        "Hugging Face's 'auto' sizes are accepted and filled")


def test_declarative_deepspeed_takes_ludwigs_json_sections():
    cfg = _declarative(batch_size=64)
    cfg["backend"]["trainer"]["strategy"] = {
        "type": "deepspeed",
        # Ludwig's DEFAULT_ZERO_OPTIMIZATION leaves these to be resolved: raylight's defaults
        "zero_optimization": {
            "stage": "auto", "stage3_gather_16bit_weights_on_model_save": "auto",
            "offload_optimizer": {"device": "auto"}, "offload_param": {"device": "auto"},
            "reduce_bucket_size": 5e7,
        },
        "bf16": {"enabled": False},
    }
    got = ModelConfig.model_validate(cfg).backend.trainer.strategy
    assert isinstance(got, DeepSpeed) and got.stage == 2 and not got.offload_optimizer
    assert got.config_dict == {"zero_optimization": {"reduce_bucket_size": 5e7}, "bf16": {"enabled": False}}
    cfg["backend"]["trainer"]["strategy"] = {
        "type": "deepspeed", "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}},
    }
    got = ModelConfig.model_validate(cfg).backend.trainer.strategy
    assert got.stage == 1 and got.offload_optimizer, "the ZeRO section sets raylight's options"
    cfg["backend"]["trainer"]["strategy"] = {"type": "deepspeed", "zero_optimization": {"stage": 3}}
    with pytest.raises(ValueError, match=r"deepspeed stage 3 is not available in declarative configs"):
        ModelConfig.model_validate(cfg)
    cfg["backend"]["trainer"]["strategy"] = {"type": "deepspeed", "stage": 1, "zero_optimization": {"stage": 2}}
    with pytest.raises(ConfigError, match=r"stage=1 but config zero_optimization\.stage gives 2"):
        validate(ModelConfig, cfg)
    cfg["backend"]["trainer"]["strategy"] = {
        "type": "deepspeed", "fp16": {"enabled": False}, "config": {"fp16": {"enabled": True}},
    }
    with pytest.raises(ConfigError, match=r"\['fp16'\] given both as strategy options and inside config"):
        validate(ModelConfig, cfg)


def test_sharded_cpu_workers_start_with_huge_pages_for_malloc_unless_the_user_tunes_glibc():
    from raylight.worker.strategies.base import HEAP_TUNABLES, worker_env

    assert worker_env("fsdp", False, {}) == {"GLIBC_TUNABLES": HEAP_TUNABLES}
    assert worker_env("deepspeed", False, {}) == {"GLIBC_TUNABLES": HEAP_TUNABLES}
    assert worker_env("ddp", False, {}) == {} and worker_env("fsdp", True, {}) == {}
    assert worker_env("fsdp", False, {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) == {}


def test_deepspeed_is_imported_without_mlflow_and_mlflow_still_imports_after():
    """DeepSpeed's autotuner imports mlflow where it is installed (most of the import's
    time); raylight's import leaves it out, and mlflow imports as usual afterwards."""
    pytest.importorskip("deepspeed")
    pytest.importorskip("mlflow")
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from raylight.worker.strategies.deepspeed import import_deepspeed\n"
        "ds = import_deepspeed()\n"
        "print('mlflow' in sys.modules, ds.autotuning.autotuner.has_mlflow)\n"
        "import mlflow\n"
        "print(mlflow.__name__, 'mlflow' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        env={**os.environ, "DS_ACCELERATOR": "cpu"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False", "mlflow", "True"], out.stdout


def test_the_collectives_deepspeed_calls_do_not_print_torch_s_deprecation_warning():
    """torch deprecated ``all_gather_into_tensor`` and ``reduce_scatter_tensor``, which
    DeepSpeed's ZeRO calls at every step: after raylight's DeepSpeed import they run
    without the FutureWarning (shown by default before it), and other warnings still show."""
    pytest.importorskip("deepspeed")
    import subprocess
    import sys

    code = (
        "import warnings, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "x, out = torch.ones(2), torch.zeros(2)\n"
        "dist.all_gather_into_tensor(out, x)\n"
        "from raylight.worker.strategies.deepspeed import _import_deepspeed\n"
        "_import_deepspeed(torch.device('cpu'))\n"
        "dist.all_gather_into_tensor(torch.zeros(2), x)\n"
        "dist.reduce_scatter_tensor(torch.zeros(2), x)\n"
        "warnings.warn('still shown', FutureWarning)\n"
        "dist.destroy_process_group()\n"
        # What is checked is written; skip the interpreter's teardown, which aborted once in a
        # fresh clone ("terminate called without an active exception": a native thread of
        # torch's or DeepSpeed's still joinable at exit), outside what this test is about.
        "import os, sys; sys.stderr.flush(); os._exit(0)\n"
    )
    out = subprocess.run(
        [sys.executable, "-W", "default", "-c", code], capture_output=True, text=True, timeout=120,
        env={**os.environ, "LOCAL_RANK": "0"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "all_gather_into_tensor` is deprecated" in out.stderr  # before the import: shown
    # torch's collectives' own notices (DeepSpeed >= 0.19.7's import adds DeprecationWarnings of
    # torch's compiler stack, which Python hides by default: not what this is about)
    collective = "` is deprecated. Please use `torch.distributed."
    after = out.stderr.split(collective)[-1]
    assert "still shown" in after and "reduce_scatter_tensor` is deprecated" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.count(collective) == 1, out.stderr[-2000:]


def test_a_deepspeed_process_group_on_cpu_builds_no_shared_memory_op(tmp_path):
    """DeepSpeed's CPU backend compiles its shared-memory all-reduce (inference only) when
    its communication starts; raylight's DeepSpeed import marks it not to be built: a fresh
    extensions directory stays empty and the backend has no such op."""
    pytest.importorskip("deepspeed")
    import subprocess
    import sys

    code = (
        "import torch, torch.distributed as dist\n"
        "from raylight.worker.strategies.deepspeed import _import_deepspeed\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "ds = _import_deepspeed(torch.device('cpu'))\n"
        "ds.init_distributed(dist_backend='gloo', verbose=False)\n"
        "from deepspeed.comm import comm\n"
        "print(type(comm.cdb).__name__, comm.cdb.shm_comm_op is None)\n"
        "dist.destroy_process_group()\n"
    )
    extensions = tmp_path / "torch_extensions"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        env={**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions), "LOCAL_RANK": "0"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["TorchBackend", "True"], out.stdout + out.stderr[-2000:]
    assert not extensions.exists() or not list(extensions.rglob("*shm_comm*")), list(extensions.rglob("*"))


def _garbage_ddp_then_destroy(rank: int, port: int, queue) -> None:
    import gc
    import weakref

    import torch.distributed as dist

    from raylight.worker import process_group

    gc.disable()  # only an explicit collection frees the cycle below
    dist.init_process_group("gloo", store=dist.TCPStore("127.0.0.1", port, 1, True), rank=0, world_size=1)
    model = torch.nn.parallel.DistributedDataParallel(nn.Linear(3, 3))
    model(torch.ones(2, 3)).sum().backward()
    model.__dict__["cycle"] = [model]  # as a hook or closure that refers back to the model makes one
    gone = weakref.ref(model)
    del model
    seen = {"freed_by_del": gone() is None}
    real = dist.destroy_process_group

    def destroy(*args):
        seen["freed_before_destroy"] = gone() is None
        real(*args)

    dist.destroy_process_group = destroy
    process_group.destroy_process_group()
    queue.put({"rank": 0, **seen})


@pytest.mark.distributed
def test_destroying_the_group_frees_garbage_ddp_models_first():
    """A DDP model caught in a reference cycle holds the process group (its C++ reducer). Freed
    after the group's Python handle, it drops the last reference with the GIL held and
    gloo's destructor can deadlock on its own threads (a rank of tests/worker/
    test_step_sync_gloo.py hung so under load): raylight's workers destroy the group
    through ``process_group.destroy_process_group``, which frees such garbage first."""
    seen = run_gloo_ranks(_garbage_ddp_then_destroy, world_size=1)[0]
    assert seen["freed_by_del"] is False, "the model outlived its last name"
    assert seen["freed_before_destroy"] is True


def test_one_fsdp_worker_with_mixed_precision_computes_in_it():
    """A mesh of one still shards (nothing), so FSDP's mixed precision (and CPU offload, on
    GPUs) hold for one worker too: it trained in full precision before."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        strategy = FSDPStrategy(FSDP(mixed_precision="bf16"))
        wrapped = strategy.wrap_model(model(), device=torch.device("cpu"), world_size=1)
        computed = []
        wrapped[0].register_forward_hook(lambda m, i, out: computed.append(out.dtype))
        wrapped(torch.randn(3, 4)).float().sum().backward()
        assert computed == [torch.bfloat16]
        assert {p.dtype for p in wrapped.parameters()} == {torch.float32}  # kept in full precision
        plain = FSDPStrategy(FSDP()).wrap_model(model(), device=torch.device("cpu"), world_size=1)
        assert not any(type(p).__name__ == "DTensor" for p in plain.parameters())  # nothing to shard: as it is
    finally:
        dist.destroy_process_group()
