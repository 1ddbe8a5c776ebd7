"""Listeners bind one address; content from checkpoints never chooses a path."""

from __future__ import annotations

import json
import logging
import os
import pickle
import socket
import threading
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from raylight.base.net import interface_for, listen_socket, loopback_interface
from raylight.launch.agent import _Channel
from raylight.tune.trial import DEFAULT_CKPT_NAME, safe_filename
from raylight.worker import run_channel as client
from raylight.worker import run_wire
from raylight.worker_group.worker import RankInfo, RaylightWorker
from tests.helpers import listening_sockets
from tests.hostile import as_torch_file, hostile_pickles


def test_rendezvous_store_listens_on_the_given_address_only():
    import torch.distributed as dist

    worker = RaylightWorker(RankInfo(0, 0, 2, 2, 0), "sec")
    port = worker.open_store("127.0.0.1", 2, 10.0)
    mine = [s for s in listening_sockets([os.getpid()]) if s[2] == port]
    assert [(a, p) for _, a, p in mine] == [("127.0.0.1", port)]
    client = dist.TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=10))
    client.set("k", "v")
    assert worker._store.get("k") == b"v"
    worker._store = None


def test_listen_socket_binds_one_address():
    sock = listen_socket("127.0.0.1")
    try:
        host, port = sock.getsockname()
        assert host == "127.0.0.1"
        assert (os.getpid(), "127.0.0.1", port) in listening_sockets([os.getpid()])
    finally:
        sock.close()


def test_interface_lookup():
    assert interface_for("127.0.0.1") == loopback_interface()
    assert interface_for("203.0.113.77") is None  # no interface holds it (TEST-NET-3)
    assert interface_for("not an address") is None


def test_a_node_address_is_found_on_its_interface_when_it_is_not_the_first_there(monkeypatch):
    """Ray's node address may be an interface's second IPv4 address (an alias) or IPv6;
    without the interface, gloo resolves the host name (127.0.1.1 on Debian) and the group
    of several machines never forms."""
    import psutil

    def addr(family, address):  # what psutil.net_if_addrs() lists per interface
        return SimpleNamespace(family=family, address=address)

    machine = {
        "lo": [addr(socket.AF_INET, "127.0.0.1")],
        "eth0": [addr(psutil.AF_LINK, "02:00:00:00:00:01"), addr(socket.AF_INET, "10.0.0.5"), addr(socket.AF_INET, "10.0.7.9")],
        "eth1": [addr(socket.AF_INET6, "fd00::2"), addr(socket.AF_INET6, "fe80::1%eth1")],
    }
    monkeypatch.setattr(psutil, "net_if_addrs", lambda: machine)
    assert [interface_for(a) for a in ("10.0.0.5", "10.0.7.9", "fd00::2", "fe80::1", "10.0.0.6")] == ["eth0", "eth0", "eth1", "eth1", None]


@pytest.mark.parametrize(
    "name",
    ["../../etc/passwd", "/abs/path.ckpt", "a/b.ckpt", "..", ".", "", None, 5, "bad\nname", "x" * 300, "a\\b"],
)
def test_checkpoint_file_names_from_content_are_sanitised(name, caplog):
    with caplog.at_level(logging.WARNING, logger="raylight"):
        assert safe_filename(name) == DEFAULT_CKPT_NAME
    assert "not a plain file name" in caplog.text


def test_plain_checkpoint_file_names_are_kept():
    assert safe_filename("epoch=3-step=40.ckpt") == "epoch=3-step=40.ckpt"


def test_disabled_auth_is_warned(monkeypatch, caplog):
    from raylight.driver import runtime

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with caplog.at_level(logging.WARNING, logger="raylight"):
        runtime.warn_if_auth_disabled()
    assert "RAY_AUTH_MODE=disabled" in caplog.text and "can run code" in caplog.text
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    caplog.clear()
    runtime.warn_if_auth_disabled()
    assert not caplog.text


# -- raylight run's agent channel --------------------------------------------------------


class _ChannelContext:
    """What the agent channel calls on a worker's context, counting the loads it serves."""

    rank = 0

    def __init__(self) -> None:
        self.reports: list[tuple[dict, dict | None]] = []
        self.loads = 0

    def _output(self, stream, text):
        pass

    def report(self, metrics, *, checkpoint=None):
        self.reports.append((metrics, checkpoint))

    def load_checkpoint(self):
        self.loads += 1
        return {"secret": torch.arange(3.0)}

    def _started(self):
        pass


def _in_time(fn, seconds):
    """``fn()``'s result if it returns within ``seconds``, else the test fails (a stalled
    channel must fail the test, not hang it)."""
    done: list = []
    thread = threading.Thread(target=lambda: done.append(fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert done, f"not done within {seconds} s"
    return done[0]


def _frame(sock) -> bytes:
    size = int.from_bytes(_exact(sock, 8), "big")
    return _exact(sock, size)


def _exact(sock, n) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise EOFError
        out += chunk
    return out


def test_a_silent_connection_to_the_agent_channel_does_not_stall_run_context():
    """Before: the listener authenticated each connection in its accept loop, so one that
    sent nothing held up every later run_context() for as long as it stayed open."""
    ctx = _ChannelContext()
    with _Channel(ctx) as channel:
        host, port = channel.address.rsplit(":", 1)
        silent = [socket.create_connection((host, int(port))) for _ in range(3)]
        half = socket.create_connection((host, int(port)), timeout=20)  # took the challenge, then went quiet mid-answer
        _frame(half)
        half.sendall((64).to_bytes(8, "big") + b"\0" * 10)
        try:
            start = time.monotonic()
            run = _in_time(lambda: client.RunContext(channel.address, channel.key), 20)
            run.report({"step": 1})
            assert torch.equal(run.load_checkpoint()["secret"], torch.arange(3.0))
            took = time.monotonic() - start
            assert ctx.reports == [({"step": 1}, None)]
            assert took < channel.timeout_s, f"run_context() waited {took:.1f} s behind the silent connections"
            run._conn.close()
        finally:
            for sock in (*silent, half):
                sock.close()


def test_a_connection_silent_past_the_channel_timeout_is_closed_with_the_setting_named(caplog):
    ctx = _ChannelContext()
    with caplog.at_level(logging.WARNING, logger="raylight"), _Channel(ctx, timeout_s=0.5) as channel:
        host, port = channel.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=20) as sock:
            start = time.monotonic()
            assert _frame(sock).startswith(run_wire.HELLO)
            answer = _frame(sock)  # the channel's own word, once the timeout has passed
            assert time.monotonic() - start >= 0.5
            assert answer.startswith(b"no") and b"--channel-timeout=0.5s" in answer
            assert sock.recv(1) == b""  # and then it closed the connection
    assert "--channel-timeout" in caplog.text
    assert ctx.loads == 0


def test_a_connection_without_the_run_s_key_is_refused_and_gets_nothing(caplog):
    ctx = _ChannelContext()
    with caplog.at_level(logging.WARNING, logger="raylight"), _Channel(ctx) as channel:
        with pytest.raises(run_wire.ChannelRefused, match="not this run's"):
            client.RunContext(channel.address, b"k" * 32)
        host, port = channel.address.rsplit(":", 1)
        # no key at all: a client that skips the handshake and asks for the checkpoint
        with socket.create_connection((host, int(port)), timeout=20) as sock:
            _frame(sock)
            request = json.dumps({"op": "load"}).encode()
            sock.sendall(len(request).to_bytes(8, "big") + request)
            assert _frame(sock).startswith(b"no")
            assert sock.recv(1) == b""
        # a replayed answer from another connection's challenge does not pass either
        with socket.create_connection((host, int(port)), timeout=20) as a, socket.create_connection((host, int(port)), timeout=20) as b:
            nonce_a = _frame(a)[len(run_wire.HELLO):]
            _frame(b)
            b.sendall((64).to_bytes(8, "big") + run_wire.proof(channel.key, b"script", nonce_a) + b"\0" * 32)
            assert _frame(b).startswith(b"no")
        assert ctx.loads == 0 and ctx.reports == []
        assert channel.key.hex() not in caplog.text
        run = client.RunContext(channel.address, channel.key)  # the run's own script still gets in
        assert run.load_checkpoint() is not None and ctx.loads == 1
        run._conn.close()


def test_run_context_refuses_an_agent_that_does_not_hold_the_key():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def impostor():
            conn, _ = server.accept()
            with conn:
                hello = run_wire.HELLO + b"\1" * 32
                conn.sendall(len(hello).to_bytes(8, "big") + hello)
                _frame(conn)
                ok = b"ok" + b"\0" * 32
                conn.sendall(len(ok).to_bytes(8, "big") + ok)

        thread = threading.Thread(target=impostor, daemon=True)
        thread.start()
        with pytest.raises(run_wire.ChannelRefused, match="not the run's agent"):
            client.RunContext(f"127.0.0.1:{port}", b"k" * 32)
        thread.join(10)


def test_the_agent_channel_listens_on_loopback_unless_told_otherwise():
    for host in (None, "127.0.0.2"):
        with _Channel(_ChannelContext(), **({"host": host} if host else {})) as channel:
            port = int(channel.address.rsplit(":", 1)[1])
            mine = [(a, p) for _, a, p in listening_sockets([os.getpid()]) if p == port]
            assert mine == [(host or "127.0.0.1", port)]


# -- Ray's token file ---------------------------------------------------------------------


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A HOME of the test's own, with none of Ray's token settings, and the warnings of
    this process forgotten."""
    from raylight.base import ray_token

    monkeypatch.setenv("HOME", str(tmp_path))
    for name in (ray_token.TOKEN_ENV, ray_token.TOKEN_PATH_ENV, ray_token.AUTH_MODE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(ray_token, "_warned", set())
    return tmp_path


def _mode(path) -> int:
    return os.stat(path).st_mode & 0o777


def test_the_token_raylight_creates_for_a_new_cluster_is_readable_by_its_owner_only(home, caplog):
    from raylight.base import ray_token

    old = os.umask(0o022)  # the usual umask, with which Ray writes it 0644
    try:
        with caplog.at_level(logging.WARNING, logger="raylight"):
            created = ray_token.create_for_new_cluster()
            assert created == home / ".ray" / "auth_token"
            token = created.read_text()
            assert len(token) == 64 and int(token, 16) >= 0  # Ray's format: 32 random bytes, hex
            assert _mode(created) == 0o600 and _mode(home / ".ray") == 0o700
            assert ray_token.create_for_new_cluster() is None  # there is one now: kept as it is
            assert created.read_text() == token
        assert caplog.text == ""
    finally:
        os.umask(old)


def test_a_token_file_open_to_others_is_warned_about_once_with_the_fix_and_left_alone(home, caplog, monkeypatch):
    from raylight.base import ray_token

    (home / ".ray").mkdir()
    token = home / ".ray" / "auth_token"
    token.write_text("f" * 64)
    os.chmod(token, 0o644)
    with caplog.at_level(logging.WARNING, logger="raylight"):
        assert ray_token.create_for_new_cluster() is None
        ray_token.warn_if_readable_by_others()  # once per file
    assert caplog.text.count("open to other users") == 1
    assert f"chmod 600 {token}" in caplog.text and "0644" in caplog.text
    assert "f" * 64 not in caplog.text  # never the token
    assert _mode(token) == 0o644  # not raylight's to change
    caplog.clear()
    named = home / "elsewhere"
    named.write_text("e" * 64)
    os.chmod(named, 0o640)
    monkeypatch.setenv(ray_token.TOKEN_PATH_ENV, str(named))  # the file Ray reads instead
    with caplog.at_level(logging.WARNING, logger="raylight"):
        assert ray_token.create_for_new_cluster() is None
    assert f"chmod 600 {named}" in caplog.text
    caplog.clear()
    os.chmod(named, 0o600)
    monkeypatch.setattr(ray_token, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="raylight"):
        ray_token.warn_if_readable_by_others()
    assert caplog.text == ""


def test_no_token_file_is_made_or_judged_where_ray_reads_none(home, caplog, monkeypatch):
    from raylight.base import ray_token

    monkeypatch.setenv(ray_token.AUTH_MODE_ENV, "disabled")
    assert ray_token.create_for_new_cluster() is None
    monkeypatch.delenv(ray_token.AUTH_MODE_ENV)
    monkeypatch.setenv(ray_token.TOKEN_ENV, "t" * 64)  # the token itself, in the environment
    assert ray_token.create_for_new_cluster() is None
    assert not (home / ".ray").exists()


@pytest.mark.parametrize("shape", sorted(hostile_pickles(Path("m"))))
def test_a_hostile_checkpoint_on_the_agent_channel_runs_nothing_at_either_end(tmp_path, shape):
    marker = tmp_path / "ran"
    payload = as_torch_file(hostile_pickles(marker)[shape])
    ctx = _ChannelContext()
    with _Channel(ctx) as channel:
        run = client.RunContext(channel.address, channel.key)
        # the script's end sends it (an authenticated script, tampered with): the agent refuses it
        request = json.dumps({"op": "report", "metrics": {}, "checkpoint": True}).encode()
        run_wire.send_frame(run._conn, request)
        run_wire.send_frame(run._conn, payload)
        reply = json.loads(run_wire.recv_frame(run._conn))
        assert reply["ok"] is False and "the checkpoint this rank's script reported" in reply["error"]
        assert ctx.reports == []
        run._conn.close()

        # the agent's end sends it: the script refuses it
        with socket.create_server(("127.0.0.1", 0)) as server:
            port = server.getsockname()[1]

            def agent():
                conn, _ = server.accept()
                with conn:
                    nonce = b"\2" * 32
                    run_wire.send_frame(conn, run_wire.HELLO + nonce)
                    answer = run_wire.recv_frame(conn)
                    run_wire.send_frame(conn, b"ok" + run_wire.proof(b"k" * 32, b"agent", answer[32:]))
                    run_wire.recv_frame(conn)
                    run_wire.send_frame(conn, json.dumps({"ok": True, "checkpoint": True, "payload": True}).encode())
                    run_wire.send_frame(conn, payload)

            thread = threading.Thread(target=agent, daemon=True)
            thread.start()
            other = client.RunContext(f"127.0.0.1:{port}", b"k" * 32)
            with pytest.raises(pickle.UnpicklingError, match="the checkpoint the agent channel sent"):
                other.load_checkpoint()
            other._conn.close()
            thread.join(10)
    assert not marker.exists()


@pytest.mark.parametrize("shape", ["global_os_system", "nested_reduce"])
def test_a_hostile_preprocessing_cache_file_runs_nothing_and_is_named(tmp_path, shape):
    import numpy as np

    from raylight.base.exceptions import ConfigError
    from raylight.declarative import cache

    marker = tmp_path / "ran"
    cache.save(str(tmp_path / "cache"), "k1", {"rows": 2}, {"train": {"x": np.arange(2.0)}, "validation": None, "test": None})
    assert cache.load(str(tmp_path / "cache"), "k1")[1]["train"]["x"].tolist() == [0.0, 1.0]

    class Pickled:  # what np.save writes for an object array: a pickle of its items
        def __reduce__(self):
            return (pickle.loads, (hostile_pickles(marker)[shape],))

    np.savez(tmp_path / "cache" / "k1" / "train.npz", x=np.array([Pickled()], dtype=object))
    with pytest.raises(ConfigError, match=r"cache file .*k1/train\.npz holds Python objects.*Delete that cache entry"):
        cache.load(str(tmp_path / "cache"), "k1")
    assert not marker.exists()


def test_a_parquet_dataset_with_a_column_of_pickles_runs_nothing_and_is_named(tmp_path):
    """Ray Data registers a Parquet extension type whose values are pickles; once it is
    imported (the ray_data processor, or anything in the driver), reading such a column,
    with pandas too, unpickled every value."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray.data  # noqa: F401  (registers the type, as the ray_data processor does)
    from ray.data._internal.object_extensions.arrow import ArrowPythonObjectType

    from raylight.base.exceptions import ConfigError
    from raylight.declarative.dataset import read_pandas

    marker = tmp_path / "ran"
    kind = ArrowPythonObjectType()
    raw = hostile_pickles(marker)["stack_global_builtins_eval"]
    column = pa.ExtensionArray.from_storage(kind, pa.array([raw, raw], type=kind.storage_type))
    path = tmp_path / "data.parquet"
    pq.write_table(pa.table({"x": [1.0, 2.0], "payload": column}), path)
    with pytest.raises(ConfigError, match=r"data\.parquet'?: column 'payload' holds pickled Python objects"):
        read_pandas(str(path))
    assert not marker.exists()
    pq.write_table(pa.table({"x": [1.0, 2.0], "y": ["a", "b"]}), tmp_path / "plain.parquet")
    assert read_pandas(str(tmp_path / "plain.parquet"))["y"].tolist() == ["a", "b"]
