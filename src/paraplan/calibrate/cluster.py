"""``calibrate_links``: fit a cluster's link parameters to a folder of NCCL samples, score them
on a hold-out and return every table as data."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from paraplan.calibrate._common import (
    COMMAND,
    US,
    ErrorStats,
    check_fit_options,
    err_stats,
    rel_path,
    silent,
    split_mask,
)
from paraplan.calibrate.catalog_yaml import links_yaml
from paraplan.calibrate.links import (
    FIT_KINDS,
    CollSamples,
    fit_links,
    link_cost,
    load_collective_samples,
    predict_colls,
)
from paraplan.catalog import load_cluster
from paraplan.specs import ClusterSpec, ConfigError, LinkSpec

__all__ = ["CollErrorRow", "LinkCalibration", "LinkOptions", "LinkRow", "TopologyFit", "calibrate_links"]

TOPOLOGIES = ("auto", "mesh", "switch")


@dataclasses.dataclass(frozen=True)
class LinkOptions:
    """The settings of ``paraplan calibrate links`` (docs/calibration.md)."""

    intra_topology: str = "auto"  # "auto" fits both and keeps the better
    seed: int = 0
    holdout: float = 0.2
    loss: str = "linear"
    date: str | None = None  # written into the source string (None: today)

    def check(self) -> None:
        check_fit_options(self.seed, self.holdout, self.loss)
        if self.intra_topology not in TOPOLOGIES:
            raise ConfigError(f"intra_topology: expected one of {', '.join(TOPOLOGIES)} (got {self.intra_topology!r})")


@dataclasses.dataclass(frozen=True)
class TopologyFit:
    """The fit with one intra-node topology (None: one GPU per node)."""

    topology: str | None
    params: tuple[str, ...]  # "intra_node.efficiency", ...
    evaluations: int
    cost: float  # weighted sum of squared log errors
    # links whose latency the fit drove to 0 (not identified by the message sizes): they keep
    # the catalog value and the other parameters are refitted
    kept_latency: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class LinkRow:
    """One fitted link, with the bus and p2p bandwidths it gives."""

    side: str
    bandwidth_bytes_per_s: float
    topology: str
    efficiency: float
    bus_bytes_per_s: float
    p2p_efficiency: float | None
    p2p_bytes_per_s: float
    latency_s: float


@dataclasses.dataclass(frozen=True)
class CollErrorRow:
    """Errors of one (config, collective) file; ``errors`` None when no row was usable."""

    config: str
    kind: str
    rows: int
    excluded: int
    fitted: bool
    holdout_median_abs: float | None  # fitted collectives only
    errors: ErrorStats | None


@dataclasses.dataclass(frozen=True)
class LinkCalibration:
    """Everything ``calibrate_links`` found; the report renders it."""

    folder: str
    cluster: ClusterSpec  # the catalog cluster, at the samples' largest node count
    options: LinkOptions
    topologies: tuple[TopologyFit, ...]
    chosen: TopologyFit
    notes: tuple[str, ...]  # one line per file: exclusions as checked against the chosen topology
    fitted: ClusterSpec
    links: tuple[LinkRow, ...]
    rows: tuple[CollErrorRow, ...]
    holdout: ErrorStats  # all-reduce + p2p, fitted on the other 80 %
    in_sample: ErrorStats  # all-reduce + p2p, final fit
    all_gather: ErrorStats | None  # not fitted
    block: str  # the YAML link block
    seconds: float


@dataclasses.dataclass
class _Trial:
    fit: TopologyFit
    samples: CollSamples
    counts: dict[tuple[str, str], dict[str, int]]
    hold_set: CollSamples
    hold_pred: np.ndarray
    fitted: ClusterSpec
    notes: list[str]


def _trial(folder: Path, cluster: ClusterSpec, topo: str | None, opts: LinkOptions) -> _Trial:
    notes: list[str] = []
    samples, counts = load_collective_samples(folder, cluster, notes.append)
    fit_set = samples.subset(np.array([c.kind in FIT_KINDS for c in samples.coll]))
    if not len(fit_set):
        raise ConfigError(f"{folder}: no usable all-reduce or send/recv samples")
    # A latency the fit drives to zero is not identified by these sizes (>= 4 MB): keep the
    # catalog cluster's value for it and fit the rest.
    fitted, params, res = fit_links(fit_set, cluster, loss=opts.loss)
    fixed = frozenset(
        (side, fld) for side, fld in params.names if fld == "latency_s" and getattr(fitted, side).latency_s < 0.01 * US
    )
    test = split_mask(list(range(len(fit_set))), opts.holdout, opts.seed)
    fitted80, _, _ = fit_links(fit_set.subset(~test), cluster, loss=opts.loss, fixed=fixed)
    hold_set = fit_set.subset(test)
    hold_pred = predict_colls(hold_set, fitted80)
    if fixed:
        fitted, params, res = fit_links(fit_set, cluster, loss=opts.loss, fixed=fixed)
    names = tuple(f"{s}.{f}" for s, f in params.names)
    fit = TopologyFit(topo, names, int(res.nfev), link_cost(fit_set, fitted), tuple(s for s, _ in sorted(fixed)))
    return _Trial(fit, samples, counts, hold_set, hold_pred, fitted, notes)


def _link_rows(cluster: ClusterSpec) -> tuple[LinkRow, ...]:
    out = []
    for side in ("intra_node", "inter_node"):
        link: LinkSpec | None = getattr(cluster, side)
        if link is not None:
            out.append(
                LinkRow(side, link.bandwidth_bytes_per_s, link.topology, link.efficiency, link.bus_bytes_per_s,
                        link.p2p_efficiency, link.p2p_bytes_per_s, link.latency_s)
            )
    return tuple(out)


def _error_rows(trial: _Trial, pred: np.ndarray) -> tuple[CollErrorRow, ...]:
    from paraplan.samples.gpumodeling import NCCL_KINDS

    samples, hs, hp = trial.samples, trial.hold_set, trial.hold_pred
    rows = []
    configs, tags = np.asarray(samples.config), np.asarray(samples.tag)
    for (config, tag), c in sorted(trial.counts.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        m = (configs == config) & (tags == tag)
        fitted = NCCL_KINDS[tag] in FIT_KINDS
        excluded = c["nan"] + c["impossible"]
        if not m.any():
            rows.append(CollErrorRow(config, tag, c["rows"], excluded, fitted, None, None))
            continue
        hold = None
        hm = (np.asarray(hs.config) == config) & (np.asarray(hs.tag) == tag)
        if fitted and hm.any():
            hold = err_stats(hp[hm], hs.measured[hm]).median_abs
        stats = err_stats(pred[m], samples.measured[m])
        rows.append(CollErrorRow(config, tag, c["rows"], excluded, fitted, hold, stats))
    return tuple(rows)


def calibrate_links(
    folder: Path, cluster_name: str, options: LinkOptions | None = None, log: Callable[[str], None] = silent
) -> LinkCalibration:
    """Fit the link efficiency, p2p efficiency and latency of catalog cluster ``cluster_name``
    to the NCCL samples in ``folder``: with both intra-node topologies (``switch``, ``mesh``)
    unless ``options.intra_topology`` names one, keeping the better fit."""
    t0 = time.perf_counter()
    opts = options or LinkOptions()
    opts.check()
    from paraplan.samples.gpumodeling import NCCL_FILE

    base = load_cluster(cluster_name)
    probe = [NCCL_FILE.match(p.name) for p in Path(folder).glob("*.csv")]
    if not any(probe):
        raise ConfigError(f"{folder}: no NCCL sample files (<GPU>_<collective>_fp16_<N>_<M>.csv)")
    max_nodes = max(int(mt["n"]) for mt in probe if mt)
    base = load_cluster(cluster_name, num_nodes=max(max_nodes, base.num_nodes))
    topologies: list[str | None] = ["switch", "mesh"] if opts.intra_topology == "auto" else [opts.intra_topology]
    if base.intra_node is None:
        topologies = [None]
    trials = []
    for topo in topologies:
        log(f"fitting the links of {base.name}" + (f" with intra-node topology {topo}" if topo else ""))
        cluster = base
        if topo is not None:
            cluster = base.model_copy(update={"intra_node": base.intra_node.model_copy(update={"topology": topo})})
        trials.append(_trial(folder, cluster, topo, opts))
    best = min(trials, key=lambda t: t.fit.cost)

    pred = predict_colls(best.samples, best.fitted)
    fit_mask = np.array([c.kind in FIT_KINDS for c in best.samples.coll])
    holdout = err_stats(best.hold_pred, best.hold_set.measured)
    ag = ~fit_mask
    all_gather = err_stats(pred[ag], best.samples.measured[ag]) if ag.any() else None
    rel = rel_path(folder)
    date = opts.date or _dt.date.today().isoformat()
    source = (
        f"fitted by {COMMAND} links {rel} --cluster {base.name} on {date}; "
        f"all-reduce + p2p hold-out median |err| {holdout.median_abs:.1f}% (mean {holdout.mean_abs:.1f}%)"
    )
    return LinkCalibration(
        folder=rel, cluster=base, options=opts, topologies=tuple(t.fit for t in trials), chosen=best.fit,
        notes=tuple(best.notes), fitted=best.fitted, links=_link_rows(best.fitted),
        rows=_error_rows(best, pred), holdout=holdout,
        in_sample=err_stats(pred[fit_mask], best.samples.measured[fit_mask]), all_gather=all_gather,
        block=links_yaml(best.fitted, source), seconds=time.perf_counter() - t0,
    )
