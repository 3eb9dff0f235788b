"""The GPU's idle gap between back-to-back queued kernels, in every real trace we have.

    python benchmarks/queued_gaps.py [path/to/shared/data]

For each trace (our H100 trace, benchmarks/data/gpu/h100-2026-11-27; HolisticTraceAnalysis's test
traces under ../shared/data/traces/hta, README there): on each stream, the time from a kernel's
end to the next kernel's start, for every next kernel whose launch call returned at least
``calibrate.kernel_floor.QUEUED_MARGIN_S`` (5 us) before the previous kernel ended (the GPU had it in hand). Timestamps are
read exactly (decimals, not floats: an epoch-based trace's microseconds lose a quarter of a
microsecond in a float). Per trace: median and quartiles; by the kind of the kernel before the
gap and by the next kernel's duration; and HolisticTraceAnalysis's idle-time classes for the same
streams (host wait: launched after the previous kernel ended; kernel wait: a shorter gap than
``consecutive_kernel_delay``, 30 of the trace's unit in HTA: 30 us in HTA before its nanosecond
timestamps, 30 ns since; other: the rest). Kernel events only: no iteration time is read.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from paraplan.calibrate.kernel_floor import kernel_boundaries

HERE = Path(__file__).resolve().parent
DATA = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parents[1] / "shared" / "data"
H100_TRACE = HERE / "data" / "gpu" / "h100-2026-11-27" / "run2" / "gpucheck" / "trace" / "rank0.json.gz"
GPU_OF = {"A_vit128_sampled": "A100", "B_resnet_nccl_a100": "A100", "C_dfindex_v100": "V100",
          "E1_diff_control_a100x8": "A100", "F_ns_resolution_v100": "V100", "I_amd_mi250": "MI250",
          "J_gpu_user_annotation": "A100"}


def kind(name: str) -> str:
    n = name.lower()
    if "nccl" in n:
        return "nccl"
    if any(k in n for k in ("gemm", "cutlass", "xmma", "cublas", "sm80_", "sm90_", "nvjet", "conv", "wgrad", "dgrad")):
        return "gemm/conv"
    if any(k in n for k in ("elementwise", "copy", "fill", "cat")):
        return "elementwise/copy"
    if any(k in n for k in ("reduce", "norm", "softmax", "bn_")):
        return "reduce/norm"
    return "other"


def gaps_of(path: Path) -> tuple[list[tuple[float, str, float]], dict[str, float]]:
    """(gap us, kind of the kernel before, next kernel's duration us) for every queued boundary,
    and HTA's idle classes (us) over all boundaries of the kernel streams (the boundaries read by
    ``calibrate.kernel_floor.kernel_boundaries``, timestamps exact)."""
    out, hta = [], {"host wait": 0.0, "kernel wait (30 us)": 0.0, "kernel wait (30 ns)": 0.0, "other": 0.0}
    for b in kernel_boundaries(path):
        gap = round(b.gap_s * 1e6, 6)  # us, to the picosecond: a 30 us gap stays 30 (bins' edges)
        if gap > 0:
            if b.ahead_s is not None and b.ahead_s < 0:
                hta["host wait"] += gap
            else:
                hta["kernel wait (30 us)"] += gap if gap < 30 else 0.0
                hta["kernel wait (30 ns)"] += gap if gap < 0.03 else 0.0
                hta["other"] += gap if gap >= 30 else 0.0
        if b.queued:
            out.append((gap, kind(b.before), round(b.next_s * 1e6, 6)))
    return out, hta


def quartiles(values: list[float]) -> str:
    if not values:
        return "-"
    q1, med, q3 = np.percentile(values, [25, 50, 75])
    return f"{med:.2f} ({q1:.2f}-{q3:.2f}) n={len(values)}"


def main() -> None:
    traces = [("H100", "ours h100-2026-11-27", H100_TRACE)]
    hta = DATA / "traces" / "hta"
    for folder in sorted(hta.iterdir()) if hta.exists() else ():
        for f in sorted(folder.glob("*.json.gz")):
            traces.append((GPU_OF.get(folder.name, "?"), f"hta {folder.name}/{f.name[:24]}", f))
    print("| GPU | trace | queued gaps | min us | median (quartiles) us | share < 0 |")
    print("|---|---|---|---|---|---|")
    detail = []
    for gpu, label, path in traces:
        rows, classes = gaps_of(path)
        g = [r[0] for r in rows]
        if not g:
            print(f"| {gpu} | {label} | 0 | - | - | - |")
            continue
        print(f"| {gpu} | {label} | {len(g)} | {min(g):.2f} | {quartiles(g)} | {np.mean(np.array(g) < 0):.1%} |")
        detail.append((gpu, label, rows, classes))
    for gpu, label, rows, classes in detail:
        print(f"\n{gpu} {label}")
        for k in sorted({r[1] for r in rows}):
            print(f"  after {k:17s} {quartiles([r[0] for r in rows if r[1] == k])}")
        for lo, hi in ((0, 5), (5, 50), (50, float("inf"))):
            sel = [r[0] for r in rows if lo <= r[2] < hi]
            print(f"  next kernel {lo:>3}-{hi:<4} us  {quartiles(sel)}")
        total = classes["host wait"] + classes["kernel wait (30 us)"] + classes["other"]
        if total > 0:
            print("  HTA idle classes: " + ", ".join(f"{k} {v / 1e3:.2f} ms ({v / total:.0%})"
                                                      for k, v in classes.items()))


if __name__ == "__main__":
    main()
