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

    python benchmarks/fit_kernel_floor.py --memory [TRACE --gpu NAME]

fits the GPU's memory curves per kernel kind instead (``calibrate.memory_kernels``): one sample
per distinct streaming kernel at its true bytes, above the launch floor
(``calibrate.operators.above_launch_floor`` per class); one ``memory_kernels`` curve per kind
(vectorized: fill, copy, cast, element-wise; unrolled; strided); the catalog's curves and the
fitted ones per class, leave-one-out errors, and the catalog lines. The generic ``memory`` curve
(operators whose kernels' kind is not known) is not fitted here. Default: our H100 trace.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from paraplan.calibrate.kernel_floor import NEGLIGIBLE_BYTES, KernelFloor, fit_kernel_floor, queued_gaps
from paraplan.calibrate.memory_kernels import (
    KIND_CLASSES,
    STREAMING,
    curve_errors,
    fit_memory_curve,
    kind_samples,
    leave_one_out,
    stream_samples,
    with_memory_curve,
    without_kind_curves,
)
from paraplan.calibrate.operators import above_launch_floor
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


def memory_report(trace: Path, name: str) -> list[str]:
    """The memory curves fitted to ``trace``'s streaming kernels, one per kind
    (``efficiency.memory_kernels``), with each class's errors."""
    gpu = load_gpu(name)
    generic = without_kind_curves(gpu)
    every = stream_samples(trace)
    kept = every.subset(above_launch_floor(every))
    tags = np.asarray(kept.tag)
    pct = lambda a: f"{100 * float(np.median(a)):+.1f}"  # noqa: E731
    fitted: dict = {}
    kinds: list[str] = []
    for kind in KIND_CLASSES:
        sub = kind_samples(kept, kind)
        if len(sub) < 3:
            kinds.append(f"    {kind.value}: {len(sub)} kernels, not fitted")
            continue
        c, loo_kind = fit_memory_curve(sub, gpu), np.abs(leave_one_out(sub, gpu))
        fitted[kind] = c
        ins = np.abs(curve_errors(sub, with_memory_curve(generic, c)))
        kinds += [f"    {kind.value:10} n {len(sub):2d}: max_fraction {c.max_fraction:.4f}, half_work {c.half_work:.4g}: "
                  f"|err| median {100 * np.median(ins):.1f} %; leave-one-out median {100 * np.median(loo_kind):.1f} %, "
                  f"max {100 * loo_kind.max():.1f} %",
                  f"      catalog line: {kind.value}: {{max_fraction: {c.max_fraction:.4f}, half_work: {c.half_work:.4g}, "
                  f"fitted: {len(sub)}, held_out: {len(sub)}, held_out_median_err: {np.median(loo_kind):.3f}}}"]
    mine = gpu.model_copy(update={"efficiency": gpu.efficiency.model_copy(update={"memory_kernels": fitted})})
    lines = [f"{name} memory curves: {trace.parent.parent.name}/{trace.parent.name}/{trace.name}",
             f"  {len(every)} distinct streaming kernels, {len(kept)} above the launch floor; vectorized: "
             f"{', '.join(STREAMING)}",
             "  median error per class: on the catalog's generic memory curve alone (operators of unknown",
             "  kinds), on the catalog's curve of each kernel's kind, on the kind curves fitted here",
             f"  {'class':12} {'n':>3} {'rate/HBM':>13} {'generic %':>10} {'by kind %':>10} {'fitted %':>9}"]
    for cls in dict.fromkeys(kept.tag):
        m = tags == cls
        sub = kept.subset(m)
        rate = np.array([op.bytes for op in sub.ops]) / np.asarray(sub.measured) / gpu.hbm_bandwidth_bytes_per_s
        lines.append(f"  {cls:12} {int(m.sum()):3d} {rate.min():6.2f}-{rate.max():.2f} {pct(curve_errors(sub, generic)):>10} "
                     f"{pct(curve_errors(sub, gpu)):>10} {pct(curve_errors(sub, mine)):>9}")
    lines += ["  per kind (efficiency.memory_kernels):", *kinds,
              "  fitted apart, for reference (in the vectorized curve):"]
    parts = {"fills and element-wise": np.isin(tags, ("fill", "copy", "elementwise")), "casts": tags == "cast"}
    for label, m in parts.items():
        if m.sum() >= 3:
            sub = kept.subset(m)
            c, loo_part = fit_memory_curve(sub, gpu), np.abs(leave_one_out(sub, gpu))
            lines.append(f"    {label:24} n {int(m.sum()):2d}: max_fraction {c.max_fraction:.3f}, half_work "
                         f"{c.half_work:.3g}, leave-one-out |err| median {100 * np.median(loo_part):.1f} %, "
                         f"max {100 * loo_part.max():.1f} %")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", type=Path, help="rank traces of one GPU (default: see above)")
    parser.add_argument("--gpu", default="H100-SXM5-80GB")
    parser.add_argument("--memory", action="store_true", help="fit the memory curves (generic and per kernel kind) instead")
    args = parser.parse_args()
    if args.memory:
        print("\n".join(memory_report(args.traces[0] if args.traces else H100_TRACE, args.gpu)))
        return
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
