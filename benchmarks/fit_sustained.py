"""The sustained-clock GEMM factor of a GPU from `benchmarks/gpu/sustained.py`'s measurements.

    python benchmarks/fit_sustained.py [RECORD.json ...] [--gpu H100-SXM5-80GB]

For every GEMM the probe timed on `torch.randn` operands, in bf16 and FP8, this prints

- the rate the GPU's catalog curve predicts in a burst (``estimate_op_s`` without the sustained
  factor: the curve was fitted to XLA's burst table),
- the measured burst rate and its ratio to the curve (does the curve describe bursts on this board?),
- the measured rate once the kernel has been held until the board sits at its power limit, and its
  ratio to the curve: the catalog's ``efficiency.sustained.gemm_fraction`` is the median of these
  ratios over the shapes (bf16), and ``fp8_gemm_fraction`` the same for FP8.

Operator-level measurements only: no end-to-end run is read. Records default to the H100 check
committed under benchmarks/data/gpu/h100-2026-11-27 (the full JSON of run2 and the headline rows of
run1, from its manifest: run1's other files did not come back from the GPU machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from paraplan.catalog.loader import load_gpu
from paraplan.costmodel import estimate_op_s
from paraplan.inventory.layer import gemm
from paraplan.specs import Phase, Precision

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "gpu" / "h100-2026-11-27"
DEFAULT_RECORDS = [DATA / "run2" / "gpucheck" / "profile" / "sustained_gemm.json", DATA / "run1" / "manifest.json"]
SHAPES = {  # the probe's shapes (benchmarks/gpu/sustained.py), for the manifest's rows that omit them
    "gpt3-tp4 qkv": (2048, 9216, 12288), "gpt3-tp4 proj": (2048, 12288, 3072), "gpt3-tp4 fc1": (2048, 12288, 12288),
    "gpt3-tp4 fc2": (2048, 12288, 12288), "gpt3-tp4 fc1 wgrad": (12288, 12288, 2048),
    "llama70-tp8 qkv": (8192, 1280, 8192), "llama70-tp8 gate_up": (8192, 7168, 8192),
    "llama70-tp8 down": (8192, 8192, 3584), "8192^3": (8192, 8192, 8192)}


def run_of(path: Path) -> str:
    """The run folder a record lies in (run1, run2, ...), or its file name."""
    return next((p for p in reversed(path.parts) if p.startswith("run")), path.name)


def rows_of(path: Path) -> list[dict]:
    """The GEMM rows of a probe record, or of a check's manifest (``results.sustained``)."""
    record = json.loads(path.read_text())
    if "gemms" in record:
        return [dict(r, run=run_of(path)) for r in record["gemms"]]
    rows = record["results"]["sustained"]["gemms"]
    out = []
    for r in rows:
        m, n, k = SHAPES[r["gemm"]]
        out.append(dict(r, m=m, n=n, k=k, run=run_of(path)))
    return out


def curve_tflops(gpu, m: int, n: int, k: int, precision: Precision) -> float:
    fp8 = precision is Precision.FP8
    op = gemm("gemm", "probe", m, k, n, 2, bias=False, saved=0.0, fp8=fp8)
    seconds = estimate_op_s(op, Phase.FWD, gpu, gpu.flops_for(precision), precision)
    return 2.0 * m * n * k / seconds / 1e12


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", nargs="*", type=Path, default=DEFAULT_RECORDS)
    parser.add_argument("--gpu", default="H100-SXM5-80GB")
    args = parser.parse_args(argv)
    gpu = load_gpu(args.gpu)
    ratios: dict[str, list[float]] = {"bf16": [], "fp8": []}
    print(f"{'gemm':<20} {'prec':>4} {'run':>5} {'curve':>7} {'burst':>7} {'/curve':>6} {'held':>7} {'/curve':>6}")
    for path in args.records:
        for r in rows_of(path):
            if r["data"] != "randn":
                continue
            precision = Precision.FP8 if r["precision"] == "fp8" else Precision.BF16
            curve = curve_tflops(gpu, r["m"], r["n"], r["k"], precision)
            held = r["sustained_tflops"] / curve
            ratios[r["precision"]].append(held)
            print(f"{r['gemm']:<20} {r['precision']:>4} {r['run'][:5]:>5} {curve:7.1f} {r['burst_tflops']:7.1f} "
                  f"{r['burst_tflops'] / curve:6.3f} {r['sustained_tflops']:7.1f} {held:6.3f}")
    print("TFLOP/s; curve: the catalog's burst curve; held: after the kernel ran until\n"
          "the board sat at its power limit")
    for precision, values in ratios.items():
        if values:
            print(f"{precision}: held / curve median {statistics.median(values):.4f} over {len(values)} rows "
                  f"(range {min(values):.3f}-{max(values):.3f})")


if __name__ == "__main__":
    main()
