"""What drives a prediction's error, as a regime, and the dev runs' residuals in each.

A regime is three facts a prediction knows about itself: whether its GPU's kernels were timed
with curves measured on that GPU and precision (``calibrated``) or borrowed from another GPU or
a generic rule (``uncalibrated``: a ``Prediction.uncalibrated`` note naming the GPU); whether a
framework preset filled the plan's unstated fields (``preset``) or the engine's own defaults did
(``engine``); and whether the model is ``dense`` or a mixture of experts (``moe``). The signed
log-residuals log(measured / predicted) of the dev runs in each regime are catalog data
(``catalog/intervals.yaml``, written by ``benchmarks/fit_intervals.py``): validation data used
only for the interval, never to move a prediction.

Each residual also carries its run's GPU architecture (``GpuSpec.architecture``, the GPU's
name where the catalog gives none): split conformal's guarantee needs the new prediction's
error to be exchangeable with the residuals it is bounded by, and runs on one architecture
share a bias another architecture need not have (``interval.conformal_interval`` falls back to
a stated rule for a GPU whose architecture has no run in its regime).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from paraplan.catalog.loader import packaged_yaml
from paraplan.prediction import Prediction

#: each feature of a regime and its values, in the order a regime is named
FEATURES: dict[str, tuple[str, ...]] = {
    "gpu": ("calibrated", "uncalibrated"),
    "framework": ("preset", "engine"),
    "model": ("dense", "moe"),
}
ANY = "*"


@dataclass(frozen=True, slots=True, order=True)
class Regime:
    gpu: str
    framework: str
    model: str

    @property
    def name(self) -> str:
        """``GPU calibrated, preset, dense``; a pooled regime leaves a feature out
        (``GPU calibrated, dense``); all three out: ``all runs``."""
        words = [f"GPU {self.gpu}" if self.gpu != ANY else "", self.framework if self.framework != ANY else "",
                 self.model if self.model != ANY else ""]
        shown = [w for w in words if w]
        return ", ".join(shown) if shown else "all runs"

    def covers(self, other: Regime) -> bool:
        """``other`` (a run's own regime) falls in this one (which may pool features)."""
        return all(mine in (ANY, theirs) for mine, theirs in zip(self.values, other.values, strict=True))

    @property
    def values(self) -> tuple[str, str, str]:
        return (self.gpu, self.framework, self.model)

    def coarser(self) -> list[Regime]:
        """The pooled regimes above this one (one feature or more left out), narrowest first,
        ending with all runs."""
        out = []
        for k in range(1, 4):
            for dropped in itertools.combinations(range(3), k):
                values = [ANY if i in dropped else v for i, v in enumerate(self.values)]
                out.append(Regime(*values))
        return out


def architecture_of(gpu: Any) -> str:
    """The group a GPU's errors are exchangeable within: its architecture, else its name."""
    return str(getattr(gpu, "architecture", None) or gpu.name)


def architectures_of(pred: Prediction) -> frozenset[str]:
    """The architectures of the GPUs ``pred`` runs on (a heterogeneous cluster: several)."""
    cluster = pred.job.cluster
    gpus = [cluster.gpu, *(g.gpu for g in getattr(cluster, "node_groups", None) or ())]
    return frozenset(architecture_of(g) for g in gpus)


def regime_of(pred: Prediction) -> Regime:
    """The regime of one prediction, from what it says about itself."""
    gpus = {pred.job.cluster.gpu.name}
    if pred.placement is not None:
        gpus |= {g for stage in pred.placement.stage_gpus for g in stage.split("+")}
    uncalibrated = any(note.split(":")[0].strip() in gpus for note in pred.uncalibrated)
    return Regime(
        gpu="uncalibrated" if uncalibrated else "calibrated",
        framework="preset" if getattr(pred.job, "preset", None) is not None else "engine",
        model="moe" if pred.job.model.is_moe else "dense",
    )


@dataclass(frozen=True, slots=True)
class ResidualTable:
    """Signed log-residuals per regime, and where they came from."""

    residuals: Mapping[Regime, tuple[float, ...]]
    sources: tuple[str, ...] = ()
    produced_by: str = ""
    fallback_factor: float = 1.5
    user_runs: Mapping[Regime, int] = field(default_factory=dict)  # residuals a user's runs file added
    # per regime, each dev run's (source, residual): runs of one source shared a cluster and a
    # framework, so the differences of their residuals are how far a comparison can be trusted
    by_source: Mapping[Regime, tuple[tuple[str, float], ...]] = field(default_factory=dict)
    # per regime, the GPU architectures its runs were measured on (empty: not recorded)
    architectures: Mapping[Regime, frozenset[str]] = field(default_factory=dict)

    def architectures_in(self, regime: Regime) -> frozenset[str]:
        """The architectures of the runs ``regime`` covers."""
        return frozenset(a for own, archs in self.architectures.items() if regime.covers(own) for a in archs)

    def pooled(self, regime: Regime) -> tuple[float, ...]:
        """Every residual of the runs ``regime`` covers (a pooled regime: several)."""
        return tuple(r for own, rs in self.residuals.items() if regime.covers(own) for r in rs)

    def with_runs(self, extra: Iterable[tuple[Regime, float] | tuple[Regime, float, str]]) -> ResidualTable:
        """This table with a user's measured runs' residuals (and their GPUs' architectures,
        when given) added to their regimes."""
        merged = {k: list(v) for k, v in self.residuals.items()}
        archs = {k: set(v) for k, v in self.architectures.items()}
        added: dict[Regime, int] = dict(self.user_runs)
        for regime, r, *arch in extra:
            merged.setdefault(regime, []).append(r)
            archs.setdefault(regime, set()).update(arch)
            added[regime] = added.get(regime, 0) + 1
        return ResidualTable({k: tuple(sorted(v)) for k, v in merged.items()}, self.sources, self.produced_by,
                             self.fallback_factor, added, self.by_source,
                             {k: frozenset(v) for k, v in archs.items()})

    def source_differences(self, regime: Regime) -> tuple[float, ...]:
        """r_i - r_j for every ordered pair of distinct dev runs of one source in the runs
        ``regime`` covers: the error left in a ratio of two predictions of one kind."""
        groups: dict[str, list[float]] = {}
        for own, pairs in self.by_source.items():
            if regime.covers(own):
                for source, r in pairs:
                    groups.setdefault(source, []).append(r)
        return tuple(a - b for rs in groups.values() for i, a in enumerate(rs) for j, b in enumerate(rs) if i != j)

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[Regime, float] | tuple[Regime, float, str]],
                  **kwargs: Any) -> ResidualTable:
        """A table from (regime, residual) pairs, or (regime, residual, architecture) triples
        (the leave-one-source-out check builds these)."""
        by: dict[Regime, list[float]] = {}
        archs: dict[Regime, set[str]] = {}
        for regime, r, *arch in rows:
            by.setdefault(regime, []).append(r)
            archs.setdefault(regime, set()).update(arch)
        return cls({k: tuple(sorted(v)) for k, v in by.items()},
                   architectures={k: frozenset(v) for k, v in archs.items() if v}, **kwargs)


def table_from_mapping(raw: Mapping[str, Any]) -> ResidualTable:
    """``catalog/intervals.yaml`` (or a mapping of its form) as a table."""
    residuals, by_source, architectures = {}, {}, {}
    for entry in raw.get("regimes") or ():
        regime = Regime(str(entry["gpu"]), str(entry["framework"]), str(entry["model"]))
        residuals[regime] = tuple(sorted(float(r) for r in entry["residuals"]))
        if entry.get("architectures"):
            architectures[regime] = frozenset(str(a) for a in entry["architectures"])
        runs = entry.get("runs") or ()
        if len(runs) == len(entry["residuals"]):  # "source: run id", in the residuals' order
            by_source[regime] = tuple((str(run).partition(":")[0], float(r))
                                      for run, r in zip(runs, entry["residuals"], strict=True))
    return ResidualTable(residuals, tuple(str(s) for s in raw.get("sources") or ()),
                         str(raw.get("produced_by") or ""), float(raw.get("fallback_factor", 1.5)),
                         by_source=by_source, architectures=architectures)


@functools.cache
def load_residuals() -> ResidualTable:
    """The package's residual table (``catalog/intervals.yaml``)."""
    return table_from_mapping(packaged_yaml("intervals.yaml"))
