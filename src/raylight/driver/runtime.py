"""Connecting to Ray: a given cluster, or an embedded local one started once.

The embedded cluster binds to 127.0.0.1 only (Ray otherwise advertises the machine's
network address), keeps Ray's token authentication on (the default of the Ray versions
raylight requires: a new local cluster gets a token, ``~/.ray/auth_token``, which raylight
creates 0600 where Ray would create it readable by all, ``base.ray_token``), warns when
``RAY_AUTH_MODE=disabled`` turns it off or the token file is open to other users, and is
shut down at exit. Its processes die with the driver however it ends (a reaper process
watches it, ``_reaper.py``), and its session directory goes with them.
``ray.init()`` with no address may attach to some other cluster on the machine, so
raylight never calls it that way: no address means embedded, ``"auto"`` means "the
running cluster".
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from raylight.base import ray_token, verbosity
from raylight.base.exceptions import ClusterConnectionError
from raylight.base.net import is_loopback
from raylight.config.schema import CONNECT_TIMEOUT_S
from raylight.driver import _reaper, termination

log = logging.getLogger("raylight")

# Ray advertises 127.0.0.1 instead of the machine's address when this is off; it is
# read once when Ray is imported, and again below for a Ray imported before raylight.
_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# Ray's own switch for token authentication; Ray >= 2.60 turns it on for new local
# clusters when unset. raylight only reads it: Ray caches it once imported.
AUTH_MODE_ENV = "RAY_AUTH_MODE"
# The cluster launcher (`ray up`, then `ray submit`/`ray exec`) writes this file on the
# head node, and only there; Ray Tune reads it the same way ("am I on a Ray cluster?").
# A script run there uses the head's cluster, as a Ray Job driver does through RAY_ADDRESS.
LAUNCHER_HEAD_FILE = "~/ray_bootstrap_config.yaml"


# Ray prestarts one idle worker process per CPU when the first driver connects. On the
# embedded cluster raylight's workers did not land on them (Ray had killed them as idle
# by then, and started new processes), so they only cost CPU while Ray and the run start,
# and kept polling while idle (~0.6 CPU-s a minute each, measured). Ray starts a worker
# when a task or actor needs one either way. docs/performance.md.
# A Ray client that connects to a local socket not yet listening (the raylet to its own
# object store, which starts on another thread) waits raylet_client_connect_timeout
# before it tries again: Ray's 1 s put a whole second into about half of the embedded
# starts measured. Asked every 50 ms instead, with the same 10 s in all.
EMBEDDED_SYSTEM_CONFIG = {
    "prestart_worker_first_driver": False,
    "raylet_client_connect_timeout_milliseconds": 50,
    "raylet_client_num_connect_attempts": 200,
}
# The script the embedded cluster's raylet runs Ray's node agent through (``_lean_head``).
EMBEDDED_AGENT = Path(__file__).with_name("_embedded_agent.py")


@dataclass(frozen=True)
class RayRuntime:
    embedded: bool  # started by raylight in this process: no autoscaler, fixed resources
    address: str


_started_embedded: list[str] = []  # the GCS address of the cluster raylight started
REAPER = Path(__file__).with_name("_reaper.py")


@dataclass
class EmbeddedSession:
    """What the embedded cluster's processes carry (``_reaper.EMBEDDED_ENV``), its session
    directory, and the reaper watching this driver for it."""

    token: str
    session_dir: str
    reaper: subprocess.Popen[bytes] | None


_embedded_session: list[EmbeddedSession] = []


@contextmanager
def _marked_env(token: str) -> Iterator[None]:
    """``_reaper.EMBEDDED_ENV=token`` in this process's environment while ``ray.init``
    starts the GCS and the raylet (which pass it on to all they start), and only then."""
    before = os.environ.get(_reaper.EMBEDDED_ENV)
    os.environ[_reaper.EMBEDDED_ENV] = token
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_reaper.EMBEDDED_ENV, None)
        else:
            os.environ[_reaper.EMBEDDED_ENV] = before


def _start_reaper(token: str) -> EmbeddedSession:
    """Start the process that ends the embedded cluster when this driver dies (however it
    dies: SIGKILL included) and removes its session directory (``_reaper.py``)."""
    node = ray._private.worker._global_node
    assert node is not None, "called after ray.init started the embedded cluster"
    session_dir = node.get_session_dir_path()
    try:
        reaper: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, str(REAPER), str(os.getpid()), token, session_dir],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,  # a signal to the driver's process group spares it
        )
    except OSError as exc:
        log.warning("could not start the embedded Ray's reaper (%s): a killed driver may leave Ray's agents behind", exc)
        reaper = None
    return EmbeddedSession(token, session_dir, reaper)


def _end_embedded_session() -> None:
    """After ``ray.shutdown()``: kill what is left of the cluster (Ray's node agents notice
    their raylet is gone only later), remove its session directory, stop the reaper."""
    if not _embedded_session:
        return
    session = _embedded_session.pop()
    left = _reaper.kill_marked(session.token)
    if left:
        log.debug("embedded Ray: killed %d process(es) left after shutdown: %s", len(left), left)
    _reaper.remove_session_dir(session.session_dir)
    if session.reaper is not None and session.reaper.poll() is None:
        session.reaper.kill()
        session.reaper.wait(timeout=10)


def _force_loopback() -> None:
    os.environ[_LOOPBACK_ENV] = "0"
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


def start_embedded(
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    temp_dir: str | None = None,
    object_store_memory: int | None = None,
) -> RayRuntime:
    """Start the embedded local Ray for this process (once), bound to 127.0.0.1."""
    if ray.is_initialized():
        return current()
    _force_loopback()
    warn_if_auth_disabled()
    ray_token.create_for_new_cluster()  # 0600, where Ray would write it with the umask
    _import_in_background("torch")  # the run needs it next; Ray's start is mostly waiting
    token = f"{os.getpid()}-{uuid.uuid4().hex}"
    with _lean_head(), _marked_env(token):
        ray.init(
            address="local",
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            include_dashboard=False,
            logging_level=verbosity.before_ray_starts(),  # Ray's INFO lines only when verbose
            object_store_memory=object_store_memory,
            _temp_dir=temp_dir,
            _system_config=EMBEDDED_SYSTEM_CONFIG,
        )
    termination.install()  # in place of ray.init's sys.exit(15)
    address = ray.get_runtime_context().gcs_address
    _started_embedded[:] = [address]
    _embedded_session[:] = [_start_reaper(token)]
    atexit.register(_shutdown_embedded)
    if os.environ.get(AUTH_MODE_ENV, "").lower() != "token" and not auth_disabled():
        log.warning(
            "the embedded Ray cluster started without token authentication (this Ray "
            "does not turn it on by default); raylight needs ray>=2.60"
        )
    return RayRuntime(embedded=True, address=address)


@contextmanager
def _lean_head() -> Iterator[None]:
    """Start a head node without Ray's API server and autoscaler monitor processes, and
    with Ray's minimal node agent, for the embedded cluster.

    - Ray's head starts its API server (the dashboard process) even with
      ``include_dashboard=False``; it then loads only Ray's usage-stats module, and
      ``ray.init`` waits for that process to publish its address before it starts the
      raylet. On this project's 2-core machine that wait was 1.2-1.8 s of every embedded
      start. The embedded cluster serves no dashboard, no Jobs API and no state API, so
      nothing needs that process (its start is allowed to fail when the dashboard is off).
    - Ray's head also starts its autoscaler monitor, a Python process that imports the
      autoscaler while the raylet and its agents start, on the same cores. The embedded
      cluster has fixed resources and no autoscaler to drive; Ray's own ``ray start
      --no-monitor`` does the same. Measured on the 2-core machine: ``ray.init`` 2.7 s
      instead of 3.1 s (median of 4 interleaved starts each), docs/performance.md.
    - Where ``ray[default]`` is installed (the ``cluster`` extra), the raylet's node agent
      also serves metrics to Prometheus and the dashboard: it starts a gRPC and an HTTP
      server, and the raylet registers the node only once that metrics server answers.
      Without ``ray[default]`` (raylight's core install) Ray starts it as its minimal
      agent, which has neither, and the embedded cluster, with no dashboard, starts that
      one either way. Measured: ``ray.init`` 2.6-2.8 s instead of 3.2-3.4 s.

    - That agent still imports every module of Ray's dashboard to find the ones it runs
      (about a second here, on the path of the start, since the raylet waits for it). The
      modules serve what the embedded cluster does not have (the dashboard, the Jobs API,
      the state API's logs, metrics), so the raylet runs the agent through
      ``raylight/driver/_embedded_agent.py``, which starts Ray's agent with none of them.
      Measured: ``ray.init`` 1.0 s shorter, every start.
    - ``ray.init`` waits for the raylet to register its node by asking the GCS once a
      second, so its wait ended a whole number of seconds after it began. It now asks
      every 20 ms first (``NODE_POLL_S``, for up to ``NODE_FAST_WAIT_S``); Ray's own wait
      follows and finds the node at once. Measured: the raylet registered 0.72 s before
      Ray's wait noticed. (The third wait, on the raylet's own object store, is a setting:
      ``EMBEDDED_SYSTEM_CONFIG``.)

    A cluster started with ``ray start`` (``raylight`` given its address) keeps all of them.
    Where Ray's internals moved, what is missing is left alone and Ray starts that process
    as before."""
    import ray._private.utils as ray_utils
    from ray._private import node, ray_constants, services

    def start_api_server(self: Any, *, include_dashboard: bool | None, raise_on_failure: bool) -> None:
        if include_dashboard is not False:  # None is Ray's "start it where it can"
            original = originals[node.Node, "start_api_server"]
            original(self, include_dashboard=include_dashboard, raise_on_failure=raise_on_failure)
        else:
            log.debug("embedded Ray: not starting Ray's API server (no dashboard, Jobs or state API)")

    def start_monitor(self: Any) -> None:
        log.debug("embedded Ray: not starting Ray's autoscaler monitor (fixed resources)")

    def get_dashboard_dependency_error() -> ImportError:
        # Ray asks this when it builds the node agent's command: anything but None starts
        # the minimal agent (its name says what Ray uses it for: "the dashboard's
        # dependencies are missing").
        return ImportError("raylight's embedded cluster runs Ray's minimal node agent")

    def python_command(component: str, *args: Any, **kwargs: Any) -> list[str]:
        command: list[str] = originals[services, "_build_python_executable_command_memory_profileable"](
            component, *args, **kwargs
        )
        if component == getattr(ray_constants, "PROCESS_TYPE_DASHBOARD_AGENT", None):
            command = [*command, str(EMBEDDED_AGENT)]
        return command

    def start_ray_processes(self: Any) -> None:
        originals[node.Node, "start_ray_processes"](self)
        _wait_for_node(self.get_gcs_client(), self._node_id)  # then Ray's wait, at once

    replacements: dict[tuple[Any, str], Any] = {
        (node.Node, "start_api_server"): start_api_server,
        (node.Node, "start_monitor"): start_monitor,
        (ray_utils, "get_dashboard_dependency_error"): get_dashboard_dependency_error,
        (services, "_build_python_executable_command_memory_profileable"): python_command,
        (node.Node, "start_ray_processes"): start_ray_processes,
    }
    originals: dict[tuple[Any, str], Any] = {key: getattr(key[0], key[1], None) for key in replacements}
    for (owner, name), original in originals.items():
        if original is not None:
            setattr(owner, name, replacements[owner, name])
    try:
        yield
    finally:
        for (owner, name), original in originals.items():
            if original is not None:
                setattr(owner, name, original)


NODE_POLL_S = 0.02  # how often the embedded start asks the GCS for its node
NODE_FAST_WAIT_S = 10.0  # then Ray's own wait (once a second, its own timeout) takes over


def _wait_for_node(gcs_client: Any, node_id: str) -> bool:
    """Whether the GCS lists ``node_id`` within NODE_FAST_WAIT_S, asking every NODE_POLL_S.
    Ray's wait for its new node (``services.get_node``) asks once a second; this one only
    ends sooner, and Ray's still follows, with its timeout and error."""
    deadline = time.monotonic() + NODE_FAST_WAIT_S
    try:
        while time.monotonic() < deadline:
            nodes = gcs_client.get_all_node_info(timeout=max(NODE_POLL_S, deadline - time.monotonic()))
            if any(key.hex() == node_id for key in nodes):
                return True
            time.sleep(NODE_POLL_S)
    except Exception:  # Ray's client moved or the GCS did not answer: Ray's own wait decides
        log.debug("embedded Ray: could not ask the GCS for the new node", exc_info=True)
    return False


def _shutdown_embedded() -> None:
    """``ray.shutdown()`` for the embedded cluster, a second faster at every exit.

    The embedded head starts without Ray's autoscaler monitor (``_lean_head``). Where a
    Ray release started one all the same: Ray stops its processes in turn and gives each a
    second after SIGTERM; the monitor is stopped after the GCS, and on SIGTERM it first
    reports its own termination to that GCS, which is gone, so it always used its whole
    second. It is killed first (its report would only print an "autoscaler failed" line)."""
    try:
        node = ray._private.worker._global_node
        monitors: list[Any] = node.all_processes.get("monitor", []) if node is not None else []
        for info in monitors:
            if info.process.poll() is None:
                info.process.kill()
                info.process.wait(timeout=5)
    except Exception:  # Ray's internals moved: its own shutdown still stops the monitor
        log.debug("could not stop Ray's monitor before shutdown", exc_info=True)
    ray.shutdown()
    _end_embedded_session()


def _import_in_background(name: str) -> None:
    """Start importing ``name`` in a thread (seconds for torch) while this one waits for
    Ray's processes to start; whoever imports it next waits for that import to finish."""
    import importlib
    import sys
    import threading

    if name not in sys.modules:
        threading.Thread(target=importlib.import_module, args=(name,), name=f"raylight-import-{name}", daemon=True).start()


def auth_disabled() -> bool:
    return os.environ.get(AUTH_MODE_ENV, "").lower() == "disabled"


def warn_if_auth_disabled() -> None:
    """Ray's token authentication is what keeps other local users and processes from
    running code in the cluster; say so when it is switched off."""
    if auth_disabled():
        log.warning(
            "%s=disabled: Ray's token authentication is off, so any process that can "
            "reach this cluster's ports can run code in it and read its data. Unset it "
            "(or set %s=token) unless the network is yours alone.",
            AUTH_MODE_ENV, AUTH_MODE_ENV,
        )


def default_address() -> tuple[str | None, str]:
    """The cluster to use when none is given, and where that came from: RAY_ADDRESS (a
    Ray Job's driver gets it from Ray), ``"auto"`` on a cluster launcher's head node, or
    None (the embedded local Ray: never a stray cluster that merely runs here)."""
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    if os.path.exists(os.path.expanduser(LAUNCHER_HEAD_FILE)):
        return "auto", f"the cluster launcher's head node ({LAUNCHER_HEAD_FILE})"
    return None, "address"


def would_start_embedded(address: str | None) -> bool:
    """Whether ``connect(address)`` would start the embedded local Ray."""
    if ray.is_initialized():
        return False
    if address is None:
        address = default_address()[0]
    return address is None or address == "local"


def local_capacity() -> dict[str, float]:
    """The most an embedded local Ray started now can have, known without starting it:
    CPUs as Ray counts them at most (it may see fewer in a container), GPUs where they are
    certain (CUDA_VISIBLE_DEVICES, or no NVIDIA driver at all); no custom resources."""
    import multiprocessing

    capacity: dict[str, float] = {"CPU": float(multiprocessing.cpu_count())}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        capacity["GPU"] = float(len([d for d in visible.split(",") if d.strip() not in ("", "-1")]))
    elif not (os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia/version")):
        capacity["GPU"] = 0.0
    return capacity


def current() -> RayRuntime:
    address = ray.get_runtime_context().gcs_address
    return RayRuntime(embedded=address in _started_embedded, address=address)


def _host_port(address: str) -> tuple[str, int] | None:
    """Host and port of a 'host:port' or 'ray://host:port' address; None for 'auto'."""
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _resolved(target: tuple[str, int]) -> tuple[str, int]:
    try:
        return socket.gethostbyname(target[0]), target[1]
    except OSError:
        return target


def _check_same_cluster(address: str | None) -> None:
    """This process already uses a Ray cluster: an ``address`` naming another (host:port of
    its GCS) is refused rather than silently ignored."""
    target = _host_port(address) if address and "://" not in address else None
    if target is None:
        return
    try:
        running = ray.get_runtime_context().gcs_address
    except Exception:  # a Ray Client driver's context has no GCS address to compare
        return
    here = _host_port(running or "")
    if here is not None and _resolved(here) != _resolved(target):
        raise ClusterConnectionError(
            f"address={address!r} names another Ray cluster than the one this process already uses "
            f"({running}, from an earlier ray.init): leave the address unset to train on that one, or "
            "call ray.shutdown() first to connect to the other"
        )


def connect(address: str | None, *, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> RayRuntime:
    """Use the running Ray of this process (a Ray Client driver's too), the cluster at
    ``address`` (or ``default_address()``: RAY_ADDRESS, as in a Ray Job's driver, or a
    cluster launcher's head node), or else start the embedded local one."""
    if ray.is_initialized():
        _check_same_cluster(address)
        termination.install()
        return current()
    source = "address"
    if address is None:
        address, source = default_address()
    if address is None or address == "local":
        return start_embedded()
    fix = (
        f"Start the cluster (`ray start --head`), fix {source}, or leave it unset to "
        "train on an embedded local Ray."
    )
    target = _host_port(address)
    if target is not None:
        # Ray retries an unreachable address for minutes; a plain TCP probe answers now.
        try:
            socket.create_connection(target, timeout=connect_timeout_s).close()
        except OSError as exc:
            raise ClusterConnectionError(
                f"could not reach the Ray cluster at {address!r} (from {source}) within "
                f"FailureConfig.connect_timeout_s={connect_timeout_s:g}s: {exc}. {fix}"
            ) from None
        if is_loopback(target[0]):
            _force_loopback()  # stay on loopback rather than the machine's address
    warn_if_auth_disabled()
    ray_token.warn_if_readable_by_others()
    try:
        ray.init(address=address, logging_level=verbosity.before_ray_starts())
    except Exception as exc:
        raise ClusterConnectionError(
            f"could not connect to the Ray cluster at {address!r} (from {source}): "
            f"{type(exc).__name__}: {exc}. {fix}"
        ) from None
    termination.install()  # in place of ray.init's sys.exit(15)
    return current()
