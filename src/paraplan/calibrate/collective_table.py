"""Fit a link's collective curves to XLA's collective performance table.

``shared/data/xla_perf_tables/collectives.csv`` holds, per GPU key, all-reduce, all-gather,
reduce-scatter and all-to-all timed on 1x8, 2x4 and 4x2 groups of one 8-GPU node (groups of 4
to 72 of an NVL72 rack) over message sizes of 1 KiB to 2 GiB (288 B to 32 GiB), and
collective-permutes (``network_throughput_bytes_per_sec`` is the algorithm bandwidth of
``xla_tensor_bytes``, the nccl-tests size). Per collective, the fit finds the asymptotic bus
bandwidth of each group size and one half size S_1/2 shared by the group sizes, so that
bus(S) = B_n S / (S + S_1/2), with ``estimate_collective_s`` computing the time from it
(``CollectiveCurve``), by least squares on log time over the messages of at least
``min_bytes``; a random share of the rows is held out and scored. Below those sizes the curve
takes each group size's measured small call (``small_s``: the median time of the messages of at
most 64 KiB, where the table's times are flat in size, as NCCL's LL protocol's are).
All-to-all is fitted the same way (bus factor (n-1)/n). The collective-permute rows (a one-way
half swap, mutual pairs, a ring: every rank sends its whole message to one peer) are one
send/recv per rank: they are fitted as a single curve of the pair (group size 2, bus factor 1),
every pattern pooled (their times scatter by 30-50 % around any size curve, the patterns alike).
The measured points kept beside a curve are one series per group size (``one_series``: a
permute's mutual pairs, the job of the most devices), made non-decreasing in size
(``non_decreasing``, pool-adjacent-violators).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from paraplan.calibrate._common import ErrorStats, err_stats, import_extra, split_mask
from paraplan.costmodel import estimate_collective_s
from paraplan.inventory import Collective, CollectiveKind, GroupLayout, ParallelDim
from paraplan.specs import ClusterSpec, CollectiveCurve, ConfigError, Phase

SMALL_BYTES = 2.0**16  # the small calls: up to 64 KiB, where NCCL's measured time is flat
_OPCODES = {"all-reduce": CollectiveKind.ALL_REDUCE, "all-gather": CollectiveKind.ALL_GATHER,
            "reduce-scatter": CollectiveKind.REDUCE_SCATTER, "all-to-all": CollectiveKind.ALL_TO_ALL,
            "collective-permute": CollectiveKind.SEND_RECV}
PAIR = 2  # a collective-permute's rows: one send/recv per rank, the curve of a pair
# the kinds whose measured times are kept beside the curve (``CollectiveCurve.points``), interpolated
# where measured: the collective-permutes change regime near 128 MiB, which one curve cannot follow,
# and every kind's curve misses its measured times by 12-15 % (median) beyond 1 GiB, where the
# points miss the held-out sizes by 1-1.5 % (benchmarks/pointed_collectives.py)
POINTED = tuple(_OPCODES)


def _read(path: Path, gpu_key: str) -> Any:
    """The table's usable rows of ``gpu_key`` (a measured time), collective-permutes as pairs."""
    pd = import_extra("pandas")
    table = pd.read_csv(path)
    table = table[(table.gpu_key == gpu_key) & (table.network_throughput_bytes_per_sec > 0)
                  & table.opcode.isin(list(_OPCODES))].copy()
    table.loc[table.opcode == "collective-permute", "devices_per_group"] = PAIR
    return table


@dataclass(frozen=True)
class CollectiveFit:
    kind: CollectiveKind
    curve: CollectiveCurve
    rows: int
    fitted: int
    holdout: ErrorStats


@dataclass(frozen=True)
class CollectiveTableFit:
    gpu_key: str
    fits: tuple[CollectiveFit, ...]
    source: str

    @property
    def block(self) -> str:
        """The ``collectives:`` block of an intra-node link in a catalog YAML."""
        lines = [f"collectives:                # paraplan calibrate collective-table ({self.source})"]
        for fit in self.fits:
            bus = ", ".join(f"{n}: {b / 1e9:.0f} GB/s" for n, b in sorted(fit.curve.bus_bytes_per_s.items()))
            small = ", ".join(f"{n}: {t * 1e6:.1f} us" for n, t in sorted(fit.curve.small_s.items()))
            points = ""
            if fit.curve.points:
                points = ", points: {" + ", ".join(
                    f"{n}: {{" + ", ".join(f"{size}: {t * 1e6:.4g} us" for size, t in by_size.items()) + "}"
                    for n, by_size in fit.curve.points.items()) + "}"
            lines.append(f"  {fit.kind.value}: {{bus_bytes_per_s: {{{bus}}}, half_bytes: {fit.curve.half_bytes:.3g}, "
                         f"fit_bytes: {fit.curve.fit_bytes:.0f}, small_s: {{{small}}}{points}}}")
        return "\n".join(lines) + "\n"


def _node(cluster: ClusterSpec, curve: CollectiveCurve, kind: CollectiveKind) -> ClusterSpec:
    assert cluster.intra_node is not None
    link = cluster.intra_node.model_copy(update={"collectives": {kind.value: curve}})
    return cluster.model_copy(update={"intra_node": link})


def small_call_s(rows: Any, small_bytes: float = SMALL_BYTES) -> dict[int, float]:
    """The median seconds per group size of the table ``rows``' calls of at most ``small_bytes``
    (nccl-tests' size): NCCL's small calls take about the same time whatever their size (LL)."""
    small = rows[rows.xla_tensor_bytes <= small_bytes]
    seconds = small.xla_tensor_bytes / small.network_throughput_bytes_per_sec
    return {int(n): float(seconds[small.devices_per_group == n].median()) for n in sorted(small.devices_per_group.unique())}


PIPELINE_PATTERN = "0>1 1>0"  # a collective-permute's mutual pairs, the pattern a pipeline's send/recv makes


def _devices(row: Any) -> int:
    """The devices of the job that measured ``row``: its replica groups', or its permute pattern's."""
    if isinstance(row.pattern, str) and row.pattern:
        return 1 + max(int(rank) for pair in row.pattern.split() for rank in pair.split(">"))
    return int(row.num_replica_groups * row.devices_per_group)


def one_series(rows: Any) -> Any:
    """The rows of one measured series per group size: XLA's table times each collective in
    several jobs whose sizes lie on different grids (on a rack, 64 devices at 2^k bytes and 72 at
    9 x 2^k; groups of 4 and 8 in both), their times up to 1.7x apart at the same size (GB200
    send/recv: 16 MiB 750 us in one, 18 MiB 432 us in the other), so pooling them makes the time
    fall with more bytes. Kept: of the collective-permutes the mutual pairs (``0>1 1>0 ...``:
    a pipeline's 1F1B steady state, where neighbouring stages swap an activation for a gradient
    in one batched send/recv), then per group size the job of the most devices (the whole NVL72
    rack, the whole node)."""
    if rows.empty:
        return rows
    mutual = rows.pattern.fillna("").astype(str).str.startswith(PIPELINE_PATTERN)
    if mutual.any():
        rows = rows[mutual]
    devices = rows.apply(_devices, axis=1)
    largest = devices.groupby(rows.devices_per_group).transform("max")
    return rows[devices == largest]


def non_decreasing(times: list[float]) -> list[float]:
    """``times`` (in increasing message size) made non-decreasing by pool-adjacent-violators: each
    run of sizes whose measured times fall is replaced by its mean (the least-squares non-decreasing
    fit), so that a priced call never takes less time for more bytes."""
    blocks: list[list[float]] = []  # [mean, count]
    for t in times:
        blocks.append([t, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, c1), (m2, c2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2])
    return [m for m, c in blocks for _ in range(int(c))]


def measured_points(rows: Any) -> dict[int, dict[int, float]]:
    """The median seconds of the table ``rows``' calls per group size and message size (nccl-tests'
    size) of one series (``one_series``), made non-decreasing in size (``non_decreasing``), for
    the group sizes measured at two sizes or more."""
    rows = one_series(rows)
    seconds = rows.xla_tensor_bytes / rows.network_throughput_bytes_per_sec
    medians = seconds.groupby([rows.devices_per_group, rows.xla_tensor_bytes]).median()
    points: dict[int, dict[int, float]] = {}
    for (n, size), t in medians.items():
        points.setdefault(int(n), {})[int(size)] = float(t)
    out = {}
    for n, p in sorted(points.items()):
        if len(p) >= 2:
            sizes = sorted(p)
            out[n] = dict(zip(sizes, non_decreasing([p[size] for size in sizes]), strict=True))
    return out


def fit_collective_table(
    path: Path, gpu_key: str, cluster: ClusterSpec, *, min_bytes: float = 2**20, seed: int = 0, holdout: float = 0.2
) -> CollectiveTableFit:
    """Curves of all-reduce, all-gather, reduce-scatter, all-to-all and send/recv (the table's
    collective-permutes) inside one node of ``cluster``: those the table has rows of."""
    return fit_collective_rows(_read(path, gpu_key), gpu_key, cluster, source=Path(path).name,
                               min_bytes=min_bytes, seed=seed, holdout=holdout)


def fit_collective_rows(
    usable: Any, gpu_key: str, cluster: ClusterSpec, *, source: str, min_bytes: float = 2**20, seed: int = 0,
    holdout: float = 0.2, pointed: tuple[str, ...] = POINTED
) -> CollectiveTableFit:
    """``fit_collective_table`` on the table's rows ``usable`` (``_read``'s frame). The kinds of
    ``pointed`` keep their measured times of at least ``min_bytes`` (``measured_points``: all the
    rows' in the curve, the training rows' where the held-out rows are scored)."""
    least_squares = import_extra("scipy.optimize").least_squares
    rows = usable[usable.xla_tensor_bytes >= min_bytes]
    if rows.empty:
        raise ConfigError(f"--gpu-key: no collective rows of at least {min_bytes:g} bytes for {gpu_key} in {source}")
    if cluster.intra_node is None or rows.devices_per_group.max() > cluster.domain_size:
        raise ConfigError(f"--cluster {cluster.name}: the table's groups do not fit in one of its scale-up domains")
    fits = []
    for opcode, kind in _OPCODES.items():
        part = rows[rows.opcode == opcode]
        if part.empty:
            continue
        groups = sorted(int(n) for n in part.devices_per_group.unique())
        calls = [(Collective("c", kind, ParallelDim.TP, float(r.xla_tensor_bytes), Phase.FWD),
                  GroupLayout(int(r.devices_per_group), 1, int(r.devices_per_group))) for r in part.itertuples()]
        seconds = (part.xla_tensor_bytes / part.network_throughput_bytes_per_sec).to_numpy()
        held = split_mask(list(range(len(calls))), holdout, seed)

        def curve(p: np.ndarray, groups=groups) -> CollectiveCurve:
            return CollectiveCurve(bus_bytes_per_s={n: 10 ** p[1 + i] for i, n in enumerate(groups)},
                                   half_bytes=10 ** p[0], fit_bytes=float(min_bytes))

        def predict(p: np.ndarray, index: np.ndarray, kind=kind, calls=calls, curve=curve) -> np.ndarray:
            node = _node(cluster, curve(p), kind)
            return np.array([estimate_collective_s(*calls[i], node) for i in index])

        train, test = np.flatnonzero(~held), np.flatnonzero(held)
        result = least_squares(lambda p, train=train, seconds=seconds, predict=predict:
                               np.log(predict(p, train) / seconds[train]), [7.0] + [11.5] * len(groups))
        fitted = curve(result.x).model_copy(update={"small_s": small_call_s(usable[usable.opcode == opcode])})
        trained = fitted
        if opcode in pointed:
            trained = fitted.model_copy(update={"points": measured_points(part[~held])})
            fitted = fitted.model_copy(update={"points": measured_points(part)})
        scored = test if len(test) else train
        node = _node(cluster, trained.model_copy(update={"small_s": {}}), kind)
        score = err_stats(np.array([estimate_collective_s(*calls[i], node) for i in scored]), seconds[scored])
        fits.append(CollectiveFit(kind, fitted, len(calls), len(train), score))
    source = (f"{source} {gpu_key}, messages >= {min_bytes / 2**20:g} MiB; small_s: the median call of "
              f"<= {SMALL_BYTES / 2**10:g} KiB"
              + ("; points" + ("" if set(pointed) == set(_OPCODES) else " (" + ", ".join(pointed) + ")")
                 + ": the median call per size of one series (permutes: mutual pairs; the job of the most devices), "
                 "non-decreasing (pool-adjacent-violators), log-log between sizes, extrapolated along the curve beyond the last"
                 if pointed else ""))
    return CollectiveTableFit(gpu_key, tuple(fits), source)


def small_call_table(path: Path, gpu_key: str, cluster: ClusterSpec, *, seed: int = 0, holdout: float = 0.2) -> Any:
    """The held-out calls below the fitted sizes of ``cluster``'s intra-node curves, one row each
    (opcode, n, bytes, measured_s), priced three ways: ``curve_s`` the curve's extrapolation
    (moved / bus(S)), ``nccl_s`` NCCL's LL latency (``nccl_ll_latency_s``), ``small_s`` the curve
    with its small-call times fitted on the other rows (a seeded draw of whole message sizes
    held out per collective)."""
    from paraplan.costmodel.collectives import bus_factor, nccl_ll_latency_s

    pd = import_extra("pandas")
    table = pd.read_csv(path)
    table = table[(table.gpu_key == gpu_key) & (table.network_throughput_bytes_per_sec > 0)]
    if cluster.intra_node is None:
        raise ConfigError(f"--cluster {cluster.name}: no intra-node link")
    out = []
    for opcode, kind in list(_OPCODES.items())[:3]:  # the kinds NCCL's LL model prices
        curve = cluster.intra_node.collectives.get(kind.value)
        rows = table[table.opcode == opcode]
        if curve is None or rows.empty:
            continue
        held = split_mask(list(rows.xla_tensor_bytes), holdout, seed)
        trained = curve.model_copy(update={"small_s": small_call_s(rows[~held])})
        for r in rows[held & (rows.xla_tensor_bytes < curve.fit_bytes)].itertuples():
            n, size = int(r.devices_per_group), float(r.xla_tensor_bytes)
            moved = bus_factor(kind, n) * size
            out.append({"opcode": opcode, "n": n, "bytes": size,
                        "measured_s": size / r.network_throughput_bytes_per_sec,
                        "curve_s": moved / curve.bus_for(n, size),
                        "nccl_s": nccl_ll_latency_s(kind, GroupLayout(n, 1, n)),
                        "small_s": trained.seconds(n, size, moved)})
    return pd.DataFrame(out)


def _opcode_rows(path: Path, gpu_key: str, cluster: ClusterSpec, opcodes: tuple[str, ...]) -> Any:
    """(opcode, kind, the table's usable rows of it) for each of ``opcodes``, on a node with an intra-node link."""
    if cluster.intra_node is None:
        raise ConfigError(f"--cluster {cluster.name}: no intra-node link")
    table = _read(path, gpu_key)
    for opcode in opcodes:
        yield opcode, _OPCODES[opcode], table[table.opcode == opcode]


def held_out_table(path: Path, gpu_key: str, cluster: ClusterSpec, opcodes: tuple[str, ...], *,
                   seed: int = 0, holdout: float = 0.2) -> Any:
    """The table's held-out calls of ``opcodes`` (a seeded draw of whole message sizes per
    opcode), one row each (opcode, n, bytes, measured_s), priced before (``before_s``:
    ``cluster`` without its curve of the kind, the alpha-beta link) and after (``after_s``:
    the curve and its small-call times fitted as ``fit_collective_table`` fits them, on the
    other rows, at the catalog curve's fitted sizes, or 1 MiB)."""
    pd = import_extra("pandas")
    out = []
    for opcode, kind, rows in _opcode_rows(path, gpu_key, cluster, opcodes):
        if rows.empty:
            continue
        held = split_mask(list(rows.xla_tensor_bytes), holdout, seed)
        known = cluster.intra_node.collectives.get(kind.value)
        fit = fit_collective_rows(rows[~held], gpu_key, cluster, source=Path(path).name, holdout=0.0,
                                  min_bytes=known.fit_bytes if known else 2.0**20)
        others = {k: c for k, c in cluster.intra_node.collectives.items() if k != kind.value}
        before = cluster.model_copy(update={"intra_node": cluster.intra_node.model_copy(update={"collectives": others})})
        after = _node(cluster, fit.fits[0].curve, kind)
        for r in rows[held].itertuples():
            n, size = int(r.devices_per_group), float(r.xla_tensor_bytes)
            call = (Collective("c", kind, ParallelDim.TP, size, Phase.FWD), GroupLayout(n, 1, n))
            out.append({"opcode": opcode, "n": n, "bytes": size,
                        "measured_s": size / r.network_throughput_bytes_per_sec,
                        "before_s": estimate_collective_s(*call, before),
                        "after_s": estimate_collective_s(*call, after)})
    return pd.DataFrame(out)


def pointed_held_out_table(path: Path, gpu_key: str, cluster: ClusterSpec, opcodes: tuple[str, ...], *,
                           seed: int = 0, holdout: float = 0.2) -> Any:
    """The table's held-out calls of ``opcodes`` at ``cluster``'s curves' fitted sizes or larger (a
    seeded draw of whole message sizes per opcode), one row each (opcode, n, bytes, measured_s),
    priced by the curve fitted on the other rows alone (``before_s``) and with those rows'
    measured points (``after_s``): a held-out size lies between two measured ones or beyond the
    last, never on its own rows."""
    pd = import_extra("pandas")
    out = []
    for opcode, kind, rows in _opcode_rows(path, gpu_key, cluster, opcodes):
        known = cluster.intra_node.collectives.get(kind.value)
        if rows.empty or known is None:
            continue
        held = split_mask(list(rows.xla_tensor_bytes), holdout, seed)
        nodes = {way: _node(cluster, fit_collective_rows(rows[~held], gpu_key, cluster, source=Path(path).name,
                                                         holdout=0.0, min_bytes=known.fit_bytes,
                                                         pointed=pointed).fits[0].curve, kind)
                 for way, pointed in (("before_s", ()), ("after_s", (opcode,)))}
        for r in rows[held & (rows.xla_tensor_bytes >= known.fit_bytes)].itertuples():
            n, size = int(r.devices_per_group), float(r.xla_tensor_bytes)
            call = (Collective("c", kind, ParallelDim.TP, size, Phase.FWD), GroupLayout(n, 1, n))
            out.append({"opcode": opcode, "n": n, "bytes": size,
                        "measured_s": size / r.network_throughput_bytes_per_sec,
                        **{way: estimate_collective_s(*call, node) for way, node in nodes.items()}})
    return pd.DataFrame(out)
