"""Measure cpu-core's efficiency curves on this machine (one CPU core, torch fp32).

    paraplan profile ops --grid examples/tiny-cpu/curves-grid.yaml --out S
    python examples/tiny-cpu/measure_cpu_core.py S

prints the large-GEMM and streaming rates torch reaches on one thread and the ``efficiency:``
block (gemm from linear1, attention from flash_atten, memory from gelu and res_add forwards,
kernel_overhead_s the one fitting res_add best;
gelu, whose erf is not bandwidth-bound, its own curve) fitted in log space to the samples with
paraplan's own FLOP and byte counts, time = (work + half_work) / (peak * max_fraction) + overhead.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pandas as pd
import torch
from scipy.optimize import least_squares

from paraplan.inventory.samples import op_for_sample
from paraplan.specs import Phase, Precision

PEAK_FLOPS = 166.4e9  # cluster.yaml's nominal fp32 peak
HBM = 166e9  # cluster.yaml's nominal L2 bandwidth
CURVES = {"gemm": (["linear1"], 0), "attention": (["flash_atten"], 0), "memory": (["res_add"], 1)}


def _median_s(fn, repeat: int = 20) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def torch_rates() -> tuple[float, float]:
    torch.set_num_threads(1)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    gemm = 2 * 1024**3 / _median_s(lambda: a @ b)
    x, y = torch.randn(1 << 16), torch.randn(1 << 16)  # 3 x 256 kB: in the 2 MB L2
    out = torch.empty_like(x)
    stream = 3 * 4 * x.numel() / _median_s(lambda: torch.add(x, y, out=out), 200)
    return gemm, stream


def fit(samples: pd.DataFrame, names: list[str], which: int, rate: float, overhead: float):
    rows = samples[samples["name"].isin(names) & (samples["phase"] == "fwd")]
    work, measured = [], []
    for r in rows.itertuples(index=False):
        row = {k: getattr(r, k) for k in ("mp", "b", "h", "l", "dim") if not pd.isna(getattr(r, k))}
        work.append(op_for_sample(r.name, row, Precision.FP32).work(Phase.FWD)[which])
        measured.append(r.time_s)
    work, measured = np.asarray(work), np.asarray(measured)

    def residual(p):
        fraction, log_half = p
        return np.log(((work + 10**log_half) / (rate * fraction) + overhead) / measured)

    best = least_squares(residual, [0.5, 6.0], bounds=([1e-3, 0.0], [1.0, 12.0]))
    err = np.median(np.abs(np.exp(residual(best.x)) - 1))
    return best.x[0], 10 ** best.x[1], len(work), err


def main(path: str) -> None:
    samples = pd.read_parquet(path)
    gemm, stream = torch_rates()
    print(f"torch, 1 thread: 1024^3 fp32 mm {gemm / 1e9:.1f} GFLOP/s "
          f"({gemm / PEAK_FLOPS:.2f} of {PEAK_FLOPS / 1e9:.1f}); add in L2 {stream / 1e9:.1f} GB/s "
          f"({stream / HBM:.2f} of {HBM / 1e9:.0f})")
    # the per-call overhead: the one that fits res_add (the plainest streaming op) best
    overhead = min(np.arange(0.0, 3.01e-6, 0.25e-6), key=lambda o: fit(samples, ["res_add"], 1, HBM, o)[3])
    print(f"efficiency:\n  kernel_overhead_s: {overhead:.2e}")
    for curve, (names, which) in CURVES.items():
        fraction, half, n, err = fit(samples, names, which, PEAK_FLOPS if which == 0 else HBM, overhead)
        print(f"  {curve}: {{max_fraction: {fraction:.3f}, half_work: {half:.3g}}}"
              f"  # {n} points, median |err| {err:.0%}")
    fraction, half, n, err = fit(samples, ["gelu"], 1, HBM, overhead)  # erf: not bandwidth-bound
    print(f"  ops:\n    gelu: {{max_fraction: {fraction:.3f}, half_work: {half:.3g}}}"
          f"  # {n} points, median |err| {err:.0%}")


if __name__ == "__main__":
    main(sys.argv[1])
