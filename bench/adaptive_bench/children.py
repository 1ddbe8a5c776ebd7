"""The child processes, each a cold process with its own local Ray (NUM_WORKERS CPUs),
started by the parent as ``bench/adaptive.py --child NAME --job JSON`` (CHILDREN names
them): one time-to-target run of raylight or Ray Train, one repetition of the throughput
pair, one series of forced layouts, one resize. Each writes its result to the job's
result_path, and what raylight's driver learned (resizes, the adaptive state and trace)
to driver.json beside it."""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from common import run_ray_train

from adaptive_bench import NUM_WORKERS, TPUT_ORDER
from adaptive_bench.analysis import forward_predictions
from adaptive_bench.loops import (
    elastic_loop,
    ray_train_ttt_loop,
    raylight_ttt_loop,
    throughput_loop,
)
from adaptive_bench.tasks import tensors


def adaptive_config(job: dict[str, Any]) -> Any:
    from raylight import AdaptiveConfig

    return AdaptiveConfig(**job["adaptive"]) if job.get("adaptive") else None


def write_driver_info(job: dict[str, Any], result: Any) -> None:
    """What the driver learned, for the parent: resizes and the adaptive state."""
    run_dir = Path(result.path)
    info: dict[str, Any] = {"resizes": result.resizes, "reports": len(result.metrics_history)}
    state = run_dir / "adaptive_state.json"
    if state.exists():
        info["engine_state"] = json.loads(state.read_text())
    trace = run_dir / "adaptive.jsonl"
    if trace.exists():
        rows = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
        info["trace_rows"] = len(rows)
        info["batch_decisions"] = [r.get("reason") for r in rows if r.get("decision") == "batch"]
        info["forward_predictions"] = forward_predictions(rows)
    if (run_dir / "adaptive.png").exists():
        shutil.copy(run_dir / "adaptive.png", Path(job["result_path"]).with_name("adaptive.png"))
    Path(job["result_path"]).with_name("driver.json").write_text(json.dumps(info, default=str))


@contextlib.contextmanager
def embedded_ray(job: dict[str, Any]) -> Iterator[None]:
    """The child's own local Ray (NUM_WORKERS CPUs, the job's temp dir), shut down after."""
    import ray

    from raylight.driver import runtime

    runtime.start_embedded(num_cpus=NUM_WORKERS, temp_dir=job["ray_temp_dir"])
    try:
        yield
    finally:
        ray.shutdown()


def bench_fit(
    loop: Callable[..., Any], config: dict[str, Any], adaptive: Any, storage_path: str, name: str
) -> Any:
    """One raylight run as every raylight child runs it: NUM_WORKERS workers, no display."""
    import raylight

    return raylight.fit(
        loop,
        config=config,
        num_workers=NUM_WORKERS,
        adaptive=adaptive,
        progress=False,
        storage_path=storage_path,
        name=name,
    )


def child_raylight(job: dict[str, Any]) -> None:
    """raylight_fixed / raylight_adaptive (time to target)."""
    with embedded_ray(job):
        result = bench_fit(
            raylight_ttt_loop, job, adaptive_config(job), job["storage_path"], "bench"
        )
        write_driver_info(job, result)


def child_ray_train(job: dict[str, Any]) -> None:
    """ray_train_fixed (time to target)."""
    run_ray_train(ray_train_ttt_loop, job, NUM_WORKERS)


def child_tput(job: dict[str, Any]) -> None:
    """The throughput pair in one child and one embedded cluster: ``tput_blocks`` blocks,
    each in the order fixed, pinned, pinned, fixed. Rates drift by several percent from
    one run to the next on a shared machine; within a block the drift hits both systems
    alike, and each block's overhead is the ratio of the two systems' mean rates."""
    runs = []
    with embedded_ray(job):
        for block in range(job["tput_blocks"]):
            for system in TPUT_ORDER:
                i = len(runs)
                run_job = dict(job, system=system, result_path=f"{job['result_path']}.{i}")
                adaptive = adaptive_config(job) if system == "raylight_pinned" else None
                cpu = time.process_time()
                bench_fit(throughput_loop, run_job, adaptive, f"{job['storage_path']}/{i}", "bench")
                result = json.loads(Path(run_job["result_path"]).read_text())
                result["driver_cpu_s"] = time.process_time() - cpu
                runs.append({"system": system, "block": block, **result})
    Path(job["result_path"]).write_text(json.dumps({"runs": runs}))


def child_sweep(job: dict[str, Any]) -> None:
    """Forced layouts for the throughput model: short adaptive runs on digits, one per
    atomic batch, each pinned there (local_batch_bounds=(m, m)), in one Ray session; their
    profiles are merged as the engine merges increments."""
    from raylight import AdaptiveConfig
    from raylight.adaptive.profile import StepProfile

    train_size = len(tensors(job, "train"))
    merged = StepProfile()
    runs = []
    with embedded_ray(job):
        for atomic in job["atomic_sizes"]:
            batch = NUM_WORKERS * atomic
            epochs = max(1, math.ceil(job["steps"] * batch / train_size))
            config = dict(job, batch_size=batch, epochs=epochs, system="raylight_adaptive")
            pinned = AdaptiveConfig(
                max_batch_size=batch, local_batch_bounds=(atomic, atomic), accumulation=False
            )
            result = bench_fit(
                raylight_ttt_loop, config, pinned, job["storage_path"], f"sweep-{atomic}"
            )
            state = json.loads((Path(result.path) / "adaptive_state.json").read_text())
            merged.merge(StepProfile.from_json(state["profile"]))
            runs.append({"atomic": atomic, "epochs": epochs, "profile": state["profile"]})
    Path(job["result_path"]).write_text(json.dumps({"profile": merged.to_json(), "runs": runs}))


def _wait_for(cond: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def child_resize(job: dict[str, Any]) -> None:
    """Grow 1 -> 2 workers: a blocker holds one CPU until the first checkpoint (and, for
    in_place, until the warm spare is ready: the CPU comes back while one waits)."""
    import ray

    import raylight
    from raylight import RunConfig, ScalingConfig, TrainerConfig

    with embedded_ray(job):

        @ray.remote(num_cpus=1)
        class Blocker:
            def ready(self) -> bool:
                return True

        blocker = Blocker.remote()  # type: ignore[attr-defined]
        ray.get(blocker.ready.remote())
        run_dir = Path(job["storage_path"]) / "bench"
        trainer = raylight.Trainer(
            elastic_loop,
            train_loop_config=job,
            config=TrainerConfig(
                scaling=ScalingConfig(
                    num_workers=(1, NUM_WORKERS),
                    scaling_policy="max",
                    resize_interval_s=0.3,
                    resize_in_place=job["resize_kind"] != "checkpoint",
                    warm_spare=job["resize_kind"] == "in_place",
                ),
                run=RunConfig(storage_path=job["storage_path"], name="bench", progress=False),
            ),
        )
        out: dict[str, Any] = {}

        def fit() -> None:
            try:
                out["result"] = trainer.fit()
            except BaseException as exc:  # reported by the parent through the exit code
                out["error"] = exc

        thread = threading.Thread(target=fit, name="fit")
        thread.start()
        events: dict[str, float] = {}
        try:
            trace = run_dir / "adaptive.jsonl"

            def ready_to_grow() -> bool:
                if not thread.is_alive():
                    return True
                if not any(run_dir.glob("checkpoints/*/meta.json")):
                    return False
                return job["resize_kind"] != "in_place" or (
                    trace.exists() and '"event": "spare_ready"' in trace.read_text()
                )

            if _wait_for(ready_to_grow, 120):
                events["blocker_killed"] = time.time()
                ray.kill(blocker)

                def resized() -> bool:
                    return (
                        trace.exists() and '"event": "resized"' in trace.read_text()
                    ) or not thread.is_alive()

                _wait_for(resized, 120)
        finally:
            Path(job["stop_file"]).touch()
            thread.join(180)
        if "error" in out:
            raise out["error"]
        result = out["result"]
        write_driver_info(job, result)
        workers = [m.get("workers") for m in result.metrics_history]
        Path(job["result_path"]).write_text(
            json.dumps({"events": events, "workers_per_epoch": workers})
        )


CHILDREN = {
    "raylight": child_raylight,
    "ray_train": child_ray_train,
    "resize": child_resize,
    "sweep": child_sweep,
    "tput": child_tput,
}
