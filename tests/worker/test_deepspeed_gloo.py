"""DeepSpeed through raylight's strategy on real gloo processes (no Ray): ZeRO-1/2/3 (and
ZeRO-2 with its optimizer offloaded) train like DDP, accumulation agrees with DDP's, and a
DeepSpeed checkpoint of objects round-trips through ``ctx.report``,
``RunStorage.commit_sharded`` and ``ctx.load_checkpoint`` at 1, 2 and 3 workers, under
another ZeRO stage and under DDP; a DDP checkpoint loads into ZeRO-3; a process whose
DeepSpeed groups were released forms them anew on the next process group."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch import nn

pytest.importorskip("deepspeed")

from raylight.config import DeepSpeed
from raylight.storage import sharded
from raylight.storage.checkpoint import Checkpoint
from raylight.storage.run_dir import RunStorage
from raylight.worker.context import TrainContext
from raylight.worker.strategies import DDPStrategy, DeepSpeedStrategy
from tests.helpers import Sink, deepspeed_releases_groups, run_gloo_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(420)]

GLOBAL_BATCH, SAVE_AT, STEPS = 24, 3, 6
CLIP = 0.5  # max_grad_norm, below every step's gradient norm (the targets are large)
# fp32 parameters after 6 Adam steps. DeepSpeed reduces the gradients with other
# collectives than DDP (reduce-scatter or all-reduce of flat buckets, divided before or
# after the sum), so they may differ in the last bits (~1e-7 relative; measured: equal, or
# 6e-8 with DeepSpeedCPUAdam's vectorised update). Adam moves every weight by up to lr
# (1e-3) a step however small its gradient, so 1e-5 is 1% of one step: far below any real
# difference (a gradient reduced twice, or not at all, or a step lost in accumulation
# moves weights by ~1e-3), far above rounding.
TOL = 1e-5
ZERO3 = {"zero_optimization": {"stage3_param_persistence_threshold": 0}}  # partition even tiny tensors


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 33), nn.Tanh(), nn.Sequential(nn.Linear(33, 33), nn.Tanh()), nn.Linear(33, 3))


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    x = torch.randn(GLOBAL_BATCH, 8, generator=gen)
    # targets large enough that the gradient norm is above 1: DeepSpeed's default clipping
    # at 1.0 (which raylight turns off) would show
    return x, 4 * torch.stack([x.sum(1).sin(), x[:, 0], x[:, 1] * x[:, 2]], 1)


def mine(rank: int, world: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    per = GLOBAL_BATCH // world
    x, y = global_batch(step)
    return x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]


def train(model, opt, rank: int, world: int, steps: range, sched=None) -> None:
    for step in steps:
        x, y = mine(rank, world, step)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
        if sched is not None:
            sched.step()


def context(rank, world, strategy, checkpoint=None, directory=None, sink=None):
    return TrainContext(
        rank=rank, local_rank=rank, world_size=world, local_world_size=world, node_rank=0,
        device=torch.device("cpu"), sink=sink or Sink(), checkpoint=checkpoint, strategy=strategy,
        checkpoint_dir=directory, next_checkpoint=0,
    )


def deepspeed(stage: int, **options) -> DeepSpeedStrategy:
    if stage == 3:
        options.setdefault("config", ZERO3)
    return DeepSpeedStrategy(DeepSpeed(stage=stage, **options))


def prepared(ctx, optimizer=torch.optim.Adam):
    model = ctx.prepare_model(make_model())
    return model, ctx.prepare_optimizer(optimizer(model.parameters(), lr=1e-3))


def snapshot(strategy, model, opt) -> dict:
    """The whole model and Adam state, in torch's layout, as plain lists (a collective)."""
    state = strategy.full_state(strategy.objects_state({"model": model, "opt": opt}))
    return {
        "params": {k: v.reshape(-1).tolist() for k, v in state["model"].items()},
        "adam": {k: [s["exp_avg"].reshape(-1).tolist(), s["exp_avg_sq"].reshape(-1).tolist(), float(s["step"])]
                 for k, s in state["opt"]["state"].items()},
    }


def start(rank: int, port: int, world: int) -> None:
    torch.set_num_threads(1)
    os.environ["LOCAL_RANK"] = str(rank)  # as raylight's workers (and torchrun) set it
    dist.init_process_group("gloo", store=dist.TCPStore("127.0.0.1", port, world, rank == 0), rank=rank, world_size=world)


def trainer(rank: int, port: int, directory: str, queue) -> None:
    """World 2: DDP, ZeRO-1/2/3, offload and accumulation runs; a ZeRO-3 checkpoint of
    objects and a DDP one; raw state dicts."""
    start(rank, port, 2)
    try:
        out = {"rank": rank}
        ddp = DDPStrategy()
        model, opt = prepared(context(rank, 2, ddp))
        train(model, opt, rank, 2, range(STEPS))
        out["ddp"] = snapshot(ddp, model, opt)["params"]

        # First, while deepspeed.comm is not set up in this process: ZeRO-3 with a model
        # built on the meta device: materialised and partitioned module
        # by module (the whole tensors any worker holds at once: at most one module's),
        # then given the DDP run's initial weights, it trains like DDP
        strategy = deepspeed(3)
        with torch.device("meta"):
            meta = make_model()
        partition, whole = strategy._partition, []

        def spy(module, **options):
            whole.append(sum(p.numel() for p in meta.parameters() if not p.is_meta and not hasattr(p, "ds_id")))
            partition(module, **options)

        strategy._partition = spy
        ctx = context(rank, 2, strategy)
        model = ctx.prepare_model(meta)
        out["meta_whole"] = whole
        out["meta_partitioned"] = [(p.data.numel(), p.ds_tensor.numel(), p.ds_numel) for p in meta.parameters()]
        opt = ctx.prepare_optimizer(torch.optim.Adam(model.parameters(), lr=1e-3))
        strategy.load_objects({"model": model}, {"model": make_model().state_dict()}, full=True)
        train(model, opt, rank, 2, range(STEPS))
        out["zero3_meta"] = snapshot(strategy, model, opt)["params"]


        for stage in (1, 2, 3):
            strategy = deepspeed(stage)
            ctx = context(rank, 2, strategy)
            model, opt = prepared(ctx)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0) if stage == 1 else None
            if stage == 1:  # the training loader fills DeepSpeed's batch fields
                ctx.prepare_loader(torch.utils.data.TensorDataset(torch.zeros(96, 1)), batch_size=GLOBAL_BATCH)
                out["batch"] = (model.engine.train_micro_batch_size_per_gpu(), model.engine.train_batch_size(),
                                model.engine.gradient_accumulation_steps())
            if stage == 3:
                out["partitioned"] = [p.numel() for p in model.parameters()]
                try:
                    ctx.unwrap_model(model).state_dict()
                except RuntimeError as exc:
                    out["raw_zero3"] = str(exc)
            train(model, opt, rank, 2, range(STEPS), sched)
            out[f"zero{stage}"] = snapshot(strategy, model, opt)["params"]

        # torch's SGD (with momentum: per-element state), which DeepSpeed calls untested
        def sgd(params, lr):
            return torch.optim.SGD(params, lr=lr * 10, momentum=0.9)

        for name, strategy in (("sgd_ddp", DDPStrategy()), ("sgd_zero2", deepspeed(2))):
            model, opt = prepared(context(rank, 2, strategy), sgd)
            train(model, opt, rank, 2, range(STEPS))
            out[name] = strategy.full_state(strategy.objects_state({"model": model}))["model"]
            out[name] = {k: v.reshape(-1).tolist() for k, v in out[name].items()}

        # max_grad_norm: DeepSpeed's gradient_clipping, clipping as DDP's clip at the step
        for name, strategy in (("clip_ddp", DDPStrategy()), ("clip_zero2", deepspeed(2))):
            ctx = context(rank, 2, strategy)
            model = ctx.prepare_model(make_model())
            opt = ctx.prepare_optimizer(sgd(model.parameters(), 1e-3), max_grad_norm=CLIP)
            norms = []
            for step in range(STEPS):
                train(model, opt, rank, 2, range(step, step + 1))
                norms.append(ctx.grad_norm)
            params = strategy.full_state(strategy.objects_state({"model": model}))["model"]
            out[name] = {"params": {k: v.reshape(-1).tolist() for k, v in params.items()}, "norms": norms}

        # a rate set on the prepared optimizer's groups is the one the engine's step uses
        # (as the declarative loop's learning_rate_scheduler sets it): at 0, nothing moves
        strategy = deepspeed(2)
        model, opt = prepared(context(rank, 2, strategy))
        train(model, opt, rank, 2, range(1))
        for group in opt.param_groups:
            group["lr"] = 0.0
        before = snapshot(strategy, model, opt)["params"]
        train(model, opt, rank, 2, range(1, 3))
        out["lr_zero_still"] = snapshot(strategy, model, opt)["params"] == before
        for group in opt.param_groups:
            group["lr"] = 1e-3
        train(model, opt, rank, 2, range(3, 4))
        out["lr_back_moved"] = snapshot(strategy, model, opt)["params"] != before

        from deepspeed.ops.adam import DeepSpeedCPUAdam

        for name, optimizer in (("offload_cpu_adam", DeepSpeedCPUAdam), ("offload_torch_adam", torch.optim.Adam)):
            strategy = deepspeed(2, offload_optimizer=True)
            model, opt = prepared(context(rank, 2, strategy), optimizer)
            train(model, opt, rank, 2, range(STEPS))
            out[name] = snapshot(strategy, model, opt)["params"]
            out[f"{name}_device"] = str(next(iter(opt.state.values()))["exp_avg"].device)

        # accumulation: each step's batch in two micro-batches, opt.zero_grad() and
        # opt.step() after each (DeepSpeed counts); the first under ctx's no_sync, as
        # raylight's loader runs accumulation micro-steps. ZeRO-1 keeps the gradients in
        # the parameters until the boundary, ZeRO-2 reduces each micro-step's.
        for stage in (1, 2):
            strategy = deepspeed(stage, config={"gradient_accumulation_steps": 2})
            ctx = context(rank, 2, strategy)
            model, opt = prepared(ctx)
            for step in range(STEPS):
                x, y = mine(rank, 2, step)
                for j, (xs, ys) in enumerate(zip(x.chunk(2), y.chunk(2), strict=True)):
                    opt.zero_grad()
                    with ctx._no_sync() if j == 0 else torch.enable_grad():
                        ((model(xs) - ys) ** 2).mean().backward()
                    opt.step()
                    if step == 0 and j == 0:
                        try:
                            ctx.report({}, checkpoint={"model": model, "opt": opt})
                        except RuntimeError as exc:
                            out["mid_accumulation"] = str(exc)
            out[f"accumulated{stage}"] = snapshot(strategy, model, opt)["params"]

        # raw state dicts under ZeRO-2: the module's and opt.state_dict() resume exactly
        strategy = deepspeed(2)
        ctx = context(rank, 2, strategy)
        model, opt = prepared(ctx)
        train(model, opt, rank, 2, range(SAVE_AT))
        raw = {"model": {k: v.clone() for k, v in ctx.unwrap_model(model).state_dict().items()}, "opt": opt.state_dict()}
        out["raw_opt_keys"] = (sorted(raw["opt"]["state"]), raw["opt"]["param_groups"][0]["params"])
        train(model, opt, rank, 2, range(SAVE_AT, STEPS))
        want = snapshot(strategy, model, opt)
        strategy = deepspeed(2)
        ctx = context(rank, 2, strategy)
        model, opt = prepared(ctx)
        ctx.unwrap_model(model).load_state_dict(raw["model"])
        opt.load_state_dict(raw["opt"])
        train(model, opt, rank, 2, range(SAVE_AT, STEPS))
        out["raw_resumed_equal"] = snapshot(strategy, model, opt) == want

        # the checkpoints the readers load: ZeRO-3 objects (sharded), and DDP's (full)
        for name, strategy, shards in (("zero3", deepspeed(3), directory), ("ddp", ddp, None)):
            sink = Sink()
            ctx = context(rank, 2, strategy, directory=shards, sink=sink)
            model, opt = prepared(ctx)
            train(model, opt, rank, 2, range(SAVE_AT))
            ctx.report({"loss": 1.0}, checkpoint={"model": model, "opt": opt, "epoch": 2})
            out[f"{name}_saved"] = snapshot(strategy, model, opt)
            train(model, opt, rank, 2, range(SAVE_AT, STEPS))
            out[f"{name}_final"] = snapshot(strategy, model, opt)["params"]
            if rank == 0:
                out[f"{name}_data"] = sink.reports[0].checkpoint
        queue.put(out)
    finally:
        dist.destroy_process_group()


def reader(rank: int, port: int, world: int, plan: list, queue) -> None:
    """Load each (kind, stage, path, data) of ``plan`` at ``world`` workers, train on to STEPS."""
    start(rank, port, world)
    try:
        out = {"rank": rank}
        for label, stage, path, data, sharded_ckpt in plan:
            strategy = DDPStrategy() if stage == 0 else deepspeed(stage)
            metadata = {"index": 0, "format": "sharded"} if sharded_ckpt else {"index": 0}
            ckpt = Checkpoint(path, metadata=metadata, data=data)
            ctx = context(rank, world, strategy, checkpoint=ckpt)
            model, opt = prepared(ctx)
            rest = ctx.load_checkpoint({"model": model, "opt": opt})
            out[label] = {"rest": rest, "loaded": snapshot(strategy, model, opt)}
            train(model, opt, rank, world, range(SAVE_AT, STEPS))
            out[label]["final"] = snapshot(strategy, model, opt)["params"]
        queue.put(out)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    storage = RunStorage(str(root))
    ranks = run_gloo_ranks(trainer, f"{root}/checkpoints", timeout_s=360)
    uri, _ = storage.commit_sharded(0, ranks[0]["zero3_data"], {"index": 0})
    return {"ranks": ranks, "uri": uri, "data": ranks[0]["zero3_data"]}


@pytest.fixture(scope="module")
def read(trained):
    uri, data, ddp_data = trained["uri"], trained["data"], trained["ranks"][0]["ddp_data"]
    plans = {
        1: [("zero2", 2, uri, data, True)],
        2: [("zero1", 1, uri, data, True), ("ddp", 0, uri, data, True), ("zero3_from_ddp", 3, None, ddp_data, False)],
        3: [("zero3", 3, uri, data, True)],
    }
    return {world: run_gloo_ranks(reader, world, plan, world_size=world, timeout_s=240) for world, plan in plans.items()}


def close(a: dict, b: dict, tol: float) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key] == pytest.approx(b[key], abs=tol), key


def test_zero_stages_train_like_ddp(trained):
    for rank in (0, 1):
        ranks = trained["ranks"][rank]
        for stage in (1, 2, 3):
            close(ranks[f"zero{stage}"], ranks["ddp"], TOL)
    zero = trained["ranks"][0]
    init = {k: v.reshape(-1).tolist() for k, v in make_model().state_dict().items()}
    moved = max(abs(a - b) for k in init for a, b in zip(zero["ddp"][k], init[k], strict=True))
    assert moved > 3e-3, "training moved the parameters by several steps' worth"
    assert zero["partitioned"] and not any(zero["partitioned"]), "ZeRO-3 holds placeholders, not parameters"
    # the training loader filled the batch fields: 12 samples a worker, no accumulation
    assert zero["batch"] == (12, 24, 1)


def test_a_meta_model_is_partitioned_module_by_module_under_zero3_and_trains_like_ddp(trained):
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in make_model().modules())
    for out in trained["ranks"].values():
        assert len(out["meta_whole"]) == 3 and max(out["meta_whole"]) <= largest, out["meta_whole"]
        for held, partition, numel in out["meta_partitioned"]:
            assert held == 0 and partition == -(-numel // 2), (held, partition, numel)
        close(out["zero3_meta"], out["ddp"], TOL)


def test_torch_sgd_with_momentum_trains_like_ddp(trained):
    zero = trained["ranks"][0]
    # SGD moves each weight by lr x its (momentum-averaged) gradient, so rounding in the
    # gradient stays rounding: 1e-6 is far above it, far below a step (lr 1e-2 x O(1))
    close(zero["sgd_zero2"], zero["sgd_ddp"], 1e-6)


def test_max_grad_norm_clips_under_zero2_as_under_ddp(trained):
    zero = trained["ranks"][0]
    ddp, ds = zero["clip_ddp"], zero["clip_zero2"]
    assert min(ddp["norms"]) > CLIP, "every step was clipped"
    assert ds["norms"] == pytest.approx(ddp["norms"], rel=1e-5), "the norm before clipping, as DeepSpeed computed it"
    close(ds["params"], ddp["params"], 1e-6)
    moved = max(abs(a - b) for k in ddp["params"] for a, b in zip(ddp["params"][k], zero["sgd_ddp"][k], strict=True))
    assert moved > 1e-3, "clipped training differs from unclipped"


def test_a_rate_set_on_the_prepared_optimizer_is_the_step_s(trained):
    for out in trained["ranks"].values():
        assert out["lr_zero_still"] and out["lr_back_moved"]


def test_offloaded_optimizer_trains_like_ddp(trained):
    zero = trained["ranks"][0]
    for name in ("offload_cpu_adam", "offload_torch_adam"):
        close(zero[name], zero["ddp"], TOL)
        assert zero[f"{name}_device"] == "cpu"


def test_accumulation_agrees_with_ddp_and_refuses_a_checkpoint_inside_it(trained):
    zero = trained["ranks"][0]
    for stage in (1, 2):
        close(zero[f"accumulated{stage}"], zero["ddp"], TOL)
    assert "1 micro-steps into an accumulation of 2" in zero["mid_accumulation"]


def test_raw_state_dicts_resume_under_zero2_and_are_refused_under_zero3(trained):
    zero = trained["ranks"][0]
    assert zero["raw_resumed_equal"], "module state and opt.state_dict() resume bit for bit"
    keys, params = zero["raw_opt_keys"]
    assert keys == list(range(6)) and params == list(range(6)), "torch's numbered layout"
    assert "checkpoint={'model': model, 'opt': opt}" in zero["raw_zero3"]


def test_every_rank_writes_its_shards(trained):
    metadata = sharded.read_metadata(trained["uri"])
    chunks = metadata.state_dict_metadata["model.0.weight"].chunks
    assert sorted(tuple(c.sizes) for c in chunks) == [(16, 8), (17, 8)], "each rank wrote its half"
    state = Checkpoint(trained["uri"], data=trained["data"]).load()
    assert state["epoch"] == 2 and type(state["model"]["0.weight"]) is torch.Tensor
    assert set(state["opt"]["state"]["model.0.weight"]) == {"exp_avg", "exp_avg_sq", "step"}
    assert len(trained["data"]) < 20_000, "the skeleton holds no tensors"


@pytest.mark.parametrize(("world", "label"), [(1, "zero2"), (2, "zero1"), (3, "zero3"), (2, "ddp")])
def test_a_checkpoint_written_by_two_loads_at_any_size_and_stage_and_under_ddp(trained, read, world, label):
    saved = trained["ranks"][0]["zero3_saved"]
    for rank in range(world):
        got = read[world][rank][label]
        assert got["loaded"] == saved, "parameters and Adam state restored bit for bit"
        assert got["rest"] == {"epoch": 2}
    # 3 more steps at another world size or stage: reductions in another order
    close(read[world][0][label]["final"], trained["ranks"][0]["zero3_final"], TOL)


def test_a_ddp_checkpoint_loads_into_zero3(trained, read):
    got = read[2][0]["zero3_from_ddp"]
    assert got["loaded"] == trained["ranks"][0]["ddp_saved"]
    close(got["final"], trained["ranks"][0]["ddp_final"], TOL)


def regrouped(rank: int, port: int, directory: str, queue) -> None:
    """DeepSpeed's groups on one process group, released, then a new process group in the
    same process (a pooled worker's next run): DeepSpeed builds everything anew on it."""
    from raylight.worker.strategies.deepspeed import (
        _import_deepspeed,
        holds_process_groups,
        release_process_group,
    )

    start(rank, port, 2)
    ds = _import_deepspeed(torch.device("cpu"))
    from deepspeed.utils import groups

    out = {"rank": rank, "before": holds_process_groups()}
    ds.init_distributed(dist_backend="gloo")
    first = groups._get_data_parallel_group()  # DeepSpeed keeps a clone of the world group
    out["held"] = holds_process_groups() and groups._WORLD_GROUP is first
    out["released"] = release_process_group()
    out["after"] = [holds_process_groups(), groups._WORLD_GROUP, dist.is_initialized()]
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(directory, "store"), 2), rank=rank, world_size=2)
    ds.init_distributed(dist_backend="gloo")
    second = groups._get_data_parallel_group()
    total = torch.tensor(float(rank + 1))
    ds.comm.all_reduce(total, group=second)
    out["again"] = [second is not first, float(total)]
    release_process_group()
    queue.put(out)


def test_a_released_process_forms_deepspeed_s_groups_anew_on_the_next_process_group(tmp_path):
    """What lets a DeepSpeed worker serve the next run (raylight.worker_group.pool)."""
    if not deepspeed_releases_groups():
        pytest.skip("this DeepSpeed (< 0.19.8) keeps references to a destroyed group: its workers are not reused")
    for out in run_gloo_ranks(regrouped, str(tmp_path)).values():
        assert out["before"] is False and out["held"] is True and out["released"] is True, out
        assert out["after"] == [False, None, False], "nothing of the old group is left"
        assert out["again"] == [True, 3.0], "a new world group, and it reduces"
