"""The shapes an operator sweep measures: grid files, grids derived from a job, and splits.

A grid point names one operator and its shape in the terms of the samples schema
(GPUModeling's): ``mp`` (tensor-parallel degree emulated on one rank), ``b`` (micro-batch),
``h`` (attention heads before division by ``mp``), ``l`` (sequence length), ``dim`` (hidden
size), ``Vp`` (vocabulary rows per rank). The tensors a point runs are the ones the inventory
gives that shape (:func:`paraplan.inventory.samples.op_for_sample`); no shape is computed here.

Two grid file styles are read (:func:`load_grid`):

GPUModeling's kernel grids (``sampling_grids/kernel/*.yml``), one operator per file::

    {"kernel_name": "linear1", "columns_name": ['mp', 'b', 'l', 'dim', 'F_dur(us)', ...],
     "first_n_column": 4, "starts": [1, 2, 1024, 2048], "steps": [2, 2, 512, 512],
     "ends": [16, 8, 5120, 8192], "operators": ['mul', 'mul', 'add', 'add'], ...}

(``add`` steps arithmetically, ``mul`` geometrically, ends inclusive; other keys are ignored).

paraplan's own, several operators per file, each column a list or a range::

    linear1: {mp: [1, 2], b: [2, 4], l: {start: 1024, end: 4096, step: 1024}, dim: [1024]}
    gelu:    {mp: [1], b: {start: 1, end: 8, factor: 2}, l: [2048], dim: [1024, 2048]}

Either is enumerated like an odometer, the last column fastest, operators in file order.
:func:`grid_for_job` derives a grid from a job's inventory and its neighbour plans;
:func:`split` gives worker ``k`` of ``n`` the points ``i`` with ``i mod n == k - 1``
(GPUModeling's ``--parts/--part``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paraplan.specs import ConfigError

__all__ = [
    "COLUMNS_OF",
    "GridPoint",
    "grid_for_job",
    "load_grid",
    "neighbour_jobs",
    "parse_grid",
    "split",
]

#: Operator (schema name or GPUModeling tag) -> (schema name, variant, the shape columns it
#: needs, optional columns). The columns are those of GPUModeling's grid for the operator.
_OPS: dict[str, tuple[str, str, tuple[str, ...], tuple[str, ...]]] = {
    **{t: (t, "", ("mp", "b", "l", "dim"), ()) for t in ("linear1", "linear2", "linear3", "linear4", "gelu")},
    "linear_final": ("linear_final", "", ("mp", "b", "l", "dim"), ("Vp",)),
    "embedding": ("embedding", "", ("mp", "b", "l", "dim"), ("Vp",)),
    **{t: (t, "", ("mp", "b", "h", "l", "dim"), ()) for t in ("baddbmm", "bmm", "RoPE")},
    # timed causal, as a GPT layer runs it (GPUModeling's samples are the non-causal default)
    "flash_atten": ("flash_atten", "flash_atten_causal", ("mp", "b", "h", "l", "dim"), ()),
    "softmax": ("softmax", "", ("mp", "b", "h", "l"), ("dim",)),
    **{t: (t, "", ("b", "l", "dim"), ()) for t in ("layernorm", "RMSlayernorm", "res_add")},
    "cross_entropy": ("cross_entropy", "parallel_cross_entropy_128", ("mp", "b", "l"), ("Vp",)),
    "parallel_cross_entropy_128": ("cross_entropy", "parallel_cross_entropy_128", ("mp", "b", "l"), ("Vp",)),
}
#: Operators of the schema the inventory has no shape for: a grid naming them is refused.
_NOT_IN_INVENTORY = {
    "fillmask": "the inventory fuses the causal mask into the softmax",
    "optimizer": "the optimizer step is counted per stage, not per shape (fit keeps it analytical)",
    **{f"{s}Stage_optimizer": "the optimizer step is counted per stage, not per shape" for s in ("first", "middle", "last")},
    "ScaledUpperTriangMaskedSoftmax": "sample it as softmax",
}
#: The shape columns each operator needs (schema name -> columns).
COLUMNS_OF: dict[str, tuple[str, ...]] = {tag: cols for tag, (_, _, cols, _) in _OPS.items()}
_ORDER = ("mp", "b", "h", "l", "dim", "Vp")


@dataclass(frozen=True, order=True)
class GridPoint:
    """One operator at one shape; ``shape`` is ``((column, value), ...)`` in schema order."""

    name: str
    shape: tuple[tuple[str, int], ...]
    variant: str = ""

    @property
    def tag(self) -> str:
        """The operator tag :func:`~paraplan.inventory.samples.op_for_sample` knows it by."""
        return self.variant or self.name

    def values(self) -> dict[str, int]:
        return dict(self.shape)

    def key(self, dtype: str) -> str:
        """``linear1/fp32/mp=1,b=4,l=64,dim=64``: the point's name in a journal."""
        return f"{self.name}/{dtype}/" + ",".join(f"{k}={v}" for k, v in self.shape)


def _point(tag: str, values: Mapping[str, int]) -> GridPoint:
    name, variant, _, _ = _OPS[tag]
    return GridPoint(name, tuple((c, int(values[c])) for c in _ORDER if c in values), variant)


def _check_op(tag: Any, where: str) -> str:
    if tag in _NOT_IN_INVENTORY:
        raise ConfigError(f"{where}: operator {tag!r} is not sampled ({_NOT_IN_INVENTORY[tag]})")
    if tag not in _OPS:
        raise ConfigError(f"{where}: unknown operator {tag!r} (known: {', '.join(_OPS)})")
    return str(tag)


def _positive(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 1:
        raise ConfigError(f"{where}: {value!r} is not a positive integer")
    return int(value)


def _steps(start: Any, end: Any, step: Any, how: str, where: str) -> list[int]:
    """``start`` to ``end`` inclusive, adding ``step`` (``add``) or multiplying by it (``mul``)."""
    start, end, step = (_positive(v, where) for v in (start, end, step))
    if how not in ("add", "mul"):
        raise ConfigError(f"{where}: operator {how!r} is neither 'add' nor 'mul'")
    if how == "mul" and step < 2:
        raise ConfigError(f"{where}: a 'mul' step must be at least 2 (got {step})")
    if end < start:
        raise ConfigError(f"{where}: end {end} is below start {start}")
    values, v = [], start
    while v <= end:
        values.append(v)
        v = v + step if how == "add" else v * step
    return values


def _column(value: Any, where: str) -> list[int]:
    """A paraplan-style column: a number, a list, or {start, end, step|factor}."""
    if isinstance(value, Mapping):
        unknown = set(value) - {"start", "end", "step", "factor"}
        if unknown or "start" not in value or "end" not in value or ("step" in value) == ("factor" in value):
            raise ConfigError(f"{where}: a range is {{start, end, step}} or {{start, end, factor}}")
        how = "add" if "step" in value else "mul"
        return _steps(value["start"], value["end"], value.get("step", value.get("factor")), how, where)
    values = value if isinstance(value, list) else [value]
    if not values:
        raise ConfigError(f"{where}: no values")
    return sorted({_positive(v, where) for v in values})


def _product(tag: str, columns: Mapping[str, list[int]], where: str) -> list[GridPoint]:
    _, _, required, optional = _OPS[tag]
    missing = [c for c in required if c not in columns]
    unknown = [c for c in columns if c not in required + optional]
    if missing:
        raise ConfigError(f"{where}: {tag} needs columns {', '.join(required)} (missing: {', '.join(missing)})")
    if unknown:
        raise ConfigError(f"{where}: {tag} has no column {unknown[0]!r} (it takes {', '.join(required + optional)})")
    names = list(columns)
    return [_point(tag, dict(zip(names, combo, strict=True))) for combo in itertools.product(*columns.values())]


def _gpumodeling(doc: Mapping[str, Any], where: str) -> list[GridPoint]:
    tag = _check_op(doc.get("kernel_name"), f"{where}: kernel_name")
    try:
        n = int(doc["first_n_column"])
        names = [str(c) for c in doc["columns_name"][:n]]
        ranges = [doc[k] for k in ("starts", "steps", "ends", "operators")]
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: a GPUModeling grid needs columns_name, first_n_column, starts, "
                          f"steps, ends and operators ({type(exc).__name__}: {exc})") from None
    if any(not isinstance(r, list) or len(r) != n for r in ranges):
        raise ConfigError(f"{where}: starts, steps, ends and operators need {n} values each (first_n_column)")
    columns = {c: _steps(s, e, st, op, f"{where}: {c}")
               for c, s, st, e, op in zip(names, *ranges, strict=True)}
    return _product(tag, columns, where)


def parse_grid(doc: Any, where: str = "grid") -> list[GridPoint]:
    """The points of one grid document (either style, see the module docstring)."""
    if not isinstance(doc, Mapping) or not doc:
        raise ConfigError(f"{where}: expected a mapping (operator: columns, or a GPUModeling kernel grid)")
    if "kernel_name" in doc:
        return _gpumodeling(doc, where)
    points: list[GridPoint] = []
    for tag, columns in doc.items():
        tag = _check_op(tag, where)
        if not isinstance(columns, Mapping) or not columns:
            raise ConfigError(f"{where}: {tag}: expected a mapping of columns to values")
        parsed = {str(c): _column(v, f"{where}: {tag}.{c}") for c, v in columns.items()}
        points += _product(tag, parsed, f"{where}: {tag}")
    return points


def load_grid(paths: Sequence[str | Path]) -> list[GridPoint]:
    """The points of grid files, in order; a point given twice is measured once."""
    from paraplan.catalog.userdata import load_yaml, read_text

    points: list[GridPoint] = []
    for path in map(Path, paths):
        points += parse_grid(load_yaml(read_text(path, "the grid"), str(path)), str(path))
    return list(dict.fromkeys(points))


def neighbour_jobs(job: Any) -> list[Any]:
    """The job and its neighbour plans: tensor-parallel degree one step (x2, /2), micro-batch two
    steps (x2, x4, /2, /4) and sequence length one step (x2, /2) either way, every combination
    the cluster and the model accept (the data-parallel degree follows from the cluster). The
    job comes first. A regressor needs 10 distinct shapes per operator; these give a small job
    that many."""
    from pydantic import ValidationError

    from paraplan.specs import Job, ModelSpec, ParallelPlan

    plan, model = job.parallel, job.model
    out = [job]
    grid = itertools.product(_around(plan.tp, 1), _around(plan.micro_batch_size, 2), _around(model.seq_length, 1))
    for tp, mbs, seq in grid:
        if (tp, mbs, seq) == (plan.tp, plan.micro_batch_size, model.seq_length):
            continue
        fields = plan.model_dump(exclude_unset=True)
        fields.update(tensor_model_parallel_size=tp, micro_batch_size=mbs, data_parallel_size=None)
        if tp == 1:
            fields["sequence_parallel"] = False
        try:
            shaped = model if seq == model.seq_length else ModelSpec.model_validate(
                {**model.model_dump(exclude_unset=True), "seq_length": seq})
            out.append(Job(name=job.name, model=shaped, cluster=job.cluster,
                           parallel=ParallelPlan(**fields), precision=job.precision))
        except (ValidationError, ConfigError, ValueError):
            continue  # not a plan this cluster or model can run
    return out


def _around(value: int, steps: int) -> list[int]:
    """``value`` and ``steps`` factors of two either way (the halvings only while they divide)."""
    out, low = {value}, value
    for i in range(1, steps + 1):
        out.add(value * 2**i)
        if low % 2 == 0:
            low //= 2
            out.add(low)
    return sorted(out)


def grid_for_job(job: Any, *, neighbours: bool = True) -> list[GridPoint]:
    """The points a job (and, with ``neighbours``, its neighbour plans) needs: for each plan,
    every sampled operator its inventory counts, at the shape one rank sees (``mp = tp``,
    ``b`` = micro-batch, ``l`` = sequence / cp, ``l`` / tp for norms and residual adds under
    sequence parallelism, ``Vp`` = vocabulary rows per rank)."""
    from paraplan.inventory import count_job

    points: list[GridPoint] = []
    for plan_job in neighbour_jobs(job) if neighbours else [job]:
        inventory = count_job(plan_job)
        names = {op.name for stage in inventory.stages for op in stage.ops()}
        points += _points_of(plan_job, names)
    return list(dict.fromkeys(points))


def _points_of(job: Any, names: Iterable[str]) -> list[GridPoint]:
    model, plan = job.model, job.parallel
    seq = model.seq_length // plan.cp
    tokens_norm = seq // plan.tp if plan.sequence_parallel else seq
    values = {"mp": plan.tp, "b": plan.micro_batch_size, "h": model.num_attention_heads, "l": seq,
              "dim": model.hidden_size, "Vp": model.vocab_for(plan.tp) // plan.tp}
    out = []
    for name in sorted(names):
        tag = "cross_entropy" if name == "cross_entropy" else name
        if tag not in _OPS:
            continue  # not a sampled operator (copies, bias adds, dropout ...): analytical
        _, _, required, optional = _OPS[tag]
        shape = {c: values[c] for c in required + optional if c in values}
        if tag in ("layernorm", "RMSlayernorm", "res_add"):
            shape["l"] = tokens_norm
        if tag == "softmax":
            shape["dim"] = model.kv_channels * model.num_attention_heads
        out.append(_point(tag, shape))
    return out


def split(points: Sequence[GridPoint], parts: int, part: int) -> list[GridPoint]:
    """Worker ``part`` (1-based) of ``parts``: the points ``i`` with ``i mod parts == part - 1``.
    The parts are disjoint and together are the whole grid."""
    if parts < 1:
        raise ConfigError(f"--parts: {parts} is not a positive integer")
    if not 1 <= part <= parts:
        raise ConfigError(f"--part: {part} is not between 1 and --parts {parts}")
    return [p for i, p in enumerate(points) if i % parts == part - 1]
