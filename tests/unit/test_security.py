"""Listeners bind one address; content from checkpoints never chooses a path."""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta
from types import SimpleNamespace

import pytest

from raylight.base.net import interface_for, listen_socket, loopback_interface
from raylight.tune.trial import DEFAULT_CKPT_NAME, safe_filename
from raylight.worker_group.worker import RankInfo, RaylightWorker
from tests.helpers import listening_sockets


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
