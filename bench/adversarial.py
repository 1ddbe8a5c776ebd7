"""Bad input, as users meet it: every case of tests/adversarial.py as a real command.

Run:  make bench-adversarial      (or: python bench/adversarial.py [--src DIR] [--only GROUP])

Each CLI case runs as its own `python -m raylight.cli ...` process (start-up included),
each API case as its own `python -c ...` process, timed from launch to exit. A case
meets the bar when: the exit code is the expected one (2 for what the user can fix, 1
for a failure at run time, 0 for the odd-but-valid inputs), the output holds every
fragment the case expects (the key path, column or file and the fix) and no traceback,
the workspace is left as it was (for the error cases), and it took under 10 s. `--src`
points the same cases at another raylight source tree (e.g. a checkout of an older
commit), so two versions can be compared on one machine; the expected messages are this
version's wording, so for another tree the other parts of the bar say more. Results:
bench/results/adversarial.json (or --out) and a summary on stdout.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

from tests.adversarial import API_CASES, API_PRELUDE, CASES, TRAIN, Workspace  # noqa: E402

BAR_S = 10.0


def env_for(src: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([src, REPO, env.get("PYTHONPATH", "")])
    env["COLUMNS"] = "200"
    return env


def run(cmd: list[str], env: dict[str, str], cwd: str) -> tuple[int, str, float]:
    began = time.monotonic()
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=cwd)
        code, output = res.returncode, res.stdout + res.stderr
    except subprocess.TimeoutExpired as exc:
        code, output = -9, f"timed out after 120 s: {exc}"
    return code, output, time.monotonic() - began


def reference_model(root: str, env: dict[str, str]) -> str:
    ws = Workspace(root)
    argv = [ws.fill(a) for a in TRAIN]
    code, output, _ = run([sys.executable, "-m", "raylight.cli", *argv], env, root)
    if code != 0:
        raise SystemExit(f"training the reference model failed:\n{output}")
    return os.path.join(ws.out, "model")


def judge(expect_code: int, fragments: list[str], code: int, output: str, seconds: float, unchanged: bool | None) -> dict:
    flat = " ".join(output.split())
    missing = [f for f in fragments if " ".join(f.split()) not in flat]
    row = {
        "exit": code, "exit_ok": code == expect_code, "message_ok": not missing, "missing": missing,
        "traceback": "Traceback" in output, "unchanged": unchanged, "seconds": round(seconds, 2),
        "fast": seconds < BAR_S,
    }
    row["meets_bar"] = bool(
        row["exit_ok"] and row["message_ok"] and not row["traceback"] and unchanged is not False and row["fast"]
    )
    row["output"] = output[-600:] if not row["meets_bar"] else ""
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", default=os.path.join(REPO, "src"), help="the raylight source tree to test")
    parser.add_argument("--only", help="run one group of cases (config, dataset, api, ...)")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "adversarial.json"))
    args = parser.parse_args()
    src = os.path.abspath(args.src)
    env = env_for(src)
    rows = []
    with tempfile.TemporaryDirectory(prefix="rl-adversarial-") as tmp:
        model = reference_model(os.path.join(tmp, "reference"), env)
        for i, case in enumerate(CASES):
            if args.only and case.group != args.only:
                continue
            if case.root_skips and os.geteuid() == 0:
                rows.append({"id": case.id, "group": case.group, "skipped": "permissions do not stop root"})
                continue
            ws = Workspace(os.path.join(tmp, f"case{i}"), model_source=model if case.needs_model else None)
            if case.setup is not None:
                case.setup(ws)
            before = ws.snapshot()
            code, output, seconds = run([sys.executable, "-m", "raylight.cli", *[ws.fill(a) for a in case.argv]], env, ws.root)
            unchanged = None if case.writes else ws.snapshot() == before
            rows.append({"id": case.id, "group": case.group, **judge(case.code, [ws.fill(f) for f in case.expect], code, output, seconds, unchanged)})
            print(f"{case.id:40s} {'ok ' if rows[-1]['meets_bar'] else 'BAR'} exit {code} {seconds:5.2f}s", flush=True)
        for i, api in enumerate(API_CASES):
            if args.only and args.only != "api":
                continue
            ws = Workspace(os.path.join(tmp, f"api{i}"))
            before = ws.snapshot()
            code_text = API_PRELUDE + "try:\n" + "".join(f"    {line}\n" for line in ws.fill(api.code).splitlines())
            code_text += "except Exception as exc:\n    print(type(exc).__name__ + ': ' + str(exc))\n    raise SystemExit(2)\n"
            code, output, seconds = run([sys.executable, "-c", code_text], env, ws.root)
            after = {k: v for k, v in ws.snapshot().items() if k != "afile"}
            unchanged = after == {k: v for k, v in before.items() if k != "afile"}
            rows.append({"id": api.id, "group": "api", **judge(2, [f"{api.error}:", *[ws.fill(f) for f in api.expect]], code, output, seconds, unchanged)})
            print(f"{api.id:40s} {'ok ' if rows[-1]['meets_bar'] else 'BAR'} exit {code} {seconds:5.2f}s", flush=True)
    ran = [r for r in rows if "skipped" not in r]
    groups = collections.defaultdict(lambda: [0, 0])
    for r in ran:
        groups[r["group"]][0] += 1
        groups[r["group"]][1] += r["meets_bar"]
    times = [r["seconds"] for r in ran]
    summary = {
        "src": os.path.relpath(src, REPO) if src.startswith(REPO) else src,
        "cases": len(rows),
        "ran": len(ran),
        "skipped": len(rows) - len(ran),
        "meet_bar": sum(r["meets_bar"] for r in ran),
        "exit_code_right": sum(r["exit_ok"] for r in ran),
        "message_right": sum(r["message_ok"] for r in ran),
        "tracebacks": sum(r["traceback"] for r in ran),
        "left_files": sum(r["unchanged"] is False for r in ran),
        "over_10_s": sum(not r["fast"] for r in ran),
        "seconds_median": round(statistics.median(times), 2) if times else None,
        "seconds_max": round(max(times), 2) if times else None,
        "by_group": {g: {"cases": n, "meet_bar": ok} for g, (n, ok) in sorted(groups.items())},
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"summary": summary, "cases": rows}, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
