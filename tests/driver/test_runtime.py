"""Connecting to Ray: bad addresses fail fast with the setting named, nothing written."""

import json
import subprocess
import sys

import pytest
import ray._private.utils as ray_utils
from ray._private import node, ray_constants, services

import raylight.driver.runtime
from raylight.base.net import is_loopback as _is_loopback
from raylight.driver.runtime import _host_port, _lean_head, _wait_for_node

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


def test_the_lean_head_runs_ray_s_agent_through_the_shim_and_nothing_else(tmp_path):
    build = services._build_python_executable_command_memory_profileable
    plain = build(ray_constants.PROCESS_TYPE_DASHBOARD_AGENT, str(tmp_path))
    with _lean_head():
        lean = services._build_python_executable_command_memory_profileable
        agent = lean(ray_constants.PROCESS_TYPE_DASHBOARD_AGENT, str(tmp_path))
        others = lean(ray_constants.PROCESS_TYPE_RUNTIME_ENV_AGENT, str(tmp_path))
    shim = raylight.driver.runtime.EMBEDDED_AGENT
    assert agent == [*plain, str(shim)] and shim.is_file()
    assert others == build(ray_constants.PROCESS_TYPE_RUNTIME_ENV_AGENT, str(tmp_path)) == plain
    assert services._build_python_executable_command_memory_profileable is build


def test_the_shim_runs_the_agent_s_script_as_ray_would_with_no_dashboard_modules(tmp_path):
    # A stand-in for Ray's agent.py: what it sees of its run, and the modules it would load.
    script = tmp_path / "agent.py"
    script.write_text(
        "import json, sys\n"
        "import ray.dashboard.utils as u\n"
        "from ray.dashboard.utils import DashboardAgentModule\n"
        "print(json.dumps({'name': __name__, 'file': __file__, 'argv': sys.argv, 'path0': sys.path[0],\n"
        "    'modules': u.get_all_modules(DashboardAgentModule), 'raylight': 'raylight' in sys.modules}))\n"
    )
    shim = raylight.driver.runtime.EMBEDDED_AGENT
    out = subprocess.run(
        [sys.executable, "-u", str(shim), str(script), "--node-id=x", "--minimal"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen == {
        "name": "__main__", "file": str(script), "argv": [str(script), "--node-id=x", "--minimal"],
        "path0": str(tmp_path), "modules": [], "raylight": False,
    }


class _Gcs:
    """A GCS client that lists the node from its ``registers``-th answer on (never: 0)."""

    def __init__(self, registers: int, node_id: str = "ab" * 28) -> None:
        self.registers, self.node_id, self.asked = registers, node_id, 0

    def get_all_node_info(self, timeout: float) -> dict:
        self.asked += 1
        key = type("NodeID", (), {"hex": lambda _: self.node_id})()
        return {key: None} if self.registers and self.asked >= self.registers else {}


def test_the_fast_wait_for_the_node_ends_once_the_gcs_lists_it_or_after_its_limit(monkeypatch):
    gcs = _Gcs(registers=3)
    assert _wait_for_node(gcs, "ab" * 28) is True and gcs.asked == 3
    monkeypatch.setattr(raylight.driver.runtime, "NODE_FAST_WAIT_S", 0.2)
    never = _Gcs(registers=0)
    assert _wait_for_node(never, "ab" * 28) is False and never.asked > 1  # then Ray's own wait
    assert _wait_for_node(_Gcs(registers=1, node_id="cd" * 28), "ab" * 28) is False  # another node


def test_the_fast_wait_leaves_a_gcs_that_fails_to_ray_s_own_wait():
    class Down:
        def get_all_node_info(self, timeout: float) -> dict:
            raise RuntimeError("RPC error: Deadline Exceeded")

    assert _wait_for_node(Down(), "ab" * 28) is False


_PATCHED = [
    (node.Node, "start_api_server"),
    (node.Node, "start_monitor"),
    (ray_utils, "get_dashboard_dependency_error"),
    (services, "_build_python_executable_command_memory_profileable"),
    (node.Node, "start_ray_processes"),
]


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
