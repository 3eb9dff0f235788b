"""Collective samples: GPUModeling NCCL CSVs as paraplan ``Collective`` s, and the fit of a
cluster's link parameters to them (``scipy.optimize.least_squares``)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from paraplan.calibrate._common import US, group_weights, import_extra, silent
from paraplan.costmodel import estimate_collective_s
from paraplan.inventory import Collective, CollectiveKind, GroupLayout
from paraplan.specs import ClusterSpec, ConfigError

__all__ = ["FIT_KINDS", "CollSamples", "LinkParams", "fit_links", "load_collective_samples", "predict_colls"]

#: The collectives the links are fitted on; all-gathers are predicted and reported only.
FIT_KINDS = {CollectiveKind.ALL_REDUCE, CollectiveKind.SEND_RECV}


@dataclasses.dataclass
class CollSamples:
    config: list[str]
    tag: list[str]
    coll: list[Collective]
    layout: list[GroupLayout]
    measured: np.ndarray

    def subset(self, mask: np.ndarray) -> CollSamples:
        idx = np.flatnonzero(mask)
        return CollSamples(
            [self.config[i] for i in idx],
            [self.tag[i] for i in idx],
            [self.coll[i] for i in idx],
            [self.layout[i] for i in idx],
            self.measured[idx],
        )

    def __len__(self) -> int:
        return len(self.coll)


def load_collective_samples(
    folder: Path, cluster: ClusterSpec, log: Callable[[str], None] = silent
) -> tuple[CollSamples, dict[tuple[str, str], dict[str, int]]]:
    """Every usable NCCL sample of ``folder``, and per (config, tag) the counts of rows, NaN
    and impossible rows, and rows used.

    Exclusion rules (each reported with a count):
    - pooled files without ``_N_M`` repeat the rows of the per-config files: skipped;
    - tuning tables are not measurements: skipped;
    - a NaN or non-positive time is excluded;
    - a time shorter than the same collective would take at 100 % of the links' nominal
      bandwidth with zero latency (``estimate_collective_s`` on the ideal cluster) is
      physically impossible and excluded. This is what catches the GH200 all-gather rows that
      report ~117 us whatever the size.
    """
    pd = import_extra("pandas")
    from paraplan.samples.gpumodeling import (
        NCCL_FILE,
        NCCL_KINDS,
        collective_for_row,
        group_layout,
        ideal_cluster,
    )

    ideal = ideal_cluster(cluster)
    rows: dict[str, list] = {"config": [], "tag": [], "coll": [], "layout": [], "measured": []}
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for path in sorted(Path(folder).glob("*.csv")):
        match = NCCL_FILE.match(path.name)
        if match is None:
            kind = "pooled union of the _N_M files" if "_fp16" in path.name else "regressor tuning table"
            log(f"  skip {path.name}: {kind}")
            continue
        tag, n, m = match["tag"], int(match["n"]), int(match["m"])
        if tag not in NCCL_KINDS:
            log(f"  skip {path.name}: unknown collective {tag!r}")
            continue
        if m > cluster.gpus_per_node:
            raise ConfigError(f"{path.name}: {m} GPUs per node but {cluster.name} has {cluster.gpus_per_node}")
        kind = NCCL_KINDS[tag]
        frame = pd.read_csv(path)
        frame.columns = [c.strip() for c in frame.columns]
        if (frame["nodes"] != n).any() or (frame["GPUsPerNode"] != m).any():
            raise ConfigError(f"{path.name}: nodes/GPUsPerNode columns disagree with the file name")
        layout = group_layout(n, m)
        config = f"{n}_{m}"
        c = counts.setdefault((config, tag), {"rows": 0, "nan": 0, "impossible": 0, "used": 0})
        impossible_durs = []
        for shape, dur in zip(frame["shape"].to_numpy(float), frame["dur(us)"].to_numpy(float), strict=True):
            c["rows"] += 1
            if not (math.isfinite(dur) and dur > 0 and math.isfinite(shape) and shape > 0):
                c["nan"] += 1
                continue
            coll = collective_for_row(kind, shape, n, m)
            seconds = dur * US
            if seconds < estimate_collective_s(coll, layout, ideal):
                c["impossible"] += 1
                impossible_durs.append(dur)
                continue
            c["used"] += 1
            for key, value in (
                ("config", config),
                ("tag", tag),
                ("coll", coll),
                ("layout", layout),
                ("measured", seconds),
            ):
                rows[key].append(value)
        note = ""
        if c["nan"]:
            note += f"; {c['nan']} excluded (NaN or non-positive time)"
        if impossible_durs:
            d = np.asarray(impossible_durs)
            near117 = int(np.sum((d > 100) & (d < 135)))
            note += (
                f"; {len(d)} excluded (faster than the links' nominal bandwidth allows: "
                f"{near117} of them at ~117 us (100-135 us), durations {d.min():.0f}-{d.max():.0f} us, median {np.median(d):.0f} us)"
            )
        log(f"  {path.name}: {c['rows']} rows{note}")
    return CollSamples(
        rows["config"], rows["tag"], rows["coll"], rows["layout"], np.asarray(rows["measured"])
    ), counts


def predict_colls(samples: CollSamples, cluster: ClusterSpec) -> np.ndarray:
    return np.fromiter(
        (estimate_collective_s(c, lay, cluster) for c, lay in zip(samples.coll, samples.layout, strict=True)),
        float,
        len(samples),
    )


@dataclasses.dataclass
class LinkParams:
    """Which link parameters are free: (side, field) in fitting order."""

    names: list[tuple[str, str]]

    def apply(self, cluster: ClusterSpec, x: np.ndarray) -> ClusterSpec:
        upd: dict[str, dict[str, float]] = {}
        for (side, fld), value in zip(self.names, x, strict=True):
            upd.setdefault(side, {})[fld] = float(value) * (US if fld == "latency_s" else 1.0)
        links = {side: getattr(cluster, side).model_copy(update=u) for side, u in upd.items()}
        return cluster.model_copy(update=links)


def _free_params(samples: CollSamples, cluster: ClusterSpec) -> LinkParams:
    names: list[tuple[str, str]] = []
    for side, crosses in (("intra_node", False), ("inter_node", True)):
        if getattr(cluster, side) is None:
            continue
        mine = [i for i, lay in enumerate(samples.layout) if lay.crosses_nodes == crosses]
        kinds = {samples.coll[i].kind for i in mine}
        if kinds - {CollectiveKind.SEND_RECV}:
            names.append((side, "efficiency"))
        if CollectiveKind.SEND_RECV in kinds:
            names.append((side, "p2p_efficiency"))
        if kinds:
            names.append((side, "latency_s"))
    return LinkParams(names)


def link_cost(samples: CollSamples, cluster: ClusterSpec) -> float:
    """The fit's loss at ``cluster``: weighted sum of squared log(pred/measured), every (config,
    collective) group weighing the same."""
    weights = group_weights(list(zip(samples.config, [c.kind for c in samples.coll], strict=True)))
    return float(np.sum((weights * np.log(predict_colls(samples, cluster) / samples.measured)) ** 2))


def fit_links(
    samples: CollSamples, cluster: ClusterSpec, *, loss: str, fixed: frozenset[tuple[str, str]] = frozenset()
) -> tuple[ClusterSpec, LinkParams, object]:
    """least_squares on weighted log(pred/measured); ``fixed`` parameters keep ``cluster``'s value.
    Returns the fitted cluster, the free parameters and scipy's ``OptimizeResult``."""
    least_squares = import_extra("scipy.optimize").least_squares
    params = _free_params(samples, cluster)
    params = LinkParams([p for p in params.names if p not in fixed])
    weights = group_weights(list(zip(samples.config, [c.kind for c in samples.coll], strict=True)))
    x0 = np.array([5.0 if f == "latency_s" else 0.5 for _, f in params.names])
    lower = np.array([0.0 if f == "latency_s" else 1e-3 for _, f in params.names])
    upper = np.array([1e5 if f == "latency_s" else 1.0 for _, f in params.names])

    def residuals(x: np.ndarray) -> np.ndarray:
        return weights * np.log(predict_colls(samples, params.apply(cluster, x)) / samples.measured)

    result = least_squares(
        residuals, x0, bounds=(lower, upper), loss=loss, f_scale=0.1, diff_step=1e-4, x_scale="jac"
    )
    return params.apply(cluster, result.x), params, result
