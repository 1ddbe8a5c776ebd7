"""raylight.storage.reach without Ray: the driver's marker, what a worker sees of it, the
error. The same check across real hosts: tests/hosts/test_storage_over_hosts.py."""

from __future__ import annotations

import os

import pytest

from raylight.base.exceptions import ConfigError
from raylight.storage.reach import (
    MARKER_PREFIX,
    marker,
    nearest_existing,
    not_reached_error,
    unseen,
)


def test_the_marker_goes_in_the_nearest_directory_that_exists_and_is_removed_after(tmp_path):
    run = tmp_path / "runs" / "name" / "checkpoints"  # nothing of the run exists yet
    with marker(str(run)) as mark:
        assert mark is not None
        assert os.path.dirname(mark.path) == str(tmp_path)
        assert os.path.basename(mark.path) == MARKER_PREFIX + mark.token
        assert unseen(mark.path, mark.token) is None  # this process sees it
        assert not run.exists()  # the run directory appears only when training starts
    assert not os.path.exists(mark.path)
    assert os.listdir(tmp_path) == []


def test_the_marker_is_removed_when_the_block_raises(tmp_path):
    with pytest.raises(RuntimeError), marker(str(tmp_path)) as mark:
        raise RuntimeError("a worker failed")
    assert mark is not None and not os.path.exists(mark.path)


def test_a_worker_that_sees_no_marker_or_another_s_says_what_it_found(tmp_path):
    with marker(str(tmp_path)) as first, marker(str(tmp_path)) as second:
        assert first is not None and second is not None and first.path != second.path
        assert "holds another run's marker" in (unseen(first.path, second.token) or "")
    assert "does not exist here" in (unseen(first.path, first.token) or "")


def test_an_object_store_gets_its_marker_under_the_run_s_path_removed_after():
    import fsspec

    fs = fsspec.filesystem("memory")
    uri = "memory://reach-bucket/runs/name/checkpoints"
    with marker(uri) as mark:
        assert mark.path == f"{uri}/{MARKER_PREFIX}{mark.token}"
        assert unseen(mark.path, mark.token) is None  # this process reaches the store
        assert "holds another run's marker" in (unseen(mark.path, "another") or "")
    assert not fs.exists(mark.path)
    assert "does not exist here" in (unseen(mark.path, mark.token) or "")


def test_an_object_store_a_worker_cannot_read_says_what_its_client_answered(monkeypatch):
    import fsspec

    def refuse(*args, **kwargs):
        raise ConnectionError("Could not connect to the endpoint URL: http://198.18.0.4:5000/bucket")

    monkeypatch.setattr(fsspec, "open", refuse)
    why = unseen("s3://bucket/runs/.raylight-reach-x", "x", timeout_s=5)
    assert why is not None and "cannot be read here" in why and "http://198.18.0.4:5000" in why, why


def test_an_object_store_read_that_does_not_answer_is_bounded(monkeypatch):
    import threading

    import fsspec

    release = threading.Event()
    monkeypatch.setattr(fsspec, "open", lambda *a, **k: release.wait(30))
    try:
        why = unseen("s3://bucket/runs/.raylight-reach-x", "x", timeout_s=0.2)
    finally:
        release.set()
    assert why is not None and "within 0.2 s" in why and "worker_start_timeout_s" in why, why


def test_an_object_store_the_driver_cannot_write_is_a_config_error_naming_endpoint_and_credentials(monkeypatch):
    import fsspec

    def refuse(*args, **kwargs):
        raise PermissionError("Access Denied")

    monkeypatch.setattr(fsspec, "open", refuse)
    with pytest.raises(ConfigError) as err, marker("s3://bucket/runs"):
        pass
    for part in ("RunConfig.storage_path", "s3://bucket/runs", "AWS_ENDPOINT_URL", "credentials"):
        assert part in str(err.value), (part, str(err.value))


def test_the_object_store_error_says_how_every_host_reaches_it():
    err = not_reached_error("s3://b/runs/x/checkpoints", {"b (198.18.0.2)": "s3://b/... cannot be read here (x)"})
    for part in ("RunConfig.storage_path", "s3://b/runs/x/checkpoints", "on b (198.18.0.2)", "not reached by every worker",
                 "AWS_ENDPOINT_URL", "AWS_SECRET_ACCESS_KEY", "route to the endpoint"):
        assert part in str(err), (part, str(err))


def test_nearest_existing_walks_up_to_a_directory(tmp_path):
    assert nearest_existing(str(tmp_path / "a" / "b")) == str(tmp_path)
    assert nearest_existing(str(tmp_path)) == str(tmp_path)


def test_the_error_names_the_setting_the_hosts_and_the_storage_the_run_needs():
    err = not_reached_error("/tmp/runs/x/checkpoints", {"b (198.18.0.2)": "/tmp/.m does not exist here"})
    assert isinstance(err, ConfigError)
    text = str(err)
    for part in ("RunConfig.storage_path", "/tmp/runs/x/checkpoints", "on b (198.18.0.2)", "does not exist here",
                 "shared filesystem", "s3://", "checkpoint='full'"):
        assert part in text, (part, text)


def test_storage_that_cannot_be_written_is_a_config_error(tmp_path):
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK) and os.geteuid() == 0:
            pytest.skip("root writes a read-only directory")
        with pytest.raises(ConfigError, match=r"RunConfig\.storage_path"), marker(str(locked / "runs")):
            pass
    finally:
        locked.chmod(0o700)
