"""raylight.fit under an external launcher: every process torchrun (or an mpirun-style
environment) starts joins its group instead of starting Ray workers; rank 0 records the
run; the result is the same training as Ray workers or one process give (no Ray here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest
import torch

import raylight
from raylight.base.exceptions import ConfigError
from raylight.config import AdaptiveConfig, ScalingConfig, TrainerConfig
from tests.helpers import (
    free_loopback_port,
    mpirun_command,
    openmpi_missing,
    own_temp_dir,
    processes_with,
    torchrun_command,
)
from tests.support import loops

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "launched", "fit_script.py")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    return {**env, "OMP_NUM_THREADS": "1", "RAYLIGHT_RENDEZVOUS_TIMEOUT_S": "60"}


def _torchrun(*args: str) -> subprocess.CompletedProcess:
    cmd = [*torchrun_command(), SCRIPT, *args]
    with own_temp_dir(_env()) as env:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=150, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def open_text(path: str) -> str:
    with open(path) as f:
        return f.read()


def _check_same_as_one_process(out: str) -> None:
    ref = loops.reference_sgd({"lr": 0.05, "batch_size": 32, "epochs": 3})
    got = torch.load(os.path.join(out, "model.pt"), weights_only=True)
    init = loops.initial_model().state_dict()
    for key in ref:
        assert (ref[key] - init[key]).abs().max() > 1e-2, "training must move the parameters"
        assert torch.allclose(got[key], ref[key], atol=1e-5, rtol=0), key
    ranks = [json.loads(open_text(os.path.join(out, f"rank{r}.json"))) for r in (0, 1)]
    assert ranks[0] == ranks[1], "every rank returns rank 0's result"
    assert ranks[0]["history"] == [{"world_size": 2}] and ranks[0]["checkpoint"]
    assert ranks[1]["checkpoint_keys"] == ["model"], "a rank that cannot read rank 0's disk still has the checkpoint"


def test_fit_under_torchrun_joins_its_group_and_trains_as_one_process_would(tmp_path):
    out, runs = tmp_path / "out", tmp_path / "runs"
    out.mkdir()
    _torchrun(str(out), str(runs), "r", "sgd")
    _check_same_as_one_process(str(out))
    rows = [json.loads(line) for line in (runs / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["_workers"], r["world_size"]) for r in rows] == [(2, 2)]  # num_workers=4 was the launcher's 2
    cost = json.loads((runs / "r" / "cost.json").read_text())
    assert set(cost["node_seconds"]) == {"torchrun"}
    assert sorted(os.listdir(runs)) == ["r"], "only rank 0 writes the run"


def test_fit_under_an_mpirun_environment_meets_through_a_job_file(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    procs = []
    for rank in (0, 1):
        env = {
            **_env(), "OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": str(rank),
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_ess_base_jobid": f"t{os.getpid()}{tmp_path.name}",
        }
        procs.append(subprocess.Popen(
            [sys.executable, SCRIPT, str(out), str(tmp_path / "runs"), "m", "sgd"], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        ))
    try:
        logs = [p.communicate(timeout=150)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], logs
    _check_same_as_one_process(str(out))


@pytest.mark.skipif(openmpi_missing() is not None, reason=str(openmpi_missing()))
def test_fit_under_real_mpirun_joins_its_group_through_the_job_file(tmp_path):
    """OpenMPI's own `mpirun -np 2` (no MASTER_ADDR): the ranks meet through the job-named
    file store, train as one process would, rank 0 alone writes, nothing is left behind."""
    out, runs = tmp_path / "out", tmp_path / "runs"
    out.mkdir()
    done = subprocess.run(
        [*mpirun_command(2), sys.executable, SCRIPT, str(out), str(runs), "m", "sgd"],
        capture_output=True, text=True, timeout=150, env=_env(), stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    _check_same_as_one_process(str(out))
    places = [json.loads((out / f"place{r}.json").read_text()) for r in (0, 1)]
    job = places[0][-1]
    assert job.startswith("raylight-mpi-") and places == [[0, 2, 0, 2, 0, 1, "file", job], [1, 2, 1, 2, 0, 1, "file", job]]
    rows = [json.loads(line) for line in (runs / "m" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["_workers"], r["world_size"]) for r in rows] == [(2, 2)]
    assert set(json.loads((runs / "m" / "cost.json").read_text())["node_seconds"]) == {"mpirun"}
    assert sorted(os.listdir(runs)) == ["m"], "only rank 0 writes the run"
    assert not os.path.exists(os.path.join(tempfile.gettempdir(), job)), "the rendezvous file is gone"
    assert not processes_with(str(out)), "no process of the launch is left"


def test_a_launched_run_resumes_every_rank_from_rank_zeros_checkpoint(tmp_path):
    out, runs = tmp_path / "out", tmp_path / "runs"
    out.mkdir()
    _torchrun(str(out), str(runs), "e", "epochs", "2")
    _torchrun(str(out), str(runs), "e", "epochs", "4", "--resume")
    assert [(out / f"start{r}.txt").read_text().split() for r in (0, 1)] == [["0", "2"], ["0", "2"]]
    history = json.loads((out / "rank1.json").read_text())["history"]
    assert [h["epoch"] for h in history] == [0, 1, 2, 3]
    assert not processes_with(str(out)), "no process of the launches is left"


@pytest.fixture
def launched_alone(monkeypatch):
    """This process as rank 0 of a one-process torchrun."""
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_loopback_port()), "TORCHELASTIC_RUN_ID": "test"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def test_a_one_process_launch_runs_here_and_records(launched_alone, tmp_path):
    config = {"lr": 0.05, "batch_size": 32, "epochs": 1}
    result = raylight.fit(loops.sgd_loop, config=config, num_workers=2, storage_path=str(tmp_path), name="one", progress=False)
    assert result.metrics == {"world_size": 1} and result.checkpoint is not None
    assert not torch.distributed.is_initialized(), "the group raylight formed is destroyed after the run"


def test_adaptive_under_a_launcher_is_refused_with_the_way_out(launched_alone, tmp_path):
    with pytest.raises(ConfigError, match=r"torchrun.*adaptive and elastic training need raylight's own Ray workers"):
        raylight.fit(loops.sgd_loop, config={}, num_workers=2, adaptive=AdaptiveConfig(), storage_path=str(tmp_path), progress=False)
    assert not (tmp_path / "runs").exists() and not os.listdir(tmp_path), "nothing written"


def test_launcher_ignore_runs_as_if_no_launcher_had(launched_alone, tmp_path):
    config = TrainerConfig(scaling=ScalingConfig(num_workers=0, launcher="ignore"))
    trainer = raylight.Trainer(loops.sgd_loop, train_loop_config={"lr": 0.05, "batch_size": 32, "epochs": 1}, config=config)
    assert trainer._launched() is None
    assert trainer.fit().metrics == {"world_size": 1}


def test_raylight_train_under_the_deepspeed_launcher(tmp_path):
    """Ludwig's `deepspeed --no_python ... ludwig train`: the launcher puts --local_rank=N in
    front of the command; both ranks train, rank 0 writes the output directory."""
    pytest.importorskip("deepspeed")
    from tests.declarative_data import CONFIG, write

    cfg, data = write(tmp_path, config=CONFIG.replace("backend: {type: local}", "backend: {type: deepspeed}"))
    bin_dir = os.path.dirname(sys.executable)
    env = {**_env(), "DS_ACCELERATOR": "cpu", "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        [os.path.join(bin_dir, "deepspeed"), "--num_gpus", "2", "--master_port", str(free_loopback_port()), "--no_python",
         os.path.join(bin_dir, "raylight"), "train", "--config", cfg, "--dataset", data, "--output-directory",
         str(tmp_path / "out"), "--quiet"],
        capture_output=True, text=True, timeout=150, env=env, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "out" / "model" / "weights.safetensors").exists()
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert {r["_workers"] for r in rows} == {2}
    assert (done.stdout + done.stderr).count('"best_epoch"') == 1


def test_a_group_the_script_formed_without_a_cpu_backend_is_refused_with_the_fix(launched_alone, tmp_path):
    """A script's own init_process_group("nccl") has no backend for CPU tensors, which
    raylight's bookkeeping reduces; "cuda:gloo" stands in for it on this machine without NCCL."""
    torch.distributed.init_process_group("cuda:gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(ConfigError, match=r"\(cuda:gloo\) has no backend for CPU tensors.*backend='cpu:gloo,cuda:nccl'"):
            raylight.fit(loops.sgd_loop, config={"lr": 0.05, "batch_size": 32, "epochs": 1}, num_workers=2,
                         storage_path=str(tmp_path), progress=False)
        assert not os.listdir(tmp_path), "nothing written"
    finally:
        torch.distributed.destroy_process_group()
