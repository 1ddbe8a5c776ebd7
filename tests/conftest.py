"""Test tiers and the guards every test runs under.

Tiers (markers): unit (no Ray), distributed (real gloo ranks or a launcher's
processes, no Ray; marked by the module or test), ray (a real local Ray cluster started once per
session by raylight's embedded runtime, 2 CPUs, its own temp dir; one per pytest
process: `make test` runs two, see tests/suite.py and ``BESIDE``), hosts (fake hosts on this
box, each its own network and disk, a Ray cluster over them: tests/hosts/; root, skipped
with the reason elsewhere; in the front run). Autouse guards
fail a test that leaks environment variables, a torch process group, threads, or
Ray resources (actors and placement groups hold resources until removed).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time

import pytest

from tests.cpu_log import pytest_runtest_protocol  # noqa: F401  (RAYLIGHT_TEST_CPU_LOG: CPU per test)
from tests.helpers import one_torch_thread, set_running_test, use_venv_torch_extensions

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS_DIR)
_SESSION_ENV: set[str] = set()
# Horovod's own test file, vendored: run only inside `raylight run`'s ranks
# (tests/horovod/test_horovod_upstream.py), never collected by the suite.
collect_ignore = ["horovod/upstream"]

use_venv_torch_extensions()  # DeepSpeed's CPU Adam, built once per venv (tests/helpers.py)
one_torch_thread()  # the tests that train in this process (tests/helpers.py)


# `make test` (tests/suite.py) runs the suite as two pytest runs at once: these Ray-tier
# modules run with the unit tier, beside the rest at lower CPU priority. Chosen as those
# with no timer or deadline a slower CPU could trip (Lightning, declarative training, the
# CLI's output, the examples, sharded strategies' equality and resumes, the experiment
# loggers, the listening sockets; over the fake hosts, train/hyperopt from a laptop host,
# Lightning's loggers, `raylight run` of a torchrun-style and a Horovod script, the pandas
# dataset: each one run whose limits are 4-10x its quiet time) and enough minutes to even
# out the two runs' wall time (2026-11-28: front 13:59, beside 11:25 before the last three
# moved here). Not the cost
# meter (test_cost.py): beside, its driver's first poll came 0.9 s late, and the metered
# node time fell short of the run's.
# A single test goes beside with @pytest.mark.beside. (These were in front for a while:
# beside, the front run's preempted-node test once lost a race, a survivor on the lost node
# not yet known dead at the in-place shrink; the resize now goes on without it,
# tests/driver/test_elastic.py::test_a_survivor_lost_while_the_group_re_forms...)
BESIDE = {"test_lightning.py", "test_lightning_sharded.py", "test_lightning_horovod.py", "test_output.py",
          "test_declarative_examples.py", "test_declarative_on_ray.py", "test_strategies_on_ray.py", "test_deepspeed.py",
          "test_loggers_on_ray.py", "test_security_on_ray.py", "test_doc_blocks_on_ray.py", "test_install.py",
          "test_declarative_over_hosts.py", "test_lightning_over_hosts.py", "test_run_over_hosts.py",
          "test_horovod_over_hosts.py", "test_dataset_over_hosts.py"}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by these markers
def pytest_collection_modifyitems(items):
    for item in items:
        # tests/ mirrors the wings (tests/worker/, tests/driver/, ...); a module that starts
        # Ray says so (pytestmark = [pytest.mark.ray, ...]); one that names no tier is unit.
        if not any(item.get_closest_marker(t) for t in ("unit", "ray", "gpu", "distributed", "hosts")):
            item.add_marker(pytest.mark.unit)
        # The distributed tier (real gloo ranks and launchers' processes without Ray,
        # tests.helpers.require_distributed_mark) has no Ray timers: beside, with the unit tier.
        beside = any(item.get_closest_marker(t) for t in ("unit", "distributed"))
        if beside or os.path.basename(str(item.fspath)) in BESIDE:
            item.add_marker(pytest.mark.beside)


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures, which may start gloo ranks too
def pytest_runtest_setup(item):
    set_running_test(item)


@pytest.fixture(autouse=True)
def _no_leaks():
    env = dict(os.environ)
    threads = {t.ident for t in threading.enumerate()}
    yield
    import torch.distributed as dist

    leaked_pg = dist.is_available() and dist.is_initialized()
    if leaked_pg:
        dist.destroy_process_group()
    # Expected: Ray's settings made when the session cluster starts, torch's inductor
    # cache dir, which torch sets lazily once per process, CRC32C_SW_MODE, which
    # tensorboardX sets when imported (once per process, by Ray Tune's default logger),
    # RAY_CLIENT_MODE, which `import ray` sets, KMP_DUPLICATE_LIB_OK, which
    # `import threadpoolctl` (and scikit-learn) sets, and PYTORCH_NVML_BASED_CUDA_CHECK,
    # which `import deepspeed` sets, and WANDB_SERVICE, which W&B sets when it starts its
    # service process for the experiment loggers' tests (each once per process).
    ignore = {
        "PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR", "CRC32C_SW_MODE", "RAY_CLIENT_MODE", "KMP_DUPLICATE_LIB_OK",
        "PYTORCH_NVML_BASED_CUDA_CHECK", "WANDB_SERVICE",
    } | _SESSION_ENV
    added = {k for k in os.environ if k not in env} - ignore
    changed = {k for k in env if k in os.environ and os.environ[k] != env[k]} - ignore
    for k in added:
        del os.environ[k]
    os.environ.update({k: env[k] for k in changed})
    assert not leaked_pg, "test left a torch.distributed process group initialised"
    assert not (added | changed), f"test leaked env vars {sorted(added | changed)}"
    new = [
        t
        for t in threading.enumerate()
        if t.ident not in threads and t.is_alive() and not t.daemon
    ]
    assert not new, f"test leaked non-daemon threads {[t.name for t in new]}"


def _ray_processes(temp_dir: str) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [int(line.split(None, 1)[0]) for line in out.splitlines() if temp_dir in line]


@pytest.fixture(scope="session")
def ray_session():
    """One embedded local Ray for the whole session: 2 CPUs, its own short temp dir."""
    import ray

    from raylight.driver import runtime

    temp_dir = tempfile.mkdtemp(prefix="rl-", dir="/tmp")
    before = dict(os.environ)
    runtime.start_embedded(num_cpus=2, temp_dir=temp_dir, object_store_memory=256 * 1024**2)
    _SESSION_ENV.update(k for k in os.environ if before.get(k) != os.environ[k])
    yield ray
    from raylight.driver import _reaper

    session = runtime._embedded_session[0]
    runtime._shutdown_embedded()
    deadline = time.monotonic() + 30
    while _ray_processes(temp_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    # Ray's agents and workers set their titles, so their command lines name no temp dir:
    # the cluster's own environment token finds them (driver/_reaper.py)
    left = _ray_processes(temp_dir) + _reaper.marked(session.token)
    session_left = os.path.exists(session.session_dir)
    shutil.rmtree(temp_dir, ignore_errors=True)
    assert not left, f"Ray processes left running after shutdown: {left}"
    assert not session_left, f"the session directory {session.session_dir} was left after shutdown"


@pytest.fixture
def ray_cluster(ray_session):
    """The session's Ray, checked after the test: every actor and placement group gone."""
    yield ray_session
    from ray.util import placement_group_table

    deadline = time.monotonic() + 20
    while True:
        live = [
            pg for pg in placement_group_table().values() if pg["state"] not in ("REMOVED",)
        ]
        free = ray_session.available_resources().get("CPU", 0)
        total = ray_session.cluster_resources().get("CPU", 0)
        if not live and free == total:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"test leaked Ray resources: {len(live)} placement groups, CPU {free}/{total} free")
        time.sleep(0.1)
