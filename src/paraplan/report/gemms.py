"""The matrix multiplications of one layer, as AMPeD lists them: M, N, K, FLOPs and time per GEMM,
and every pass's matrix dimensions as CSV for GEMM-level simulators such as DeepFlow.

Shapes come from the inventory (``Op.dims``): a linear layer is Y[m, n] = X[m, k] W[k, n]; the
unfused attention core's batched matmuls run (b * heads) products of [l, d] x [d, l_kv]
(scores) and [l, l_kv] x [l_kv, d] (context). Fused flash attention is one kernel, not a GEMM,
and is left out.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

from paraplan.prediction import OpEstimate, Prediction


@dataclass(frozen=True, slots=True)
class GemmRow:
    """One GEMM of one layer, one micro-batch, one GPU: ``batch`` products of [m, k] x [k, n]."""

    operator: str
    role: str
    batch: int
    m: int
    n: int
    k: int
    flops: float  # forward
    fwd_s: float
    bwd_s: float  # both backward GEMMs (input and weight gradients)

    @property
    def fwd_tflops_per_s(self) -> float:
        return self.flops / self.fwd_s / 1e12 if self.fwd_s > 0 else 0.0

    def passes(self) -> tuple[tuple[str, int, int, int], ...]:
        """(pass, M, K, N) of the forward GEMM and the two backward ones: dX = dY W^T
        ([m, n] x [n, k]) and dW = X^T dY ([k, m] x [m, n])."""
        return (
            ("fwd", self.m, self.k, self.n),
            ("bwd_input", self.m, self.n, self.k),
            ("bwd_weight", self.k, self.m, self.n),
        )


def _shape(op: OpEstimate) -> tuple[int, int, int, int] | None:
    """(batch, m, k, n) of a GEMM-shaped operator, None for any other."""
    d = dict(op.dims)
    if op.kind == "gemm" and {"m", "k", "n"} <= d.keys():
        return 1, d["m"], d["k"], d["n"]
    if op.kind == "bmm" and {"b", "h", "l", "l_kv", "d"} <= d.keys():
        batch = d["b"] * d["h"]
        if op.name == "baddbmm":  # scores Q K^T
            return batch, d["l"], d["d"], d["l_kv"]
        if op.name == "bmm":  # context P V
            return batch, d["l"], d["l_kv"], d["d"]
    return None


def gemm_rows(pred: Prediction) -> tuple[GemmRow, ...]:
    """The GEMMs of one layer of the critical stage (``Prediction.layer_ops``), in execution order."""
    rows = []
    for op in pred.layer_ops:
        shape = _shape(op)
        if shape is None:
            continue
        batch, m, k, n = shape
        rows.append(GemmRow(op.name, op.role, batch, m, n, k, op.flops, op.fwd_s, op.bwd_s))
    return tuple(rows)


def render_gemms_csv(pred: Prediction) -> str:
    """Every GEMM of one layer (one micro-batch, one GPU) in each pass: operator, pass, batch,
    M, K, N and FLOPs (2 * batch * M * K * N), one row each."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["operator", "pass", "batch", "M", "K", "N", "flops"])
    for row in gemm_rows(pred):
        for name, m, k, n in row.passes():
            writer.writerow([row.operator, name, row.batch, m, k, n, f"{2.0 * row.batch * m * k * n:.0f}"])
    return buffer.getvalue()
