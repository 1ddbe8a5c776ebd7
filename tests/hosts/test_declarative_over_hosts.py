"""`raylight train` and `raylight hyperopt` submitted from a laptop (issue 57): host d runs
only the CLI, with the cluster's token; the job's driver runs on the head a (no CPU), the
workers and trials on b and c. The dataset and the output directories are on the shared
directory, except where a test says the output is the driver's own disk."""

from __future__ import annotations

import json
import os
import sys

import pytest
import yaml

from tests.hosts.harness import RUN, SHARED
from tests.hosts.ray_cluster import DASHBOARD_PORT, RayOverHosts, cluster_env

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(480)]  # 53 s quiet, 3-4 min at load 30
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RAYLIGHT = os.path.join(os.path.dirname(sys.executable), "raylight")
FEATURES = ["mean_radius", "mean_texture", "mean_perimeter", "mean_area", "worst_radius", "worst_area"]


def _config(num_workers: int, hyperopt: bool) -> dict:
    config = {
        "input_features": [{"name": n, "type": "number"} for n in FEATURES],
        "output_features": [{"name": "diagnosis", "type": "category"}],
        "combiner": {"type": "concat", "fc_layers": [{"output_size": 16}]},
        "trainer": {"epochs": 2, "batch_size": 64, "learning_rate": 0.01, "early_stop": -1},
        "preprocessing": {"split": {"type": "random", "probabilities": [0.7, 0.15, 0.15]}},
        "backend": {"type": "ray", "processor": {"type": "pandas"},
                    "trainer": {"num_workers": num_workers, "resources_per_worker": {"CPU": 1}}},
    }
    if hyperopt:
        config["hyperopt"] = {
            "goal": "maximize", "metric": "accuracy", "split": "validation",
            "parameters": {"trainer.learning_rate": {"space": "grid", "values": [0.01, 0.05]}},
            "search_alg": {"type": "grid"},
            "executor": {"num_samples": 1, "max_concurrent_trials": "auto"},
        }
    return config


def test_train_and_hyperopt_from_a_laptop_write_to_the_shared_directory_and_a_local_one_is_refused(make_hosts):
    """train with 2 workers (b, c): the model and the run's checkpoints in the shared output
    directory. hyperopt with its output on the driver's own disk (a's /tmp): refused before
    preprocessing or any trial, naming b and c (before: the trials placed on b and c wrote
    there, and were lost). hyperopt on the shared directory: both trials, one on each of b
    and c at once, finish there."""
    made = make_hosts(["a", "b", "c", "d"], env=cluster_env())
    cluster = RayOverHosts(made, head="a", raylets={"b": 1, "c": 1})
    cluster.give_token("d")
    write = (  # in a process of its own: scikit-learn's import sets KMP_INIT_AT_FORK
        f"import sys; sys.path.insert(0, {os.path.join(REPO, 'examples', 'declarative')!r}); "
        f"from make_datasets import write_all; print(write_all({SHARED + '/data'!r})['breast_cancer'])"
    )
    data = made.run("a", [sys.executable, "-c", write], timeout=120).stdout.split()[-1]
    for name, config in (("train", _config(2, False)), ("search", _config(1, True))):
        with open(os.path.join(made.shared, f"{name}.yaml"), "w") as f:
            yaml.safe_dump(config, f)
    url = f"http://{made.address('a')}:{DASHBOARD_PORT}"

    def submit(name: str, *args: str):
        cmd = [RAYLIGHT, "submit", "--address", url, "--name", name, "--", "raylight", *args, "--dataset", data, "--quiet"]
        return made.run("d", cmd, timeout=360, check=False)

    done = submit("train", "train", "--config", f"{SHARED}/train.yaml", "--output-directory", f"{SHARED}/out/train")
    assert done.returncode == 0, done.stdout + done.stderr
    out = os.path.join(made.shared, "out", "train")
    assert os.path.isdir(os.path.join(out, "model")), os.listdir(out)
    assert any(n.startswith("checkpoint_") for n in os.listdir(os.path.join(out, "checkpoints"))), os.listdir(out)

    local = f"{RUN}/search"  # on a's own disk: the job's driver runs on the head
    done = submit("local-search", "hyperopt", "--config", f"{SHARED}/search.yaml", "--output-directory", local)
    assert done.returncode != 0, done.stdout + done.stderr
    said = " ".join((done.stdout + done.stderr).split())
    assert f"--output-directory '{local}' is not shared with every node Ray may place a trial on" in said, said
    assert "on b (198.18.0.2)" in said and "on c (198.18.0.3)" in said and "NFS" in said, said
    for host in ("a", "b", "c"):
        root = f"/proc/{made.hosts[host].holder.pid}/root{RUN}"
        assert not os.path.exists(f"{root}/search/tune"), f"no trial started ({host})"
        assert not [n for n in os.listdir(root) if n.startswith(".raylight-reach-")], f"the marker stays behind on {host}"

    done = submit("search", "hyperopt", "--config", f"{SHARED}/search.yaml", "--output-directory", f"{SHARED}/out/search")
    assert done.returncode == 0, done.stdout + done.stderr
    out = os.path.join(made.shared, "out", "search")
    with open(os.path.join(out, "results.json")) as f:
        results = json.load(f)
    trials = sorted(results["trials"], key=lambda t: t["config.trainer.learning_rate"])
    assert [(t["config.trainer.learning_rate"], t["status"]) for t in trials] == [(0.01, "COMPLETED"), (0.05, "COMPLETED")], trials
    assert os.path.isfile(os.path.join(out, "best_config.yaml"))
    trial_dirs = [d for d in os.listdir(os.path.join(out, "tune")) if os.path.isdir(os.path.join(out, "tune", d))]
    assert len(trial_dirs) == 2, trial_dirs
    for d in trial_dirs:  # each trial's results and checkpoints reached the shared output directory
        names = os.listdir(os.path.join(out, "tune", d))
        assert "result.json" in names and any(n.startswith("checkpoint_") for n in names), (d, names)
