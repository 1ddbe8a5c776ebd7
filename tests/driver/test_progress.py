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



# -- a real terminal: the child's stderr is a pty, read through a small VT100 screen -----
DRIVER = """
from raylight.driver.progress import ProgressDisplay, announce
from raylight.worker.protocol import GroupPoll, Progress, Report, WorkerPoll

def poll(epoch, step, samples, *reports):
    progress = Progress(epoch=epoch, step=step, steps_per_epoch=4, samples=samples)
    return GroupPoll(polls=[WorkerPoll(rank=0, state="running", reports=[Report(r) for r in reports], progress=progress)])

announce("starting Ray (a local cluster on this machine)...")
with ProgressDisplay(enabled=True) as display:
    assert display.live
    display.phase("starting 2 workers...")
    display.update(poll(None, 0, 0), num_workers=2, num_restarts=0)
    samples = 0
    for epoch in range(3):
        batch = 64 * 2 ** epoch
        for step in range(1, 5):
            samples += batch
            last = [{"epoch": epoch, "loss": 1.0 / (epoch + 1)}] if step == 4 else []
            display.update(poll(epoch, step, samples, *last), num_workers=2, num_restarts=0,
                           batch_size=batch, lr_factor=2 ** (epoch / 2), efficiency=1.0 - 0.1 * epoch)
"""


def _screen(raw: str) -> list[str]:
    """The text a terminal shows after ``raw``: cursor moves up, line erases, carriage
    returns and newlines (what rich's live view writes); colours and modes ignored."""
    import re

    rows: list[list[str]] = [[]]
    r = c = 0
    for tok in re.findall(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r|\n|[^\x1b]", raw):
        if tok.startswith("\x1b["):
            arg, code = tok[2:-1], tok[-1]
            n = int(arg) if arg.isdigit() else None
            if code == "A":
                r = max(0, r - (n or 1))
            elif code == "B":
                r += n or 1
            elif code == "G":
                c = (n or 1) - 1
            elif code == "K":
                while len(rows) <= r:
                    rows.append([])
                line = rows[r]
                if n == 2:
                    line.clear()
                elif n == 1:
                    line[: c + 1] = [" "] * min(c + 1, len(line))
                else:
                    del line[c:]
            continue
        if tok.startswith("\x1b"):
            continue
        if tok == "\r":
            c = 0
        elif tok == "\n":
            r, c = r + 1, 0
        else:
            while len(rows) <= r:
                rows.append([])
            line = rows[r]
            line.extend(" " * (c + 1 - len(line)))
            line[c] = tok
            c += 1
    text = ["".join(row).rstrip() for row in rows]
    while text and not text[-1]:
        text.pop()
    return text


def test_a_terminal_keeps_a_line_per_epoch_above_the_live_bar_and_says_what_starts():
    """The live bar is redrawn in place; the epochs it showed stay as lines above it, and
    at the end the bar goes, leaving the run's history: what started, then each epoch."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios

    from tests.conftest import REPO

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "COLUMNS")}
    env.update(TERM="xterm-256color", PYTHONPATH=os.pathsep.join([os.path.join(REPO, "src"), REPO]))
    proc = subprocess.Popen([sys.executable, "-c", DRIVER], stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=60) == 0, b"".join(chunks).decode(errors="replace")
    screen = _screen(b"".join(chunks).decode(errors="replace"))
    assert screen[:2] == ["starting Ray (a local cluster on this machine)...", "starting 2 workers..."], screen
    epochs = screen[2:]
    assert [line.split("  ")[:2] for line in epochs] == [[f"epoch {e}", f"loss={1 / (e + 1):.4g}"] for e in range(3)], screen
    # each epoch's batch and LR factor: from the end of the epoch before to its own end
    assert "  batch=64  lr_factor=1.00  " in epochs[0], epochs[0]
    for e, line in enumerate(epochs[1:], start=1):
        batch, lr = f"batch={64 * 2 ** (e - 1)}->{64 * 2 ** e}", f"lr_factor={2 ** ((e - 1) / 2):.2f}->{2 ** (e / 2):.2f}"
        assert "samples/s" in line and batch in line and lr in line, line


def test_starting_lines_are_for_a_terminal_only():
    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=False)
    from raylight.driver.progress import announce

    announce("starting Ray...", console=console)
    with ProgressDisplay(enabled=True, console=console) as display:
        display.phase("starting 2 workers...")
    assert out.getvalue() == ""


def test_an_epoch_line_gives_the_epoch_s_mean_samples_per_second(monkeypatch):
    """The figure adaptive.jsonl gives for its rows (SampleRate.since): global samples
    over the wall seconds of the epoch, not a 5 s window lagging a batch change (here it
    would say 460 for the second epoch). The first epoch counts from its first samples."""
    import raylight.driver.progress as progress

    clock = {"now": 0.0}
    monkeypatch.setattr(progress, "monotonic", lambda: clock["now"])
    script = [(float(t), 0, 100 * t, []) for t in range(10)]  # epoch 0: 100 samples/s
    script += [(10.0, 0, 1000, [{"epoch": 0, "loss": 1.0}]), (11.0, 1, 2000, []), (12.0, 1, 3000, [{"epoch": 1, "loss": 0.5}])]
    out = io.StringIO()
    with ProgressDisplay(enabled=True, console=Console(file=out, width=200, force_terminal=False)) as display:
        for now, epoch, samples, reports in script:
            clock["now"] = now
            display.update(poll(epoch, *reports, samples=samples), num_workers=2, num_restarts=0)
    rates = [line.split("  ")[2] for line in out.getvalue().splitlines()]
    assert rates == ["100 samples/s", "1,000 samples/s"]
