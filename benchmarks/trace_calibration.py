"""Calibrate on one plan's trace, predict the others: the README's before/after table (issue 16).

Run: python benchmarks/trace_calibration.py [--calibrate-on ddp] [--active 10] [--keep DIR]

1. Records the tiny GPT (`paraplan trace record`, gloo on the CPU, 2 ranks, 4 layers) under
   each plan of examples/tiny-cpu: ddp, fsdp and pipeline (record_shapes=True).
2. Calibrates examples/tiny-cpu/cluster.yaml on ONE plan's trace (`paraplan calibrate trace`).
3. Predicts every plan with the nominal cluster and with the calibrated one, and compares with
   the median iteration its own trace measured (`paraplan trace summarize`: the slowest rank).

The other plans' traces are never read by the calibration: their iteration times are the
validation. Prints a Markdown table (signed error = predicted / measured - 1).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "tiny-cpu"
PLANS = ("ddp", "fsdp", "pipeline")
PARAPLAN = [sys.executable, "-m", "paraplan.cli"]


def _option(name: str, default: str) -> str:
    args = sys.argv[1:]
    return args[args.index(name) + 1] if name in args else default


def run(*args: str) -> str:
    done = subprocess.run([*PARAPLAN, *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"paraplan {' '.join(args)} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def predicted_s(plan: str, cluster: Path | None) -> float:
    extra = ["--cluster", str(cluster)] if cluster else []
    record = json.loads(run("predict", str(EXAMPLES / f"{plan}.yaml"), *extra, "--format", "json"))
    return float(record["iteration_s"])


def measured_s(trace_dir: Path) -> float:
    record = json.loads(run("trace", "summarize", str(trace_dir), "--format", "json"))
    return float(record["iterations"]["median_s"])


def main() -> None:
    calibrate_on = _option("--calibrate-on", "ddp")
    active = _option("--active", "10")
    keep = _option("--keep", "")
    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="paraplan-trace-cal-"))
    for plan in PLANS:
        target = work / plan
        if not (target / "rank0.json.gz").exists():
            run("trace", "record", "--mode", plan, "--active", active, "--out", str(target))
    cluster = work / f"calibrated-on-{calibrate_on}.yaml"
    run("calibrate", "trace", str(work / calibrate_on), "--job", str(EXAMPLES / f"{calibrate_on}.yaml"),
        "-o", str(cluster), "--force")
    print(f"calibrated on the {calibrate_on} trace; traces in {work}\n")
    print("| plan | measured (median) | nominal cluster | error | calibrated | error |")
    print("|---|---:|---:|---:|---:|---:|")
    for plan in PLANS:
        measured = measured_s(work / plan)
        before, after = predicted_s(plan, None), predicted_s(plan, cluster)
        role = " (calibration run)" if plan == calibrate_on else ""
        print(f"| {plan}{role} | {measured * 1e3:,.1f} ms | {before * 1e3:,.1f} ms | {before / measured - 1:+.0%} "
              f"| {after * 1e3:,.1f} ms | {after / measured - 1:+.0%} |")


if __name__ == "__main__":
    main()
