"""The worker side of `raylight run`, the loop each raylight worker runs: like torchrun's
agent, it starts the user's script in a child process with torchrun's environment,
forwards the child's output lines to the driver with the worker's polls, serves the
child's ``raylight.run_context()`` calls, and fails with the child's exit code.

When the driver asks the worker to stop (a node of the run was given notice), the agent
tells the script: a script that asks ``run_context().should_stop()`` hears it at its next
step boundary, reports a checkpoint of where it is (the notice's snapshot) and exits; one
that never asks gets SIGTERM at once, as torchrun's agent sends when it stops its
workers (a script's own SIGTERM handler may save its own checkpoint). Either way the
loop ends "paused", not failed, and the driver restarts the group without the node.

The child runs ``bootstrap.py`` (by its path: it imports nothing of raylight), which runs
the script as ``__main__``. It is its own process group (killed as a group when the loop
stops it) and dies with the actor thread that started it (``PR_SET_PDEATHSIG``), so a
killed worker leaves no script behind.
"""

from __future__ import annotations

import hmac
import io
import json
import logging
import os
import pickle
import secrets
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from raylight.base.exceptions import ConfigError, ResizeInterrupt
from raylight.launch.bootstrap import PARENT_ENV
from raylight.worker.run_wire import CHANNEL_ENV, HELLO, KEY_ENV, proof, recv_frame, send_frame

BOOTSTRAP = str(Path(__file__).with_name("bootstrap.py"))
STORE_TIMEOUT_S = 1800.0  # the agent store's own operations (torch's default process-group timeout)
log = logging.getLogger("raylight")
STOP_GRACE_S = 5.0  # SIGTERM to SIGKILL when the loop stops a child that still runs
STOP_CHECK_S = 0.05  # how often the agent looks for the driver's stop while its child runs
CHANNEL_TIMEOUT_S = 30.0  # --channel-timeout's default: a connection's handshake, each part of a request
EVENT = "event"  # the output stream of the child's events (init_entered, init_done)


@dataclass(frozen=True)
class LaunchSpec:
    """What every agent runs: ``python TARGET ARGS`` (or ``python -m TARGET ARGS``) in
    ``cwd``, as ``run_name``, allowed ``max_restarts`` group restarts; ``channel_timeout_s``:
    ``--channel-timeout`` (see ``_Channel``)."""

    target: str
    args: tuple[str, ...]
    module: bool
    cwd: str
    run_name: str
    max_restarts: int
    channel_timeout_s: float = CHANNEL_TIMEOUT_S


class ScriptExitError(RuntimeError):
    """A rank's script exited with a non-zero code (or was killed by a signal)."""

    def __init__(self, rank: int, code: int) -> None:
        if code > 128 and code - 128 in signal.Signals._value2member_map_:
            how = f"was killed by {signal.Signals(code - 128).name} (exit code {code})"
        else:
            how = f"exited with code {code}"
        super().__init__(f"rank {rank}: the script {how}")
        self.rank = rank
        self.code = code

    def __reduce__(self) -> Any:
        return (ScriptExitError, (self.rank, self.code))


def agent_loop(ctx: Any, config: dict[str, Any]) -> None:
    """The loop of one raylight worker under `raylight run` (see the module's doc).
    ``config["restarts"]`` is the driver's count of group restarts so far (a list the
    driver updates; Ray sends its value with each start)."""
    spec: LaunchSpec = config["spec"]
    restarts = int(config["restarts"][0])
    master_addr = os.environ["MASTER_ADDR"]  # rank 0's node, set by the worker for its own group
    # The scripts' store, as torchrun's agent store: held by rank 0's agent (not its script),
    # on a port of its own (the core's store holds the worker's MASTER_PORT); all learn it.
    port = float(_open_agent_store(master_addr, ctx.world_size)) if ctx.rank == 0 else 0.0
    master_port = int(ctx.all_reduce(port, "sum"))
    nodes = int(ctx.all_reduce(float(ctx.node_rank), "max")) + 1
    env = child_env(
        dict(os.environ), spec, rank=ctx.rank, local_rank=ctx.local_rank, world_size=ctx.world_size,
        local_world_size=ctx.local_world_size, node_rank=ctx.node_rank, nodes=nodes,
        master_addr=master_addr, master_port=master_port, restarts=restarts,
    )
    with _Channel(ctx, timeout_s=spec.channel_timeout_s) as channel:
        env[CHANNEL_ENV] = channel.address
        env[KEY_ENV] = channel.key.hex()
        env[PARENT_ENV] = str(os.getpid())
        code, stopped = _run_child(ctx, spec, env, channel)
    if stopped:  # the driver asked for it: whatever the script's code, a stop, not a failure
        raise ResizeInterrupt()
    if code != 0:
        raise ScriptExitError(ctx.rank, code)


def child_env(
    base: dict[str, str], spec: LaunchSpec, *, rank: int, local_rank: int, world_size: int, local_world_size: int,
    node_rank: int, nodes: int, master_addr: str, master_port: int, restarts: int,
) -> dict[str, str]:
    """The child's environment: the worker's, with what torchrun sets for its workers."""
    env = dict(base)
    env.update(
        RANK=str(rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(local_world_size), GROUP_RANK=str(node_rank), NODE_RANK=str(node_rank),
        GROUP_WORLD_SIZE=str(nodes), ROLE_RANK=str(rank), ROLE_WORLD_SIZE=str(world_size), ROLE_NAME="default",
        MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), TORCHELASTIC_USE_AGENT_STORE="True",
        TORCHELASTIC_RESTART_COUNT=str(restarts),
        TORCHELASTIC_MAX_RESTARTS=str(spec.max_restarts), TORCHELASTIC_RUN_ID=spec.run_name,
    )
    env.setdefault("PYTHONUNBUFFERED", "1")  # lines reach the driver as they are printed
    return env


def child_command(spec: LaunchSpec) -> list[str]:
    target = ["-m", spec.target] if spec.module else [spec.target]
    return [sys.executable, BOOTSTRAP, *target, *spec.args]


# Rank 0's agent store. Like torchrun's, it lives as long as the agent's process (the worker
# serves this one run and is killed with it: reuse_workers=False), so no script outlives it.
_AGENT_STORES: list[Any] = []


def _open_agent_store(host: str, world_size: int) -> int:
    """Start the scripts' TCPStore server in this process, listening on ``host`` alone;
    its port. The scripts connect as clients (TORCHELASTIC_USE_AGENT_STORE)."""
    from datetime import timedelta

    import torch.distributed as dist

    from raylight.base.net import listen_socket

    sock = listen_socket(host)
    try:
        store = dist.TCPStore(
            host, sock.getsockname()[1], world_size, True, timedelta(seconds=STORE_TIMEOUT_S),
            wait_for_workers=False, master_listen_fd=sock.fileno(),
        )
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store owns the descriptor now
    _AGENT_STORES.append(store)
    return int(store.port)


def check_on_this_node(spec: LaunchSpec) -> None:
    """The script runs where this worker is, from the path the driver gave: on another
    machine than the driver's it must be there too."""
    if spec.module or os.path.isfile(spec.target):
        return
    import socket

    raise ConfigError(
        f"script {spec.target} is not on this node ({socket.gethostname()}): raylight run starts the "
        "script on every worker's node from the driver's path. Put it at that path on every node (a "
        "shared filesystem, the node image), or send it with the job: raylight submit --working-dir DIR -- "
        "raylight run ..."
    )


def working_directory(spec: LaunchSpec, ctx: Any) -> str | None:
    """Where the child runs: the driver's working directory, as every rank of torchrun runs
    where it was started. On a node that lacks it (the driver's own disk, on a cluster) the
    child runs in this worker's (the job's working directory under `raylight submit
    --working-dir`, else Ray's), and the rank says so on its stderr: relative paths there are
    not the driver's (issue 57: it was silent, and a relative output landed in Ray's
    session directory)."""
    if os.path.isdir(spec.cwd):
        return spec.cwd
    import socket

    ctx._output(
        "stderr",
        f"raylight run: the driver's working directory {spec.cwd} is not on this node ({socket.gethostname()}); "
        f"this rank runs in {os.getcwd()}, where relative paths are not the driver's. Run from a directory on "
        "storage every node mounts at the same path, or send it: raylight submit --working-dir DIR -- raylight run ...",
    )
    return None


def _run_child(ctx: Any, spec: LaunchSpec, env: dict[str, str], channel: _Channel) -> tuple[int, bool]:
    """Start the child, forward its output until it exits; its exit code (128 + N when
    signal N killed it) and whether the driver asked it to stop meanwhile (then the
    channel tells a script that asks ``should_stop()``; one that never asked is sent
    SIGTERM, then SIGKILL). Stopped any other way (the loop's thread interrupted), the
    child's process group is terminated, then killed."""
    check_on_this_node(spec)
    cwd = working_directory(spec, ctx)
    child = subprocess.Popen(
        child_command(spec), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=env, cwd=cwd, start_new_session=True,
    )
    assert child.stdout is not None and child.stderr is not None
    pumps = [
        threading.Thread(target=_pump, args=(stream, name, ctx), name=f"raylight-run-{name}", daemon=True)
        for stream, name in ((child.stdout, "stdout"), (child.stderr, "stderr"))
    ]
    for pump in pumps:
        pump.start()
    stopping = False
    try:
        while True:
            try:
                code = child.wait(timeout=STOP_CHECK_S)
                break
            except subprocess.TimeoutExpired:
                ctx.heartbeat()  # the script's progress is its own; the worker is alive
            if not stopping and ctx._stop_asked.is_set():
                stopping = True
                if not channel.stop():  # the script never asks: torchrun's way
                    log.warning("raylight run: rank %d: stopping the script (SIGTERM): it never asked run_context().should_stop()", ctx.rank)
                    _stop(child)
    finally:
        if child.poll() is None:
            _stop(child)
        for pump in pumps:
            pump.join(timeout=STOP_GRACE_S)
    return (128 - code if code < 0 else code), stopping


def _stop(child: subprocess.Popen[bytes]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=STOP_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def _pump(stream: IO[bytes], name: str, ctx: Any) -> None:
    """Forward each line of one of the child's streams to the driver."""
    with stream:
        for raw in iter(stream.readline, b""):
            ctx._output(name, raw.decode("utf-8", errors="replace").rstrip("\r\n"))


class _Channel:
    """The agent's listener for its child (``bootstrap`` events and ``run_context``
    calls): 127.0.0.1 unless told otherwise, an ephemeral port, a random key. Each
    connection is served in its own thread, so one that stays silent never holds up the
    others; it must prove it holds the key (``run_wire.connect``) within ``timeout_s``
    (``--channel-timeout``), and once a request has begun, each part of it must come
    within that time too. Between requests an authenticated connection may stay idle
    (the script's own, between two reports)."""

    def __init__(self, ctx: Any, *, host: str = "127.0.0.1", timeout_s: float = CHANNEL_TIMEOUT_S) -> None:
        self._ctx = ctx
        self.key = secrets.token_bytes(32)
        self.timeout_s = timeout_s
        self._listener = socket.create_server((host, 0))
        bound_host, port = self._listener.getsockname()[:2]
        self.address = f"{bound_host}:{port}"
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="raylight-run-channel", daemon=True)
        self._began = False  # the script finished its rendezvous or reported: told the driver
        self._lock = threading.Lock()
        self._stopping = False  # the driver asked the worker to stop: should_stop() says so
        self._asks = False  # the script has asked should_stop()

    def __enter__(self) -> _Channel:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._closed.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept() (close alone does not)
        except OSError:
            pass
        self._listener.close()
        self._thread.join(timeout=STOP_GRACE_S)

    def stop(self) -> bool:
        """The driver asks the script to stop: ``should_stop()`` says so from now on.
        Whether the script asks it (else it never hears)."""
        with self._lock:
            self._stopping = True
            return self._asks

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                sock, peer = self._listener.accept()
            except OSError:
                if self._closed.is_set():
                    return
                continue
            threading.Thread(target=self._serve, args=(sock, peer), name="raylight-run-client", daemon=True).start()

    def _authenticate(self, sock: socket.socket) -> bool:
        """The challenge and response (``run_wire.connect`` is the other side); False,
        with the reason sent, for a connection that does not hold the key."""
        nonce = secrets.token_bytes(32)
        send_frame(sock, HELLO + nonce)
        answer = recv_frame(sock, 64)
        if len(answer) != 64 or not hmac.compare_digest(answer[:32], proof(self.key, b"script", nonce)):
            send_frame(sock, b"no" + b"its key is not this run's (the script's RAYLIGHT_RUN_AUTHKEY)")
            return False
        send_frame(sock, b"ok" + proof(self.key, b"agent", answer[32:]))
        return True

    def _read(self, sock: socket.socket, limit: int | None = None) -> bytes:
        """One frame: the wait for its first byte has no limit, the rest ``timeout_s``."""
        sock.settimeout(None)
        first = sock.recv(1, socket.MSG_PEEK)
        if not first:
            raise EOFError("closed")
        sock.settimeout(self.timeout_s)
        return recv_frame(sock, limit)

    def _serve(self, sock: socket.socket, peer: Any) -> None:
        with sock:
            sock.settimeout(self.timeout_s)
            try:
                if not self._authenticate(sock):
                    log.warning("raylight run: refused a connection to the agent channel from %s:%s: it does not hold the run's key", *peer[:2])
                    return
            except TimeoutError:
                self._refuse(sock, peer, "did not answer the channel's challenge")
                return
            except (OSError, EOFError):  # gone, or a frame too long to be an answer
                return
            while True:
                try:
                    request = json.loads(self._read(sock))
                    wants = request.get("op") == "report" and request.get("checkpoint") and self._ctx.rank == 0
                    payload = recv_frame(sock) if wants else None
                except TimeoutError:
                    self._refuse(sock, peer, "stopped sending in the middle of a request")
                    return
                except (EOFError, OSError, ValueError):
                    return
                try:
                    reply, data = self._handle(request, payload)
                except Exception as exc:  # the script hears of it, the worker goes on
                    reply, data = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}, None
                try:
                    send_frame(sock, json.dumps({**reply, "payload": data is not None}).encode())
                    if data is not None:
                        send_frame(sock, data)
                except OSError:
                    return

    def _refuse(self, sock: socket.socket, peer: Any, what: str) -> None:
        why = f"the connection from {peer[0]}:{peer[1]} {what} within --channel-timeout={self.timeout_s:g}s; closed"
        log.warning("raylight run: %s (raise --channel-timeout on a machine too loaded to answer in time)", why)
        try:
            sock.settimeout(1.0)
            send_frame(sock, b"no" + why.encode())
        except OSError:
            pass

    def _handle(self, request: dict[str, Any], payload: bytes | None) -> tuple[dict[str, Any], bytes | None]:
        op = request.get("op")
        if op == "event":
            self._ctx._output(EVENT, str(request.get("event")))
            if request.get("event") == "init_done":
                self._begin()
            return {"ok": True}, None
        if op == "report":
            checkpoint = None
            if request.get("checkpoint"):
                checkpoint = _load(payload) if payload is not None else {}
            if checkpoint is not None and self._stopping:  # where the script stopped: the snapshot
                self._ctx._report_snapshot(request.get("metrics") or {}, checkpoint)
            else:
                self._ctx.report(request.get("metrics") or {}, checkpoint=checkpoint)
            self._begin()
            return {"ok": True}, None
        if op == "stop":
            with self._lock:
                self._asks = True
                return {"ok": True, "stop": self._stopping}, None
        if op == "load":
            state = self._ctx.load_checkpoint()
            if state is None:
                return {"ok": True, "checkpoint": False}, None
            import torch

            buf = io.BytesIO()
            torch.save(state, buf)
            return {"ok": True, "checkpoint": True}, buf.getvalue()
        return {"ok": False, "error": f"unknown request {op!r}"}, None


    def _begin(self) -> None:
        """The script is at work (its process group formed, or it reported): the
        worker's first step, once. The driver times a resize to it, and an elastic run
        considers its size again only after rank 0's."""
        with self._lock:
            began, self._began = self._began, True
        if not began:
            self._ctx._started()


def _load(data: bytes) -> dict[str, Any]:
    import torch

    # in CPU memory: the script's GPU tensors would otherwise be rebuilt on its GPU here (a
    # second copy, and a CUDA context in this process), only to be written out again
    try:
        state: dict[str, Any] = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:  # the script hears why; nothing of it ran
        from raylight.storage.checkpoint import refused_pickle

        raise pickle.UnpicklingError(refused_pickle("the checkpoint this rank's script reported", exc)) from None
    return state
