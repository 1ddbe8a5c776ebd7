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
contention. Ray starts its worker processes at nice 15 (``RAY_worker_niceness``, so its
own processes stay responsive), which put the front run's training workers below the run
beside's tests (nice 10); the front run's Ray workers start at nice 0 instead. Every test runs once, in one of the two; each run starts its own embedded Ray.

    python -m tests.suite [pytest args...]   # the args go to both runs
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

from tests.helpers import ctrl_c_reaches_child

# Both runs take minutes and every test in them has pytest-timeout's limit; this bounds
# the wait for the run beside once the front run has ended.
BESIDE_WAIT_S = 1800
BESIDE_NICE = 10
STOP_GRACE_S = 30  # stopping the run beside early: from Ctrl-C to SIGKILL
NO_TESTS = 5  # pytest's exit code when the args select no test of a run
INTERRUPTED = 130
FRONT_WORKER_NICENESS = "RAY_worker_niceness"  # Ray's, read by every worker process it starts


def _lower_priority() -> None:
    os.nice(BESIDE_NICE)
    ctrl_c_reaches_child()  # so _stop's Ctrl-C reaches it from a backgrounded make test too


def _stop(proc: subprocess.Popen) -> None:
    """Ctrl-C for the run beside (its session's Ray shuts down as pytest ends), then kill."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(args: list[str]) -> int:
    signal.signal(signal.SIGTERM, _interrupted)  # stopped by a CI runner: stop the run beside too
    pytest = [sys.executable, "-m", "pytest", *args]
    with tempfile.NamedTemporaryFile("w+", prefix="raylight-tests-beside-", suffix=".log") as log:
        beside = subprocess.Popen(
            [*pytest, "-m", "beside", "-p", "no:cacheprovider"], stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=_lower_priority, start_new_session=True,
        )
        front_rc = beside_rc = INTERRUPTED
        try:
            front_rc = subprocess.call([*pytest, "-m", "not beside"], env={**os.environ, FRONT_WORKER_NICENESS: "0"})
            beside_rc = beside.wait(timeout=BESIDE_WAIT_S)
        except subprocess.TimeoutExpired:
            print(f"\nthe run beside was still going {BESIDE_WAIT_S} s after the front run ended "
                  "(tests/suite.py BESIDE_WAIT_S); stopped", flush=True)
            beside_rc = 1
        except KeyboardInterrupt:
            print("\ninterrupted: stopping the run beside", flush=True)
        finally:
            if beside.poll() is None:
                _stop(beside)
        log.seek(0)
        print("\n" + "=" * 25 + " the run beside (unit tier and -m beside, at lower CPU priority) " + "=" * 25)
        print(log.read(), end="", flush=True)
    print(f"\nfront run: exit {front_rc}; run beside: exit {beside_rc}", flush=True)
    ran = [rc for rc in (front_rc, beside_rc) if rc != NO_TESTS] or [NO_TESTS]  # args for one run only
    return next((rc for rc in ran if rc), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
