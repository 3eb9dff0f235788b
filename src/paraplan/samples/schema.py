"""The one table of measured operator and collective timings ("sample records").

Every timing paraplan learns from is one row of a pandas DataFrame with exactly these
columns (importers and paraplan's own profiler write it; the regressors read it):

``kind``
    ``"op"`` (one operator on one GPU) or ``"collective"`` (one NCCL collective or p2p call).
``name``
    For operators, the inventory operator's name (:data:`OP_NAMES`: ``linear1`` ...
    ``linear_final``, ``baddbmm``, ``bmm``, ``softmax``, ``flash_atten``, ``layernorm``,
    ``RMSlayernorm``, ``RoPE``, ``gelu``, ``res_add``, ``embedding``, ``cross_entropy``,
    ``optimizer``, ``fillmask``). For collectives, the
    :class:`paraplan.inventory.CollectiveKind` value (``all_reduce``, ``all_gather``,
    ``reduce_scatter``, ``send_recv``, ``all_to_all``, ``broadcast``).
``variant``
    The source's own tag when it differs from ``name`` (``ScaledUpperTriangMaskedSoftmax``
    for a ``softmax``, ``parallel_cross_entropy_128`` for ``cross_entropy``,
    ``firstStage_optimizer`` for ``optimizer``, ``allreduce_large`` for ``all_reduce``), else
    ``""``. Two variants of one name are different implementations or sweeps of it.
``phase``
    ``"fwd"`` or ``"bwd"`` (backward = input- plus weight-gradient kernels of the operator)
    for operators, ``"step"`` for ``optimizer``, ``""`` for collectives.
``mp``, ``b``, ``h``, ``l``, ``dim``, ``vp``, ``encoders`` (operators; nullable integers)
    The sampled shape in GPUModeling's terms: tensor-parallel degree emulated on one rank,
    micro-batch, total attention heads (before division by ``mp``), sequence length, hidden
    size, vocabulary rows per rank, transformer layers of a synthetic pipeline stage. A
    column the operator does not depend on is null (norms and the residual add have no
    ``mp``; ``vp`` is null when the source has no such column). Null for collectives.
``bytes``, ``nodes``, ``gpus_per_node`` (collectives; nullable integers)
    The call's size in paraplan's ``Collective.bytes`` convention (nccl-tests': the buffer of
    an all-reduce or a broadcast, the TOTAL output of an all-gather, the input of a
    reduce-scatter, one rank's whole send buffer of an all-to-all, the message of a send/recv) and the group's layout, ``nodes`` x ``gpus_per_node`` ranks. Null
    for operators.
``dtype``
    The element type the timing ran in (a :class:`paraplan.specs.Precision` value, e.g.
    ``"fp16"``).
``device``
    The catalog GPU name (``paraplan.catalog.load_gpu(...).name``, e.g. ``A100-SXM4-80GB``).
``cluster``
    The catalog cluster a collective ran on (e.g. ``perlmutter-gpumodeling``); ``""`` when
    unknown and for operators.
``time_s``
    The measured time of one call, in seconds (finite and > 0). The source's reduction of its
    repeated measurements is recorded by the importer (GPUModeling: the mean of the 3rd to 7th
    smallest of 10 iterations).
``source``
    Where the row came from: the source file as ``<folder>/<file>`` (relative, no machine
    paths).
``row``
    The 0-based data row of ``source`` (header not counted), so every sample can be traced
    back to its measurement.

:func:`validate_samples` checks a frame against this schema and returns it with the
canonical column order and dtypes; it raises :class:`~paraplan.specs.ConfigError` with one
line naming the first offending column.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from paraplan.inventory import CollectiveKind
from paraplan.specs import ConfigError, Precision

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "COLLECTIVE_COLUMNS",
    "COLLECTIVE_NAMES",
    "COLUMNS",
    "KINDS",
    "OP_COLUMNS",
    "OP_NAMES",
    "PHASES",
    "SCHEMA_VERSION",
    "count_samples",
    "empty_samples",
    "validate_samples",
]

#: Bumped whenever a column is added, removed or changes meaning.
SCHEMA_VERSION = 1

KINDS = ("op", "collective")
OP_NAMES = (
    "linear1",
    "linear2",
    "linear3",
    "linear4",
    "linear_final",
    "baddbmm",
    "bmm",
    "softmax",
    "flash_atten",
    "layernorm",
    "RMSlayernorm",
    "RoPE",
    "gelu",
    "res_add",
    "embedding",
    "cross_entropy",
    "optimizer",
    "fillmask",
)
COLLECTIVE_NAMES = tuple(k.value for k in CollectiveKind)
#: Phases of operator rows; collective rows have ``""``.
PHASES = ("fwd", "bwd", "step")

OP_COLUMNS = ("mp", "b", "h", "l", "dim", "vp", "encoders")
COLLECTIVE_COLUMNS = ("bytes", "nodes", "gpus_per_node")

#: Column -> pandas dtype, in the canonical order.
COLUMNS: dict[str, str] = {
    "kind": "string",
    "name": "string",
    "variant": "string",
    "phase": "string",
    **dict.fromkeys(OP_COLUMNS, "Int64"),
    **dict.fromkeys(COLLECTIVE_COLUMNS, "Int64"),
    "dtype": "string",
    "device": "string",
    "cluster": "string",
    "time_s": "float64",
    "source": "string",
    "row": "int64",
}
_INTS = tuple(c for c, t in COLUMNS.items() if t == "Int64")
_DTYPES = tuple(p.value for p in Precision)


def empty_samples() -> pd.DataFrame:
    """A frame with the schema's columns and no rows."""
    import pandas as pd

    return pd.DataFrame({c: pd.Series([], dtype=t) for c, t in COLUMNS.items()})


def count_samples(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Records per (device, kind, name, variant, phase): operators before collectives, names
    case-insensitively, then variant, phase and device."""
    keys = ["device", "kind", "name", "variant", "phase"]
    counts = frame.groupby(keys, sort=False).size() if len(frame) else {}
    rows = [{**dict(zip(keys, map(str, k), strict=True)), "records": int(n)} for k, n in counts.items()]
    rows.sort(key=lambda r: (r["kind"] != "op", r["name"].lower(), r["variant"], r["phase"], r["device"]))
    return rows


def _first(mask: pd.Series) -> str:
    """``"N rows (first: row I)"`` for the rows where ``mask`` is true."""
    idx = mask[mask].index
    return f"{len(idx)} row{'s' if len(idx) != 1 else ''} (first: frame row {idx[0]})"


def _fail(where: str, column: str, reason: str) -> ConfigError:
    return ConfigError(f"{where}column {column!r}: {reason}")


def _check_values(
    frame: pd.DataFrame, column: str, allowed: Mapping[str, tuple[str, ...]], where: str
) -> None:
    """Each kind's rows hold one of ``allowed[kind]`` in ``column``."""
    for kind, values in allowed.items():
        rows = frame["kind"] == kind
        bad = rows & ~frame[column].isin(values)
        if bad.any():
            value = frame.loc[bad, column].iloc[0]
            shown = ", ".join(repr(v) for v in values)
            raise _fail(
                where, column, f"{kind} row with {column} {value!r} (allowed: {shown}); {_first(bad)}"
            )


def validate_samples(frame: pd.DataFrame, *, where: str = "samples") -> pd.DataFrame:
    """``frame`` checked against the schema, with canonical column order and dtypes.

    Raises :class:`ConfigError` (``"<where>: column 'x': reason"``) for a missing or unknown
    column, a value that cannot take the column's dtype, an unknown kind/name/phase/dtype, an
    operator row with collective columns (or the reverse), a shape that is not a positive
    integer, a time that is not finite and positive, or a negative ``row``.
    """
    import numpy as np
    import pandas as pd

    where = f"{where}: " if where else ""
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise _fail(
            where, missing[0], "missing" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    unknown = [c for c in frame.columns if c not in COLUMNS]
    if unknown:
        raise _fail(where, str(unknown[0]), f"not a samples column (the schema has: {', '.join(COLUMNS)})")
    out = pd.DataFrame(index=pd.RangeIndex(len(frame)))
    for column, dtype in COLUMNS.items():
        values = frame[column].reset_index(drop=True)
        try:
            if dtype == "Int64":
                numbers = pd.to_numeric(values, errors="raise").astype("Float64")
                floats = numbers.to_numpy(dtype=float, na_value=np.nan)
                with np.errstate(invalid="ignore"):
                    frac = pd.Series(np.isinf(floats) | (np.isfinite(floats) & (np.mod(floats, 1) != 0)))
                if frac.any():
                    raise _fail(where, column, f"not an integer in {_first(frac)}")
                out[column] = numbers.astype("Int64")
            elif dtype == "string":
                if values.isna().any():
                    raise _fail(where, column, f'null in {_first(values.isna())} (use "" for none)')
                out[column] = values.astype("string")
            else:
                out[column] = values.astype(dtype)
        except ConfigError:
            raise
        except (TypeError, ValueError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise _fail(where, column, f"cannot be read as {dtype}: {reason}") from None

    bad = ~out["kind"].isin(KINDS)
    if bad.any():
        raise _fail(where, "kind", f"{out.loc[bad, 'kind'].iloc[0]!r} is not one of {KINDS}; {_first(bad)}")
    _check_values(out, "name", {"op": OP_NAMES, "collective": COLLECTIVE_NAMES}, where)
    is_op = out["kind"] == "op"
    step = is_op & (out["name"] == "optimizer")
    _check_values(out[step], "phase", {"op": ("step",)}, where)
    _check_values(out[is_op & ~step], "phase", {"op": ("fwd", "bwd")}, where)
    _check_values(out, "phase", {"collective": ("",)}, where)
    bad = ~out["dtype"].isin(_DTYPES)
    if bad.any():
        raise _fail(
            where, "dtype", f"{out.loc[bad, 'dtype'].iloc[0]!r} is not one of {_DTYPES}; {_first(bad)}"
        )
    bad = out["device"] == ""
    if bad.any():
        raise _fail(where, "device", f"empty in {_first(bad)}")

    for column in _INTS:
        bad = (out[column] < 1).fillna(False)
        if bad.any():
            raise _fail(where, column, f"not a positive integer in {_first(bad)}")
    for column in COLLECTIVE_COLUMNS:
        bad = is_op & out[column].notna()
        if bad.any():
            raise _fail(where, column, f"set on an operator row in {_first(bad)}")
        bad = ~is_op & out[column].isna()
        if bad.any():
            raise _fail(where, column, f"null on a collective row in {_first(bad)}")
    for column in OP_COLUMNS:
        bad = ~is_op & out[column].notna()
        if bad.any():
            raise _fail(where, column, f"set on a collective row in {_first(bad)}")
    bad = is_op & (out["cluster"] != "")
    if bad.any():
        raise _fail(where, "cluster", f"set on an operator row in {_first(bad)}")
    time = out["time_s"].to_numpy()
    bad = pd.Series(~(np.isfinite(time) & (time > 0)))
    if bad.any():
        raise _fail(where, "time_s", f"not finite and positive in {_first(bad)}")
    bad = out["row"] < 0
    if bad.any():
        raise _fail(where, "row", f"negative in {_first(bad)}")
    return out
