"""H100's cuDNN fused attention priced by its tiles, and attention's held (power-limited) factor.

    python benchmarks/fit_h100_attention.py [DATA_DIR]

Reads what one H100 SXM5 measured on 2026-11-27 (benchmarks/data/gpu/h100-2026-11-27):

1. ``run2/gpucheck/profile/ops.samples``: the 36 causal attention records of the adaptive
   operator profile (Llama-3-8B layer, head dim 128, 4-32 heads per rank, batch 1-2, sequence
   2k-16k; forward and backward through F.scaled_dot_product_attention, which ran cuDNN's fused
   attention on that torch). Per direction it fits the two numbers of ``AttentionTiles``
   (``roofline.attention_tile_s``: max_fraction and tile_work, 128-row tiles on 132 SMs), least
   squares on log(predicted / measured), and prints the catalog's FLOP curve's errors and the
   tiles' (in sample and leave one out);
2. ``run2/probe/attention.json``: three shapes timed forward + backward in a burst and after a
   5 s hold: the held / burst median is ``efficiency.sustained.attention_fraction``. Their
   bursts are a check of the tile pricing, not fitted (the probe's backward also accumulates
   into the inputs' .grad, a few copies the profile's records do not time);
3. the published cuDNN points the catalog's FLOP curve was fitted on (Shah et al. 2024,
   src/paraplan/calibrate/data/cudnn_attention_h100.csv, 16k tokens: batch = 16k / seq, so
   every point has 2,048-4,096 tiles) against the tile pricing, for head dim 128.

Operator-level measurements only: no end-to-end run is read.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from paraplan.calibrate.operators import OpSamples, operator_records
from paraplan.catalog.loader import load_gpu
from paraplan.costmodel.roofline import attention_tile_s, with_attention_kernel
from paraplan.inventory import Op, OpKind
from paraplan.samples.store import load_samples
from paraplan.specs import AttentionKernel, Phase, Precision
from paraplan.specs.hardware import AttentionTiles, KernelCurve, TileRate

HERE = Path(__file__).resolve().parent
DATA = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "data" / "gpu" / "h100-2026-11-27"
PAPER = HERE.parent / "src" / "paraplan" / "calibrate" / "data" / "cudnn_attention_h100.csv"
GPU = "H100-SXM5-80GB"
ROWS, SMS = 128, 132  # cuDNN's / FlashAttention's 128-row tiles at head dim 128; H100 SXM5's SMs
START = (0.6, 1e8)


def attention_samples(data: Path = DATA) -> OpSamples:
    gpu = load_gpu(GPU)
    samples = operator_records(load_samples(data / "run2" / "gpucheck" / "profile" / "ops.samples"), gpu)
    return samples.subset(np.array([t == "flash_atten_causal" for t in samples.tag]))


def _curve(fwd: tuple[float, float], bwd: tuple[float, float]) -> KernelCurve:
    tiles = AttentionTiles(rows=ROWS, sms=SMS, fwd=TileRate(max_fraction=fwd[0], tile_work=fwd[1]),
                           bwd=TileRate(max_fraction=bwd[0], tile_work=bwd[1]), source="fit")
    return KernelCurve(max_fraction=1.0, half_work=0.0, source="fit", tiles=tiles)


def _phase(name: str) -> Phase:
    return Phase.FWD if name == "fwd" else Phase.BWD_INPUT


def tile_seconds(ops: list[Op], phases: list[str], curve: KernelCurve) -> np.ndarray:
    """The tiles' time plus the GPU's per-kernel overhead, as ``roofline_s`` prices one launch."""
    gpu = load_gpu(GPU)
    peak, overhead = gpu.flops_for(Precision.BF16), gpu.efficiency.kernel_overhead_s
    out = []
    for op, name in zip(ops, phases, strict=True):
        phase = _phase(name)
        out.append(attention_tile_s(op, phase, op.work(phase)[0], peak, curve) + overhead)
    return np.array(out)


def fit_direction(ops: list[Op], phases: list[str], measured: np.ndarray) -> tuple[float, float]:
    """(max_fraction, tile_work) of one direction; the other direction's numbers are unused."""
    def residuals(x: np.ndarray) -> np.ndarray:
        curve = _curve(tuple(x), tuple(x))
        return np.log(tile_seconds(ops, phases, curve) / measured)

    fit = least_squares(residuals, START, bounds=([0.05, 0.0], [1.0, np.inf]), x_scale=(0.1, 1e8))
    return float(fit.x[0]), float(fit.x[1])


def fit(samples: OpSamples) -> dict:
    """Both directions' fits, each sample's in-sample and leave-one-out error, and the catalog's
    FLOP curve's (``attention_kernels.cudnn`` without ``tiles``) error on the same samples."""
    measured = np.asarray(samples.measured)
    phases = np.asarray(samples.phase)
    gpu = with_attention_kernel(load_gpu(GPU), AttentionKernel.CUDNN)
    peak = gpu.flops_for(Precision.BF16)
    flat = gpu.efficiency.attention.model_copy(update={"tiles": None})
    out: dict = {"n": len(measured)}
    for name in ("fwd", "bwd"):
        idx = np.flatnonzero(phases == name)
        ops, ph, m = [samples.ops[i] for i in idx], [name] * len(idx), measured[idx]
        x = fit_direction(ops, ph, m)
        inside = tile_seconds(ops, ph, _curve(x, x)) / m - 1
        loo = []
        for j in range(len(idx)):
            keep = np.arange(len(idx)) != j
            xj = fit_direction([o for o, k in zip(ops, keep, strict=True) if k], [name] * int(keep.sum()), m[keep])
            loo.append(float(tile_seconds([ops[j]], [name], _curve(xj, xj))[0] / m[j] - 1))
        curve_err = []
        for op, mm in zip(ops, m, strict=True):
            flops = op.work(_phase(name))[0]
            curve_err.append((flops + flat.half_work) / (peak * flat.max_fraction) / mm - 1)
        out[name] = {"x": x, "n": len(idx), "in": inside, "loo": np.array(loo), "curve": np.array(curve_err),
                     "ops": ops, "measured": m}
    return out


def held_fraction(data: Path = DATA) -> tuple[float, list[dict]]:
    rows = json.loads((data / "run2" / "probe" / "attention.json").read_text())["attention"]
    return statistics.median(r["burst_s"] / r["sustained_s"] for r in rows), rows


def _probe_op(b: int, h: int, s: int, d: int) -> Op:
    flops = 4.0 * b * h * s * s * d
    return Op(name="flash_atten", kind=OpKind.ATTENTION, role="probe", flops=flops, bytes=0.0,
              bwd_flops=2.5 * flops, bwd_bytes=0.0, exec_fraction=0.5,
              dims=(("b", b), ("h", h), ("l", s), ("l_kv", s), ("d", d)))


def _pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def main() -> None:
    samples = attention_samples()
    result = fit(samples)
    print(f"H100 cuDNN causal attention, {result['n']} operator records ({DATA.name})")
    print("| direction | catalog FLOP curve: median, range | tiles in sample: median abs., worst | "
          "leave-one-out median abs. |")
    print("|---|---|---|---|")
    for name in ("fwd", "bwd"):
        r = result[name]
        print(f"| {name} | {_pct(np.median(r['curve']))}, {_pct(r['curve'].min())} .. {_pct(r['curve'].max())} | "
              f"{100 * np.median(abs(r['in'])):.1f} %, {_pct(r['in'][np.argmax(abs(r['in']))])} | "
              f"{100 * np.median(abs(r['loo'])):.1f} % |")
    (mf_f, w_f), (mf_b, w_b) = result["fwd"]["x"], result["bwd"]["x"]
    both = np.concatenate([result["fwd"]["in"], result["bwd"]["in"]])
    print()
    print("catalog (attention_kernels.cudnn.tiles):")
    print(f"  rows: {ROWS}\n  sms: {SMS}\n  fwd: {{max_fraction: {mf_f:.4f}, tile_work: {w_f:.3g}}}")
    print(f"  bwd: {{max_fraction: {mf_b:.4f}, tile_work: {w_b:.3g}}}")
    print(f"  fitted: {len(both)}\n  median_err: {np.median(abs(both)):.3f}")
    fraction, rows = held_fraction()
    print(f"\nefficiency.sustained.attention_fraction: {fraction:.4f} (median held / burst seconds of "
          f"{len(rows)} shapes: " + ", ".join(f"{r['burst_s'] / r['sustained_s']:.3f}" for r in rows) + ")")
    curve = _curve((mf_f, w_f), (mf_b, w_b))
    gpu = with_attention_kernel(load_gpu(GPU), AttentionKernel.CUDNN)
    peak = gpu.flops_for(Precision.BF16)
    flat = gpu.efficiency.attention
    print("\nprobe (fwd + bwd, burst; not fitted): tiles / FLOP curve, predicted / measured - 1")
    for r in rows:
        op = _probe_op(r["b"], r["heads"], r["seq"], r["head_dim"])
        tiles = sum(tile_seconds([op], [p], curve)[0] for p in ("fwd", "bwd"))
        flops = sum(op.work(_phase(p))[0] for p in ("fwd", "bwd"))
        flat_s = (flops + 2 * flat.half_work) / (peak * flat.max_fraction)
        print(f"  {r['gemm']:18s} b{r['b']} h{r['heads']} s{r['seq']}: tiles {_pct(tiles / r['burst_s'] - 1)}, "
              f"curve {_pct(flat_s / r['burst_s'] - 1)}")
    print("\npublished cuDNN (Shah et al. 2024, 16k tokens, head dim 128; not fitted): tiles, predicted / measured - 1")
    for line in PAPER.read_text().splitlines():
        if line.startswith(("#", "phase")):
            continue
        phase, d, causal, seq, tflops = line.split(",")[:5]
        if int(d) != 128:
            continue
        heads, batch = 2048 // int(d), 16384 // int(seq)
        op = _probe_op(batch, heads, int(seq), int(d))
        if causal == "0":
            op = dataclasses.replace(op, exec_fraction=1.0)
        measured = op.work(_phase(phase))[0] / (float(tflops) * 1e12)
        print(f"  {phase} {'causal' if causal == '1' else 'full  '} seq {int(seq):>5}: "
              f"{_pct(tile_seconds([op], [phase], curve)[0] / measured - 1)}")


if __name__ == "__main__":
    main()
