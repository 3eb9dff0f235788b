"""Speed of the analytical backend: predictions per second in one process, and CLI cold start.

Run: python benchmarks/bench_predict.py
Targets (issue 2): >= 2,000 predictions/s on one core; `paraplan predict` cold start <= 1 s.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from paraplan.catalog import load_job
from paraplan.catalog.jobs import demo_job_mapping, resolve_job
from paraplan.prediction import predict

ROOT = Path(__file__).resolve().parents[1]
JOBS = {
    "demo (llama-3-8b, 32 H100, pp=1, 16 micro-batches)": lambda: resolve_job(demo_job_mapping()),
    "gpt-neox-20b perlmutter (pp=4, 16 micro-batches)": lambda: load_job(
        ROOT / "examples/gpt-neox-20b-perlmutter-pp4-tp4-dp8.yaml"
    ),
    "gpt3-175b selene (pp=8, vpp=3, 64 micro-batches)": lambda: load_job(
        ROOT / "examples/gpt3-175b-selene-korthikanti.yaml"
    ),
    "llama-3-70b dgx-h100 (pp=4, vpp=5, 256 micro-batches)": lambda: load_job(
        ROOT / "examples/llama-3-70b-dgx-h100-tp8-pp4.yaml"
    ),
    "mixtral-8x7b dgx-h100 (MoE, ep=8, pp=4, vpp=8, 16 micro-batches)": lambda: load_job(
        ROOT / "examples/mixtral-8x7b-dgx-h100-ep8.yaml"
    ),
    "deepseek-v3 dgx-h100 (MoE+MLA, ep=64, pp=16, 64 micro-batches)": lambda: load_job(
        ROOT / "examples/deepseek-v3-dgx-h100-pp16-ep64.yaml"
    ),
}


def predictions_per_second(job, seconds: float = 1.0) -> float:
    for _ in range(10):
        predict(job)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        predict(job)
        count += 1
    return count / (time.perf_counter() - start)


def cold_start_s(args: list[str], repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(args, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    print("| job | predictions / s (one process) |")
    print("|---|---|")
    for name, make in JOBS.items():
        print(f"| {name} | {predictions_per_second(make()):,.0f} |")
    exe = [sys.executable, "-m", "paraplan.cli"]
    print()
    print("| command | cold start, median of 5 |")
    print("|---|---|")
    print(f"| `paraplan --version` | {cold_start_s([*exe, '--version']):.2f} s |")
    print(f"| `paraplan predict` (demo job, table) | {cold_start_s([*exe, 'predict']):.2f} s |")


if __name__ == "__main__":
    main()
