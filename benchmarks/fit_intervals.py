"""Write src/paraplan/catalog/intervals.yaml: the signed log-residuals log(measured / predicted)
of every dev run paraplan may fit its intervals on, per regime (paraplan.uncertainty.regimes),
and print the leave-one-source-out coverage of the intervals they give.

Run: python benchmarks/fit_intervals.py [path/to/shared/data] [--check]
  --check: write nothing; print the coverage table only.

The dev runs: ../shared/data/published/runs_dev.json, runs_dev_modern.json,
../shared/data/gpumodeling/runs_perlmutter.json and the repository's published MoE runs
(benchmarks/data/runs_moe_dev.json; the kept-aside evaluation runs are not read).
These residuals are validation data used only for the interval: they never move a prediction.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
from pathlib import Path

from paraplan.uncertainty.conformal import runs_needed
from paraplan.uncertainty.coverage import Held, coverage_rows, leave_one_source_out
from paraplan.uncertainty.regimes import FEATURES, Regime
from paraplan.validate import load_runs, validate_runs
from paraplan.validate.residuals import held_runs

ROOT = Path(__file__).resolve().parents[1]
ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
DATA = Path(ARGS[0]) if ARGS else ROOT.parent / "shared" / "data"
FILES = ("published/runs_dev.json", "published/runs_dev_modern.json", "gpumodeling/runs_perlmutter.json")
REPO_FILES = (ROOT / "benchmarks" / "data" / "runs_moe_dev.json",)
OUT = ROOT / "src" / "paraplan" / "catalog" / "intervals.yaml"
FACTOR = 1.5  # the fallback rule's widening (paraplan.uncertainty.interval.conformal_interval)
LEVELS = (0.5, 0.8, 0.9)


def dev_runs() -> list[Held]:
    """Every dev run predicted: its source, regime and residual."""
    held = []
    for name in (*(DATA / f for f in FILES), *REPO_FILES):
        skipped: list[tuple[str, str]] = []
        held += held_runs(validate_runs(load_runs(name), skipped=skipped))
        for run_id, reason in skipped:
            print(f"skipped {name}: {run_id}: {reason}", file=sys.stderr)
    return held


def commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_catalog(held: list[Held]) -> None:
    lines = [
        "# Written by benchmarks/fit_intervals.py: do not edit by hand; rerun it.",
        "# Signed log-residuals log(measured / predicted iteration time) of the dev runs, per regime",
        "# (paraplan.uncertainty.regimes). VALIDATION DATA USED ONLY FOR THE INTERVAL: these runs never",
        "# move a point prediction; no constant of the cost model is fitted to them.",
        "# Method: split conformal (Lei, G'Sell, Rinaldo, Tibshirani & Wasserman, 'Distribution-Free",
        "# Predictive Inference for Regression', JASA 113, 2018; Vovk, Gammerman & Shafer 2005): an",
        "# interval at level 1 - alpha takes the k-th smallest and k-th largest residual of its regime,",
        "# k = ceil((n + 1)(1 - alpha / 2)); a regime with k > n falls back to the stated wider rule",
        "# (fallback_factor: the widest pooled regime's interval, its width times this factor). A GPU whose",
        "# architecture has no run in the regime's bounds (architectures: the runs' GPUs') gets the",
        "# largest |residual| of all runs times the factor, both sides (Dunn, Wasserman & Ramdas 2022).",
        f"produced_by: \"benchmarks/fit_intervals.py at commit {commit()} on {datetime.date.today()}\"",
        f"fallback_factor: {FACTOR}",
        "sources:",
    ]
    for name in FILES:
        lines.append(f"  - \"../shared/data/{name} (see that folder's README for each record's citation)\"")
    lines.append("regimes:")
    by: dict[Regime, list[Held]] = {}
    for h in held:
        by.setdefault(h.regime, []).append(h)
    for regime in sorted(by):
        runs = sorted(by[regime], key=lambda h: h.residual)
        lines += [f"  - gpu: {regime.gpu}", f"    framework: {regime.framework}", f"    model: {regime.model}",
                  f"    n: {len(runs)}",
                  "    residuals: [" + ", ".join(f"{h.residual:.5f}" for h in runs) + "]",
                  "    runs: [" + ", ".join(f"\"{h.source}: {h.run_id}\"" for h in runs) + "]",
                  "    architectures: [" + ", ".join(sorted({h.architecture for h in runs})) + "]"]
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}: {len(held)} runs in {len(by)} regimes", file=sys.stderr)


def main() -> None:
    held = dev_runs()
    if "--check" not in sys.argv:
        write_catalog(held)
    features = ", ".join(f"{k} ({' | '.join(v)})" for k, v in FEATURES.items())
    print(f"regime features: {features}")
    for level in LEVELS:
        print(f"\nLeave one source out, {100 * level:g} % intervals ({runs_needed(level)} runs needed per regime):")
        print("| group | runs | covered | median width | fallback |")
        print("|---|---|---|---|---|")
        for row in coverage_rows(leave_one_source_out(held, level, FACTOR)):
            print(f"| {row.group} | {row.n} | {100 * row.covered:.0f} % | {100 * row.median_width:.1f} % "
                  f"| {row.fallbacks} |")
    # a GPU architecture no dev run was measured on: its runs left out together, their
    # intervals from the other architectures' runs (the stated rule, conformal_interval)
    for level in LEVELS:
        print(f"\nLeave one architecture out, {100 * level:g} % intervals (the rule for a GPU with no dev run):")
        print("| group | runs | covered | median width | fallback |")
        print("|---|---|---|---|---|")
        rows = coverage_rows(leave_one_source_out(held, level, FACTOR, by=lambda h: h.architecture))
        for row in rows:
            if row.group.startswith(("architecture", "all")):
                print(f"| {row.group} | {row.n} | {100 * row.covered:.0f} % | {100 * row.median_width:.1f} % "
                      f"| {row.fallbacks} |")


if __name__ == "__main__":
    main()
