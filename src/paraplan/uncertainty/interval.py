"""A prediction's interval at a level: split-conformal bounds from its regime's residuals, or,
where the regime has too few runs for the level, a stated wider rule; plus the spread over the
settings the job did not state (``guessed``), when that was computed."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from paraplan.prediction import Prediction
from paraplan.specs import ConfigError
from paraplan.uncertainty.conformal import conformal_bounds, runs_needed
from paraplan.uncertainty.guessed import Spread
from paraplan.uncertainty.regimes import (
    ANY,
    Regime,
    ResidualTable,
    architectures_of,
    load_residuals,
    regime_of,
)


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


ALL = Regime("*", "*", "*")


def _widest(table: ResidualTable, regime: Regime = ALL) -> tuple[float, float, int, str]:
    """The stated rule of last resort: the largest |residual| of all runs of the prediction's
    kind of model (``regime.model``: a dense model's from the dense runs, a mixture of experts'
    from the MoE runs; all runs where its kind has none) times the fallback factor, on both
    sides; the number of runs, and what they were."""
    kind = Regime(ANY, ANY, regime.model)
    runs = table.pooled(kind) if regime.model != ANY else ()
    what = f"{regime.model} runs" if runs else "runs"
    everything = runs or table.pooled(ALL)
    if not everything:
        raise ConfigError("intervals: no measured runs to earn an interval from")
    worst = max(abs(r) for r in everything) * table.fallback_factor
    return -worst, worst, len(everything), what


def conformal_interval(regime: Regime, level: float, table: ResidualTable,
                       architectures: frozenset[str] = frozenset(), gpu: str = "",
                       closed_loop: tuple[float, str] | None = None) -> tuple[float, float, str, bool, int]:
    """(low, high, rule, fallback, runs) for ``regime`` at ``level`` from ``table``.

    Enough runs in the regime: split-conformal on them. Too few: the widest of the pooled
    regimes above it that have enough (one feature or more left out, up to all runs), also
    covering every residual of the regime's own runs, its width times ``fallback_factor``
    about its middle. No pool has enough (a level near 1): the largest |residual| of all runs
    times the factor, on both sides.

    The bounds hold for a new run exchangeable with the runs they came from; runs on another
    GPU architecture are not (they share their own architecture's bias: Dunn, Wasserman &
    Ramdas, "Distribution-free prediction sets for two-layer hierarchical models", JASA 2022,
    where a new group is exchangeable with the groups, not their members, and a bound needs as
    many groups as split conformal needs runs: 9 at 80 %). So when the table records the runs'
    architectures and none of the runs behind the bounds ran on one of ``architectures`` (the
    prediction's, ``gpu`` naming it): the stated rule of last resort, the largest |residual| of
    all runs times the factor, both sides; unless the GPU's curves were measured by the user's
    closed loop (``closed_loop``: a log-error and its description, ``closed_loop_error``) and
    the regime is a calibrated one: then the bounds, each side widened by that error."""
    gated = architectures if table.architectures else frozenset()
    found = _earned(regime, level, table, gated)
    if found is not None:
        return found[:5]
    low, high, rule, fallback, runs, pool = _earned(regime, level, table, frozenset())  # type: ignore[misc]
    seen = table.architectures_in(pool)
    missing = sorted(architectures - seen)
    named = gpu or missing[0]
    what = named if missing == [named] else f"{named} ({', '.join(missing)})"
    others = table.architectures_in(Regime(regime.gpu, ANY, ANY))
    unseen = (f"no dev run on {what} among the {regime.gpu} GPUs' runs (they ran on "
              f"{', '.join(sorted(others)) or 'none'}): not exchangeable with it")
    if closed_loop is not None and regime.gpu == "calibrated":
        err, said = closed_loop
        return (low - err, high + err, f"{rule}; {unseen}, but its curves were measured on it by the user's "
                f"closed loop: widened by {said}", fallback, runs)
    wide_low, wide_high, every, what = _widest(table, regime)
    return (wide_low, wide_high, f"{unseen} (Dunn et al. 2022): the largest |error| of all {every} {what} "
            f"x{table.fallback_factor:g}, both sides", True, every)


def _earned(regime: Regime, level: float, table: ResidualTable,
            architectures: frozenset[str]) -> tuple[float, float, str, bool, int, Regime] | None:
    """``conformal_interval``'s bounds from the regime's runs, or a pool's, and the pool they
    came from, counting only pools with a run on each of ``architectures`` whose GPU was
    calibrated (or not) as the prediction's is (none given: any pool): an uncalibrated H100's
    errors say nothing of a calibrated one's; None when no pool has both."""
    def seen(pool: Regime) -> bool:  # runs on the architectures, calibrated as the prediction's GPU is
        return architectures <= table.architectures_in(Regime(regime.gpu, pool.framework, pool.model))

    need = runs_needed(level)
    own = table.pooled(regime)
    bounds = conformal_bounds(own, level)
    if bounds is not None and seen(regime):
        return bounds[0], bounds[1], f"split conformal on the {len(own)} runs of {regime.name}", False, len(own), regime
    factor = table.fallback_factor
    have = f"{len(own)} run" + ("" if len(own) == 1 else "s")
    short = (f"too few runs in {regime.name} ({have}; {need} needed at {100 * level:g} %)" if bounds is None else
             f"no run on {', '.join(sorted(architectures))} among the {have} of {regime.name}")
    for pool in regime.coarser():
        pooled = table.pooled(pool)
        found = conformal_bounds(pooled, level)
        if found is not None and seen(pool):
            low, high = min(found[0], *own) if own else found[0], max(found[1], *own) if own else found[1]
            half, mid = (high - low) / 2.0 * factor, (high + low) / 2.0
            rule = (f"{short}: the {len(pooled)} runs of {pool.name}, the interval's width x{factor:g}"
                    + (" (and covering the regime's own runs)" if own else ""))
            return mid - half, mid + half, rule, True, len(pooled), pool
    if not seen(ALL):
        return None
    low, high, runs, what = _widest(table, regime)
    return low, high, f"{short}, nor in any pool: the largest |error| of all {runs} {what} x{factor:g}, both sides", \
        True, runs, ALL


def interval_for(pred: Prediction, level: float = 0.8, table: ResidualTable | None = None,
                 guessed: tuple[Spread, ...] = (), learned: Mapping[str, float] | None = None) -> Interval:
    """The interval of ``pred`` at ``level``: its regime's bounds (``conformal_interval``) with
    the spreads of the ``guessed`` settings added, each side the sum of theirs.

    ``learned`` (a learned-backend prediction: each operator regressor's key and its held-out
    mean |error|, as ``paraplan fit`` wrote them): the operators a regressor timed were measured
    on the user's hardware, so their share of the layer's operator seconds takes the calibrated
    regime's bounds, widened as ``calibrate trace``'s curves widen them (``closed_loop_error``
    over the regressors' held-out errors); the rest keeps the prediction's own regime's bounds.
    A sum of positive parts, each within its bounds, lies between the share-weighted sums of
    their bounds; every operator timed by a regressor: the calibrated regime's bounds alone."""
    check_level(level)
    table = table if table is not None else load_residuals()
    regime = regime_of(pred)
    gpu = pred.job.cluster.gpu
    archs = architectures_of(pred)
    low, high, rule, fallback, runs = conformal_interval(regime, level, table, archs, gpu.name,
                                                         closed_loop_error(pred))
    if learned is not None:
        share, timed = learned_share(pred)
        errors = [(key.split("/", 3)[-1], err) for key, err in sorted(learned.items())
                  if key.split("/")[3:4] and key.split("/")[3] in timed]
        if share <= 0.0 or not errors:
            rule += "; the learned backend timed no operator of a layer with a regressor: the analytical rule"
        else:
            mine = Regime("calibrated", regime.framework, regime.model)
            c_low, c_high, c_rule, c_fallback, c_runs = conformal_interval(
                mine, level, table, archs, gpu.name,
                closed_loop_error(pred, errors, "held-out mean error of the learned regressors that timed it"))
            if share >= 1.0 - 1e-9:
                regime, low, high, fallback, runs = mine, c_low, c_high, c_fallback, c_runs
                rule = f"a learned regressor timed every operator of a layer: {c_rule}"
            else:
                low = math.log(share * math.exp(c_low) + (1.0 - share) * math.exp(low))
                high = math.log(share * math.exp(c_high) + (1.0 - share) * math.exp(high))
                rule = (f"learned regressors timed {100 * share:.3g} % of a layer's operator seconds "
                        f"({', '.join(sorted(timed))}): that part {c_rule}; the rest {rule}; bounds weighted "
                        "by the two parts' shares")
                fallback, runs = fallback or c_fallback, max(runs, c_runs)
    low += sum(s.low for s in guessed)
    high += sum(s.high for s in guessed)
    return Interval(level, regime, rule + one_sided(low, high), fallback, low, high, runs, guessed)


def one_sided(low: float, high: float) -> str:
    """What the rule adds when the bounds (log-ratios measured / predicted) leave out the
    prediction itself: the interval bounds the time a run will measure, and where the runs it
    came from all measured slower (or faster) than predicted, it lies wholly on that side. The
    point is left where the cost model puts it (measured iterations never move a prediction);
    "" when the interval holds the point."""
    if low <= 0.0 <= high:
        return ""
    side, by = ("above the prediction (from", low) if low > 0.0 else ("below the prediction (up to", high)
    return (f"; it lies wholly {side} {100 * math.expm1(by):+.1f} %): it bounds the time a "
            f"run will measure, and the runs it came from measured {'slower' if low > 0.0 else 'faster'} than "
            "predicted; the prediction is the cost model's, never moved toward measured runs")


def learned_share(pred: Prediction) -> tuple[float, frozenset[str]]:
    """The share of one layer's operator seconds (the critical stage's, ``Prediction.layer_ops``)
    a learned regressor timed, and those operators' names."""
    total = timed_s = 0.0
    timed = set()
    for op in pred.layer_ops:
        fwd_src, _, bwd_src = op.source.removeprefix("fwd: ").partition("; bwd: ")
        bwd_src = bwd_src or fwd_src
        fwd_s, bwd_s = op.fwd_s + op.recompute_s, op.bwd_s
        total += fwd_s + bwd_s
        for src, seconds in ((fwd_src, fwd_s), (bwd_src, bwd_s)):
            if src.startswith("learned"):
                timed_s += seconds
                timed.add(op.name)
    return (timed_s / total if total > 0 else 0.0), frozenset(timed)


def measured_curves(gpu: Any) -> list[tuple[str, int, float | None]]:
    """(curve, points held out, their median |error|) of each of ``gpu``'s GEMM, attention and
    memory curves that was fitted to timings (``calibrate trace`` writes these numbers)."""
    eff = gpu.efficiency
    named = [(name, getattr(eff, name)) for name in ("gemm", "attention", "memory")]
    named += [(f"{p.value} {name}", getattr(curves, name)) for p, curves in eff.precisions.items()
              for name in ("gemm", "attention")]
    return [(name, c.held_out or 0, c.held_out_median_err) for name, c in named
            if c is not None and c.fitted is not None]


def closed_loop_error(pred: Prediction, held: list[tuple[str, float]] | None = None,
                      what: str = "held-out median error of its fitted curves") -> tuple[float, str] | None:
    """What the user's closed loop measured, as a log-error to widen calibrated bounds by: the
    largest held-out error of what it measured, times the share of the iteration its compute
    takes (the measurements time only the compute; a sum of parts is off by at most its parts'
    largest relative error). ``held``: (name, error) of each measured piece (the learned
    backend's regressors); None: the GPU's fitted curves' held-out median |errors| (``calibrate
    trace`` writes these). None back: nothing was held out."""
    others: list[str] = []
    if held is None:
        curves = measured_curves(pred.job.cluster.gpu)
        held = [(name, err) for name, n, err in curves if n and err is not None]
        others = [c[0] for c in curves if not c[1] or c[2] is None]
    if not held or pred.iteration_s <= 0:
        return None
    name, worst = max(held, key=lambda c: c[1])
    b = pred.breakdown
    share = min(1.0, (b.forward_compute_s + b.backward_compute_s + b.recompute_s) / pred.iteration_s)
    said = (f"the largest {what} ({name}, {100 * worst:.1f} %; "
            + ", ".join(f"{n} {100 * e:.1f} %" for n, e in held if n != name)
            + ("; none held out: " + ", ".join(others) if others else "")
            + f") x the compute share of the iteration ({100 * share:.0f} %), each side")
    return math.log1p(worst * share), said.replace("%; )", "%)").replace("%; ;", "%;")
