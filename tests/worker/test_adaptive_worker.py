"""Worker-side adaptive pieces in one process (world size 1, no process group)."""

import copy
import warnings

import pytest
import torch
from torch import nn

from raylight.adaptive.engine import AdaptiveEngine
from raylight.adaptive.goodput import PerfParams, predict_step_time
from raylight.adaptive.plan import AdaptiveStats, BatchPlan
from raylight.adaptive.policy import Layout
from raylight.adaptive.profile import StepProfile
from raylight.config.schema import AdaptiveConfig, ScalingConfig
from raylight.driver.trainer import engine_settings
from raylight.worker.adaptive.optimizer import AdaptiveOptimizer
from raylight.worker.adaptive.state import Accumulator
from raylight.worker.adaptive.sync import ResizeInterrupt, StepSync


def make_sync(plan=None, rule="adascale", m0=8):
    return StepSync(
        rank=0, world_size=1, num_nodes=1, threads=1, plan=plan or BatchPlan(8), init_batch_size=m0,
        adaptive=True, lr_rule=rule,
    )


def test_boundary_adopts_the_newest_plan_and_stops_when_asked():
    sync = make_sync()
    sync.set_plan(BatchPlan(16, 1, 2))
    sync.set_plan(BatchPlan(4, 0, 1))  # older: ignored
    assert sync.begin_step() == BatchPlan(16, 1, 2), "step 0 is a control step"
    sync.set_plan(BatchPlan(32, 0, 3))
    for _ in range(sync.every - 1):
        assert sync.begin_step() == BatchPlan(16, 1, 2), "plans change only at control steps"
    assert sync.begin_step() == BatchPlan(32, 0, 3)
    sync.begin_step()
    sync.request_stop()
    with pytest.raises(ResizeInterrupt):  # alone, a stop is checked at every step (no collective)
        sync.begin_step()


def test_optimizer_accumulates_then_steps_with_scaled_lr_and_restores_it():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    sync = make_sync(plan=BatchPlan(4, 1, 1), rule="linear", m0=4)  # S = 2: linear LR x2
    opt = AdaptiveOptimizer(base, sync=sync)
    x = torch.randn(8, 3)
    before = [p.detach().clone() for p in model.parameters()]
    sync.micro_steps = 2
    grads = []
    for j, chunk in enumerate(x.split(4)):
        sync.micro = j
        opt.zero_grad()
        model(chunk).sum().backward()
        grads.append([p.grad.detach().clone() for p in model.parameters()])
        opt.step()
        if j == 0:
            assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True)), "no step mid-accumulation"
    mean_grad = [g / 2 for g in grads[1]]  # grads[1] holds the sum of both micro-steps
    for b, p, g in zip(before, model.parameters(), mean_grad, strict=True):
        assert torch.allclose(p, b - 0.2 * g, atol=1e-6)
    assert base.param_groups[0]["lr"] == 0.1, "the user's LR is restored after the step"
    assert opt.progress == pytest.approx(2.0)  # linear: progress counts S per step


def test_a_grad_scaler_driving_the_adaptive_optimizer_is_refused_before_it_touches_the_gradients():
    """GradScaler's step and update run at every micro-step: it would unscale the gradients
    being accumulated at each one (the first micro-batch's then scaled down twice)."""
    from raylight.base.exceptions import ConfigError

    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = AdaptiveOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), sync=make_sync(plan=BatchPlan(4, 1, 1)))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    opt.zero_grad()
    scaler.scale(model(torch.randn(4, 3)).sum()).backward()
    scaled = [p.grad.clone() for p in model.parameters()]
    with pytest.raises(ConfigError, match=r"GradScaler does not work with adaptive training.*bfloat16 autocast"):
        scaler.step(opt)
    assert all(torch.equal(g, p.grad) for g, p in zip(scaled, model.parameters(), strict=True)), "gradients left as they were"
    plain = [p.detach().clone() for p in model.parameters()]
    opt.step()  # without a scaler: steps as before
    assert not all(torch.equal(a, p) for a, p in zip(plain, model.parameters(), strict=True))


def test_torch_lr_schedulers_and_step_hooks_take_the_prepared_optimizer():
    """A scheduler built on what ``ctx.prepare_optimizer`` returned sets the unscaled rate
    (the LR rule scales it for its step alone); hooks registered on it run once per
    optimizer step, not per micro-step; its state is the wrapped optimizer's."""
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    sync = make_sync(plan=BatchPlan(4, 1, 1), rule="linear", m0=4)  # S = 2: linear LR x2
    opt = AdaptiveOptimizer(base, sync=sync)
    assert isinstance(opt, torch.optim.Optimizer)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    seen: list[float] = []
    opt.register_step_pre_hook(lambda o, args, kwargs: seen.append(o.param_groups[0]["lr"]))
    sync.micro_steps = 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns of a scheduler stepped before its optimizer
        for _ in range(2):
            for j in range(2):
                sync.micro = j
                opt.zero_grad()
                model(torch.randn(4, 3)).sum().backward()
                opt.step()
            scheduler.step()
    assert seen == [pytest.approx(0.2), pytest.approx(0.1)], "one hook call a step, at the rule's scaled rate"
    assert base.param_groups[0]["lr"] == pytest.approx(0.025) == scheduler.get_last_lr()[0]
    assert opt.defaults is base.defaults and opt.state is base.state
    assert opt.state_dict()["param_groups"] == base.state_dict()["param_groups"]
    extra = nn.Parameter(torch.zeros(2))
    opt.add_param_group({"params": [extra]})
    assert base.param_groups[-1]["params"] == [extra]
    assert repr(opt).startswith("AdaptiveOptimizer(SGD (")


def test_a_clip_at_the_step_clips_the_averaged_gradient_of_the_accumulated_micro_steps():
    """``prepare_optimizer(max_grad_norm=...)`` in an adaptive run: the step applies the
    micro-steps' mean gradient clipped to the norm, at the rule's rate, and the norm it
    found is the mean gradient's (clipping in the loop would clip each partial sum)."""
    from raylight.worker.strategies.base import ClipAtStep

    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    ref = copy.deepcopy(model)
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    clip = ClipAtStep(base, 0.01)
    sync = make_sync(plan=BatchPlan(4, 1, 1), rule="linear", m0=4)  # S = 2: linear LR x2
    opt = AdaptiveOptimizer(base, sync=sync)
    x = torch.randn(8, 3)
    sync.micro_steps = 2
    for j, chunk in enumerate(x.split(4)):
        sync.micro = j
        opt.zero_grad()
        model(chunk).sum().backward()
        opt.step()
        assert (clip.value is None) == (j == 0), "measured at the step, not at a micro-step"
    for chunk in x.split(4):  # the step's gradient: the mean of the two micro-batches'
        ref(chunk).sum().backward()
    mean = [p.grad / 2 for p in ref.parameters()]
    norm = float(torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in mean])))
    assert norm > 0.01 and clip.value == pytest.approx(norm, rel=1e-6)
    scale = 0.01 / (norm + 1e-6)  # torch's clip coefficient
    for start, p, g in zip(ref.parameters(), model.parameters(), mean, strict=True):
        assert torch.allclose(p.detach(), start.detach() - 0.2 * g * scale, atol=1e-7)


def test_single_replica_noise_measurement_from_accumulation():
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    sync = make_sync(plan=BatchPlan(8, 3, 1), m0=8)
    opt = AdaptiveOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), sync=sync)
    sync.micro_steps = 4
    for _ in range(30 * sync.every):
        sync.begin_step()  # measures on one step in `every`; folds it in at the next control step
        for j in range(4):
            sync.micro = j
            opt.zero_grad()
            x = torch.randn(8, 4)
            ((model(x) - x.sum(1, keepdim=True) - 3 * torch.randn(8, 1)) ** 2).mean().backward()
            opt.step()
    assert sync.gns.num_updates == 29 and sync.gns.var > 0


def test_adam_preconditioning_changes_the_norm():
    model = nn.Linear(4, 1)
    adam = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(8, 4)).sum().backward()
    adam.step()
    opt = AdaptiveOptimizer(adam, sync=make_sync())
    grads = [torch.ones_like(p) for p in model.parameters()]
    params = list(model.parameters())
    plain = sum(float(g.pow(2).sum()) for g in grads)
    assert opt.preconditioned_sqr(grads, params) != pytest.approx(plain)
    # The flat path (several replicas: one preconditioner over the flat gradient) agrees.
    from raylight.worker.adaptive.optimizer import _sqr

    flat = torch.cat([g.reshape(-1) for g in grads])
    assert _sqr(flat, opt._preconditioner(params, torch.float32)) == pytest.approx(
        opt.preconditioned_sqr(grads, params), rel=1e-6
    )


def test_accumulator_outside_and_inside_sync_and_state():
    acc = Accumulator(world_size=1)
    acc["n"] += 3
    acc["n"] += 2
    assert acc["n"] == 5
    with acc.synchronized():
        assert acc["n"] == 5
        with pytest.raises(RuntimeError, match="read-only"):
            acc["n"] = 1
    acc["n"] += 1
    state = acc.state_dict()
    again = Accumulator(world_size=1)
    again.load_state_dict(state)
    with again.synchronized():
        assert again["n"] == 6


def test_accumulator_keeps_tensor_sums_on_their_device_until_synchronised():
    acc = Accumulator(world_size=1)
    loss = torch.tensor(0.25, requires_grad=True) * 2
    for _ in range(3):
        acc["loss"] += loss * 4  # a tensor that requires grad: the sum keeps no graph
        acc["seen"] += 4
        acc["hits"] += torch.tensor([3])  # an integer count
    # still tensors, never read back (on a GPU: no wait for the device at each step)
    assert isinstance(acc["loss"], torch.Tensor) and isinstance(acc["hits"], torch.Tensor)
    assert not acc["loss"].requires_grad
    # a sum of many half-precision steps keeps its digits (float16 alone stops at 2048)
    for _ in range(3000):
        acc["half"] += torch.tensor(1.0, dtype=torch.float16)
    with acc.synchronized():
        assert (acc["loss"], acc["seen"], acc["hits"], acc["half"]) == (6.0, 12.0, 9.0, 3000.0)
        assert all(type(acc[k]) is float for k in acc)
    with pytest.raises(TypeError, match=r"accumulator\['batch'\]: a sum is one number; got a tensor of shape \(2,\)"):
        acc["batch"] += torch.ones(2)
    acc["loss"] += torch.tensor(1.0)
    again = Accumulator(world_size=1)
    again.load_state_dict(acc.state_dict())
    with again.synchronized():
        assert again["loss"] == 7.0


def stats(plan, profile, *, sqr=1.0, var=50.0, threads=1, dataset_size=None):
    return AdaptiveStats(
        profile=profile.to_json(), plan=plan, init_batch_size=16, grad_sqr=sqr, grad_var=var, lr_factor=1.0, progress=0.0,
        threads=threads, dataset_size=dataset_size,
    )


def profile_for(perf, layouts, steps=10):
    prof = StepProfile()
    for n, k, m, t in layouts:
        for _ in range(steps):
            prof.add((n, k, m, t), optim_time=float(predict_step_time(perf, n, k, m, 0)))
    return prof


def engine(*, adaptive=True, scaling_policy="goodput"):
    scaling = ScalingConfig(num_workers=(1, 4), scaling_policy=scaling_policy)
    config = AdaptiveConfig(max_batch_size=512, local_batch_bounds=(4, 128), min_profile_steps=3)
    return AdaptiveEngine(engine_settings(scaling, config if adaptive else None))


def test_engine_grows_the_batch_under_noise_and_plans_for_a_resize():
    perf = PerfParams(0.01, 1e-4, 0.05, 0.01, 0.02, 0.005, 1.0)
    eng = engine()
    eng.observe(stats(BatchPlan(8, 0, 0), profile_for(perf, [(1, 2, 8, 1), (1, 2, 16, 1)])))
    plan = eng.decide_batch(num_workers=2, threads=1)
    assert plan is not None and plan.version == 1 and plan.global_batch(2) > 16
    assert "predicted goodput" in eng.last_batch_reason
    resized = eng.plan_for(4, old_workers=2, threads=1)
    assert resized is not None and resized.version == 1 and resized.global_batch(4) >= 16
    row = eng.trace_row(num_workers=2, threads=1)
    assert row["noise_scale"] == pytest.approx(50.0) and 0 < row["efficiency"] <= 1
    # The steps since the previous row at the running plan, against the prediction.
    assert row["measured_steps"] == 10
    assert row["measured_step_time"] == pytest.approx(float(predict_step_time(perf, 1, 2, 8, 0)))
    assert row["predicted_step_time"] > 0
    assert "measured_step_time" not in eng.trace_row(num_workers=2, threads=1)


def test_the_batch_never_outgrows_the_training_set():
    """The noise that grows the batch to 512 above grows it no further than 40 samples
    when the training set has 40 (a larger one is one short step an epoch)."""
    perf = PerfParams(0.01, 1e-4, 0.05, 0.01, 0.02, 0.005, 1.0)
    eng = engine()
    eng.observe(stats(BatchPlan(8, 0, 0), profile_for(perf, [(1, 2, 8, 1), (1, 2, 16, 1)]), var=5000.0, dataset_size=40))
    plan = eng.decide_batch(num_workers=2, threads=1)
    assert plan is not None and 16 < plan.global_batch(2) <= 40
    unbounded = engine()
    unbounded.observe(stats(BatchPlan(8, 0, 0), profile_for(perf, [(1, 2, 8, 1), (1, 2, 16, 1)]), var=5000.0))
    assert unbounded.decide_batch(num_workers=2, threads=1).global_batch(2) > 40
    again = engine()
    again.load_state_dict(eng.state_dict())
    assert again.state.dataset_size == 40
    old = eng.state_dict()
    del old["dataset_size"]  # a state written before the size was kept
    again.load_state_dict(old)
    assert again.state.dataset_size is None


def test_engine_without_adaptive_keeps_the_global_batch():
    eng = engine(adaptive=False)
    eng.observe(stats(BatchPlan(8, 0, 0), StepProfile()))
    assert eng.decide_batch(num_workers=2, threads=1) is None
    assert eng.plan_for(4, old_workers=2, threads=1) == BatchPlan(4, 0, 1)


def test_engine_max_policy_and_state_round_trip():
    eng = engine(scaling_policy="max")
    eng.observe(stats(BatchPlan(8), StepProfile()))
    decision = eng.decide_layout(current=Layout(2, 1), candidates=[Layout(k, 1) for k in (1, 2, 3)])
    assert decision is not None and decision.layout.num_workers == 3
    again = engine()
    again.load_state_dict(eng.state_dict())
    assert again.state.plan == BatchPlan(8) and again.state.explored == {1}


def test_control_interval_sets_which_steps_agree_and_measure():
    sync = StepSync(rank=0, world_size=1, num_nodes=1, threads=1, plan=BatchPlan(8), init_batch_size=8, adaptive=True, every=3)
    plans, measuring = [], []
    for step in range(7):
        if step == 1:
            sync.set_plan(BatchPlan(16, 0, 1))
        plans.append(sync.begin_step().atomic_bsz)
        measuring.append(sync.measuring)
    assert plans == [8, 8, 8, 16, 16, 16, 16], "a new plan waits for the next control step"
    # One replica measures on the control step and the one after it (consecutive steps).
    assert measuring == [True, True, False, True, True, False, True]


def test_step_with_a_closure_runs_it_before_scaling_the_rate():
    # Lightning hands step() a closure that makes the gradients: it must run first, and
    # the step must then use the scaled rate once and restore the user's rate.
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    sync = make_sync(BatchPlan(16), "linear", m0=8)  # scale 2: the rate doubles
    opt = AdaptiveOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), sync=sync)
    x = torch.randn(8, 3)
    before = model.weight.detach().clone()
    calls = []

    def closure():
        calls.append(1)
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        return loss

    sync.begin_step()
    sync.micro_steps = 2
    sync.micro = 0  # accumulating: the closure still runs, the weights stay
    assert float(opt.step(closure)) > 0 and calls == [1]
    assert torch.equal(model.weight.detach(), before)
    grad = model.weight.grad.detach().clone()
    sync.micro = 1
    opt.step(closure)
    assert calls == [1, 1]
    assert torch.allclose(model.weight.detach(), before - 0.2 * grad), "mean of 2 equal micro-grads, rate x2"
    assert opt.param_groups[0]["lr"] == 0.1


def test_first_steps_at_a_layout_are_not_profiled(monkeypatch):
    """Each micro-step is timed from one hand-out to the next; the first
    PROFILE_WARMUP_STEPS optimizer steps at a layout (their micro-steps too) pay one-off
    costs and stay out of the profile, again after the batch size changes."""
    import raylight.worker.adaptive.sync as sync_mod
    from raylight.worker.adaptive.sync import PROFILE_WARMUP_STEPS

    clock = iter(range(1000))
    monkeypatch.setattr(sync_mod.time, "perf_counter", lambda: float(next(clock)))
    sync = make_sync(plan=BatchPlan(8, 1))

    def steps(n):  # n optimizer steps of 2 micro-steps each (1 accumulation)
        for _ in range(n):
            sync.tick(sync_step=False)
            sync.tick(sync_step=True)

    steps(PROFILE_WARMUP_STEPS + 3)
    stats = sync.profile.layouts[(1, 1, 8, 1)]
    # the last micro-step is timed at the next tick: 3 optimizer steps minus the open one
    assert (stats.optim_count, stats.accum_count) == (2, 3)
    assert stats.optim_time == stats.accum_time / 3 * 2 == 2.0  # one clock unit each
    sync.plan = BatchPlan(16, 1, 1)
    steps(PROFILE_WARMUP_STEPS + 2)
    assert sync.profile.layouts[(1, 1, 8, 1)].optim_count == 3  # the step that was open
    stats = sync.profile.layouts.get((1, 1, 16, 1))
    assert stats is not None and (stats.optim_count, stats.accum_count) == (1, 2)


def _accumulating_loop(ctx, data, *, log, report_at=None):
    """AdaptDL's pattern: one accumulator for the whole run, made before the epochs, and a
    new one each epoch; a checkpoint reported inside the loop at step ``report_at``."""
    loader = ctx.prepare_loader(data, batch_size=8)
    overall = ctx.accumulator()
    step = 0
    for epoch in ctx.epochs(3):
        acc = ctx.accumulator()
        for (x,) in loader:
            acc["seen"] += len(x)
            acc["even"] += int((x % 2 == 0).sum())
            overall["seen"] += len(x)
            if step == report_at:
                ctx.report({}, checkpoint={"epoch": epoch})
            step += 1
        with acc.synchronized():
            log.append((epoch, acc["seen"], acc["even"] / acc["seen"]))
    with overall.synchronized():
        log.append(("overall", overall["seen"]))


@pytest.mark.parametrize("report_at", [9, 4])
def test_a_new_accumulator_each_epoch_resumes_its_own_epoch_s_sums(report_at):
    """After a restart, an accumulator made in an epoch gets that epoch's saved sums (keyed
    by the epoch it was made in and its order there), not those of the accumulator made
    first since the start: restored by creation order, epoch 2's made 1.5 epochs' samples."""
    from raylight.storage.checkpoint import Checkpoint
    from raylight.worker.context import TrainContext
    from tests.helpers import Sink

    data = torch.utils.data.TensorDataset(torch.arange(32))

    def ctx(sink, checkpoint=None):
        return TrainContext(
            rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
            device=torch.device("cpu"), sink=sink, checkpoint=checkpoint,
        )

    whole: list = []
    _accumulating_loop(ctx(Sink()), data, log=whole)
    assert whole == [(0, 32, 0.5), (1, 32, 0.5), (2, 32, 0.5), ("overall", 96)]
    sink = Sink()
    _accumulating_loop(ctx(sink), data, log=[], report_at=report_at)
    saved = next(r.checkpoint for r in sink.reports if r.checkpoint is not None)
    resumed: list = []
    _accumulating_loop(ctx(Sink(), Checkpoint("memory://ckpt", data=saved)), data, log=resumed)
    resumed_from = report_at // 4  # the epoch of the checkpoint
    assert resumed == whole[resumed_from:]


def test_a_checkpoint_of_earlier_raylight_restores_its_accumulators_by_creation_order():
    """Before accumulators were keyed by epoch, checkpoints saved an unkeyed list: resuming
    one still gives the accumulators their sums, in the order they are made."""
    from raylight.worker.adaptive.state import Accumulators

    accs = Accumulators(world_size=1, saved=[{"totals": {"n": 3.0}}, {"totals": {"n": 5.0}}])
    first, second, third = accs.make(None), accs.make(4), accs.make(4)
    for acc, n in ((first, 3.0), (second, 5.0), (third, 0.0)):
        with acc.synchronized():
            assert acc["n"] == n
    assert [(e["epoch"], e["index"]) for e in accs.state(4)] == [(None, 0), (4, 0), (4, 1)]
    assert [(e["epoch"], e["index"]) for e in accs.state(5)] == [(None, 0)], "epoch 4's never come back"
