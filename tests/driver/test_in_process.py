"""num_workers=0: the same loop in this process, no Ray, for debugging."""

import pytest
import torch

import raylight
from raylight.base.exceptions import ConfigError
from raylight.storage.checkpoint import Checkpoint


def loop(ctx, config):
    assert ctx.rank == 0 and ctx.world_size == 1
    start = 0
    if (ckpt := ctx.get_checkpoint()) is not None:
        start = ckpt.load()["epoch"] + 1
    data = torch.utils.data.TensorDataset(torch.arange(10.0))
    loader = ctx.prepare_loader(data, batch_size=4)
    for epoch in range(start, config["epochs"]):
        loader.set_epoch(epoch)
        seen = [x for (batch,) in loader for x in batch.tolist()]
        assert sorted(seen) == [float(i) for i in range(10)]
        ctx.report({"epoch": epoch, "mean": ctx.all_reduce(torch.tensor(seen).mean())}, checkpoint={"epoch": epoch})
        if epoch == config.get("crash_at"):
            raise RuntimeError("crash in process")


def test_in_process_run_records_history_and_checkpoints(tmp_path):
    result = raylight.fit(loop, config={"epochs": 3}, num_workers=0, storage_path=str(tmp_path), name="r", progress=False)
    assert [m["epoch"] for m in result.metrics_history] == [0, 1, 2]
    assert result.metrics["mean"] == pytest.approx(4.5)
    assert result.checkpoint is not None and result.checkpoint.load() == {"epoch": 2}
    assert (tmp_path / "r" / "metrics.jsonl").read_text().count("\n") == 3
    assert (tmp_path / "r" / "config.json").exists()


def test_in_process_errors_propagate_unchanged_and_resume_continues(tmp_path):
    with pytest.raises(RuntimeError, match="crash in process"):
        raylight.fit(loop, config={"epochs": 4, "crash_at": 1}, num_workers=0, storage_path=str(tmp_path), name="r", progress=False)
    result = raylight.fit(loop, config={"epochs": 4}, num_workers=0, storage_path=str(tmp_path), name="r", resume=True, progress=False)
    assert [m["epoch"] for m in result.metrics_history] == [0, 1, 2, 3]


def test_a_checkpoint_that_is_not_a_dict_is_refused_before_anything_is_written(tmp_path):
    """A loop reporting a list, or a run started from a state file holding one: refused
    naming it, with no partial commit in the run and nothing of the refused run written;
    the last good checkpoint still loads and resumes."""
    from raylight.driver.trainer import Trainer, fit_config

    def bad_report(ctx, config):
        ctx.report({"epoch": 0}, checkpoint={"epoch": 0})
        ctx.report({"epoch": 1}, checkpoint=[torch.ones(2)])

    with pytest.raises(TypeError, match=r"a checkpoint must be a dict .*got list"):
        raylight.fit(bad_report, num_workers=0, storage_path=str(tmp_path), name="good", progress=False)
    checkpoints = tmp_path / "good" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["checkpoint_000000"]
    good = Checkpoint(str(checkpoints / "checkpoint_000000"))
    assert good.load() == {"epoch": 0}

    (tmp_path / "elsewhere").mkdir()
    torch.save([1, 2], tmp_path / "elsewhere" / "state.pt")

    def settings(name):
        return fit_config(num_workers=0, storage_path=str(tmp_path), name=name, progress=False)

    with pytest.raises(ConfigError, match=rf"checkpoint file {tmp_path}/elsewhere/state.pt holds a list, not a dict"):
        Trainer(loop, train_loop_config={"epochs": 2}, config=settings("refused"), resume_from=Checkpoint(str(tmp_path / "elsewhere"))).fit()
    assert not (tmp_path / "refused").exists()  # nothing written before the refusal
    result = Trainer(loop, train_loop_config={"epochs": 2}, config=settings("next"), resume_from=good).fit()
    assert [m["epoch"] for m in result.metrics_history] == [1]


def test_a_loop_written_as_ray_train_s_train_func_config_is_told_it_got_the_context(tmp_path):
    def train_func(config):  # Ray Train's convention: one argument, the config
        return config["epochs"]

    with pytest.raises(TypeError) as info:
        raylight.fit(train_func, config={"epochs": 1}, num_workers=0, storage_path=str(tmp_path), progress=False)
    assert "not the loop's config (looked up 'epochs')" in str(info.value) and "loop(ctx, config)" in str(info.value)

    # Ray Train's torch_linear_example reads config.get(...): every dict access says so
    for read, told in (
        (lambda config: config.get("lr", 1e-2), "called .get(...), a dict's method"),
        (lambda config: config.items(), "called .items(...), a dict's method"),
        (lambda config: "lr" in config, "asked whether it holds 'lr'"),
    ):
        with pytest.raises((TypeError, AttributeError)) as info:
            raylight.fit(read, config={"lr": 0.1}, num_workers=0, storage_path=str(tmp_path), progress=False)
        assert f"not the loop's config ({told})" in str(info.value) and "loop(ctx, config)" in str(info.value)

    def one_argument(ctx):  # the context's own copy of the config still works
        ctx.report({"epochs": ctx.config["epochs"]})

    assert raylight.fit(one_argument, config={"epochs": 2}, num_workers=0, storage_path=str(tmp_path), progress=False).metrics == {"epochs": 2}


def test_metrics_are_json_values_and_an_object_among_them_is_named():
    """The same conversion on every rank and in this process: the history is JSON, and an
    object could not travel from a worker to the driver (it failed the driver's poll)."""
    import threading

    import numpy as np

    from raylight.worker.context import _plain_metrics

    got = _plain_metrics({
        "loss": torch.tensor(0.5), "per_class": torch.tensor([1.0, 2.0]), "acc": np.float32(0.25),
        "hist": np.arange(3), "ok": np.bool_(True), "pair": (1, torch.tensor(2)), "nested": {"a": [np.int64(4)], 3: None},
        "name": "x",
    })
    assert got == {
        "loss": 0.5, "per_class": [1.0, 2.0], "acc": 0.25, "hist": [0, 1, 2], "ok": True, "pair": [1, 2],
        "nested": {"a": [4], 3: None}, "name": "x",
    }
    assert type(got["ok"]) is bool and type(got["acc"]) is float
    with pytest.raises(TypeError) as info:
        _plain_metrics({"loss": 1.0, "extra": [0, {"lock": threading.Lock()}]})
    assert str(info.value).startswith("metric 'extra'[1]['lock'] is a _thread.lock: report numbers, strings")
    with pytest.raises(TypeError, match="metric names must be strings"):
        _plain_metrics({1: 2.0})
    with pytest.raises(TypeError, match=r"metric 'm' has a key \(1, 2\)"):
        _plain_metrics({"m": {(1, 2): 3}})


def clipping_loop(ctx, config):
    model = ctx.prepare_model(torch.nn.Linear(2, 1))
    for bad in (0, -1.0, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ValueError, match="max_grad_norm must be a positive finite number"):
            ctx.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), max_grad_norm=bad)
    opt = ctx.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), max_grad_norm=config["clip"])
    norms = [ctx.grad_norm]
    x = torch.ones(4, 2)
    for _ in range(2):
        opt.zero_grad()
        (model(x) * 100).sum().backward()
        opt.step()
        norms.append(ctx.grad_norm)
    ctx.report({"norms": norms})


def test_the_loop_clips_through_prepare_optimizer_and_reads_the_norm_it_found(tmp_path):
    result = raylight.fit(clipping_loop, config={"clip": 1.0}, num_workers=0, storage_path=str(tmp_path), progress=False)
    norms = result.metrics["norms"]
    assert norms[0] is None, "no step yet"
    # d/dw sum(100 * (w.x + b)) over 4 rows of ones: 400 for each weight and the bias
    assert norms[1] == pytest.approx((3 * 400**2) ** 0.5) and norms[2] == pytest.approx(norms[1])
