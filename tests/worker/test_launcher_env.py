"""launcher_env: each launcher's variables read into one LaunchEnv, bad ones named, and
the three rendezvous forming real gloo groups across two processes (no Ray)."""

from __future__ import annotations

import http.server
import os
import tempfile
import threading
import time

import pytest

from raylight.worker.process_group import (
    LaunchEnvError,
    detect,
    init_process_group,
    rendezvous_timeout_s,
)
from tests.helpers import run_gloo_ranks

pytestmark = pytest.mark.timeout(120)

TORCHRUN = {  # what torchrun --nnodes 2 --nproc-per-node 2 gives the second process of node 1
    "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
    "ROLE_RANK": "3", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "none",
}


def test_nothing_launched_is_none():
    assert detect({"PATH": "/bin"}) is None
    assert detect({"RANK": "0"}) is None  # RANK alone is not a launcher's


def test_torchrun():
    env = detect(TORCHRUN)
    assert env is not None
    assert (env.launcher, env.rank, env.world_size, env.local_rank, env.local_world_size) == ("torchrun", 3, 4, 1, 2)
    assert (env.cross_rank, env.cross_size) == (1, 2)
    assert (env.rendezvous, env.master_addr, env.master_port) == ("env", "10.0.0.1", 29500)


def test_deepspeed_launcher():
    env = detect({
        "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "CROSS_RANK": "0", "CROSS_SIZE": "1", "LOCAL_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
    })
    assert env is not None and env.launcher == "deepspeed"
    assert (env.rank, env.world_size, env.local_world_size, env.cross_size) == (1, 2, 2, 1)


def test_horovodrun_gloo():
    env = detect({
        "HOROVOD_RANK": "2", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "2",
        "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
        "HOROVOD_GLOO_RENDEZVOUS_PORT": "4242", "HOROVOD_CONTROLLER": "gloo",
    })
    assert env is not None and env.launcher == "horovodrun"
    assert (env.rank, env.world_size, env.local_rank, env.cross_rank, env.cross_size) == (2, 4, 0, 1, 2)
    assert (env.rendezvous, env.master_addr, env.master_port) == ("horovod", "127.0.0.1", 4242)


def test_openmpi_one_node_uses_a_file_named_after_the_job():
    env = detect({
        "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_ess_base_jobid": "3172859905",
    })
    assert env is not None and (env.launcher, env.rendezvous) == ("mpirun", "file")
    assert env.rendezvous_id == "raylight-mpi-3172859905" and env.cross_size == 1


def test_openmpi_node_rank_is_not_the_node():
    """OpenMPI 4.1's `mpirun -np 2` on one node sets OMPI_COMM_WORLD_NODE_RANK=1 on rank 1
    (its rank among the node's processes); both ranks are on node 0 of 1."""
    env = detect({
        "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "1", "OMPI_MCA_ess_base_jobid": "1",
    })
    assert env is not None and (env.cross_rank, env.cross_size) == (0, 1)
    two_nodes = detect({
        "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1",
    })
    assert two_nodes is not None and (two_nodes.cross_rank, two_nodes.cross_size) == (1, 2)


def test_mpich_with_a_master_address():
    env = detect({"PMI_RANK": "0", "PMI_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1234"})
    assert env is not None and (env.launcher, env.rendezvous, env.master_port) == ("mpirun", "env", 1234)


@pytest.mark.parametrize(
    "environ, words",
    [
        ({"RANK": "0", "WORLD_SIZE": "2"}, ["MASTER_ADDR and MASTER_PORT are not"]),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "h"}, ["MASTER_PORT is not set"]),
        ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, ["RANK='x'", "not an integer"]),
        ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, ["rank 2 is outside 0..1"]),
        ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, ["LOCAL_RANK is not set"]),
        ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}, ["HOROVOD_GLOO_RENDEZVOUS_ADDR", "--gloo"]),
        (
            {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
            ["across nodes", "-x MASTER_ADDR"],
        ),
        ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}, ["no MPI job id", "MASTER_ADDR=127.0.0.1"]),
    ],
)
def test_bad_launcher_environments_are_named(environ, words):
    with pytest.raises(LaunchEnvError) as err:
        detect(environ)
    for word in words:
        assert word in str(err.value)


def test_rendezvous_timeout_setting():
    assert rendezvous_timeout_s({}) == 300.0
    assert rendezvous_timeout_s({"RAYLIGHT_RENDEZVOUS_TIMEOUT_S": "12.5"}) == 12.5
    with pytest.raises(LaunchEnvError, match="RAYLIGHT_RENDEZVOUS_TIMEOUT_S"):
        rendezvous_timeout_s({"RAYLIGHT_RENDEZVOUS_TIMEOUT_S": "soon"})


def _meet(rank: int, port: int, environ: dict[str, str], queue) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    env = {k: v.replace("{rank}", str(rank)).replace("{port}", str(port)) for k, v in environ.items()}
    launch = detect(env)
    assert launch is not None and launch.rank == rank
    init_process_group(launch, "gloo", timeout_s=60)
    try:
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        queue.put({"rank": rank, "sum": float(t.item()), "size": dist.get_world_size()})
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_env_rendezvous_forms_a_group():
    got = run_gloo_ranks(_meet, {
        "RANK": "{rank}", "WORLD_SIZE": "2", "LOCAL_RANK": "{rank}", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "{port}",
    })
    assert [got[r]["sum"] for r in (0, 1)] == [3.0, 3.0]


@pytest.mark.distributed
def test_file_rendezvous_forms_a_group_for_one_node_mpirun():
    job = f"test{os.getpid()}-{time.time_ns()}"
    path = os.path.join(tempfile.gettempdir(), f"raylight-mpi-{job}")
    try:
        got = run_gloo_ranks(_meet, {
            "OMPI_COMM_WORLD_RANK": "{rank}", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "{rank}",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_ess_base_jobid": job,
        })
    finally:
        # torch's FileStore deletes its file when the last rank's store is destroyed, which
        # a rank that exits without destroying it skips (seen once in a full run): not
        # raylight's promise, so the test only tidies up.
        if os.path.exists(path):
            os.remove(path)
    assert [got[r]["sum"] for r in (0, 1)] == [3.0, 3.0]


class _KeyValue(http.server.BaseHTTPRequestHandler):
    """horovodrun's rendezvous API (PUT/GET /scope/key, 404 until put), which the
    Horovod-less machine lacks; the real server is exercised where Horovod is installed."""

    store: dict[str, bytes] = {}

    def do_PUT(self):
        self.store[self.path] = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        value = self.store.get(self.path)
        self.send_response(200 if value is not None else 404)
        self.send_header("Content-Length", str(len(value or b"")))
        self.end_headers()
        self.wfile.write(value or b"")

    def log_message(self, *args):
        pass


@pytest.mark.distributed
def test_horovod_rendezvous_publishes_rank_zeros_store():
    handler = type("KeyValue", (_KeyValue,), {"store": {}})  # this server's own keys
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        got = run_gloo_ranks(_meet, {
            "HOROVOD_RANK": "{rank}", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "{rank}", "HOROVOD_LOCAL_SIZE": "2",
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": str(server.server_address[1]),
        })
    finally:
        server.shutdown()
        server.server_close()
    assert [got[r]["sum"] for r in (0, 1)] == [3.0, 3.0]
    host = handler.store["/raylight/master"].decode().rpartition(":")[0]
    assert host == "127.0.0.1"  # the store listened on loopback alone, toward a loopback server
