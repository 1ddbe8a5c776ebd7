"""The fake hosts themselves: separate networks, disks and hostnames, a shared directory, deaths,
partitions, listeners, and a teardown that leaves nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hosts.harness import SHARED, _alive, _netns_list

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(120)]

SERVER = (
    "import socket,sys; s=socket.socket(); s.bind((sys.argv[1], 7000)); s.listen(); print('up', flush=True); "
    "c,_=s.accept(); c.sendall(socket.gethostname().encode()); c.close()"
)
CLIENT = "import socket,sys; c=socket.create_connection((sys.argv[1], 7000), timeout=10); print(c.recv(100).decode())"


def _serve(hosts, host, address):
    server = hosts.popen(
        host, [sys.executable, "-c", SERVER, address], stdout=subprocess.PIPE, text=True
    )
    assert server.stdout.readline().strip() == "up"
    return server


def test_two_hosts_reach_each_other_over_tcp_and_have_their_own_hostnames(make_hosts):
    hosts = make_hosts(["a", "b"])
    server = _serve(hosts, "a", hosts.address("a"))
    assert (hosts.address("a"), 7000) in hosts.listening("a")
    assert hosts.listening("b") == []  # b's network is its own
    got = hosts.run("b", [sys.executable, "-c", CLIENT, hosts.address("a")]).stdout.strip()
    assert got == "a"
    assert server.wait(timeout=10) == 0
    assert hosts.run("b", "hostname").stdout.strip() == "b"


def test_a_hosts_tmp_and_shm_are_its_own_and_the_shared_directory_is_shared(make_hosts):
    hosts = make_hosts(["a", "b"])
    hosts.run("a", f"echo a > /tmp/mine && echo a > /dev/shm/mine && echo a > {SHARED}/from-a")
    assert hosts.run("b", "ls /tmp/mine /dev/shm/mine", check=False).returncode != 0
    assert hosts.run("b", f"cat {SHARED}/from-a").stdout.strip() == "a"
    assert Path(hosts.shared, "from-a").read_text().strip() == "a"
    assert not os.path.exists("/tmp/mine") and not os.path.exists("/dev/shm/mine")  # nor the box's
    assert hosts.run("a", "echo $HOME").stdout.strip() == "/tmp/home"


def test_a_cut_host_is_unreachable_until_restored(make_hosts):
    hosts = make_hosts(["a", "b"])
    server = _serve(hosts, "a", "0.0.0.0")
    probe = f"import socket; socket.create_connection(('{hosts.address('a')}', 7000), timeout=1)"
    hosts.cut("a")
    assert hosts.run("b", [sys.executable, "-c", probe], check=False).returncode != 0
    hosts.restore("a")
    hosts.run("b", [sys.executable, "-c", probe])
    assert server.wait(timeout=10) == 0


def test_kill_host_kills_every_process_of_the_host_and_only_those(make_hosts):
    hosts = make_hosts(["a", "b"])
    # a's processes: one the harness started, one that process forked and left behind
    a = hosts.popen("a", "sleep 300 & echo $!; exec sleep 300", stdout=subprocess.PIPE, text=True)
    orphan = int(a.stdout.readline())
    b = hosts.popen("b", ["sleep", "300"])
    assert {a.pid, orphan} <= set(hosts.pids("a"))
    killed = hosts.kill_host("a")
    assert {a.pid, orphan} <= set(killed)
    assert a.wait(timeout=10) == -9
    assert not _alive(orphan)
    assert b.poll() is None and hosts.pids("b") == [b.pid]
    assert (
        hosts.run("a", "echo alive").stdout.strip() == "alive"
    )  # the machine can be started again


def test_teardown_leaves_no_namespace_process_or_directory(make_hosts):
    hosts = make_hosts(["a", "b", "c"])
    left_running = hosts.popen("c", ["sleep", "300"])
    names = [h.netns for h in hosts.hosts.values()] + [hosts.bridge_ns]
    assert set(names) <= set(_netns_list())
    hosts.close()
    assert hosts.leftovers() == []
    assert left_running.poll() is not None
    assert not set(names) & set(_netns_list())
    assert not os.path.exists(hosts.shared)
