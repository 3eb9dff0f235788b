"""The concurrency of Transformer Engine's multi-stream grouped GEMM, from operator timings.

Megatron-Core runs a rank's local experts through Transformer Engine's ``GroupedLinear``: one
cuBLAS GEMM per expert, the i-th on compute stream i % 4. The cost model prices a grouped GEMM
as lone GEMMs of the summed work, each paying its ramp-up (``half_work``) and kernel overhead
(``costmodel.roofline.ramps``): 4 streams filling the GPU together would pay one per 4 experts.
A measured grouped GEMM of ``groups`` GEMMs of [m, k] x [k, n] in ``seconds`` gives how many
lone GEMMs' ramps its time holds beside the summed work (the curve is linear in them), and so
the concurrency, ``groups`` over that count. The rows are timed GEMM calls alone (a benchmark
of the grouped GEMM, burst clocks), priced on the GPU's own burst curve. Only operator-level
data: no iteration time is looked at.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

from paraplan.costmodel import estimate_op_s
from paraplan.inventory.layer import gemm
from paraplan.specs import GpuSpec, Phase, Precision


@dataclasses.dataclass(frozen=True, slots=True)
class GroupedGemmRow:
    """One measured grouped GEMM: ``groups`` GEMMs of m x k x n (m per group) at ``tflops``
    (2 m k n groups / seconds / 1e12, as the benchmarks report it)."""

    groups: int
    m: int
    n: int
    k: int
    tflops: float

    @property
    def seconds(self) -> float:
        return 2.0 * self.groups * self.m * self.n * self.k / (self.tflops * 1e12)


def row_concurrency(row: GroupedGemmRow, gpu: GpuSpec, precision: Precision = Precision.BF16) -> float:
    """``row.groups`` over the number of lone GEMMs' ramps the measured time prices on
    ``gpu``'s burst curve in ``precision`` (the time of the summed work with one ramp, and what
    each further ramp adds, both from ``estimate_op_s``)."""
    op = gemm("grouped_gemm_sample", "grouped GEMM sample", row.groups * row.m, row.k, row.n, 2,
              bias=False, saved=0.0)
    peak = gpu.flops_for(precision)
    one = estimate_op_s(op, Phase.FWD, gpu, peak, precision)
    each = estimate_op_s(dataclasses.replace(op, launches=2), Phase.FWD, gpu, peak, precision) - one
    ramps = 1.0 + (row.seconds - one) / each
    return row.groups / ramps


def fit_concurrency(rows: Sequence[GroupedGemmRow], gpu: GpuSpec, precision: Precision = Precision.BF16) -> float:
    """The median concurrency of ``rows`` on ``gpu`` (``row_concurrency``)."""
    if not rows:
        raise ValueError("rows: no measured grouped GEMM to fit the concurrency to")
    return statistics.median(row_concurrency(row, gpu, precision) for row in rows)
