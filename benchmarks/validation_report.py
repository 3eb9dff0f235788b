"""Print the README's validation tables (markdown): measured vs predicted for the five
GPUModeling25 Perlmutter runs (with per-component errors), the published runs of
runs_dev.json (Megatron-LM, A100) and runs_dev_modern.json (MLPerf H100 FP8, torchtitan and
IBM FSDP), and per source and per GPU the signed median, median and p90 of |error|.

Run: python benchmarks/validation_report.py [path/to/shared/data]
Measured runs are only compared with; nothing is fitted to them.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

from paraplan.report.validation import mean_absolute_error, stats_rows
from paraplan.validate import RunValidation, load_runs, validate_runs
from paraplan.validate.stats import error_stats

DATA = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared" / "data"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f} %"


def main() -> None:
    runs = validate_runs(load_runs(DATA / "gpumodeling" / "runs_perlmutter.json"))
    print("| run (Perlmutter, A100-80GB) | measured s | predicted s | error | GPUModeling25's error |")
    print("|---|---|---|---|---|")
    for r in runs:
        print(f"| {r.run_id} | {r.measured_iteration_s:.2f} | {r.prediction.iteration_s:.2f} | {pct(r.error)} | {pct(r.their_error)} |")
    theirs = statistics.fmean(abs(r.their_error) for r in runs if r.their_error is not None)
    print(f"| **mean absolute error** | | | **{100 * mean_absolute_error(runs):.1f} %** | {100 * theirs:.1f} % |")
    print()
    by_component: dict[str, list[float]] = defaultdict(list)
    for r in runs:
        for c in r.components:
            by_component[c.component].append(c.error)
    print("| component (all runs, traced stages) | n | median error | mean absolute error |")
    print("|---|---|---|---|")
    for name, errors in by_component.items():
        print(f"| {name} | {len(errors)} | {pct(statistics.median(errors))} | {100 * statistics.fmean(abs(e) for e in errors):.1f} % |")
    everything: list[RunValidation] = list(runs)
    per_file = [error_stats("runs_perlmutter.json", (r.error for r in runs))]
    for name in ("runs_dev.json", "runs_dev_modern.json"):
        published = validate_runs(load_runs(DATA / "published" / name))
        everything += published
        per_file.append(error_stats(name, (r.error for r in published)))
        print()
        print(f"| {name} run | GPU | measured s | predicted s | error | MFU predicted |")
        print("|---|---|---|---|---|---|")
        for r in published:
            print(f"| {r.run_id} | {r.gpu} | {r.measured_iteration_s:.2f} | {r.prediction.iteration_s:.2f} "
                  f"| {pct(r.error)} | {100 * r.prediction.mfu:.1f} % |")
        print(f"| **mean absolute error** | | | | **{100 * mean_absolute_error(published):.1f} %** | |")
    print()
    print("| source / GPU | runs | signed median | median abs. error | p90 abs. error | worst |")
    print("|---|---|---|---|---|---|")
    for s in per_file + stats_rows(everything):
        print(f"| {s.group} | {s.n} | {pct(s.signed_median)} | {100 * s.median_abs:.1f} % "
              f"| {100 * s.p90_abs:.1f} % | {pct(s.worst)} |")


if __name__ == "__main__":
    main()
