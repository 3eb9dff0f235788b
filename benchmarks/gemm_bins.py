"""Score a GPU's GEMM pricing (``estimate_op_s``: its GEMM curve, memory curve and kernel
overhead, as ``paraplan calibrate gemm-table`` fits it) against every measured GEMM we hold,
binned by FLOPs and by shape class; signed median and median |err| of predicted / measured - 1
per bin (negative: predicted too fast).

    python benchmarks/gemm_bins.py                       # XLA's table, sm_90 and sm_100 bf16
    python benchmarks/gemm_bins.py --gpumodeling         # GPUModeling25 linear1-4 on A100 / GH200
    python benchmarks/gemm_bins.py --forms               # candidate forms, held-out per bin

``--forms`` fits each candidate form of the GEMM time on 80 % of the table (5 seeds, the hold-out
split of ``paraplan calibrate``) and scores the held-out 20 %: the current FLOP curve on >= 1e10
FLOPs (what the catalog holds) and on every size, and the curve with a fill term: the FLOPs
divided by (tiles / SMs) ** alpha while the GEMM has fewer output tiles (cuBLAS's 256 x 128,
the tile nvjet ran most in our H100 trace) than the GPU has SMs, alpha fitted.

Shape classes (the table's per-batch m, n, k): ``narrow`` min(m, n) <= 256, ``skinny-k``
k <= 256 (not narrow), ``square`` the rest.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from paraplan.calibrate._common import split_mask
from paraplan.calibrate.curves import load_gemm_table
from paraplan.catalog import load_gpu
from paraplan.costmodel import estimate_op_s
from paraplan.inventory.samples import op_for_sample
from paraplan.specs import Phase, Precision

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
TABLE = SHARED / "xla_perf_tables" / "matmul.csv"
TABLE_GPUS = {"sm_90": "H100-SXM5-80GB", "sm_100_B200": "B200"}
GPUMODELING = {"A100-SXM4-80GB": "operators_A100/NVIDIAA100-SXM4-80GB", "GH200-120GB": "operators_GH200/NVIDIAGH200120GB"}
#: SMs of the table's GPUs (their catalog ``sms``; B200: NVIDIA Blackwell datasheet, 148)
SMS = {"sm_90": 132, "sm_100_B200": 148}
#: cuBLAS's output tile on H100 (nvjet_sm90_tst_256x128_64x4: 232 of the 400 GEMM kernels of our trace)
TILE = (256, 128)
FLOP_BINS = ((0, 1e9, "<1e9"), (1e9, 1e10, "1e9-1e10"), (1e10, 1e11, "1e10-1e11"), (1e11, np.inf, ">1e11"))


def shape_class(m: np.ndarray, n: np.ndarray, k: np.ndarray) -> np.ndarray:
    narrow = np.minimum(m, n) <= 256
    return np.where(narrow, "narrow", np.where(k <= 256, "skinny-k", "square"))


def binned(err: np.ndarray, flops: np.ndarray, shapes: np.ndarray) -> list[tuple[str, int, float, float]]:
    """(bin, points, signed median %, median |err| %) per FLOP bin, per shape class, and all."""
    rows = []
    masks = [(name, (flops >= lo) & (flops < hi)) for lo, hi, name in FLOP_BINS]
    masks += [(name, shapes == name) for name in ("narrow", "skinny-k", "square")]
    masks += [("all", np.ones_like(err, dtype=bool))]
    for name, mask in masks:
        if mask.any():
            e = err[mask]
            rows.append((name, int(mask.sum()), 100 * float(np.median(e)), 100 * float(np.median(np.abs(e)))))
    return rows


def table_errors(gpu_key: str, gpu_name: str, gpu=None):
    """(errors, FLOPs, shape classes, table rows) of every bf16 row of ``gpu_key``."""
    spec = gpu or load_gpu(gpu_name)
    points = load_gemm_table(TABLE, gpu_key, "bf16xbf16->bf16", spec, min_flops=0.0)
    peak = spec.flops_for(Precision.BF16)
    pred = np.array([estimate_op_s(op, Phase.FWD, spec, peak, Precision.BF16) for op in points.ops])
    t = pd.read_csv(TABLE)
    rows = t[(t.gpu_key == gpu_key) & (t.dtype == "bf16xbf16->bf16")]
    flops = (2.0 * rows.b * rows.m * rows.n * rows.k).to_numpy()
    return pred / points.seconds - 1.0, flops, shape_class(rows.m.to_numpy(), rows.n.to_numpy(), rows.k.to_numpy()), rows


def gpumodeling_errors(gpu_name: str, stem: str, gpu=None):
    """(errors, FLOPs, shape classes) of GPUModeling25's linear1-4 forward and backward rows."""
    spec = gpu or load_gpu(gpu_name)
    peak = spec.flops_for(Precision.FP16)
    errs, flops, shapes = [], [], []
    for tag in ("linear1", "linear2", "linear3", "linear4"):
        path = SHARED / "gpumodeling" / f"{stem}_{tag}_fp16.csv"
        frame = pd.read_csv(path)
        for row in frame.to_dict("records"):
            op = op_for_sample(tag, row, Precision.FP16)
            d = dict(op.dims)
            m, k, n = d["m"], d["k"], d["n"]
            fwd = estimate_op_s(op, Phase.FWD, spec, peak, Precision.FP16)
            bwd = sum(estimate_op_s(op, p, spec, peak, Precision.FP16) for p in (Phase.BWD_INPUT, Phase.BWD_WEIGHT))
            for pred, measured, f in ((fwd, row["F_dur(us)"], op.flops), (bwd, row["B_dur(us)"], op.bwd_flops)):
                if measured > 0:
                    errs.append(pred / (measured * 1e-6) - 1.0)
                    flops.append(f)
                    shapes.append(shape_class(np.array([m]), np.array([n]), np.array([k]))[0])
    return np.array(errs), np.array(flops), np.array(shapes)


def _log_errors(p: np.ndarray, seconds, form: str, train: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return np.log(seconds(p, form)[train] / measured[train])


def fitted_forms(gpu_key: str, gpu_name: str, seeds: int = 5) -> dict[str, tuple[np.ndarray, list]]:
    """Per candidate form: (its mean fitted parameters, held-out bins pooled over ``seeds``
    splits), the GEMM time max(compute, memory) + kernel overhead as ``estimate_op_s`` prices
    it (memory curve and overhead the GPU's own)."""
    from scipy.optimize import least_squares

    spec = load_gpu(gpu_name)
    eff, peak = spec.efficiency, spec.flops_for(Precision.BF16)
    points = load_gemm_table(TABLE, gpu_key, "bf16xbf16->bf16", spec, min_flops=0.0)
    t = pd.read_csv(TABLE)
    rows = t[(t.gpu_key == gpu_key) & (t.dtype == "bf16xbf16->bf16")]
    b, m, n, k = (rows[c].to_numpy().astype(float) for c in "bmnk")
    flops, measured = 2.0 * b * m * n * k, points.seconds
    traffic = np.array([op.bytes for op in points.ops])
    memory_s = (traffic + eff.memory.half_work) / (spec.hbm_bandwidth_bytes_per_s * eff.memory.max_fraction)
    tiles = b * np.ceil(m / TILE[0]) * np.ceil(n / TILE[1])
    fill = np.minimum(1.0, tiles / SMS[gpu_key])
    shapes = shape_class(m, n, k)

    def seconds(p: np.ndarray, form: str) -> np.ndarray:
        work = flops * fill ** -p[2] if form == "fill" else flops
        return np.maximum((work + 10 ** p[1]) / (peak * p[0]), memory_s) + eff.kernel_overhead_s

    catalog = np.array([eff.gemm.max_fraction, np.log10(eff.gemm.half_work)])
    current = np.array([estimate_op_s(op, Phase.FWD, spec, peak, Precision.BF16) for op in points.ops])
    assert np.allclose(seconds(catalog, "plain"), current), "the replica must be estimate_op_s"
    out = {}
    for label, form, least in (("curve >= 1e10", "plain", 1e10), ("curve, all", "plain", 0.0),
                               ("fill, all", "fill", 0.0), ("fill >= 1e10", "fill", 1e10)):
        size = 3 if form == "fill" else 2
        errs, held_all, params = [], [], []
        for seed in range(seeds):
            held = split_mask(list(range(len(flops))), 0.2, seed)
            train = ~held & (flops >= least)
            fit = least_squares(_log_errors, [0.8, 9.5, 0.2][:size], args=(seconds, form, train, measured),
                                bounds=([0.01, 3.0, 0.0][:size], [1.0, 13.0, 3.0][:size]))
            errs.append(seconds(fit.x, form)[held] / measured[held] - 1.0)
            held_all.append(np.flatnonzero(held))
            params.append(fit.x)
        index = np.concatenate(held_all)
        out[label] = (np.mean(params, axis=0), binned(np.concatenate(errs), flops[index], shapes[index]))
    return out


def show(title: str, rows) -> None:
    print(title)
    print(f"  {'bin':<10} {'points':>6} {'signed':>8} {'|err|':>7}")
    for name, count, signed, absolute in rows:
        print(f"  {name:<10} {count:>6} {signed:>+7.1f}% {absolute:>6.1f}%")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpumodeling", action="store_true", help="score GPUModeling25's linear samples instead")
    parser.add_argument("--forms", action="store_true", help="held-out error per bin of candidate forms")
    args = parser.parse_args(argv)
    if args.forms:
        for key, name in TABLE_GPUS.items():
            for label, (params, rows) in fitted_forms(key, name).items():
                shown = f"max_fraction {params[0]:.4f}, half_work {10 ** params[1]:.3g}"
                shown += f", alpha {params[2]:.3f}" if len(params) > 2 else ""
                show(f"{name} ({key}) {label}: {shown}; held-out (5 x 20 %)", rows)
        return 0
    if args.gpumodeling:
        for name, stem in GPUMODELING.items():
            err, flops, shapes = gpumodeling_errors(name, stem)
            show(f"{name} GPUModeling25 linear1-4 fp16 (fwd and bwd rows)", binned(err, flops, shapes))
        return 0
    for key, name in TABLE_GPUS.items():
        err, flops, shapes, _ = table_errors(key, name)
        show(f"{name} ({key}) every bf16 row of {TABLE.name}", binned(err, flops, shapes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
