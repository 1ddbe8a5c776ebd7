"""Connecting to Ray: bad addresses fail fast with the setting named, nothing written."""

import subprocess
import sys

from raylight.runtime import _host_port
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
