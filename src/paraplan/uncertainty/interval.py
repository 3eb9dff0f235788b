"""A prediction's interval at a level: split-conformal bounds from its regime's residuals, or,
where the regime has too few runs for the level, a stated wider rule; plus the spread over the
settings the job did not state (``guessed``), when that was computed."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from paraplan.prediction import Prediction
from paraplan.specs import ConfigError
from paraplan.uncertainty.conformal import conformal_bounds, runs_needed
from paraplan.uncertainty.guessed import Spread
from paraplan.uncertainty.regimes import Regime, ResidualTable, load_residuals, regime_of


def check_level(level: float, flag: str = "--interval") -> float:
    """``level`` if it lies strictly between 0 and 1; otherwise a one-line ConfigError."""
    if not isinstance(level, (int, float)) or not 0.0 < level < 1.0 or math.isnan(level):
        raise ConfigError(f"{flag}: {level!r} is not a level between 0 and 1 (exclusive), e.g. 0.8")
    return float(level)


@dataclass(frozen=True, slots=True)
class Interval:
    """Bounds on log(measured / predicted iteration time) at ``level``, and how they were had."""

    level: float
    regime: Regime  # the prediction's own regime
    rule: str  # in words: which residuals, which rule
    fallback: bool  # the regime had too few runs for the level: the wider rule was used
    low: float  # log-ratio bounds (measured / predicted), guessed settings' spread included
    high: float
    runs: int  # residuals the bounds came from
    guessed: tuple[Spread, ...] = ()  # the unstated settings' spreads (added in)

    def time(self, seconds: float) -> tuple[float, float]:
        """Bounds on a figure that scales with the iteration time (seconds, cost)."""
        return seconds * math.exp(self.low), seconds * math.exp(self.high)

    def rate(self, value: float) -> tuple[float, float]:
        """Bounds on a figure inverse to the iteration time (tokens/s, TFLOP/s, MFU)."""
        return value * math.exp(-self.high), value * math.exp(-self.low)

    @property
    def label(self) -> str:
        """``80 %``."""
        return f"{100 * self.level:g} %"

    def to_dict(self, pred: Prediction) -> dict[str, Any]:
        """The JSON form: every time, rate and cost figure's [low, high], and the rule."""
        out: dict[str, Any] = {
            "level": self.level,
            "regime": self.regime.name,
            "rule": self.rule,
            "fallback": self.fallback,
            "runs": self.runs,
            "log_ratio": [self.low, self.high],
            "iteration_s": list(self.time(pred.iteration_s)),
            "tokens_per_s": list(self.rate(pred.tokens_per_s)),
            "tflops_per_gpu": list(self.rate(pred.tflops_per_gpu)),
            "mfu": list(self.rate(pred.mfu)),
        }
        for key, value in (("usd_per_million_tokens", pred.usd_per_million_tokens),
                           ("time_to_train_s", pred.time_to_train_s),
                           ("cost_to_train_usd", pred.cost_to_train_usd)):
            out[key] = None if value is None else list(self.time(value))
        out["guessed_settings"] = [s.to_dict() for s in self.guessed]
        return out

    def to_columns(self, pred: Prediction) -> dict[str, Any]:
        """The CSV form: each bound its own column (``iteration_s_low``, ``iteration_s_high``)."""
        out: dict[str, Any] = {}
        for key, value in self.to_dict(pred).items():
            if key == "guessed_settings":
                out[key] = "; ".join(f"{g['field']} {g['log_ratio'][0]:+.4f}/{g['log_ratio'][1]:+.4f}" for g in value)
            elif isinstance(value, list):
                out[f"{key}_low"], out[f"{key}_high"] = value
            elif value is None:
                out[f"{key}_low"] = out[f"{key}_high"] = None
            else:
                out[key] = value
        return out


def conformal_interval(regime: Regime, level: float, table: ResidualTable) -> tuple[float, float, str, bool, int]:
    """(low, high, rule, fallback, runs) for ``regime`` at ``level`` from ``table``.

    Enough runs in the regime: split-conformal on them. Too few: the widest of the pooled
    regimes above it that have enough (one feature or more left out, up to all runs), also
    covering every residual of the regime's own runs, its width times ``fallback_factor``
    about its middle. No pool has enough (a level near 1): the largest |residual| of all runs
    times the factor, on both sides."""
    need = runs_needed(level)
    own = table.pooled(regime)
    bounds = conformal_bounds(own, level)
    if bounds is not None:
        return bounds[0], bounds[1], f"split conformal on the {len(own)} runs of {regime.name}", False, len(own)
    factor = table.fallback_factor
    have = f"{len(own)} run" + ("" if len(own) == 1 else "s")
    short = f"too few runs in {regime.name} ({have}; {need} needed at {100 * level:g} %)"
    for pool in regime.coarser():
        pooled = table.pooled(pool)
        found = conformal_bounds(pooled, level)
        if found is not None:
            low, high = min(found[0], *own) if own else found[0], max(found[1], *own) if own else found[1]
            half, mid = (high - low) / 2.0 * factor, (high + low) / 2.0
            rule = (f"{short}: the {len(pooled)} runs of {pool.name}, the interval's width x{factor:g}"
                    + (" (and covering the regime's own runs)" if own else ""))
            return mid - half, mid + half, rule, True, len(pooled)
    everything = table.pooled(Regime("*", "*", "*"))
    if not everything:
        raise ConfigError("intervals: no measured runs to earn an interval from")
    worst = max(abs(r) for r in everything) * factor
    rule = (f"{short}, nor in any pool: the largest |error| of all {len(everything)} runs x{factor:g}, "
            "both sides")
    return -worst, worst, rule, True, len(everything)


def interval_for(pred: Prediction, level: float = 0.8, table: ResidualTable | None = None,
                 guessed: tuple[Spread, ...] = ()) -> Interval:
    """The interval of ``pred`` at ``level``: its regime's bounds (``conformal_interval``) with
    the spreads of the ``guessed`` settings added, each side the sum of theirs."""
    check_level(level)
    table = table if table is not None else load_residuals()
    regime = regime_of(pred)
    low, high, rule, fallback, runs = conformal_interval(regime, level, table)
    low += sum(s.low for s in guessed)
    high += sum(s.high for s in guessed)
    return Interval(level, regime, rule, fallback, low, high, runs, guessed)
