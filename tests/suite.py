"""`make test`: the whole suite as two pytest runs at once, with one exit code.

On a 2-core machine one pytest run leaves about a quarter of the CPU idle (processes
starting, clusters forming, ranks meeting), and two equal runs (pytest-xdist) made the
timing-sensitive Ray tests fail under the contention. So:

- the front run (``-m "not beside"``): the Ray tests with timers and deadlines (elastic
  resizes, killed workers and drivers, autoscaling, jobs, Ctrl-C), at normal CPU priority,
  its output on the terminal;
- the run beside it (``-m beside``, set in ``conftest.py``): the unit tier, which mostly
  waits, and the Ray-tier modules with no deadline a slower CPU could trip, at a lower CPU
  priority (nice 10, its Ray processes too), its output kept in a file and printed after.

It takes the cores the front run leaves idle, so the front run's timing sees almost no
contention. (Ray starts its worker processes at nice 15, ``RAY_worker_niceness``, below
the run beside's tests at nice 10. Starting the front run's at nice 0 instead was tried
and made it slower: a busy training worker then held its core against the driver's
controller, and the elastic tests waited minutes for a resize.) Every test runs once, in
one of the two; each run starts its own embedded Ray.

    python -m tests.suite [pytest args...]   # the args go to both runs
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile

from tests.helpers import ctrl_c_reaches_child, use_venv_torch_extensions

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Both runs take minutes and every test in them has pytest-timeout's limit; this bounds
# the wait for the run beside once the front run has ended.
BESIDE_WAIT_S = 1800
BESIDE_NICE = 10
STOP_GRACE_S = 30  # stopping the run beside early: from Ctrl-C to SIGKILL
NO_TESTS = 5  # pytest's exit code when the args select no test of a run
INTERRUPTED = 130
# Left out of both runs: the peers' own programs run whole and the longest runs over fake
# hosts, minutes each (`make test-extended`; docs/testing.md), so that `make test` stays
# within its budget on 2 cores.
EXTENDED = "extended"


def _lower_priority() -> None:
    os.nice(BESIDE_NICE)
    ctrl_c_reaches_child()  # so _stop's Ctrl-C reaches it from a backgrounded make test too


def _stop(procs: list[subprocess.Popen]) -> list[subprocess.Popen]:
    """Ctrl-C for each run still going (pytest tears its fixtures down: the drivers and
    clusters tests started, its session's Ray), then kill what is left of its group.
    Returns the runs it stopped."""
    running = [p for p in procs if p.poll() is None]
    for proc in running:
        proc.send_signal(signal.SIGINT)
    for proc in running:
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    return running


# DeepSpeed's CPU Adam, built the way a CPU rank loads it in tests/worker/test_deepspeed_gloo.py.
_BUILD_CPU_ADAM = (
    "from deepspeed.accelerator import get_accelerator; "
    "get_accelerator().create_op_builder('CPUAdamBuilder').load(verbose=False)"
)


def _prebuild() -> subprocess.Popen | None:
    """Start building DeepSpeed's CPU Adam beside both runs, at the run beside's priority.

    torch compiles it on first use into this venv's extension cache: 46 s and 80 CPU-s on
    this project's 2 cores, paid by every new venv (CI's, a fresh clone's) in the one test
    that uses it, late in the run beside, which then ended a minute after the front run.
    Started here, it overlaps the start of both runs; a test that gets there first waits
    on torch's build lock. Where it is built already this only loads it. Its outcome does
    not matter: a test that needs the op builds it, or fails, as before."""
    if importlib.util.find_spec("deepspeed") is None:
        return None
    use_venv_torch_extensions()  # the runs inherit it: one cache
    return subprocess.Popen(
        [sys.executable, "-c", _BUILD_CPU_ADAM], env={**os.environ, "DS_ACCELERATOR": "cpu"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_lower_priority, start_new_session=True,
    )


def _compile_sources() -> None:
    """Write the bytecode of raylight's, the tests' and the examples' modules before the runs.

    Where ``PYTHONDONTWRITEBYTECODE`` is set (this project's machines set it), Python never
    caches what it compiles, and an editable install has no bytecode of its own: every
    process the suite starts (both pytest runs, each Ray worker, each driver and CLI a test
    launches) compiled each raylight and test module it imported from source again:
    measured here, 0.04 CPU-s of a worker's 0.17 for its 39 raylight modules, 0.25-0.3 CPU-s
    for a driver that imports the declarative stack. A few percent of the suite's CPU;
    ``compileall`` writes it once (only what changed since the last run, 0.5 s from
    nothing), and Python checks it against the source as usual."""
    import compileall

    for directory in ("src", "tests", "examples"):
        compileall.compile_dir(os.path.join(REPO, directory), quiet=1)


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(args: list[str]) -> int:
    signal.signal(signal.SIGTERM, _interrupted)  # stopped by a CI runner: stop both runs too
    pytest = [sys.executable, "-m", "pytest", *args]
    _compile_sources()
    build = _prebuild()
    with tempfile.NamedTemporaryFile("w+", prefix="raylight-tests-beside-", suffix=".log") as log:
        beside = subprocess.Popen(
            [*pytest, "-m", f"beside and not {EXTENDED}", "-p", "no:cacheprovider"], stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=_lower_priority, start_new_session=True,
        )
        front_rc = beside_rc = INTERRUPTED
        # Its own session too, so that Ctrl-C reaches it through _stop alone: a Ctrl-C that
        # killed it outright (subprocess.call does) left the drivers its tests had started.
        front = subprocess.Popen([*pytest, "-m", f"not beside and not {EXTENDED}"], preexec_fn=ctrl_c_reaches_child, start_new_session=True)
        try:
            front_rc = front.wait()
            beside_rc = beside.wait(timeout=BESIDE_WAIT_S)
        except subprocess.TimeoutExpired:
            print(f"\nthe run beside was still going {BESIDE_WAIT_S} s after the front run ended "
                  "(tests/suite.py BESIDE_WAIT_S); stopped", flush=True)
            beside_rc = 1
        except KeyboardInterrupt:
            print("\ninterrupted: stopping both runs", flush=True)
        finally:
            stopped = _stop([front, beside])
            if build is not None:  # still going only when stopped early
                _stop([build])  # Ctrl-C first: torch releases its build lock on the way out
        # A run that had ended before an interrupt keeps its own exit code.
        front_rc, beside_rc = (
            rc if proc in stopped or proc.returncode is None else proc.returncode
            for proc, rc in ((front, front_rc), (beside, beside_rc))
        )
        log.seek(0)
        print("\n" + "=" * 25 + " the run beside (unit tier and -m beside, at lower CPU priority) " + "=" * 25)
        print(log.read(), end="", flush=True)
    print(f"\nfront run: exit {front_rc}; run beside: exit {beside_rc}", flush=True)
    ran = [rc for rc in (front_rc, beside_rc) if rc != NO_TESTS] or [NO_TESTS]  # args for one run only
    return next((rc for rc in ran if rc), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
