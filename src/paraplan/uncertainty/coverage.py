"""Coverage without peeking: leave one source out. Each source's runs get intervals from the
residuals of the other sources' runs only, and each interval is checked against the run's own
measured residual."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from paraplan.uncertainty.interval import conformal_interval
from paraplan.uncertainty.regimes import Regime, ResidualTable


@dataclass(frozen=True, slots=True)
class Held:
    """One measured run: its source, its regime and its residual log(measured / predicted)."""

    run_id: str
    source: str
    regime: Regime
    residual: float
    architecture: str = ""  # the GPU's architecture (regimes.architecture_of); "": not known


@dataclass(frozen=True, slots=True)
class HeldOut:
    run: Held
    low: float
    high: float
    fallback: bool

    @property
    def covered(self) -> bool:
        return self.low <= self.run.residual <= self.high

    @property
    def width(self) -> float:
        """The interval's width as a fraction of the prediction."""
        return math.exp(self.high) - math.exp(self.low)


@dataclass(frozen=True, slots=True)
class Coverage:
    group: str
    n: int
    covered: float  # fraction of the runs inside their interval
    median_width: float  # fraction of the prediction
    fallbacks: int  # runs whose regime had too few runs once their source was left out


def leave_one_source_out(runs: Sequence[Held], level: float, fallback_factor: float = 1.5,
                         by: Callable[[Held], str] = lambda r: r.source) -> list[HeldOut]:
    """Every run's interval at ``level`` from the other sources' runs (``by``: what a run is
    left out with; its GPU's architecture: leave one architecture out). Runs that record their
    GPU's architecture are checked against it as a prediction is (``conformal_interval``)."""
    out = []
    for group in sorted({by(r) for r in runs}):
        table = ResidualTable.from_rows(((r.regime, r.residual, *([r.architecture] if r.architecture else []))
                                         for r in runs if by(r) != group), fallback_factor=fallback_factor)
        for run in (r for r in runs if by(r) == group):
            archs = frozenset([run.architecture]) if run.architecture else frozenset()
            low, high, _, fallback, _ = conformal_interval(run.regime, level, table, archs)
            out.append(HeldOut(run, low, high, fallback))
    return out


def coverage_rows(held: Sequence[HeldOut]) -> list[Coverage]:
    """Coverage and median width per regime, per source, and over all runs."""
    groups: dict[str, list[HeldOut]] = {}
    for h in held:
        groups.setdefault(h.run.regime.name, []).append(h)
    for h in held:
        groups.setdefault(f"source {h.run.source}", []).append(h)
    for h in held:
        if h.run.architecture:
            groups.setdefault(f"architecture {h.run.architecture}", []).append(h)
    groups["all runs"] = list(held)
    return [Coverage(name, len(hs), sum(h.covered for h in hs) / len(hs),
                     statistics.median(h.width for h in hs), sum(h.fallback for h in hs))
            for name, hs in groups.items()]
