"""The progress display off a terminal: one unwrapped line per epoch, one per resize (fake polls; the live terminal view is rich's)."""

from __future__ import annotations

import io

from rich.console import Console

from raylight.driver.progress import ProgressDisplay
from raylight.worker.protocol import GroupPoll, Progress, Report, WorkerPoll


def poll(epoch: int | None, *reports: dict, samples: int = 0) -> GroupPoll:
    progress = Progress(epoch=epoch, step=1, steps_per_epoch=4, samples=samples)
    return GroupPoll(polls=[WorkerPoll(rank=0, state="running", reports=[Report(r) for r in reports], progress=progress)])


def lines(*polls: tuple[GroupPoll, dict]) -> list[str]:
    out = io.StringIO()
    console = Console(file=out, width=40, force_terminal=False)  # narrower than every line
    with ProgressDisplay(enabled=True, console=console) as display:
        assert not display.live
        for p, kw in polls:
            display.update(p, **{"num_workers": 2, "num_restarts": 0, **kw})
    return out.getvalue().splitlines()


def test_one_line_per_epoch_when_its_last_report_is_in():
    out = lines(
        (poll(0, {"epoch": 0, "loss": 1.0}, {"epoch": 0, "loss": 0.9}), {}),  # two reports, one epoch
        (poll(0), {}),
        (poll(1, {"epoch": 1, "loss": 0.5}), {"batch_size": 64}),
        (poll(2), {}),  # the loader moved on: epoch 1 is over
        (poll(2, {"epoch": 2, "loss": 0.25}), {}),  # the last: printed when the display closes
    )
    assert [line.split("  ")[:2] for line in out] == [["epoch 0", "loss=0.9"], ["epoch 1", "loss=0.5"], ["epoch 2", "loss=0.25"]]
    assert "workers=2  batch=64" in out[1] and len(out[1]) > 40  # never wrapped


def test_a_resize_gets_a_line_and_a_restart_only_its_count():
    """A restart's one line is the controller's warning, which says where it restarts
    from (a checkpoint's index, or the beginning): the display adds no second line that
    would claim a checkpoint the run may not have; its status counts the restarts."""
    out = lines(
        (poll(0, {"epoch": 0, "loss": 1.0}), {}),
        (poll(0), {"num_restarts": 1}),
        (poll(0), {"num_restarts": 1, "num_workers": 3}),
        (poll(1, {"epoch": 1, "loss": 0.5}), {"num_restarts": 1, "num_workers": 3}),
    )
    assert out[0].startswith("epoch 0") and "restarts" not in out[0]
    assert out[1] == "resized: 2 -> 3 workers"
    assert not any("restarted" in line for line in out)
    assert out[2].startswith("epoch 1") and "restarts=1" in out[2]


def test_reports_without_epochs_get_their_own_lines():
    out = lines((GroupPoll(polls=[WorkerPoll(rank=0, state="running", reports=[Report({"loss": 2.0})])]), {}))
    assert len(out) == 1 and out[0].startswith("report  loss=2")


def test_a_loop_in_the_driver_s_process_shows_its_epochs_as_a_worker_s_would(capsys, tmp_path):
    """``num_workers=0`` (the declarative local backend): the display gets the loop's
    progress and reports from the in-process sink, one line per epoch; never the live
    view, where a debugger may stop the loop."""
    import torch

    import raylight

    def loop(ctx):
        loader = ctx.prepare_loader(torch.utils.data.TensorDataset(torch.arange(12.0)), batch_size=4)
        for epoch in range(3):
            loader.set_epoch(epoch)
            total = sum(float(x.sum()) for (x,) in loader)
            ctx.report({"epoch": epoch, "total": total})

    for progress in (True, False):
        raylight.fit(loop, num_workers=0, progress=progress, storage_path=str(tmp_path), name=f"run-{progress}")
        out = capsys.readouterr().err.splitlines()
        if progress:
            assert [line.split("  ")[:2] for line in out] == [[f"epoch {e}", "total=66"] for e in range(3)]
            assert all(line.endswith("workers=1") and "samples/s" in line for line in out)
        else:
            assert out == []

