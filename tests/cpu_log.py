"""Where the suite's CPU goes, test by test: ``RAYLIGHT_TEST_CPU_LOG=DIR make test``.

Each pytest process writes ``DIR/cpu-<pid>.jsonl``: per test (setup, call and teardown;
a module's fixtures count in its first test) the wall seconds and the CPU seconds of the
pytest process and every process under it (Ray's processes and workers, the drivers and
CLIs a test starts). A thread reads them from /proc every ``INTERVAL_S`` and keeps each
process's last figure after it exits: Ray's raylet does not wait for its workers, so
the kernel's accounting of reaped children (cutime) misses them, and reading it alone
missed three quarters of the suite's CPU. A process that lives less than one interval is
missed. ``python -m tests.cpu_log DIR`` prints the tests that used the most, and each
module's total. Linux only; nothing runs without the variable.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import defaultdict
from typing import Any

import pytest

ENV = "RAYLIGHT_TEST_CPU_LOG"
INTERVAL_S = 0.25


def _tree(root: int) -> dict[tuple[int, int], int]:
    """CPU ticks (utime + stime) of ``root`` and its live descendants, by (pid, start time)."""
    children: dict[int, list[int]] = defaultdict(list)
    ticks: dict[int, tuple[int, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:  # exited meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # the name may hold spaces
        children[int(fields[1])].append(int(name))
        ticks[int(name)] = (int(fields[19]), int(fields[11]) + int(fields[12]))
    out, stack = {}, [root]
    while stack:
        pid = stack.pop()
        if pid in ticks:
            started, used = ticks[pid]
            out[(pid, started)] = used
        stack.extend(children.get(pid, ()))
    return out


class _Sampler:
    """Every process seen under this one, with its CPU ticks when last seen."""

    def __init__(self) -> None:
        self._seen: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name="raylight-cpu-log", daemon=True).start()

    def _run(self) -> None:
        while True:
            self.cpu_s()
            time.sleep(INTERVAL_S)

    def cpu_s(self) -> float:
        tree = _tree(os.getpid())
        with self._lock:
            self._seen.update(tree)
            return sum(self._seen.values()) / os.sysconf("SC_CLK_TCK")


_sampler: list[_Sampler] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    directory = os.environ.get(ENV)
    if not directory:
        yield
        return
    if not _sampler:
        _sampler.append(_Sampler())
    wall, cpu = time.monotonic(), _sampler[0].cpu_s()
    yield
    row = {"test": item.nodeid, "wall_s": time.monotonic() - wall, "cpu_s": _sampler[0].cpu_s() - cpu}
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"cpu-{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def main(directory: str, top: int = 40) -> None:
    rows = []
    for name in sorted(os.listdir(directory)):
        if name.startswith("cpu-") and name.endswith(".jsonl"):
            with open(os.path.join(directory, name)) as f:
                rows += [json.loads(line) for line in f if line.strip()]
    modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in rows:
        m = modules[r["test"].split("::")[0]]
        m[0] += r["cpu_s"]
        m[1] += r["wall_s"]
    print(f"{len(rows)} tests: {sum(r['cpu_s'] for r in rows):.0f} CPU-s, {sum(r['wall_s'] for r in rows):.0f} s of test time")
    print(f"\n{'cpu s':>7} {'wall s':>7}  test (top {top})")
    for r in sorted(rows, key=lambda r: -r["cpu_s"])[:top]:
        print(f"{r['cpu_s']:7.1f} {r['wall_s']:7.1f}  {r['test']}")
    print(f"\n{'cpu s':>7} {'wall s':>7}  module")
    for name, (cpu, wall) in sorted(modules.items(), key=lambda kv: -kv[1][0]):
        print(f"{cpu:7.1f} {wall:7.1f}  {name}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
