"""The roofline of the operator kinds no kernel of has been measured: the state-space scans,
the causal convolution before them and chunked linear attention (``inventory.scan_kinds``).

time = max(compute time, memory time) + kernel overhead (Williams, Waterman & Patterson 2009,
"Roofline"), where the compute side runs where the kernel does:

- Mamba-2's SSD scan and gated DeltaNet's chunks on the tensor cores: their FLOPs are chunked
  matrix products (Dao & Gu 2024, section 6: SSD "leverages matrix multiplication"; Yang et al.
  2025, section 3.3: the chunkwise form is matmuls), at the GPU's 16-bit peak and its GEMM curve;
- Mamba-1's selective scan on the CUDA cores (a recurrence, no matmul: Dao & Gu 2024's
  "H100 has 989 TFLOPS of BF16 matmul but only 67 TFLOPS of FP32 arithmetic"), at the GPU's fp32
  peak (a sixteenth of its 16-bit tensor peak where the catalog has none) and its GEMM curve;
- the causal convolution is memory-bound (4 multiply-adds per 2-byte element: far below any
  GPU's ridge point), its bytes over the HBM bandwidth on the memory curve.

No operator of these kinds has been measured: every prediction that has one says so
(``scan_gaps``), naming the formula its work comes from.
"""

from __future__ import annotations

from collections.abc import Iterable

from paraplan.inventory import Op, OpKind
from paraplan.specs import EfficiencyCurve, GpuSpec, Phase, Precision

# kind -> where its FLOPs run ("tensor" | "fp32" | None: memory-bound), and what it is
SCAN_KINDS: dict[OpKind, tuple[str | None, str]] = {
    OpKind.SSM_SCAN: ("tensor", "Mamba-2 SSD chunked scans (Dao & Gu 2024, section 6)"),
    OpKind.LINEAR_ATTENTION: ("tensor", "gated DeltaNet chunk kernels (Yang et al. 2025, section 3.3)"),
    OpKind.SELECTIVE_SCAN: ("fp32", "Mamba-1 selective scans (Gu & Dao 2023, section 3.3)"),
    OpKind.CAUSAL_CONV1D: (None, "causal conv1d kernels"),
}


def _seconds(work: float, rate: float, curve: EfficiencyCurve) -> float:
    return 0.0 if work <= 0.0 else (work + curve.half_work) / (rate * curve.max_fraction)


def scan_op_s(op: Op, phase: Phase, gpu: GpuSpec, tensor_peak: float) -> float:
    """Seconds of one operator of a ``SCAN_KINDS`` kind in ``phase``: the roofline above, with
    ``tensor_peak`` the 16-bit (the job's non-FP8) tensor-core rate."""
    flops, traffic = op.work(phase)
    if flops <= 0.0 and traffic <= 0.0:
        return 0.0
    eff = gpu.efficiency
    where = SCAN_KINDS[op.kind][0]
    memory_s = _seconds(traffic, gpu.hbm_bandwidth_bytes_per_s, eff.memory)
    compute_s = 0.0
    if where == "tensor":
        compute_s = _seconds(flops, tensor_peak, eff.gemm)
    elif where == "fp32":
        compute_s = _seconds(flops, cuda_core_peak(gpu, tensor_peak), eff.gemm)
    return max(compute_s, memory_s) + eff.kernel_overhead_s


def cuda_core_peak(gpu: GpuSpec, tensor_peak: float) -> float:
    """The GPU's fp32 (CUDA-core) FLOP/s; a sixteenth of the 16-bit tensor peak where the
    catalog gives none (the ratio the Mamba-2 authors quote for A100 and H100)."""
    fp32 = gpu.peak_flops.get(Precision.FP32)
    return float(fp32) if fp32 else tensor_peak / 16.0


def scan_source(op: Op) -> str:
    """What timed ``op`` (``--explain``)."""
    where = SCAN_KINDS[op.kind][0]
    side = {"tensor": "tensor-core peak", "fp32": "fp32 CUDA-core peak", None: "HBM bandwidth"}[where]
    return f"roofline ({side}; uncalibrated: no measured {op.kind.value} kernel)"


def scan_gaps(gpu: GpuSpec, ops: Iterable[Op]) -> tuple[str, ...]:
    """One note per kind of ``SCAN_KINDS`` the ops use: it is timed by a roofline, not measured."""
    kinds = sorted({op.kind for op in ops if op.kind in SCAN_KINDS and (op.flops or op.bytes)}, key=lambda k: k.value)
    notes = []
    for kind in kinds:
        where, what = SCAN_KINDS[kind]
        side = {"tensor": "its 16-bit tensor peak", "fp32": "its fp32 peak", None: "its HBM bandwidth"}[where]
        notes.append(f"{gpu.name}: no measured kernel for {what}; their work is the cited formula's, "
                     f"timed by the roofline at {side}")
    return tuple(notes)


# attention variants the flash kernel runs with extra work per score the measured curves never saw
_VARIANTS = {"soft cap": "logit soft-capping (Gemma 2: a tanh per score)",
             "sinks": "attention sinks (gpt-oss: one more logit per head in the softmax)"}


def attention_variant_gaps(gpu: GpuSpec, ops: Iterable[Op]) -> tuple[str, ...]:
    """One note per attention variant the ops run that the GPU's attention curve was not measured
    with: they are timed as plain flash attention of the same FLOPs (the sliding window and the
    chunks are not variants: they only shrink the square the kernel executes)."""
    roles = {op.role for op in ops if op.kind is OpKind.ATTENTION}
    return tuple(f"{gpu.name}: attention with {what} timed as plain flash attention (no measurement of it)"
                 for word, what in _VARIANTS.items() if any(word in r for r in roles))

