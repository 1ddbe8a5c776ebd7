"""Connecting to Ray: bad addresses fail fast with the setting named, nothing written."""

import subprocess
import sys

import pytest
import ray._private.utils as ray_utils
from ray._private import node

from raylight.runtime import _host_port, _lean_head
from raylight.worker_group.net import is_loopback as _is_loopback

SCRIPT = """
import raylight
try:
    raylight.fit(lambda ctx: None, num_workers=1, address={address!r}, storage_path={storage!r}, progress=False)
except raylight.ClusterConnectionError as e:
    print("ERROR", e)
"""


def test_unreachable_address_fails_fast_and_writes_nothing(tmp_path):
    code = SCRIPT.format(address="127.0.0.1:1", storage=str(tmp_path / "runs"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "ERROR could not reach the Ray cluster at '127.0.0.1:1' (from address)" in out.stdout, out.stderr
    assert "connect_timeout_s" in out.stdout and "ray start --head" in out.stdout
    assert not (tmp_path / "runs").exists()


def test_ray_address_env_is_used_and_named(tmp_path):
    code = SCRIPT.format(address=None, storage=str(tmp_path))
    env = {"RAY_ADDRESS": "127.0.0.1:1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert "(from RAY_ADDRESS)" in out.stdout and "fix RAY_ADDRESS" in out.stdout, out.stderr


def test_address_parsing():
    assert _host_port("ray://127.0.0.1:10001") == ("127.0.0.1", 10001)
    assert _host_port("localhost:6379") == ("localhost", 6379)
    assert _host_port("[::1]:6379") == ("::1", 6379)
    assert _host_port("auto") is None
    assert _is_loopback("127.0.0.2") and _is_loopback("localhost") and not _is_loopback("10.0.0.1")


def test_the_api_server_is_skipped_only_for_a_head_without_dashboard_and_the_monitor_always(monkeypatch):
    calls = []
    monkeypatch.setattr(node.Node, "start_api_server", lambda self, **kw: calls.append(kw))
    monkeypatch.setattr(node.Node, "start_monitor", lambda self: calls.append("monitor"))
    originals = node.Node.start_api_server, node.Node.start_monitor
    with _lean_head():
        assert node.Node.start_api_server is not originals[0] and node.Node.start_monitor is not originals[1]
        node.Node.start_api_server(None, include_dashboard=False, raise_on_failure=False)
        node.Node.start_api_server(None, include_dashboard=None, raise_on_failure=False)
        node.Node.start_api_server(None, include_dashboard=True, raise_on_failure=True)
        node.Node.start_monitor(None)
    assert calls == [
        {"include_dashboard": None, "raise_on_failure": False}, {"include_dashboard": True, "raise_on_failure": True},
    ]
    assert (node.Node.start_api_server, node.Node.start_monitor) == originals


def test_the_lean_head_asks_for_ray_s_minimal_node_agent_only_while_it_starts():
    # Where the dashboard's dependencies are installed (the dev install: ray[default]), Ray
    # starts its full agent; inside _lean_head it is told they are missing, after it not.
    installed = ray_utils.get_dashboard_dependency_error() is None
    with _lean_head():
        assert isinstance(ray_utils.get_dashboard_dependency_error(), ImportError)
    assert (ray_utils.get_dashboard_dependency_error() is None) == installed


_PATCHED = [(node.Node, "start_api_server"), (node.Node, "start_monitor"), (ray_utils, "get_dashboard_dependency_error")]


def test_the_lean_head_patches_are_undone_on_error_and_absent_where_ray_moved(monkeypatch):
    originals = [getattr(owner, name) for owner, name in _PATCHED]
    with pytest.raises(RuntimeError), _lean_head():
        raise RuntimeError("ray.init failed")
    assert [getattr(owner, name) for owner, name in _PATCHED] == originals
    for owner, name in _PATCHED:
        monkeypatch.delattr(owner, name)
        with _lean_head():  # Ray without it: nothing to skip, nothing added
            assert not hasattr(owner, name)
        assert not hasattr(owner, name)
