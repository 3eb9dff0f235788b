"""Fit one efficiency curve of a GPU to published kernel measurements.

Two kinds of tables, each turned into inventory operators so that the fitted numbers mean
exactly what ``estimate_op_s`` does with them:

- ``load_gemm_table``: XLA's GEMM performance table (``shared/data/xla_perf_tables/matmul.csv``:
  ``gpu_key, b, m, n, k, dtype, flops_per_s``; one batched ``b x (m x k) @ (k x n)`` per row).
  A table whose rows exceed the GPU's dense peak in that precision is refused: it cannot
  describe that GPU (XLA's sm_90 FP8 rows reach 2,620 TFLOP/s against H100's 1,979).
- ``load_attention_points``: attention benchmarks as the FlashAttention papers print them
  (``phase, head_dim, causal, seq_len, tflops, tokens, hidden``; FLOPs counted as FA counts
  them: 4 s^2 d heads batch forward, halved when causal, 2.5x backward; a ``fwd+bwd`` row is
  one forward and its backward over their summed time, 3.5x the forward's FLOPs), e.g. the
  package's ``calibrate/data/flash_attention2_h100.csv``.

``fit_curve`` fits ``max_fraction`` and ``half_work`` by least squares on log(predicted /
measured) on a random share of the rows and scores the rest.
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paraplan.calibrate._common import ErrorStats, err_stats, import_extra, split_mask
from paraplan.costmodel import estimate_op_s
from paraplan.inventory import Op
from paraplan.inventory.layer import attention_core, gemm
from paraplan.inventory.shapes import LocalShape
from paraplan.specs import ConfigError, EfficiencyCurve, GpuSpec, ModelSpec, Phase, Precision, PrecisionCurves

FP8_DTYPES = ("f8e4m3fn", "f8e5m2", "f8e4m3fnuz", "f8e5m2fnuz")
ATTENTION_POINTS = Path(__file__).parent / "data" / "flash_attention2_h100.csv"
#: an attention table's phases: a forward, a backward, or both timed together
ATTENTION_PHASES = {"fwd": (Phase.FWD,), "bwd": (Phase.BWD_INPUT,), "fwd+bwd": (Phase.FWD, Phase.BWD_INPUT)}


@dataclass(frozen=True)
class KernelPoints:
    """Measured kernels as inventory operators: op i ran ``seconds[i]`` in ``phases[i]`` (a
    tuple of phases: one run of each, timed together)."""

    kind: str  # "gemm" or "attention": the curve they fit
    precision: Precision
    ops: list[Op]
    phases: list[Phase | tuple[Phase, ...]]
    seconds: np.ndarray
    source: str


@dataclass(frozen=True)
class CurveFit:
    kind: str
    precision: Precision
    curve: EfficiencyCurve
    points: int
    fitted: int
    holdout: ErrorStats
    source: str

    @property
    def block(self) -> str:
        """The catalog line (under ``efficiency:``, or under ``precisions: fp8:``)."""
        c = self.curve
        return f"{self.kind}: {{max_fraction: {c.max_fraction:.4f}, half_work: {c.half_work:.3g}}}"


def _table_precision(dtype: str) -> Precision:
    operand = dtype.split("x")[0]
    if operand.startswith(FP8_DTYPES):
        return Precision.FP8
    for p in (Precision.BF16, Precision.FP32):
        if operand == p.value.replace("fp", "f"):
            return p
    if operand == "f16":
        return Precision.FP16
    raise ConfigError(f"--dtype {dtype}: not a GEMM dtype of the table (e.g. bf16xbf16->bf16)")


def load_gemm_table(
    path: Path, gpu_key: str, dtype: str, gpu: GpuSpec, min_flops: float = 1e10
) -> KernelPoints:
    """The rows of one (GPU key, dtype) with at least ``min_flops`` FLOPs (smaller GEMMs are
    launch-latency-bound and irrelevant to training) as GEMM operators."""
    pd = import_extra("pandas")
    table = pd.read_csv(path)
    rows = table[(table.gpu_key == gpu_key) & (table.dtype == dtype)]
    if rows.empty:
        raise ConfigError(f"--gpu-key/--dtype: no rows for {gpu_key} {dtype} in {path}")
    precision = _table_precision(dtype)
    peak = gpu.flops_for(precision)
    fastest = float(rows.flops_per_s.max())
    if fastest > peak:
        raise ConfigError(
            f"--gpu-key {gpu_key}: its {dtype} rows reach {fastest / 1e12:,.0f} TFLOP/s, above "
            f"{gpu.name}'s dense {precision.value} peak of {peak / 1e12:,.0f}: the table cannot describe it"
        )
    flops = 2.0 * rows.b * rows.m * rows.n * rows.k
    rows = rows[flops >= min_flops]
    fp8 = precision is Precision.FP8
    operand = 1 if fp8 else 4 if precision.full_width else 2
    ops = []
    for r in rows.itertuples():
        op = gemm("gemm", "table row", int(r.b * r.m), int(r.k), int(r.n), 2, bias=False, saved=0.0, fp8=fp8)
        # b independent products: each reads its own B matrix
        ops.append(dataclasses.replace(op, bytes=r.b * (operand * (r.m * r.k + r.k * r.n) + 2 * r.m * r.n)))
    seconds = (2.0 * rows.b * rows.m * rows.n * rows.k / rows.flops_per_s).to_numpy()
    source = f"{Path(path).name} {gpu_key} {dtype}, {len(ops)} rows >= {min_flops:.0e} FLOPs"
    return KernelPoints("gemm", precision, ops, [Phase.FWD] * len(ops), seconds, source)


def load_attention_points(path: Path = ATTENTION_POINTS) -> KernelPoints:
    """Attention benchmark points (``#`` lines are comments naming the source) as flash
    attention operators of the inventory."""
    text = Path(path).read_text(encoding="utf-8").splitlines()
    comments = [line.lstrip("# ").strip() for line in text if line.startswith("#")]
    reader = csv.DictReader(line for line in text if line.strip() and not line.startswith("#"))
    ops, phases, seconds = [], [], []
    for row in reader:
        d, s, hidden = int(row["head_dim"]), int(row["seq_len"]), int(row["hidden"])
        heads, batch = hidden // d, int(row["tokens"]) // s
        x = LocalShape(b=batch, s=s, s_kv=s, s_norm=s, h=hidden, heads=heads, groups=heads, d=d, ffn=1, vocab=1,
                       tp=1, e=2)
        model = ModelSpec(num_layers=1, hidden_size=hidden, num_attention_heads=heads, seq_length=s, vocab_size=1)
        op = dataclasses.replace(attention_core(model, x)[0], exec_fraction=0.5 if row["causal"] == "1" else 1.0)
        if row["phase"] not in ATTENTION_PHASES:
            raise ConfigError(f"{path}: phase {row['phase']!r}: not one of {', '.join(ATTENTION_PHASES)}")
        steps = ATTENTION_PHASES[row["phase"]]
        ops.append(op)
        phases.append(steps if len(steps) > 1 else steps[0])
        seconds.append(sum(op.work(p)[0] for p in steps) / (float(row["tflops"]) * 1e12))
    if not ops:
        raise ConfigError(f"{path}: no attention points")
    title = comments[0].split(":")[0] if comments else Path(path).name
    return KernelPoints("attention", Precision.BF16, ops, phases, np.array(seconds), f"{Path(path).name}: {title}")


def with_curve(
    gpu: GpuSpec, kind: str, precision: Precision, curve: EfficiencyCurve, source: str | None = None
) -> GpuSpec:
    """``gpu`` with ``curve`` as its ``kind`` curve in ``precision`` (the 16-bit curves are the
    base ones, others go under ``precisions``; memory has one curve for all). ``source``, when
    given, becomes the precision's curves' source too (else a new entry says "trial")."""
    eff = gpu.efficiency
    if kind == "memory" or precision in (Precision.BF16, Precision.FP16):
        eff = eff.model_copy(update={kind: curve})
    else:
        own = eff.precisions.get(precision) or PrecisionCurves(source=source or "trial")
        own = own.model_copy(update={kind: curve, **({"source": source} if source else {})})
        eff = eff.model_copy(update={"precisions": {**eff.precisions, precision: own}})
    return gpu.model_copy(update={"efficiency": eff})


def predict_points(points: KernelPoints, gpu: GpuSpec, curve: EfficiencyCurve, index: Sequence[int]) -> np.ndarray:
    trial = with_curve(gpu, points.kind, points.precision, curve)
    peak = gpu.flops_for(points.precision)
    return np.array([sum(estimate_op_s(points.ops[i], p, trial, peak, points.precision) for p in _steps(points.phases[i]))
                     for i in index])


def _steps(phase: Phase | tuple[Phase, ...]) -> tuple[Phase, ...]:
    return phase if isinstance(phase, tuple) else (phase,)


#: The smallest half_work the fits consider (log10): no start-up cost beyond the kernel overhead.
MIN_HALF_WORK_LOG10 = 3.0


def fit_curve(
    points: KernelPoints,
    gpu: GpuSpec,
    *,
    seed: int = 0,
    holdout: float = 0.2,
    fit_half_work: bool = True,
    loss: str = "linear",
) -> CurveFit:
    """max_fraction and half_work of ``points.kind``'s curve on ``gpu`` (its other curves
    as they are), fitted on 1 - ``holdout`` of the points and scored on the rest. With
    ``fit_half_work=False`` (too few distinct sizes to tell the two apart) only max_fraction
    is fitted and half_work is the smallest the fit allows (10**MIN_HALF_WORK_LOG10). ``loss``
    is least_squares' (``soft_l1`` keeps one outlier call from pulling the curve)."""
    least_squares = import_extra("scipy.optimize").least_squares
    held = split_mask(list(range(len(points.ops))), holdout, seed)
    train, test = np.flatnonzero(~held), np.flatnonzero(held)

    def curve(p: np.ndarray) -> EfficiencyCurve:
        log_half = p[1] if fit_half_work else MIN_HALF_WORK_LOG10
        return EfficiencyCurve(max_fraction=float(min(p[0], 1.0)), half_work=float(10**log_half))

    def residuals(p: np.ndarray) -> np.ndarray:
        return np.log(predict_points(points, gpu, curve(p), train) / points.seconds[train])

    if fit_half_work:
        start, bounds = [0.6, 9.5], ([0.01, MIN_HALF_WORK_LOG10], [1.0, 13.0])
    else:
        start, bounds = [0.6], ([0.01], [1.0])
    result = least_squares(residuals, start, bounds=bounds, loss=loss, f_scale=0.1)
    fitted = curve(result.x)
    score = err_stats(predict_points(points, gpu, fitted, test), points.seconds[test]) if len(test) else \
        err_stats(predict_points(points, gpu, fitted, train), points.seconds[train])
    return CurveFit(points.kind, points.precision, fitted, len(points.ops), len(train), score, points.source)
