"""raylight.lightning without Ray: argument checks, the environment, the adaptive batch
sampler, atomic and safe checkpoint I/O, and the driver-side recovery of rank 0's
results (round trip through the same serialisation the workers use)."""

from __future__ import annotations

import ast
import importlib.util
import os
import pathlib
import pickle
import sys
from types import SimpleNamespace

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

from lightning.pytorch.callbacks import EarlyStopping  # noqa: E402
from torch.utils.data import DataLoader, SequentialSampler, TensorDataset  # noqa: E402

import raylight  # noqa: E402
import raylight.lightning  # noqa: E402
from raylight.adaptive.plan import BatchPlan  # noqa: E402
from raylight.base.exceptions import ConfigError  # noqa: E402
from raylight.lightning import AtomicCheckpointIO, RayFSDPStrategy, RaylightEnvironment, RayStrategy  # noqa: E402
from raylight.lightning._launcher import RayLauncher, recover  # noqa: E402
from raylight.lightning._worker import collect  # noqa: E402
from raylight.lightning.adaptive import PlanBatchSampler, lightning_adaptive  # noqa: E402
from raylight.storage.checkpoint import deserialize_state, serialize_state  # noqa: E402

SRC = pathlib.Path(raylight.__file__).parent


@pytest.mark.parametrize("bad", [0, -1, (1, 2), True, 1.5])
def test_num_workers_must_be_a_positive_int(bad):
    with pytest.raises(ConfigError, match=r"RayStrategy\(num_workers="):
        RayStrategy(num_workers=bad)


def test_reserved_and_invalid_arguments_name_the_setting():
    with pytest.raises(ConfigError, match=r"RayStrategy\(cluster_environment=\.\.\.\)"):
        RayStrategy(num_workers=2, cluster_environment=RaylightEnvironment())
    with pytest.raises(ConfigError, match=r"RayStrategy.resources_per_worker"):
        RayStrategy(num_workers=2, resources_per_worker={"CPU": -1})
    with pytest.raises(ConfigError, match="FailureConfig"):
        RayStrategy(num_workers=2, failure={"max_failures": 1})


def test_every_strategy_takes_the_worker_arguments_with_their_one_set_of_defaults():
    """The arguments all three strategies share have one table of defaults; each
    signature lists them (users pass them by name) with exactly those defaults."""
    import inspect

    from raylight.lightning import RayDeepSpeedStrategy
    from raylight.lightning.strategies import WORKER_ARGUMENTS

    for strategy, skipped in ((RayStrategy, ()), (RayFSDPStrategy, ("adaptive",)), (RayDeepSpeedStrategy, ("adaptive",))):
        params = inspect.signature(strategy.__init__).parameters
        for name, default in WORKER_ARGUMENTS.items():
            if name in skipped:
                assert name not in params, (strategy.__name__, name)
                continue
            assert params[name].default == default, (strategy.__name__, name)
            assert params[name].kind in (params[name].KEYWORD_ONLY, params[name].POSITIONAL_OR_KEYWORD)


def test_every_strategy_forwards_the_worker_arguments_into_its_settings():
    given = {
        "num_workers": 3, "use_gpu": True, "resources_per_worker": {"CPU": 2, "GPU": 1}, "placement": "SPREAD",
        "threads_per_worker": 2, "failure": raylight.FailureConfig(max_failures=4), "address": "auto",
    }
    settings = [RayStrategy(**given).settings, RayFSDPStrategy(**given).settings, _deepspeed()(**given).settings]
    for got in settings:
        scaling = got.scaling
        assert (scaling.num_workers, scaling.use_gpu, scaling.resources_per_worker, scaling.placement) == (3, True, {"CPU": 2, "GPU": 1}, "SPREAD")
        assert (scaling.threads_per_worker, got.failure, got.address, got.adaptive) == (2, given["failure"], "auto", None)
    defaults = [RayStrategy().settings, RayFSDPStrategy().settings, _deepspeed()().settings]
    assert [(s.scaling.num_workers, s.scaling.placement, s.failure, s.address) for s in defaults] == [(1, "PACK", raylight.FailureConfig(), None)] * 3


def test_an_adaptive_setting_of_the_wrong_type_is_named():
    with pytest.raises(ConfigError, match=r"RayStrategy\(adaptive=\.\.\.\) must be a raylight.AdaptiveConfig, got dict"):
        RayStrategy(num_workers=2, adaptive={"lr_rule": "sqrt"})


def test_package_surface_snapshot():
    assert raylight.lightning.__all__ == [
        "AtomicCheckpointIO", "HorovodRayStrategy", "RayDeepSpeedStrategy", "RayFSDPStrategy", "RayShardedStrategy",
        "RayStrategy", "RaylightEnvironment",
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_workers": 0}, r"RayFSDPStrategy\(num_workers=0\)"),
        ({"cluster_environment": RaylightEnvironment()}, r"RayFSDPStrategy\(cluster_environment=\.\.\.\)"),
        ({"auto_wrap_policy": None}, r"RayFSDPStrategy\(auto_wrap_policy=\.\.\.\).*blocks="),
        ({"mixed_precision": "fp8"}, r"RayFSDPStrategy\.mixed_precision"),
        ({"min_block_params": 0}, r"RayFSDPStrategy\.min_block_params"),
        ({"blocks": "Linear"}, r"RayFSDPStrategy\.blocks"),
        ({"cpu_offload": True}, r"RayFSDPStrategy\(cpu_offload=True\) needs use_gpu=True"),
    ],
)
def test_fsdp_arguments_are_checked_and_named(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        RayFSDPStrategy(**{"num_workers": 2, **kwargs})


def test_fsdp_options_are_raylights():
    strategy = RayFSDPStrategy(num_workers=2, blocks=["Linear"], mixed_precision="bf16")
    assert strategy.fsdp == raylight.FSDP(blocks=("Linear",), mixed_precision="bf16", checkpoint="full")
    assert RayFSDPStrategy(num_workers=2, use_gpu=True, cpu_offload=True).fsdp.cpu_offload


def test_fsdp_workers_start_and_are_pooled_as_fsdp_workers(tmp_path):
    # Its group's strategy is "ddp" (Lightning drives FSDP), but FSDP runs in the processes
    # and tunes their malloc: they start with FSDP's environment and pool apart from DDP's.
    from raylight.worker.strategies.base import HEAP_TUNABLES, worker_env
    from raylight.worker_group.pool import pool_key

    fsdp, ddp = RayFSDPStrategy(num_workers=2).settings.scaling, RayStrategy(num_workers=2).settings.scaling
    assert fsdp.strategy_name == ddp.strategy_name == "ddp"
    assert (fsdp.process_kind, ddp.process_kind) == ("fsdp", "ddp")
    assert worker_env(fsdp.process_kind, False, {}) == {"GLIBC_TUNABLES": HEAP_TUNABLES}
    assert pool_key(None, fsdp.process_kind) != pool_key(None, ddp.process_kind)
    assert pickle.loads(pickle.dumps(fsdp)).process_kind == "fsdp"  # as the workers get it
    copy = fsdp.model_copy(update={"threads_per_worker": 2})
    assert copy.process_kind == "fsdp" and copy.strategy_name == "ddp"
    config = raylight.ScalingConfig(num_workers=2)
    assert config.for_processes_of("fsdp").process_kind == "fsdp" and config.process_kind == "ddp"
    # A submitted job's cap on workers rebuilds the config; the kind stays.
    from raylight.driver.job_env import MAX_WORKERS_ENV, apply_job_env

    trainer_config = RayFSDPStrategy(num_workers=2).settings.trainer_config(storage_path=str(tmp_path))
    capped = apply_job_env(trainer_config, {MAX_WORKERS_ENV: "1"})
    assert capped.scaling.num_workers == 1 and capped.scaling.process_kind == "fsdp"


def test_fsdp_blocks_must_name_a_submodule_class():
    from raylight.lightning.fsdp import check_blocks

    check_blocks(_Tiny(), raylight.FSDP(blocks=("Linear", "Other")))  # one match is enough
    with pytest.raises(ConfigError, match=r"RayFSDPStrategy\(blocks=\('Nope',\)\) names no submodule of _Tiny; its submodule classes are \['Linear'\]"):
        check_blocks(_Tiny(), raylight.FSDP(blocks=("Nope",)))


@pytest.mark.parametrize(
    "module,options,expected",
    [
        ("_Tiny", {"blocks": ("Nope",)}, r"RayFSDPStrategy.blocks \['Nope'\] names no submodule of _Tiny; its submodule classes are \['Linear'\]"),
        ("_Gated", {}, r"RayFSDPStrategy is FSDP, but the model's parameters gain are 0-dim .*nn.Parameter\(torch.ones\(1\)\)"),
    ],
)
def test_fsdp_refuses_a_module_it_cannot_shard_in_the_driver_before_ray_starts(monkeypatch, module, options, expected):
    from raylight.driver.trainer import Trainer as RaylightTrainer

    def started(self):
        raise AssertionError("raylight.Trainer.fit ran: the mistake was left to the workers")

    monkeypatch.setattr(RaylightTrainer, "fit", started)
    strategy = RayFSDPStrategy(num_workers=2, **options)
    trainer = pl.Trainer(strategy=strategy, max_epochs=1, logger=False, enable_progress_bar=False, enable_checkpointing=False)
    data = DataLoader(TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,))), batch_size=4)
    with pytest.raises(ConfigError, match=expected):
        trainer.fit(globals()[module](), data)


def test_fsdp_worker_evaluates_under_no_grad():
    # FSDP2 cannot train after a forward under torch.inference_mode (its gathered
    # parameters would be inference tensors), so the worker's loops use no_grad.
    strategy = RayFSDPStrategy(num_workers=2)
    trainer = pl.Trainer(strategy=strategy, logger=False, enable_progress_bar=False)
    ctx = SimpleNamespace(world_size=2, rank=1, local_rank=1, node_rank=0, device=torch.device("cpu"), sync=None)
    strategy.attach_worker(ctx, trainer)
    loops = (trainer.fit_loop.epoch_loop.val_loop, trainer.validate_loop, trainer.test_loop, trainer.predict_loop)
    assert not any(loop.inference_mode for loop in loops)
    assert (strategy.global_rank, strategy.world_size, strategy.root_device) == (1, 2, torch.device("cpu"))


def _deepspeed():
    pytest.importorskip("deepspeed")
    from raylight.lightning import RayDeepSpeedStrategy

    return RayDeepSpeedStrategy


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_workers": (1, 2)}, r"RayDeepSpeedStrategy\(num_workers=\(1, 2\)\)"),
        ({"stage": 4}, r"RayDeepSpeedStrategy\(stage=4\): the ZeRO stage is 0, 1, 2 or 3"),
        ({"stage": True}, r"RayDeepSpeedStrategy\(stage=True\)"),
        ({"offload_optimizer": True}, r"RayDeepSpeedStrategy\(offload_optimizer=True\) needs use_gpu=True"),
        ({"use_gpu": True, "offload_parameters": True}, r"offload_parameters=True\) needs stage=3"),
        ({"config": {"train_micro_batch_size_per_gpu": 1}, "stage": 3}, r"config=\.\.\., stage=\.\.\.\).*drop stage="),
        ({"config": 3}, r"RayDeepSpeedStrategy\(config=\.\.\.\) must be a DeepSpeed config dict"),
        ({"process_group_backend": "gloo"}, r"RayDeepSpeedStrategy\(process_group_backend=\.\.\.\)"),
        ({"timeout": 5}, r"RayDeepSpeedStrategy\(timeout=\.\.\.\).*collective_timeout_s"),
        ({"accelerator": "cpu"}, r"RayDeepSpeedStrategy\(accelerator=\.\.\.\)"),
        ({"resources_per_worker": {"CPU": -1}}, r"RayDeepSpeedStrategy\.resources_per_worker"),
    ],
)
def test_deepspeed_arguments_are_checked_and_named(kwargs, message):
    strategy = _deepspeed()
    with pytest.raises(ConfigError, match=message):
        strategy(**{"num_workers": 2, **kwargs})


def test_deepspeed_settings_reach_lightnings_config():
    strategy = _deepspeed()(num_workers=2, stage=3, allgather_bucket_size=1000)
    assert strategy.config["zero_optimization"]["stage"] == 3
    assert strategy.config["zero_optimization"]["allgather_bucket_size"] == 1000
    assert strategy.zero_stage_3 and strategy.settings.scaling.min_workers == 2
    given = {"zero_optimization": {"stage": 1}}
    assert _deepspeed()(num_workers=2, config=given).config == given


def test_deepspeed_missing_names_the_extra(monkeypatch):
    from raylight.lightning import RayDeepSpeedStrategy

    monkeypatch.setitem(sys.modules, "deepspeed", None)  # import deepspeed now fails
    with pytest.raises(ImportError, match=r"pip install 'raylight\[deepspeed\]'"):
        RayDeepSpeedStrategy(num_workers=2)


def _strategies():
    yield RayStrategy(num_workers=2)
    yield RayFSDPStrategy(num_workers=2)
    if importlib.util.find_spec("deepspeed") is not None:
        from raylight.lightning import RayDeepSpeedStrategy

        yield RayDeepSpeedStrategy(num_workers=2)


def test_every_strategy_is_notebook_safe_on_the_driver(monkeypatch):
    # In a notebook, Lightning refuses strategies whose launcher forks the kernel; ours
    # start Ray actors. The check is live here: Lightning's own "ddp" is refused.
    import lightning.pytorch.trainer.connectors.accelerator_connector as connector
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    monkeypatch.setattr(connector, "_IS_INTERACTIVE", True)
    with pytest.raises(MisconfigurationException, match="not compatible with an interactive"):
        pl.Trainer(strategy="ddp", accelerator="cpu", devices=2, logger=False)
    for strategy in _strategies():
        trainer = pl.Trainer(strategy=strategy, logger=False, enable_progress_bar=False)
        assert isinstance(trainer.strategy.launcher, RayLauncher), type(strategy).__name__
        assert trainer.world_size == 2 and strategy.distributed_sampler_kwargs == {"num_replicas": 2, "rank": 0}
        assert trainer._accelerator_connector.is_distributed  # DistributedSampler, sync_dist


def test_adaptive_accumulation_belongs_to_lightning():
    assert lightning_adaptive(None) is None
    assert lightning_adaptive(raylight.AdaptiveConfig()).accumulation is False
    with pytest.raises(ConfigError, match="accumulate_grad_batches"):
        lightning_adaptive(raylight.AdaptiveConfig(accumulation=True))


def test_driver_side_trainer_sees_the_ray_world():
    strategy = RayStrategy(num_workers=3)
    trainer = pl.Trainer(strategy=strategy, logger=False, enable_progress_bar=False)
    assert isinstance(trainer.strategy.launcher, RayLauncher)
    assert trainer.strategy.launcher.is_interactive_compatible
    assert trainer.world_size == 3 and trainer.global_rank == 0
    assert strategy.distributed_sampler_kwargs == {"num_replicas": 3, "rank": 0}
    env = RaylightEnvironment(world_size=4, global_rank=2, local_rank=1, node_rank=1)
    env.set_world_size(1)
    env.set_global_rank(0)  # Lightning's own guesses are ignored: raylight placed the ranks
    assert (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()) == (4, 2, 1, 1)
    assert env.creates_processes_externally and not RaylightEnvironment.detect()


def test_plan_batch_sampler_follows_the_plan_live():
    sync = SimpleNamespace(plan=BatchPlan(2))
    sampler = PlanBatchSampler(SequentialSampler(range(10)), sync)
    it = iter(sampler)
    assert next(it) == [0, 1]
    sync.plan = BatchPlan(3, 0, 1)  # a new plan takes effect at the next batch
    assert list(it) == [[2, 3, 4], [5, 6, 7], [8, 9]]
    assert list(PlanBatchSampler(SequentialSampler(range(10)), sync, drop_last=True)) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    with pytest.raises(TypeError):
        len(sampler)  # on purpose: Lightning then ends epochs when the data runs out


class _Opaque:
    pass


def test_checkpoint_io_writes_atomically_and_loads_safely(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = str(tmp_path / "sub" / "a.ckpt")
    io.save_checkpoint({"w": torch.ones(2)}, path)
    assert torch.equal(io.load_checkpoint(path)["w"], torch.ones(2))
    assert os.listdir(tmp_path / "sub") == ["a.ckpt"]

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        io.save_checkpoint({"w": torch.zeros(2)}, path)
    monkeypatch.undo()
    assert os.listdir(tmp_path / "sub") == ["a.ckpt"], "a failed write leaves no temp file"
    assert torch.equal(io.load_checkpoint(path)["w"], torch.ones(2)), "and the old file intact"

    unsafe = str(tmp_path / "unsafe.ckpt")
    io.save_checkpoint({"obj": _Opaque()}, unsafe)
    with pytest.raises(pickle.UnpicklingError, match=r"weights_only=False"):
        io.load_checkpoint(unsafe)
    assert isinstance(io.load_checkpoint(unsafe, weights_only=False)["obj"], _Opaque)


class _Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.layer(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def test_rank_zero_results_round_trip_to_a_fresh_trainer(tmp_path):
    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,))), batch_size=4)
    kwargs = {"max_epochs": 2, "default_root_dir": str(tmp_path), "enable_progress_bar": False, "enable_model_summary": False}
    worker = pl.Trainer(accelerator="cpu", devices=1, callbacks=[EarlyStopping("loss", patience=0, mode="max")], **kwargs)
    trained = _Tiny()
    worker.fit(trained, data)
    # What a worker sends, through the same serialisation (loaded with weights_only=True).
    output = deserialize_state(serialize_state(collect(worker, None)))

    driver = pl.Trainer(accelerator="cpu", devices=1, callbacks=[EarlyStopping("loss", patience=0, mode="max")], **kwargs)
    fresh = _Tiny()
    driver.strategy.connect(fresh)
    recover(driver, output)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), trained.state_dict().values(), strict=True))
    assert driver.state.finished and driver.current_epoch == 2 and driver.global_step == 8
    assert driver.checkpoint_callback.best_model_path == worker.checkpoint_callback.best_model_path
    assert float(driver.callback_metrics["loss"]) == float(worker.callback_metrics["loss"])
    assert set(driver.logged_metrics) == set(worker.logged_metrics)
    # The loss falls, so this EarlyStopping (mode="max", patience=0) stops after epoch 1.
    stopper = driver.early_stopping_callback
    assert stopper.stopped_epoch == worker.early_stopping_callback.stopped_epoch > 0
    assert float(stopper.best_score) == float(worker.early_stopping_callback.best_score)


def test_the_driver_s_file_loggers_take_the_versions_rank_0_resolved_where_it_wrote(tmp_path):
    """Rank 0's disk holds an earlier run's version_0, the driver's disk (here another
    directory) none: the driver's loggers say version_1 after recover, as rank 0 wrote; a
    version the user gave stays (issue 57: resolved on the driver, it was version_0)."""
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    for kind in ("csv", "tb"):
        os.makedirs(tmp_path / "rank0" / kind / "lightning_logs" / "version_0")
    data = DataLoader(TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,))), batch_size=4)
    quiet = {"max_epochs": 1, "enable_progress_bar": False, "enable_model_summary": False, "enable_checkpointing": False}

    def loggers(root):
        return [CSVLogger(root / "csv"), TensorBoardLogger(root / "tb"), CSVLogger(root / "own", version="mine")]

    worker = pl.Trainer(accelerator="cpu", devices=1, logger=loggers(tmp_path / "rank0"), **quiet)
    worker.fit(_Tiny(), data)
    output = deserialize_state(serialize_state(collect(worker, None)))
    driver = pl.Trainer(accelerator="cpu", devices=1, logger=loggers(tmp_path / "driver"), **quiet)
    driver.strategy.connect(_Tiny())
    recover(driver, output)
    assert [lg.version for lg in driver.loggers] == [1, 1, "mine"]
    assert driver.log_dir == str(tmp_path / "driver" / "csv" / "lightning_logs" / "version_1")
    assert not os.path.exists(tmp_path / "driver"), "nothing resolved or written on the driver's disk"


def _lightning_imports(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lightning"):
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_private_lightning_api_is_isolated_in_one_module():
    private = {
        p.name: {n for n in _lightning_imports(p) if any(part.startswith("_") for part in n.split("."))}
        for p in (SRC / "lightning").glob("*.py")
    }
    assert {k for k, v in private.items() if v} == {"_launcher.py"}
    assert private["_launcher.py"] == {"lightning.pytorch.strategies.launchers.launcher._Launcher"}


def test_core_never_imports_the_lightning_leaf():
    for path in SRC.rglob("*.py"):
        if "lightning" in path.relative_to(SRC).parts:
            continue
        assert "raylight.lightning" not in path.read_text(), path


def test_a_gpu_worker_of_a_cpu_driver_autocasts_on_its_gpu():
    """The driver's Trainer (no GPU there) built its mixed precision for the CPU; the GPU
    worker's strategy takes the CUDA accelerator and an autocast for CUDA with it."""
    from lightning.pytorch.accelerators import CPUAccelerator
    from lightning.pytorch.plugins.precision import MixedPrecision

    from raylight.lightning.strategies import _attach

    strategy = RayStrategy(num_workers=1)
    strategy.accelerator = CPUAccelerator()
    strategy.precision_plugin = MixedPrecision("bf16-mixed", "cpu")
    ctx = SimpleNamespace(world_size=1, rank=0, local_rank=0, node_rank=0, device=torch.device("cuda", 0), sync=None)
    _attach(strategy, ctx, SimpleNamespace(callbacks=[]))
    plugin = strategy.precision_plugin
    assert type(strategy.accelerator).__name__ == "CUDAAccelerator"
    assert isinstance(plugin, MixedPrecision) and (plugin.precision, plugin.device) == ("bf16-mixed", "cuda")


@pytest.mark.parametrize("shape", ["global_os_system", "stack_global_builtins_eval", "dotted_stack_global", "nested_reduce"])
def test_a_hostile_lightning_checkpoint_runs_nothing_and_is_refused_naming_the_file(tmp_path, shape):
    from tests.hostile import as_torch_file, hostile_pickles

    marker = tmp_path / "ran"
    path = tmp_path / "epoch=1.ckpt"
    path.write_bytes(as_torch_file(hostile_pickles(marker)[shape]))
    with pytest.raises(pickle.UnpicklingError, match=rf"checkpoint {path} holds objects .*nsupported"):
        AtomicCheckpointIO().load_checkpoint(str(path))
    assert not marker.exists()


def _lightning_says(monkeypatch, verbose: bool) -> tuple[list[str], list[str]]:
    """(log lines, warnings) Lightning makes after a strategy is built, quiet or verbose."""
    import logging
    import warnings

    from lightning.fabric.utilities.rank_zero import rank_zero_deprecation, rank_zero_info
    from lightning.fabric.utilities.warnings import PossibleUserWarning

    from raylight.base import verbosity

    monkeypatch.setattr(verbosity, "_current", [verbose])
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [logger.level for logger in loggers]
    keep = Keep()
    for logger in loggers:
        logger.setLevel(logging.INFO)  # as Lightning's import leaves them
        logger.addHandler(keep)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            RayStrategy(num_workers=2)
            logging.getLogger("lightning.pytorch.utilities.rank_zero").info("GPU available: False, used: False")
            rank_zero_info("Tip: install litlogger")
            warnings.warn("fewer batches than the logging interval", PossibleUserWarning, stacklevel=1)
            rank_zero_deprecation("an old argument")
            warnings.warn("a user's own warning", UserWarning, stacklevel=1)
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(keep)
            logger.setLevel(level)
    return lines, [str(w.message) for w in caught]


def test_lightning_is_quiet_unless_verbose(monkeypatch):
    """Quiet (the default): Lightning's INFO lines, PossibleUserWarning tips and deprecation
    warnings are not made; other warnings stay. Verbose: all of them, as Lightning says."""
    lines, warned = _lightning_says(monkeypatch, verbose=False)
    assert lines == [] and warned == ["a user's own warning"]
    lines, warned = _lightning_says(monkeypatch, verbose=True)
    assert "GPU available: False, used: False" in lines and "Tip: install litlogger" in lines
    assert {"fewer batches than the logging interval", "an old argument", "a user's own warning"} <= set(warned)


def test_a_quiet_worker_drops_the_model_summary(monkeypatch):
    from lightning.pytorch.callbacks import EarlyStopping, RichModelSummary

    from raylight.base import verbosity
    from raylight.lightning._quiet import quiet_worker

    for verbose, kept in ((False, 1), (True, 2)):
        monkeypatch.setattr(verbosity, "_current", [verbose])
        trainer = SimpleNamespace(callbacks=[RichModelSummary(), EarlyStopping("val_loss")])
        quiet_worker(trainer)
        assert len(trainer.callbacks) == kept and isinstance(trainer.callbacks[-1], EarlyStopping)


class _Gated(_Tiny):
    def __init__(self):
        super().__init__()
        self.gain = torch.nn.Parameter(torch.tensor(1.0))  # 0-dim: FSDP2 cannot shard it
