"""Import GPUModeling25's CSV layout (``data/gpumodeling/README.md``) as sample records.

A folder may hold operator files ``<GPU>_<tag>_fp16.csv`` (columns among ``mp, b, h, l, dim,
Vp, encoders`` and ``F_dur(us), B_dur(us)`` or ``dur(us)``) and NCCL files
``<GPU>_<collective>_fp16_<N>_<M>.csv`` (``shape, nodes, GPUsPerNode, dur(us)``); each file is
recognised by its name. Skipped whole, with a note: the tuning tables ``<GPU>.csv`` (regressor
settings, not measurements) and the NCCL files without ``_N_M`` (row unions of the per-config
files; importing them would count every row twice).

Every row becomes one record per timed phase (``fwd``/``bwd``, or ``step`` for the optimizer
files). A record that breaks a rule is excluded and counted under the first rule it breaks, in
this order:

1. ``undocumented file layout``: a file whose columns are not the documented ones or whose
   operator or collective tag is unknown (the A100 ``optimizer_fp16.csv`` sweep: unlabelled
   ``dur`` column, ``num_layers``/``params`` instead of the grid, producing code not public).
   A file that cannot be read as CSV at all (empty, binary, not UTF-8, ragged rows) is excluded
   under this reason too and counts as one record, since its rows are unknown; the notes name
   it and say why.
2. ``non-numeric value``: a cell of the shape columns (or the NCCL ``nodes``/``GPUsPerNode``),
   or the record's own time cell, holding text that is not a number (``abc``). Cells are read
   with ``pd.to_numeric(errors="coerce")``; an empty cell is NaN and falls under rule 3 or 5.
3. ``shape not a positive integer``: a NaN, zero, negative or fractional shape value.
4. ``nodes/GPUsPerNode disagree with the file name`` (NCCL).
5. ``time NaN or not positive``.
6. ``bwd equals fwd (copied, not measured)``: a backward time exactly equal to the forward
   time of the same row. Two timings at the source's full precision do not coincide; the
   sampler wrote F_dur into B_dur (every ``res_add`` row, part of GH200 ``softmax`` and
   ``layernorm``). At the A100 files' 0.2 us resolution a rare equal pair may be chance; it
   cannot be told from a copy and is excluded too.
7. ``bwd faster than fwd (not fully captured)``: for an operator whose backward does at least
   the forward's FLOPs and is compute-bound in the inventory (GEMM, batched GEMM, flash
   attention), a file whose median B/F ratio is below 1 cannot have timed the whole backward;
   every backward record of that file is excluded (GH200 ``flash_atten``: median 0.11).
8. ``faster than the links' peak bandwidth`` (NCCL): a time shorter than
   :func:`paraplan.costmodel.estimate_collective_s` on the row's catalog cluster at 100 % of its
   links' nominal bandwidth with zero latency (:func:`ideal_cluster`) is physically impossible
   (GH200 all-gather rows at a constant ~117 us).
9. ``outlier (>10x its trend and its file's median)``: per file and phase, a robust
   least-squares fit of log(time) on the logs of the shape columns (refitted on the rows within
   3 MADs of it until stable) over the records left by the rules above; a record more than 10x
   away from that trend AND more than 10x away from the median time of its file and phase is
   an outlier (GH200 ``firstStage_optimizer``: 48 rows of 3.5-54 s against a 5.7 ms median).
   The second condition keeps tiny kernels on a launch-latency floor, which a power law
   under-predicts (GH200 ``linear2`` bwd at mp=16: 70 us, 11.6x its trend).

Grid points measured more than once in one file are kept (each is a measurement) and counted
in :attr:`ImportResult.duplicates`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from paraplan.catalog import load_cluster, load_gpu
from paraplan.costmodel import estimate_collective_s
from paraplan.inventory import Collective, CollectiveKind, GroupLayout, OpKind, ParallelDim
from paraplan.inventory.samples import SAMPLE_TAGS, op_for_sample
from paraplan.samples.schema import COLUMNS, count_samples, validate_samples
from paraplan.specs import ClusterSpec, ConfigError, LinkSpec, Phase

__all__ = [
    "EXCLUSION_REASONS",
    "GPUMODELING_CLUSTERS",
    "NCCL_FILE",
    "NCCL_KINDS",
    "OP_FILE",
    "OP_TAGS",
    "ImportResult",
    "collective_for_row",
    "gpumodeling_files",
    "group_layout",
    "ideal_cluster",
    "import_gpumodeling",
    "outlier_mask",
    "summarize_import",
]

US = 1e-6
FP16_BYTES = 2.0
#: How GPUModeling reduced its 10 timed iterations to one number.
REDUCTION = "mean of the 3rd to 7th smallest of 10 iterations"

OP_FILE = re.compile(r"^(?P<gpu>[^_]+)_(?P<tag>.+)_fp16\.csv$")
NCCL_FILE = re.compile(r"^(?P<gpu>[^_]+)_(?P<tag>.+)_fp16_(?P<n>\d+)_(?P<m>\d+)\.csv$")
NCCL_KINDS = {
    "allreduce": CollectiveKind.ALL_REDUCE,
    "allreduce_large": CollectiveKind.ALL_REDUCE,
    "allgather_large": CollectiveKind.ALL_GATHER,
    "p2p": CollectiveKind.SEND_RECV,
}
#: Operator file tag -> (schema name, variant).
OP_TAGS: dict[str, tuple[str, str]] = {
    **{t: (t, "") for t in ("linear1", "linear2", "linear3", "linear4", "linear_final", "baddbmm", "bmm")},
    **{t: (t, "") for t in ("softmax", "flash_atten", "layernorm", "RMSlayernorm", "RoPE", "gelu")},
    **{t: (t, "") for t in ("res_add", "embedding", "fillmask")},
    "ScaledUpperTriangMaskedSoftmax": ("softmax", "ScaledUpperTriangMaskedSoftmax"),
    "parallel_cross_entropy_128": ("cross_entropy", "parallel_cross_entropy_128"),
    **{f"{s}Stage_optimizer": ("optimizer", f"{s}Stage_optimizer") for s in ("first", "middle", "last")},
}
#: The machines the GPUModeling25 NCCL data were measured on (README there): catalog GPU ->
#: catalog cluster whose nominal links bound the physically possible times.
GPUMODELING_CLUSTERS = {"A100-SXM4-80GB": "perlmutter-gpumodeling", "GH200-120GB": "vista-gpumodeling"}

_OP_SHAPE = {"mp": "mp", "b": "b", "h": "h", "l": "l", "dim": "dim", "Vp": "vp", "encoders": "encoders"}
_OP_TIMES = ({"F_dur(us)": "fwd", "B_dur(us)": "bwd"}, {"dur(us)": "step"})
_NCCL_COLUMNS = ("shape", "nodes", "GPUsPerNode", "dur(us)")
_BWD_AT_LEAST_FWD_KINDS = {OpKind.GEMM, OpKind.BMM, OpKind.ATTENTION}
#: Rule 9: how far from its trend and from its file's median a time must be to be an outlier.
OUTLIER_FACTOR = 10.0

EXCLUDE_LAYOUT = "undocumented file layout"
EXCLUDE_NUMBER = "non-numeric value"
EXCLUDE_SHAPE = "shape not a positive integer"
EXCLUDE_TOPOLOGY = "nodes/GPUsPerNode disagree with the file name"
EXCLUDE_TIME = "time NaN or not positive"
EXCLUDE_COPY = "bwd equals fwd (copied, not measured)"
EXCLUDE_RATIO = "bwd faster than fwd (not fully captured)"
EXCLUDE_OUTLIER = "outlier (>10x its trend and its file's median)"
EXCLUDE_BANDWIDTH = "faster than the links' peak bandwidth"
#: Every exclusion reason, in the order the rules are applied.
EXCLUSION_REASONS = (
    EXCLUDE_LAYOUT,
    EXCLUDE_NUMBER,
    EXCLUDE_SHAPE,
    EXCLUDE_TOPOLOGY,
    EXCLUDE_TIME,
    EXCLUDE_COPY,
    EXCLUDE_RATIO,
    EXCLUDE_BANDWIDTH,
    EXCLUDE_OUTLIER,
)
_REJECTED_COLUMNS = ("source", "row", "kind", "name", "variant", "phase", "device", "time_s", "reason")


# ----------------------------------------------------------------------------------------
# collectives: the row -> Collective / GroupLayout mapping (shared with paraplan.calibrate)
# ----------------------------------------------------------------------------------------


def collective_for_row(kind: CollectiveKind, shape: float, nodes: int, per_node: int) -> Collective:
    """One NCCL sample as a paraplan Collective. GPUModeling's ``shape`` counts fp16 elements of
    the per-rank tensor: the buffer of an all-reduce, the message of a send/recv, but each
    rank's INPUT chunk of an all-gather, whose paraplan size is the whole output (x N*M)."""
    size = shape * FP16_BYTES
    if kind is CollectiveKind.ALL_GATHER:
        size *= nodes * per_node
    dim = ParallelDim.PP if kind is CollectiveKind.SEND_RECV else ParallelDim.DP
    return Collective(f"nccl_{kind.value}", kind, dim, size, Phase.FWD)


def group_layout(nodes: int, per_node: int) -> GroupLayout:
    """The process group of an ``<N>_<M>`` NCCL file: N nodes x M GPUs each."""
    return GroupLayout(size=nodes * per_node, nodes=nodes, per_node=per_node)


def ideal_cluster(cluster: ClusterSpec) -> ClusterSpec:
    """The cluster at 100 % of its links' nominal bandwidth with zero latency."""
    upd = {}
    for side in ("intra_node", "inter_node"):
        link: LinkSpec | None = getattr(cluster, side)
        if link is not None:
            upd[side] = link.model_copy(update={"efficiency": 1.0, "p2p_efficiency": 1.0, "latency_s": 0.0})
    return cluster.model_copy(update=upd)


# ----------------------------------------------------------------------------------------
# rules
# ----------------------------------------------------------------------------------------


def outlier_mask(shape: np.ndarray, seconds: np.ndarray, factor: float = OUTLIER_FACTOR) -> np.ndarray:
    """Rule 9: True where ``seconds`` is more than ``factor`` x away from both the robust
    log-log trend over ``shape`` (rows x shape columns, all positive) and the median.

    The trend is least squares of log(time) on 1 and the logs of the columns that vary,
    refitted on the rows within max(3 MADs, log 1.5) of it until the set is stable. Fewer
    than 10 rows (or fewer than twice the fitted parameters) are never flagged."""
    n = len(seconds)
    y = np.log(seconds)
    varying = [j for j in range(shape.shape[1]) if np.unique(shape[:, j]).size > 1]
    a = np.column_stack([np.ones(n), *(np.log(shape[:, j]) for j in varying)])
    if n < max(10, 2 * a.shape[1]):
        return np.zeros(n, dtype=bool)
    keep = np.ones(n, dtype=bool)
    for _ in range(20):
        coef, *_ = np.linalg.lstsq(a[keep], y[keep], rcond=None)
        r = y - a @ coef
        r -= np.median(r[keep])
        mad = 1.4826 * np.median(np.abs(r[keep]))
        new = np.abs(r) <= max(3.0 * mad, math.log(1.5))
        if (new == keep).all() or new.sum() < a.shape[1]:
            break
        keep = new
    far = math.log(factor)
    return (np.abs(r) > far) & (np.abs(y - np.median(y)) > far)


def _positive_int(values: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.isfinite(values) & (values >= 1) & (np.mod(values, 1) == 0)


def _bwd_at_least_fwd(tag: str, frame: pd.DataFrame, ok: np.ndarray) -> bool:
    """Rule 7 applies: the inventory operator of ``tag`` (built from the first valid row) is a
    compute kind whose backward does at least the forward's FLOPs."""
    if tag not in SAMPLE_TAGS or not ok.any():
        return False
    row = frame.loc[np.flatnonzero(ok)[0]].to_dict()
    try:
        op = op_for_sample(tag, row)
    except ValueError:
        return False
    return op.kind in _BWD_AT_LEAST_FWD_KINDS and op.bwd_flops >= op.flops


# ----------------------------------------------------------------------------------------
# one file
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Chunk:
    """``n`` records; each column is a scalar (the same for all) or an array of ``n`` values."""

    n: int
    columns: dict[str, Any]


@dataclasses.dataclass
class _FileResult:
    kept: list[_Chunk]
    rejected: list[_Chunk]
    note: str
    duplicates: int = 0


def _frame(chunks: Sequence[_Chunk], columns: Sequence[str]) -> pd.DataFrame:
    """One frame of ``columns`` from ``chunks`` (a column a chunk lacks is NaN there)."""
    data = {}
    for col in columns:
        parts = []
        for chunk in chunks:
            v = chunk.columns.get(col, np.nan)
            if isinstance(v, np.ndarray):
                parts.append(v)
            else:
                parts.append(np.full(chunk.n, v, dtype=object if isinstance(v, str) else float))
        data[col] = np.concatenate(parts) if parts else np.array([], dtype=float)
    return pd.DataFrame(data)


def _file_result(
    source: str,
    rows: int,
    parts: Sequence[tuple[dict[str, Any], np.ndarray, np.ndarray]],
    extra: Sequence[str],
    duplicates: int,
) -> _FileResult:
    """Kept and rejected records of one file from (columns, reason per row, time in us) per
    phase; a record is kept when its reason is ``""``. Array columns hold one value per row."""
    kept, rejected, counts = [], [], []
    index = np.arange(rows)
    for columns, reason, t in parts:
        ok = reason == ""
        for mask, out, more in ((ok, kept, {"dtype": "fp16"}), (~ok, rejected, {"reason": reason[~ok]})):
            cols = {k: (v[mask] if isinstance(v, np.ndarray) else v) for k, v in columns.items()}
            cols |= {**more, "time_s": t[mask] * US, "source": source, "row": index[mask]}
            out.append(_Chunk(int(mask.sum()), cols))
        phase = columns.get("phase", "")
        counts += [(r, phase, n) for r, n in Counter(reason[~ok]).items()]
    notes = [f"{source}: {rows} rows, {sum(c.n for c in kept)} records kept"]
    notes += [f"{n} {phase + ' ' if phase else ''}excluded ({r})" for r, phase, n in counts]
    return _FileResult(kept, rejected, "; ".join([*notes, *extra]), duplicates)


def _reject_file(source: str, frame: pd.DataFrame, why: str, **ids: Any) -> _FileResult:
    n = len(frame)
    cols = {**ids, "source": source, "row": np.arange(n), "time_s": np.nan, "reason": EXCLUDE_LAYOUT}
    return _FileResult([], [_Chunk(n, cols)], f"{source}: {n} rows excluded ({EXCLUDE_LAYOUT}: {why})")


def _read_csv(path: Path, source: str, ids: dict[str, Any]) -> pd.DataFrame | _FileResult:
    """The file's rows with stripped column names, or (unreadable) the whole file excluded."""
    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError) as exc:  # EmptyDataError, ParserError, UnicodeDecodeError
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        cols = {**ids, "source": source, "row": np.nan, "time_s": np.nan, "reason": EXCLUDE_LAYOUT}
        note = f"{source}: not readable as CSV, excluded whole and counted as 1 record ({EXCLUDE_LAYOUT}: {why})"
        return _FileResult([], [_Chunk(1, cols)], note)
    frame.columns = [str(c).strip() for c in frame.columns]
    return frame


def _numeric(frame: pd.DataFrame, columns: Sequence[str]) -> dict[str, np.ndarray]:
    """Make ``columns`` of ``frame`` float in place (text that is not a number becomes NaN);
    per column, where a cell held such text (rule 2). Empty cells are NaN but not text."""
    text = {}
    for col in columns:
        values = pd.to_numeric(frame[col], errors="coerce")
        text[col] = (values.isna() & frame[col].notna()).to_numpy(bool)
        frame[col] = values.astype(float)
    return text


def _op_file(path: Path, source: str, tag: str, device: str) -> _FileResult:
    name, variant = OP_TAGS.get(tag, (tag, ""))
    ids = {"kind": "op", "name": name, "variant": variant, "phase": "", "device": device}
    frame = _read_csv(path, source, ids)
    if isinstance(frame, _FileResult):
        return frame
    times = next((t for t in _OP_TIMES if set(t) <= set(frame.columns)), None)
    shape_cols = [c for c in frame.columns if c in _OP_SHAPE]
    if times is None or len(shape_cols) + len(times) != len(frame.columns):
        return _reject_file(source, frame, f"columns {', '.join(frame.columns)}", **ids)
    if tag not in OP_TAGS:
        return _reject_file(source, frame, f"unknown operator tag {tag!r}", **ids)
    if (name == "optimizer") != ("dur(us)" in times):
        return _reject_file(source, frame, f"{tag} with columns {', '.join(times)}", **ids)

    text = _numeric(frame, [*shape_cols, *times])
    text_row = np.zeros(len(frame), dtype=bool)
    for col in shape_cols:
        text_row |= text[col]
    shape = frame[shape_cols].to_numpy(float)
    shape_ok = _positive_int(shape).all(axis=1)
    raw = {phase: frame[col].to_numpy(float) for col, phase in times.items()}
    reason = {
        phase: np.where(text_row | text[col], EXCLUDE_NUMBER, np.where(shape_ok, "", EXCLUDE_SHAPE)).astype(object)
        for col, phase in times.items()
    }
    for phase, t in raw.items():
        reason[phase][(reason[phase] == "") & ~(np.isfinite(t) & (t > 0))] = EXCLUDE_TIME
    extra: list[str] = []
    if "bwd" in raw:
        both = (reason["fwd"] == "") & (reason["bwd"] == "")
        copy = both & (raw["bwd"] == raw["fwd"])
        reason["bwd"][copy] = EXCLUDE_COPY
        usable = both & ~copy
        if usable.any() and _bwd_at_least_fwd(tag, frame, usable):
            ratio = float(np.median(raw["bwd"][usable] / raw["fwd"][usable]))
            if ratio < 1.0:
                reason["bwd"][reason["bwd"] == ""] = EXCLUDE_RATIO
                extra.append(f"median B/F {ratio:.2f} < 1 for a backward with at least the forward's FLOPs")
    for phase, t in raw.items():
        ok = reason[phase] == ""
        if ok.sum():
            flagged = outlier_mask(shape[ok], t[ok])
            idx = np.flatnonzero(ok)[flagged]
            reason[phase][idx] = EXCLUDE_OUTLIER
            if len(idx):
                extra.append(
                    f"{phase} outliers {t[idx].min():.0f}-{t[idx].max():.0f} us vs median {np.median(t[ok]):.0f} us"
                )

    shape_out = {_OP_SHAPE[c]: frame[c].to_numpy(float) for c in shape_cols}
    parts = [
        ({**ids, "phase": phase, **shape_out, "cluster": ""}, reason[phase], t) for phase, t in raw.items()
    ]
    duplicates = int(frame.duplicated(subset=shape_cols).sum())
    if duplicates:
        extra.append(f"{duplicates} grid points measured more than once (kept)")
    return _file_result(source, len(frame), parts, extra, duplicates)


def _nccl_file(
    path: Path, source: str, tag: str, device: str, nodes: int, per_node: int, cluster: ClusterSpec
) -> _FileResult:
    kind = NCCL_KINDS.get(tag)
    ids = {
        "kind": "collective",
        "name": kind.value if kind else tag,
        "variant": tag,
        "phase": "",
        "device": device,
    }
    frame = _read_csv(path, source, ids)
    if isinstance(frame, _FileResult):
        return frame
    if kind is None:
        return _reject_file(source, frame, f"unknown collective tag {tag!r}", **ids)
    if sorted(frame.columns) != sorted(_NCCL_COLUMNS):
        return _reject_file(source, frame, f"columns {', '.join(frame.columns)}", **ids)
    if per_node > cluster.gpus_per_node:
        raise ConfigError(
            f"{source}: {per_node} GPUs per node but cluster {cluster.name} has {cluster.gpus_per_node}"
        )
    layout = group_layout(nodes, per_node)
    ideal = ideal_cluster(cluster)
    text = _numeric(frame, _NCCL_COLUMNS)
    shape = frame["shape"].to_numpy(float)
    t = frame["dur(us)"].to_numpy(float)
    text_row = np.logical_or.reduce([text[col] for col in _NCCL_COLUMNS])
    reason = np.where(text_row, EXCLUDE_NUMBER, np.where(_positive_int(shape), "", EXCLUDE_SHAPE)).astype(object)
    topo = (frame["nodes"].to_numpy(float) != nodes) | (frame["GPUsPerNode"].to_numpy(float) != per_node)
    reason[(reason == "") & topo] = EXCLUDE_TOPOLOGY
    reason[(reason == "") & ~(np.isfinite(t) & (t > 0))] = EXCLUDE_TIME
    size = np.zeros(len(frame))
    for i in np.flatnonzero(reason == ""):
        coll = collective_for_row(kind, shape[i], nodes, per_node)
        size[i] = coll.bytes
        if t[i] * US < estimate_collective_s(coll, layout, ideal):
            reason[i] = EXCLUDE_BANDWIDTH
    ok = reason == ""
    if ok.any():
        reason[np.flatnonzero(ok)[outlier_mask(shape[ok, None], t[ok])]] = EXCLUDE_OUTLIER
    extra = []
    slow = t[reason == EXCLUDE_BANDWIDTH]
    if len(slow):
        extra.append(
            f"impossible times {slow.min():.0f}-{slow.max():.0f} us, median {np.median(slow):.0f} us"
        )
    duplicates = int(frame.duplicated(subset=["shape"]).sum())
    if duplicates:
        extra.append(f"{duplicates} sizes measured more than once (kept)")
    cols = {**ids, "bytes": size, "nodes": nodes, "gpus_per_node": per_node, "cluster": cluster.name}
    return _file_result(source, len(frame), [(cols, reason, t)], extra, duplicates)


# ----------------------------------------------------------------------------------------
# folders
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class ImportResult:
    """The imported samples, what was excluded and why.

    ``excluded`` maps each reason to its number of excluded records (one per row and phase);
    ``rejected`` holds those records (``source, row, kind, name, variant, phase, device,
    time_s, reason``); ``notes`` has one line per file (and per skipped file);
    ``duplicates`` maps a source file to its grid points measured more than once (kept)."""

    samples: pd.DataFrame
    excluded: dict[str, int]
    notes: list[str]
    rejected: pd.DataFrame = dataclasses.field(
        default_factory=lambda: pd.DataFrame(columns=_REJECTED_COLUMNS)
    )
    duplicates: dict[str, int] = dataclasses.field(default_factory=dict)
    sources: list[str] = dataclasses.field(default_factory=list)

    def metadata(self) -> dict[str, Any]:
        """The provenance to store with the samples (``save_samples(..., metadata=...)``)."""
        by_source: dict[str, dict[str, int]] = {}
        for (source, reason), n in self.rejected.groupby(["source", "reason"]).size().items():
            by_source.setdefault(str(source), {})[str(reason)] = int(n)
        return {
            "importer": "gpumodeling",
            "origin": "GPUModeling25 CSV layout (github.com/Littlesnakess/GPUModeling25, data/gpumodeling/README.md)",
            "sources": list(self.sources),
            "reduction": REDUCTION,
            "excluded": dict(self.excluded),
            "excluded_by_source": by_source,
            "duplicates": dict(self.duplicates),
            "notes": list(self.notes),
        }


def _classify(path: Path) -> tuple[str, re.Match[str] | None]:
    """("op" | "collective" | "pooled" | "tuning", match) from the file name."""
    match = NCCL_FILE.match(path.name)
    if match:
        return "collective", match
    match = OP_FILE.match(path.name)
    if match:
        return ("pooled" if match["tag"] in NCCL_KINDS else "op"), match
    return "tuning", None


def gpumodeling_files(dirs: Iterable[str | Path]) -> list[Path]:
    """The CSV files of ``dirs`` in import order; a ConfigError for a missing folder, a folder
    without CSVs or one without any GPUModeling timing file."""
    files: list[Path] = []
    seen: set[Path] = set()
    for folder in map(Path, dirs):
        if folder.resolve() in seen:
            continue  # the same folder twice would import every row twice
        seen.add(folder.resolve())
        if not folder.is_dir():
            raise ConfigError(f"{folder}: no such folder")
        csvs = sorted(folder.glob("*.csv"))
        if not csvs:
            raise ConfigError(f"{folder}: no CSV files")
        if not any(_classify(p)[0] in ("op", "collective") for p in csvs):
            raise ConfigError(
                f"{folder}: no GPUModeling timing files (<GPU>_<op>_fp16.csv or <GPU>_<collective>_fp16_<N>_<M>.csv)"
            )
        files.extend(csvs)
    return files


def _device(source: str, token: str) -> str:
    try:
        return load_gpu(token).name
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def import_gpumodeling(
    dirs: Sequence[str | Path],
    *,
    clusters: Mapping[str, str] | None = None,
    progress: Callable[[Path], None] | None = None,
) -> ImportResult:
    """Read GPUModeling operator and NCCL folders into validated sample records.

    ``clusters`` maps a catalog GPU to the catalog cluster its NCCL files were measured on
    (default :data:`GPUMODELING_CLUSTERS`); ``progress`` is called after each file."""
    clusters = dict(GPUMODELING_CLUSTERS if clusters is None else clusters)
    files = gpumodeling_files(dirs)
    max_nodes: Counter[str] = Counter()
    for path in files:
        kind, match = _classify(path)
        if kind == "collective" and match:
            max_nodes[match["gpu"]] = max(max_nodes[match["gpu"]], int(match["n"]))
    kept, rejected, notes = [], [], []
    duplicates: dict[str, int] = {}
    for path in files:
        source = f"{path.parent.name}/{path.name}"
        kind, match = _classify(path)
        if kind == "tuning":
            notes.append(f"{source}: skipped (regressor tuning table, not measurements)")
        elif kind == "pooled":
            notes.append(f"{source}: skipped (row union of the _N_M files; would duplicate their rows)")
        elif match is not None:
            device = _device(source, match["gpu"])
            if kind == "op":
                result = _op_file(path, source, match["tag"], device)
            else:
                if device not in clusters:
                    raise ConfigError(
                        f"{source}: no catalog cluster known for {device} (pass clusters={{GPU: cluster}})"
                    )
                base = load_cluster(clusters[device])
                cluster = load_cluster(
                    clusters[device], num_nodes=max(base.num_nodes, max_nodes[match["gpu"]])
                )
                result = _nccl_file(
                    path, source, match["tag"], device, int(match["n"]), int(match["m"]), cluster
                )
            kept += result.kept
            rejected += result.rejected
            notes.append(result.note)
            if result.duplicates:
                duplicates[source] = result.duplicates
        if progress is not None:
            progress(path)
    samples = validate_samples(_frame(kept, list(COLUMNS)), where="gpumodeling import")
    rej = _frame(rejected, _REJECTED_COLUMNS)
    counts = rej["reason"].value_counts()
    excluded = {r: int(counts[r]) for r in EXCLUSION_REASONS if r in counts.index}
    return ImportResult(samples, excluded, notes, rej, duplicates, [str(Path(d)) for d in dirs])


def summarize_import(result: ImportResult) -> dict[str, Any]:
    """Counts for a report: records kept per device/kind/name/variant/phase
    (:func:`~paraplan.samples.schema.count_samples`), records excluded per folder and reason
    (folders in import order, reasons in rule order), duplicates per file."""
    folders = result.rejected["source"].astype(str).str.split("/").str[0]
    excluded = Counter(zip(folders, result.rejected["reason"].astype(str), strict=True))
    folder_order = {f: i for i, f in enumerate(dict.fromkeys(folders))}
    reason_order = {r: i for i, r in enumerate(EXCLUSION_REASONS)}
    return {
        "records": len(result.samples),
        "kept": count_samples(result.samples),
        "excluded": [
            {"folder": f, "reason": r, "records": n}
            for (f, r), n in sorted(
                excluded.items(), key=lambda kv: (folder_order[kv[0][0]], reason_order[kv[0][1]])
            )
        ],
        "excluded_total": dict(result.excluded),
        "duplicates": dict(result.duplicates),
    }
