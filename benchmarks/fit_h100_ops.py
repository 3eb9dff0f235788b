"""H100's operator samples against the catalog's curves, and H100's own per-operator curves.

    python benchmarks/fit_h100_ops.py [OPS.samples] [--gpu H100-SXM5-80GB] [--fit RMSlayernorm:fwd,...]

Reads the adaptive operator profile of a Llama-3-8B layer that `benchmarks/gpu/check.sh` took on
one H100 SXM5 (`paraplan profile adaptive`, bf16, 274 records: benchmarks/data/gpu/h100-2026-11-27,
run2/gpucheck/profile/ops.samples) and prints

1. per operator and direction, the catalog's prediction against each measured time, as
   predicted / measured - 1: over every sample, and over the samples above the launch floor
   (``calibrate.operators.above_launch_floor``: at least twice the fastest sample of their
   operator and direction; below it the sampler times the host's calls or an L2-resident
   input, not the kernel's work). Causal flash attention is compared with each attention
   kernel curve of the catalog (torch's SDPA ran cuDNN's fused attention on this H100). The
   samples are bursts: GEMMs are predicted without the sustained-clock factor, which applies to
   training steps only;
2. for each curve of ``--fit`` (default: the RMSNorm curves, which the samples show wrong), the
   curve fitted to the samples above the floor with the package's fitter
   (``calibrate.efficiency.fit_efficiency``: least squares on log(pred / measured) through
   ``estimate_op_s``, soft_l1 loss, the GPU's kernel overhead kept), its in-sample errors and
   its leave-one-out errors (each sample predicted by the curve fitted without it), and the
   catalog line to paste.

Operator-level measurements only: no end-to-end run is read.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np

from paraplan.calibrate.efficiency import fit_efficiency
from paraplan.calibrate.operators import OpSamples, above_launch_floor, operator_records, predict_ops
from paraplan.calibrate.params import ParamLayout
from paraplan.catalog.loader import load_gpu
from paraplan.costmodel.roofline import with_attention_kernel
from paraplan.samples.store import load_samples
from paraplan.specs import AttentionKernel, EfficiencyCurve, GpuSpec, Precision

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "gpu" / "h100-2026-11-27"
DEFAULT_SAMPLES = DATA / "run2" / "gpucheck" / "profile" / "ops.samples"
DEFAULT_FIT = ("RMSlayernorm:fwd", "RMSlayernorm:bwd")
ATTENTION = ("flash_atten", "flash_atten_causal")
FLOOR = 2.0  # above_launch_floor's factor
LOSS = "soft_l1"


def load(path: Path, gpu: GpuSpec) -> OpSamples:
    return operator_records(load_samples(path), gpu)


def errors(samples: OpSamples, gpu: GpuSpec) -> np.ndarray:
    """predicted / measured - 1 of every sample, in the burst regime the samples were timed in."""
    peak = gpu.flops_for(Precision.BF16)
    return predict_ops(samples, gpu, peak) / np.asarray(samples.measured) - 1.0


def _select(samples: OpSamples, tag: str, phase: str) -> np.ndarray:
    return np.array([t == tag and p == phase for t, p in zip(samples.tag, samples.phase, strict=True)])


def error_table(samples: OpSamples, gpu: GpuSpec) -> list[dict]:
    """One row per (operator, direction[, attention kernel curve]): n, median signed error and
    range over every sample, and n and median over those above the launch floor."""
    floor = above_launch_floor(samples, FLOOR)
    kernels = {"": gpu, **{f" [{k.value}]": with_attention_kernel(gpu, k) for k in AttentionKernel
                           if gpu.efficiency.attention_kernel_curve(k) is not None}}
    rows = []
    for tag, phase in dict.fromkeys(zip(samples.tag, samples.phase, strict=True)):
        m = _select(samples, tag, phase)
        for label, g in kernels.items() if tag in ATTENTION else [("", gpu)]:
            err = errors(samples.subset(m), g)
            above = err[floor[m]]
            rows.append({"op": tag + label, "phase": phase, "n": int(m.sum()), "median": float(np.median(err)),
                         "lo": float(err.min()), "hi": float(err.max()), "n_above": len(above),
                         "median_above": float(np.median(above)) if len(above) else None})
    return rows


def fit_curve(samples: OpSamples, gpu: GpuSpec, key: str) -> EfficiencyCurve:
    """``key``'s curve (``"<op name>:<fwd|bwd>"``) fitted to ``samples`` (all of that operator
    and direction), everything else of the GPU's curves kept."""
    peak = gpu.flops_for(Precision.BF16)
    layout = ParamLayout.for_keys({key: False})
    spec, _ = fit_efficiency(samples, gpu, peak, gpu.efficiency, loss=LOSS, max_nfev=400, layout=layout,
                             fix_overhead=True)
    return spec.ops[key]


def with_curve(gpu: GpuSpec, key: str, curve: EfficiencyCurve) -> GpuSpec:
    eff = gpu.efficiency
    return gpu.model_copy(update={"efficiency": eff.model_copy(update={"ops": {**eff.ops, key: curve}})})


def fit_report(samples: OpSamples, gpu: GpuSpec, key: str) -> dict:
    """The curve of ``key`` fitted above the launch floor, its in-sample and leave-one-out
    errors there, and the catalog's (transferred) curve's errors on the same samples."""
    name, phase = key.rsplit(":", 1)
    mine = samples.subset(np.array([op.name == name for op in samples.ops]) & (np.asarray(samples.phase) == phase))
    keep = above_launch_floor(mine, FLOOR)
    kept = mine.subset(keep)
    curve = fit_curve(kept, gpu, key)
    loo = []
    for i in range(len(kept)):
        out = np.arange(len(kept)) == i
        g = with_curve(gpu, key, fit_curve(kept.subset(~out), gpu, key))
        loo.append(float(errors(kept.subset(out), g)[0]))
    fitted = with_curve(gpu, key, curve)
    return {"key": key, "n": len(mine), "kept": len(kept), "curve": curve,
            "before": errors(kept, gpu), "after": errors(kept, fitted), "loo": np.array(loo),
            "after_all": errors(mine, fitted)}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("samples", nargs="?", type=Path, default=DEFAULT_SAMPLES)
    parser.add_argument("--gpu", default="H100-SXM5-80GB")
    parser.add_argument("--fit", default=",".join(DEFAULT_FIT), help="curves to fit, comma-separated ('' for none)")
    args = parser.parse_args()
    gpu = load_gpu(args.gpu)
    samples = load(args.samples, gpu)
    print(f"{args.samples}: {len(samples)} samples of {gpu.name}; errors predicted/measured - 1, %")
    print(f"{'op':30} {'phase':5} {'n':>3} {'median':>7} {'range':>17} {'n>floor':>7} {'median':>7}")
    for r in error_table(samples, gpu):
        rng = f"{_pct(r['lo'])}..{_pct(r['hi'])}"
        print(f"{r['op']:30} {r['phase']:5} {r['n']:3d} {_pct(r['median']):>7} {rng:>17} {r['n_above']:7d} "
              f"{_pct(r['median_above']):>7}")
    for key in filter(None, args.fit.split(",")):
        name, _, phase = key.rpartition(":")
        mine = samples.subset(np.array([o.name == name for o in samples.ops]) & (np.asarray(samples.phase) == phase))
        if above_launch_floor(mine, FLOOR).sum() < 3:
            print(f"\n{key}: {int(above_launch_floor(mine, FLOOR).sum())} of {len(mine)} samples above the launch "
                  "floor: too few to fit a curve")
            continue
        f = fit_report(samples, gpu, key)
        c = f["curve"]
        med = lambda a: f"{100 * statistics.median(a):+.1f} %"  # noqa: E731
        absmed = lambda a: f"{100 * statistics.median(np.abs(a)):.1f} %"  # noqa: E731
        print(f"\n{key}: fitted on {f['kept']} of {f['n']} samples (above the launch floor), loss {LOSS}")
        print(f"  catalog curve now: median {med(f['before'])}, range {_pct(f['before'].min())}..{_pct(f['before'].max())} %")
        print(f"  fitted: max_fraction {c.max_fraction:.4f}, half_work {c.half_work:.4g} bytes: in-sample median "
              f"{med(f['after'])}, |err| median {absmed(f['after'])}, max {100 * np.abs(f['after']).max():.1f} %")
        print(f"  leave-one-out: |err| median {absmed(f['loo'])}, max {100 * np.abs(f['loo']).max():.1f} %; "
              f"on every sample (floor included): median {med(f['after_all'])}")
        print(f'  "{key}": {{max_fraction: {c.max_fraction:.4f}, half_work: {c.half_work:.4g}, fitted: {f["kept"]}}}')


if __name__ == "__main__":
    main()
