"""A dataset path that only the driver's host has (issue 57): `raylight train --dataset
/tmp/run/data.parquet` on host a, the file in a's private /tmp, the two training workers on
b and c. It must be read where it exists and shipped: by the driver (processor pandas), by
Ray Data read tasks placed on the driver's node (processor ray_data)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.declarative_data import CONFIG, frame
from tests.hosts.harness import RUN
from tests.hosts.ray_cluster import cluster_env, start_ray

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(600)]


@pytest.mark.parametrize("processor", ["pandas", "ray_data"])  # pandas: passed first time; ray_data found the bug
def test_a_dataset_only_on_the_driver_s_host_is_read_there_and_trains_on_workers_elsewhere(make_hosts, processor):
    made = make_hosts(["a", "b", "c"], env=cluster_env())
    cluster = start_ray(made, head="a", raylets={"b": 1, "c": 1})
    on_a = f"/proc/{made.hosts['a'].holder.pid}/root{RUN}"  # a's own disk
    frame(200).to_parquet(os.path.join(on_a, "data.parquet"))
    backend = f"backend: {{type: ray, processor: {{type: {processor}}}, trainer: {{num_workers: 2}}}}"
    config = CONFIG.replace("backend: {type: local}", backend).replace("epochs: 6", "epochs: 2")
    with open(os.path.join(on_a, "config.yaml"), "w") as f:
        f.write(config)
    for host in ("b", "c"):  # the path is a's alone
        assert made.run(host, ["test", "-e", f"{RUN}/data.parquet"], check=False).returncode != 0
    cmd = [
        "env", f"RAY_ADDRESS={cluster.address}", sys.executable, "-m", "raylight.cli", "train",
        "--config", f"{RUN}/config.yaml", "--dataset", f"{RUN}/data.parquet",
        "--output-directory", f"{RUN}/out",
    ]
    done = made.run("a", cmd, timeout=420, check=False)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    with open(os.path.join(on_a, "out", "evaluation.json")) as f:
        evaluation = json.load(f)
    assert "test" in evaluation, evaluation
    assert os.path.isdir(os.path.join(on_a, "out", "model"))
