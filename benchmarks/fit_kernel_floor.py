"""A GPU's kernel duration floor from real profiler traces: the catalog's ``kernel_overhead_s``.

    python benchmarks/fit_kernel_floor.py [TRACE --gpu NAME ...]

With no argument, reads our own H100 trace (one H100 SXM5 at 700 W, torch 2.11.0+cu130,
2026-11-27: benchmarks/data/gpu/h100-2026-11-27, run2/gpucheck/trace/rank0.json.gz, recorded
with record_shapes) for H100-SXM5-80GB, and, where ../shared/data/traces/hta is present, the A100
traces of HolisticTraceAnalysis's test data (E1_diff_control_a100x8, A_vit128_sampled) for
A100-SXM4-80GB. For each: the kernels launched alone by a streaming operator (element-wise,
copy, fill) that moved at most 1 MiB (``calibrate.kernel_floor``), their durations, the
catalog's memory curve at their bytes, and the fitted overhead (median of measured - curve),
with the catalog line, and the gaps between back-to-back queued kernels (reported, not
fitted). Kernel durations only: no iteration time is read.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from paraplan.calibrate.kernel_floor import NEGLIGIBLE_BYTES, KernelFloor, fit_kernel_floor, queued_gaps
from paraplan.catalog.loader import load_gpu

HERE = Path(__file__).resolve().parent
H100_TRACE = HERE / "data" / "gpu" / "h100-2026-11-27" / "run2" / "gpucheck" / "trace" / "rank0.json.gz"
HTA = HERE.parents[1] / "shared" / "data" / "traces" / "hta"
DEFAULTS = (
    ("H100-SXM5-80GB", (H100_TRACE,)),
    ("A100-SXM4-80GB", (HTA / "E1_diff_control_a100x8" / "control.json.gz",)),
    ("A100-SXM4-80GB", tuple(sorted((HTA / "A_vit128_sampled").glob("*.json.gz")))),
)


def describe(floor: KernelFloor) -> list[str]:
    us = 1e6
    lo, hi = floor.quartiles_s()
    where = ", ".join(f"{p.parent.name}/{p.name}" for p in floor.files)
    step = "1 us (whole microseconds)" if floor.resolution_s >= 1e-6 else "sub-microsecond"
    return [
        f"{floor.gpu}: {where}",
        f"  {floor.kernels} kernels of <= {NEGLIGIBLE_BYTES:,} bytes ({floor.shapes} operator shapes), "
        f"time resolution {step}",
        f"  measured: min {floor.min_s * us:.2f} us, median {floor.median_s * us:.2f} us, "
        f"quartiles {lo * us:.2f}-{hi * us:.2f} us",
        f"  memory curve at their bytes (no overhead): median {floor.curve_s * us:.2f} us",
        f"  kernel_overhead_s: catalog {floor.before_s * us:.2f} us -> fitted {floor.overhead_s * us:.2f} us "
        f"(median of measured - curve)",
        f"  catalog line: kernel_overhead_s: {floor.overhead_s * us:.2f} us",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", type=Path, help="rank traces of one GPU (default: see above)")
    parser.add_argument("--gpu", default="H100-SXM5-80GB")
    args = parser.parse_args()
    jobs = [(args.gpu, tuple(args.traces))] if args.traces else DEFAULTS
    for name, files in jobs:
        present = tuple(f for f in files if f.exists())
        if not present:
            print(f"{name}: {files[0] if files else 'no trace'} is not present: skipped")
            continue
        print("\n".join(describe(fit_kernel_floor(present, load_gpu(name)))))
        gaps = [g for f in present for g in queued_gaps(f)]
        if gaps:
            lo, med = min(gaps) * 1e6, float(np.median(gaps)) * 1e6
            print(f"  not fitted: GPU idle between back-to-back queued kernels on one stream: {len(gaps)} gaps, "
                  f"min {lo:.2f} us, median {med:.2f} us (in no kernel's duration; part may be the profiler's)")


if __name__ == "__main__":
    main()
