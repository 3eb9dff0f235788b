"""How far the difference between two predictions can be trusted (``paraplan compare``).

Two plans in one regime share most of their error: the same GPU's kernel curves, the same
framework's overheads, the same model are mispredicted alike, so the two plans' own intervals
overlapping says little about which is faster. What matters is the error of the ratio B / A of
their iteration times: log(measured B / measured A) = log(predicted B / predicted A) + (r_B - r_A).
Its bounds are earned like the plans' own (split conformal, ``conformal``) from the
differences r_i - r_j of the residuals of every two dev runs of one source in the regime (one
source: one cluster and one framework, as two plans a user compares), widened by the spread of
the ratio over each setting either plan left unstated (``guessed.ratio_spreads``). Plans in
different regimes (say, two GPUs) share no error that we can count on: the ratio's bounds are
then B's regime bounds less A's, both sides (the conservative sum).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from paraplan.uncertainty.conformal import conformal_bounds
from paraplan.uncertainty.guessed import Spread
from paraplan.uncertainty.interval import check_level, conformal_interval
from paraplan.uncertainty.regimes import Regime, ResidualTable, load_residuals


@dataclass(frozen=True, slots=True)
class RatioInterval:
    """Bounds on the measured ratio B / A of two plans' iteration times at ``level``."""

    level: float
    ratio: float  # predicted B / A
    low: float  # log-ratio bounds on measured (B / A) / predicted (B / A), spreads included
    high: float
    rule: str
    guessed: tuple[Spread, ...] = ()

    @property
    def bounds(self) -> tuple[float, float]:
        """The measured B / A ratio's bounds."""
        return self.ratio * math.exp(self.low), self.ratio * math.exp(self.high)

    @property
    def verdict(self) -> str:
        """``faster`` | ``slower`` (B than A, beyond the uncertainty) | ``within``."""
        low, high = self.bounds
        return "faster" if high < 1.0 else "slower" if low > 1.0 else "within"

    @property
    def sentence(self) -> str:
        low, high = self.bounds
        label = f"{100 * self.level:g} %"
        said = {"faster": "B is faster than A beyond the uncertainty",
                "slower": "B is slower than A beyond the uncertainty",
                "within": "the difference is within the uncertainty: either may be faster"}[self.verdict]
        return f"B / A iteration time {self.ratio:.3f} ({label}: {low:.3f}-{high:.3f}): {said}"

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "iteration_ratio": self.ratio, "iteration_ratio_bounds": list(self.bounds),
                "verdict": self.verdict, "rule": self.rule, "guessed_settings": [s.to_dict() for s in self.guessed]}


def ratio_interval(regime_a: Regime, regime_b: Regime, ratio: float, level: float = 0.8,
                   table: ResidualTable | None = None, guessed: tuple[Spread, ...] = (),
                   architectures: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset()),
                   gpus: tuple[str, str] = ("", "")) -> RatioInterval:
    """The interval of the measured B / A at ``level``, for predictions in ``regime_a`` and
    ``regime_b`` whose predicted ratio is ``ratio``, widened by ``guessed`` (the ratio's spreads).
    ``architectures`` (A's and B's GPUs', ``regimes.architectures_of``; ``gpus`` names them):
    plans on different architectures share no error we count on, and a pool's differences bound
    only plans on an architecture its runs were measured on (else each plan's own bounds,
    ``conformal_interval``, which then take its stated wide rule)."""
    check_level(level)
    table = table if table is not None else load_residuals()
    found = None
    same_gpus = architectures[0] == architectures[1]
    if regime_a == regime_b and same_gpus:
        for pool in (regime_a, *regime_a.coarser()):
            diffs = table.source_differences(pool)
            bounds = conformal_bounds(diffs, level)
            if table.architectures and not architectures[0] <= table.architectures_in(pool):
                continue
            if bounds is not None:
                runs = len({r for own, pairs in table.by_source.items() if pool.covers(own) for r in pairs})
                found = (*bounds, f"one regime ({regime_a.name}), errors shared: split conformal on the "
                                  f"{len(diffs)} differences between {runs} dev runs of one source"
                                  + ("" if pool == regime_a else f" in {pool.name}"))
                break
    if found is None:
        a_low, a_high, *_ = conformal_interval(regime_a, level, table, architectures[0], gpus[0])
        b_low, b_high, *_ = conformal_interval(regime_b, level, table, architectures[1], gpus[1])
        why = ("different regimes" if regime_a != regime_b else "different GPU architectures" if not same_gpus
               else "too few runs of one source on its GPU's architecture")
        found = (b_low - a_high, b_high - a_low,
                 f"{why} ({regime_a.name} / {regime_b.name}), no error counted as shared: "
                 "B's interval less A's, both sides")
    low, high, rule = found
    low += sum(s.low for s in guessed)
    high += sum(s.high for s in guessed)
    return RatioInterval(level, ratio, low, high, rule, guessed)
