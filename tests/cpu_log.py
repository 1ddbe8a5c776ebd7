"""Where the suite's CPU goes, test by test: ``RAYLIGHT_TEST_CPU_LOG=DIR make test``.

Each pytest process writes ``DIR/cpu-<pid>.jsonl``: per test (setup, call and teardown;
a module's fixtures count in its first test) the wall seconds and the CPU seconds of the
pytest process and every process under it (Ray's processes and workers, the drivers and
CLIs a test starts). A thread reads them from /proc every ``INTERVAL_S`` and keeps each
process's last figure after it exits: Ray's raylet does not wait for its workers, so
the kernel's accounting of reaped children (cutime) misses them, and reading it alone
missed three quarters of the suite's CPU. A process that lives less than one interval is
missed. ``python -m tests.cpu_log DIR`` prints the tests that used the most, each
module's total, and the total by kind of process (pytest, Ray's actors by class, its
daemons, the scripts tests start) with how many of each were started. Linux only; nothing runs without the variable.
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


def _kind(pid: int, root: int) -> str:
    """What a process is, from its command line: pytest itself, a Ray process (``ray::`` and
    the actor's class, ``raylet``, ``gcs_server``, ``dashboard.py``...), or the script or
    program a test started."""
    if pid == root:
        return "pytest"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return ""
    if not argv:
        return ""
    if argv[0].startswith("ray::"):
        return argv[0].split()[0].split(".")[0]
    words = [a for a in argv[1:] if not a.startswith("-")]
    if "python" in os.path.basename(argv[0]) and "-c" in argv:
        return "python -c"
    if "python" in os.path.basename(argv[0]) and "-m" in argv:
        return "python -m " + argv[argv.index("-m") + 1]
    if "python" in os.path.basename(argv[0]) and words:
        return "python " + os.path.basename(words[0])
    return os.path.basename(argv[0])


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
        self._kinds: dict[tuple[int, int], str] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name="raylight-cpu-log", daemon=True).start()

    def _run(self) -> None:
        while True:
            self.cpu_s()
            time.sleep(INTERVAL_S)

    def cpu_s(self) -> tuple[dict[str, float], dict[str, int]]:
        """CPU seconds so far, by kind of process (``_kind``) and in all (""), and how
        many processes of each kind were seen."""
        tree = _tree(os.getpid())
        kinds = {key: kind for key in tree if (kind := _kind(key[0], os.getpid()))}
        with self._lock:
            self._seen.update(tree)
            self._kinds.update(kinds)  # the latest name: Ray renames its workers as they start
            out: dict[str, float] = defaultdict(float)
            count: dict[str, int] = defaultdict(int)
            for key, ticks in self._seen.items():
                out[self._kinds.get(key, "?")] += ticks / os.sysconf("SC_CLK_TCK")
                count[self._kinds.get(key, "?")] += 1
            out[""] = sum(out.values())
            return out, count


_sampler: list[_Sampler] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    directory = os.environ.get(ENV)
    if not directory:
        yield
        return
    if not _sampler:
        _sampler.append(_Sampler())
    wall, (cpu, count) = time.monotonic(), _sampler[0].cpu_s()
    yield
    after, count_after = _sampler[0].cpu_s()
    kinds = {k: round(v - cpu.get(k, 0.0), 2) for k, v in after.items() if k and v - cpu.get(k, 0.0) >= 0.01}
    started = {k: n - count.get(k, 0) for k, n in count_after.items() if n > count.get(k, 0)}
    row = {"test": item.nodeid, "wall_s": time.monotonic() - wall, "cpu_s": after[""] - cpu[""], "kinds": kinds, "started": started}
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
    kinds: dict[str, float] = defaultdict(float)
    for r in rows:
        for kind, cpu in r.get("kinds", {}).items():
            kinds[kind] += cpu
    started: dict[str, int] = defaultdict(int)
    for r in rows:
        for kind, n in r.get("started", {}).items():
            started[kind] += n
    print(f"\n{'cpu s':>7} {'procs':>6}  kind of process")
    for kind, cpu in sorted(kinds.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{cpu:7.1f} {started.get(kind, 0):6d}  {kind}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
