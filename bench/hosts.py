"""Several machines (issue 57): bench/overhead.py's job across two hosts, raylight and torchrun
side by side, and how long a host's death stops an elastic run.

Run:  make bench-hosts                 (root: fake hosts, tests/hosts/harness.py)
      python bench/hosts.py [--reps 1] [--samples 60000] [--epochs 2]
      python bench/hosts.py --quick    (smoke run: tiny sizes)

The hosts are tests/hosts/harness.py's: separate network namespaces on one box (their own
address on 198.18.0.0/24, over veths and a bridge), each its own /tmp, /dev/shm, home and
hostname, one shared directory (what NFS gives a cluster). A Ray cluster over them
(tests/hosts/ray_cluster.py): the head on a (no CPU), raylets on b (2 CPUs) and c (1 CPU),
token authentication on. All hosts share this box's CPUs: "two hosts" here means two
network stacks and two disks, not twice the cores, so what is measured is what crossing
machines costs (gloo over TCP between hosts, no shared memory), not more compute.

The job is bench/overhead.py's (an MLP 32-256-256-10, DDP over gloo, 1 torch thread per
worker, SGD, global batch 128, 2 epochs of 60,000 samples), in four rows, interleaved:

  raylight_two_hosts  raylight.fit from a, 2 workers, placement STRICT_SPREAD: one on b, one on c
  torchrun_two_hosts  `torchrun --nnodes 2 --nproc_per_node 1` on b (node rank 0, the master) and c
  raylight_one_host   the same fit, placement STRICT_PACK: both workers on b
  torchrun_one_host   `torchrun --nnodes 1 --nproc_per_node 2` on b

torchrun gets what a user gives it across machines: the master's address and
GLOO_SOCKET_IFNAME=eth0 (gloo otherwise resolves the hostname, which no host's /etc/hosts
names). Then, once: an elastic raylight run (1-2 workers, one on b and one on c) trains until
every process of c is SIGKILLed (the machine dies) mid-epoch; host_death_to_first_step_s is the
time from the kill to the end of the first step of the run shrunk onto b (every rank writes each
step's end on the wall clock into the shared directory; the hosts share the box's clock).

Results: a table on stdout and bench/results/hosts.json: each row's steady samples/s and
start-to-first-step (overhead.py's StepClock, from the row's launch),
raylight_vs_torchrun_two_hosts_throughput (goal >= 1.0), each system's two hosts over one host,
host_death_to_first_step_s (goal <= 2 s) with the resizes the driver saw.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO), str(BENCH)]  # the hosts harness (tests/hosts) and the overhead job

from common import machine_info, ratio, read_result, run_child, write_results  # noqa: E402
from overhead import make_dataset, make_model, raylight_loop  # noqa: E402

NUM_WORKERS = 2
TORCHRUN_PORT = 29500  # on b's own address: each host has its own network
THROUGHPUT_GOAL = 1.0  # raylight across two hosts >= this x torchrun across the same two
DEATH_GOAL_S = 2.0  # a host's death to the first step of the shrunk run
ROWS = ("raylight_two_hosts", "torchrun_two_hosts", "raylight_one_host", "torchrun_one_host")
DEATH_STEPS_BEFORE = 30  # steps at 2 workers before the kill
DEATH_WAIT_S = 240.0  # the longest wait for either side of the kill
RESULTS_DIR = BENCH / "results"


# -- children, run on a host ------------------------------------------------------------------


def child_raylight(job: dict[str, Any]) -> None:
    """On a: the overhead job through raylight.fit on the cluster (RAY_ADDRESS)."""
    import raylight

    raylight.fit(
        raylight_loop, config=job, num_workers=NUM_WORKERS, placement=job["placement"],
        storage_path=job["storage_path"], name=job["name"], progress=False,
    )


def elastic_loop(ctx: Any, job: dict[str, Any]) -> None:
    """The overhead job's model and data, epochs until ``stop`` appears (agreed at an epoch's
    end); every rank appends "wall-clock step end, world size" to its host's steps file."""
    import socket

    import torch
    from torch import nn

    torch.set_num_threads(1)
    model = ctx.prepare_model(make_model(job["seed"]))
    opt = torch.optim.SGD(model.parameters(), lr=job["lr"], momentum=0.9)
    loader = ctx.prepare_loader(make_dataset(job["samples"], job["seed"]), batch_size=job["batch_size"], shuffle=True)
    steps = open(os.path.join(job["dir"], f"steps-{socket.gethostname()}"), "a")  # noqa: SIM115
    loss_fn = nn.CrossEntropyLoss()
    for _ in ctx.epochs(10_000):
        for x, y in loader:
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            steps.write(f"{time.time()} {ctx.world_size}\n")
            steps.flush()
        if ctx.all_reduce(float(os.path.exists(job["stop"])), op="max") > 0:
            break
    steps.close()


def child_elastic(job: dict[str, Any]) -> None:
    """On a: the elastic run of 1-2 workers, one per host; prints its resizes (JSON)."""
    from raylight import RunConfig, ScalingConfig, Trainer, TrainerConfig

    trainer = Trainer(
        elastic_loop,
        train_loop_config=job,
        config=TrainerConfig(
            scaling=ScalingConfig(num_workers=(1, NUM_WORKERS), placement="STRICT_SPREAD", scaling_policy="max"),
            run=RunConfig(storage_path=job["storage_path"], name="elastic", progress=False),
        ),
    )
    result = trainer.fit()
    print(json.dumps({"resizes": result.resizes, "num_failures": result.num_failures}))


def _by_value(child: Any) -> Any:
    """``child``, with overhead.py's code sent to the workers by value: they do not have
    bench/ on their path (and must not: its modules' names, e.g. lightning.py, would
    shadow packages)."""

    def run(job: dict[str, Any]) -> None:
        import overhead
        import ray.cloudpickle

        ray.cloudpickle.register_pickle_by_value(overhead)
        child(job)

    return run


CHILDREN = {"raylight": _by_value(child_raylight), "elastic": _by_value(child_elastic)}


# -- the parent: hosts, cluster, rows -----------------------------------------------------------


class Bench:
    """The hosts and the cluster over them, and one run of each row."""

    def __init__(self, job: dict[str, Any], timeout_s: float) -> None:
        from tests.hosts.harness import SHARED, Hosts
        from tests.hosts.ray_cluster import RayOverHosts, cluster_env

        self.hosts = Hosts(["a", "b", "c"], env=cluster_env()).__enter__()
        self.cluster = RayOverHosts(self.hosts, head="a", raylets={"b": 2, "c": 1})
        self.shared_in, self.job, self.timeout_s, self.count = SHARED, job, timeout_s, 0

    def close(self) -> None:
        self.hosts.close()

    def _job(self, row: str) -> dict[str, Any]:
        self.count += 1
        name = f"{row}-{self.count}"
        return {**self.job, "name": name, "storage_path": f"{self.shared_in}/runs",
                "result_path": f"{self.shared_in}/{name}.json"}

    def _on_box(self, path_in_hosts: str) -> str:
        return os.path.join(self.hosts.shared, os.path.relpath(path_in_hosts, self.shared_in))

    def _python(self, *args: str) -> list[str]:
        return ["env", f"RAY_ADDRESS={self.cluster.address}", sys.executable, str(BENCH / "hosts.py"), *args]

    def _torchrun(self, job: dict[str, Any], nnodes: int, node_rank: int, nproc: int, master: str) -> list[str]:
        ifname = "eth0" if nnodes > 1 else "lo"
        return [
            "env", f"GLOO_SOCKET_IFNAME={ifname}", sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(nnodes), "--node_rank", str(node_rank), "--nproc_per_node", str(nproc),
            "--master_addr", master, "--master_port", str(TORCHRUN_PORT), "--log-dir", f"/tmp/run/torchrun-{job['name']}",
            str(BENCH / "overhead.py"), "--child", "torchrun-worker", "--job", json.dumps(job),
        ]

    def row(self, row: str) -> dict[str, Any]:
        job = self._job(row)
        if row.startswith("raylight"):
            job["placement"] = "STRICT_SPREAD" if row.endswith("two_hosts") else "STRICT_PACK"
            commands = {"a": self._python("--child", "raylight", "--job", json.dumps(job))}
        elif row.endswith("two_hosts"):
            master = self.hosts.address("b")
            commands = {"b": self._torchrun(job, 2, 0, 1, master), "c": self._torchrun(job, 2, 1, 1, master)}
        else:
            commands = {"b": self._torchrun(job, 1, 0, 2, "127.0.0.1")}
        launched = time.time()
        procs = {h: self.hosts.popen(h, cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for h, cmd in commands.items()}
        record: dict[str, Any] = {"system": row, "ok": False}
        outputs = {}
        for host, proc in procs.items():
            try:
                outputs[host], _ = proc.communicate(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                outputs[host], _ = proc.communicate()
                record["error"] = f"on {host}: still running after --timeout {self.timeout_s:g} s"
        record["process_s"] = time.time() - launched
        failed = {h: p.returncode for h, p in procs.items() if p.returncode != 0}
        if failed and "error" not in record:
            record["error"] = f"exit codes {failed}"
        if "error" not in record:
            record.update(read_result(self._on_box(job["result_path"]), launched))
        record["ok"] = "error" not in record
        if not record["ok"]:
            record["output_tail"] = {h: out[-2000:] for h, out in outputs.items()}
        return record

    def host_death(self) -> dict[str, Any]:
        """The elastic run; c dies after DEATH_STEPS_BEFORE steps at 2 workers."""
        job = {**self._job("elastic"), "dir": self.shared_in, "stop": f"{self.shared_in}/stop"}
        job["samples"] = min(job["samples"], 12_800)  # short epochs: the stop file is read at their ends
        driver = self.hosts.popen("a", self._python("--child", "elastic", "--job", json.dumps(job)),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        record: dict[str, Any] = {"ok": False}
        try:
            if not self._wait(lambda: len(self._steps("b", 2)) >= DEATH_STEPS_BEFORE, driver):
                record["error"] = f"no {DEATH_STEPS_BEFORE} steps at 2 workers on b within {DEATH_WAIT_S:g} s"
                return record
            killed = time.time()
            self.hosts.kill_host("c")
            if not self._wait(lambda: any(t > killed for t in self._steps("b", 1)), driver):
                record["error"] = f"no step at 1 worker within {DEATH_WAIT_S:g} s of the kill"
                return record
            first = min(t for t in self._steps("b", 1) if t > killed)
            last_two = max([t for t in self._steps("b", 2) + self._steps("c", 2) if t <= killed], default=None)
            record.update(host_death_to_first_step_s=first - killed,
                          last_step_before_kill_s=None if last_two is None else killed - last_two)
        finally:
            Path(self._on_box(job["stop"])).touch()
            try:
                out, err = driver.communicate(timeout=DEATH_WAIT_S)
            except subprocess.TimeoutExpired:
                driver.kill()
                out, err = driver.communicate()
        if driver.returncode == 0 and out.strip():
            record.update(json.loads(out.splitlines()[-1]))
            record["ok"] = "error" not in record
        else:
            record.setdefault("error", f"the driver exited {driver.returncode}")
            record["stderr_tail"] = err[-3000:]
        return record

    def _steps(self, host: str, world: int) -> list[float]:
        try:
            with open(os.path.join(self.hosts.shared, f"steps-{host}")) as f:
                rows = [line.split() for line in f if line.endswith("\n")]
        except FileNotFoundError:
            return []
        return [float(t) for t, w in rows if int(w) == world]

    def _wait(self, done: Any, driver: subprocess.Popen) -> bool:
        deadline = time.monotonic() + DEATH_WAIT_S
        while not done():
            if driver.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.02)  # polling a file the workers append to; the times are theirs
        return True


# -- summary ------------------------------------------------------------------------------------


def median(records: list[dict[str, Any]], metric: str) -> float | None:
    values = [r[metric] for r in records if r["ok"] and r.get(metric) is not None]
    return statistics.median(values) if values else None


def summarise(reps: dict[str, list[dict[str, Any]]], death: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    med = {row: {m: median(r, m) for m in ("steady_samples_per_s", "start_to_first_step_s", "wall_s", "process_s")}
           for row, r in reps.items()}
    tput = {row: m["steady_samples_per_s"] for row, m in med.items()}
    vs = ratio(tput["raylight_two_hosts"], tput["torchrun_two_hosts"])
    seconds = death.get("host_death_to_first_step_s")
    return {
        "config": config,
        "machine": {**machine_info(), "hosts": "tests/hosts/harness.py: network + mount namespaces on this box"},
        "systems": {row: {"median": med[row], "ok_reps": sum(x["ok"] for x in r), "reps": r} for row, r in reps.items()},
        "raylight_vs_torchrun_two_hosts_throughput": vs,
        "throughput_goal": THROUGHPUT_GOAL,
        "throughput_goal_met": None if vs is None else vs >= THROUGHPUT_GOAL,
        "raylight_vs_torchrun_one_host_throughput": ratio(tput["raylight_one_host"], tput["torchrun_one_host"]),
        "raylight_two_hosts_vs_one_host_throughput": ratio(tput["raylight_two_hosts"], tput["raylight_one_host"]),
        "torchrun_two_hosts_vs_one_host_throughput": ratio(tput["torchrun_two_hosts"], tput["torchrun_one_host"]),
        "host_death_to_first_step_s": seconds,
        "host_death_goal_s": DEATH_GOAL_S,
        "host_death_goal_met": None if seconds is None else seconds <= DEATH_GOAL_S,
        "host_death": death,
    }


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(results: dict[str, Any]) -> None:
    print(f"\n{'row':<20} {'ok':>4} {'start->1st step s':>18} {'steady samples/s':>17}")
    for row, s in results["systems"].items():
        m = s["median"]
        print(f"{row:<20} {s['ok_reps']}/{len(s['reps'])}  {fmt(m['start_to_first_step_s'], '.2f'):>18} "
              f"{fmt(m['steady_samples_per_s'], ',.0f'):>17}")
        for rep in s["reps"]:
            if not rep["ok"]:
                print(f"  FAILED: {rep.get('error')}\n    {rep.get('output_tail')}")
    print(f"raylight / torchrun across two hosts, throughput: {fmt(results['raylight_vs_torchrun_two_hosts_throughput'], '.3f')} "
          f"(goal >= {THROUGHPUT_GOAL}: {results['throughput_goal_met']})")
    print(f"a host's death to the first step of the shrunk run: {fmt(results['host_death_to_first_step_s'], '.2f')} s "
          f"(goal <= {DEATH_GOAL_S} s: {results['host_death_goal_met']})")
    if not results["host_death"].get("ok"):
        print(f"  FAILED: {results['host_death'].get('error')}\n    {results['host_death'].get('stderr_tail', '')[-1500:]}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=1, help="repetitions of each row")
    parser.add_argument("--samples", type=int, default=60_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per row's run")
    parser.add_argument("--quick", action="store_true", help="tiny smoke run")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON results (default bench/results/hosts.json, hosts-quick.json with --quick)")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.epochs = 6_400, 1
    if args.out is None:
        args.out = RESULTS_DIR / ("hosts-quick.json" if args.quick else "hosts.json")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if run_child(args, CHILDREN):
        return
    from tests.hosts.harness import unavailable

    why = unavailable()
    if why:
        sys.exit(f"bench/hosts.py: {why}; run it as root on Linux (make bench-hosts)")
    job = {"samples": args.samples, "epochs": args.epochs, "batch_size": 128, "lr": 0.05, "seed": 0}
    bench = Bench(job, args.timeout)
    try:
        reps: dict[str, list[dict[str, Any]]] = {row: [] for row in ROWS}
        for rep in range(args.reps):
            for row in ROWS:  # interleaved, so drift hits every row alike
                print(f"rep {rep + 1}/{args.reps}: {row} ...", end=" ", flush=True)
                record = bench.row(row)
                reps[row].append(record)
                print(f"{record['process_s']:.1f}s" if record["ok"] else f"FAILED ({record['error']})")
        print("host death ...", end=" ", flush=True)
        death = bench.host_death()
        print("done" if death["ok"] else f"FAILED ({death.get('error')})")
    finally:
        bench.close()
    config = {**job, "num_workers": NUM_WORKERS, "reps": args.reps, "timeout_s": args.timeout,
              "model": "MLP 32-256-256-10 float32", "backend": "gloo (CPU)", "torch_threads_per_worker": 1,
              "hosts": {"a": "head, driver, 0 CPUs", "b": "raylet, 2 CPUs", "c": "raylet, 1 CPU"}}
    results = summarise(reps, death, config)
    print_table(results)
    write_results(args.out, results)


if __name__ == "__main__":
    main()
