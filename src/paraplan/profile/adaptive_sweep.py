"""`paraplan profile adaptive`: the adaptive loop (:mod:`~paraplan.profile.adaptive`) measuring
with the operator sampler (:mod:`~paraplan.profile.ops`) through its journal.

Every grid point (x dtype) becomes a forward and a backward candidate; each regressor's pool
(operator, dtype, direction) runs the loop. With ``stop="holdout"`` it first sets 20 % of its
shapes aside as the held-out set and measures them, then runs the loop on the rest; with
``stop="oob"`` the loop runs on the whole pool and stops on the forest's out-of-bag error, so no
shape is measured only to score the others. A point is measured once, forward and backward together, and
appended to the journal at once: the backward pool reuses what the forward loop measured, and a
killed run started again with the same command reuses the whole journal. A point the sampler
cannot run (out of memory, unsupported) is recorded as skipped and left out of the pool.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from paraplan.profile.adaptive import (
    BUDGET_SPENT,
    AdaptiveRun,
    HeldOut,
    pools_from_samples,
    sample_adaptively,
    split_pool,
)
from paraplan.profile.grid import GridPoint
from paraplan.profile.records import RecordStore

__all__ = ["JournalMeasure", "candidate_samples", "run_adaptive_sweep"]

MIN_POOL = 12  # a pool of fewer shapes is measured whole: too few to hold some out and learn


def candidate_samples(points: Sequence[GridPoint], dtypes: Sequence[str], device_name: str) -> Any:
    """Sample rows (``time_s`` NaN) for the forward and backward of every point and dtype, with
    a ``point`` column holding the journal key; points the inventory cannot build are left out."""
    import pandas as pd

    from paraplan.inventory.samples import op_for_sample
    from paraplan.profile.ops import _row as sample_row  # the sampler's own row layout
    from paraplan.samples.schema import COLUMNS

    rows = []
    for point in points:
        try:
            op = op_for_sample(point.tag, point.values())
        except (ValueError, LookupError):
            continue
        for dtype in dtypes:
            for phase in ("fwd", "bwd"):
                row = sample_row(point, op, dtype, phase, float("nan"), device_name)
                rows.append({**row, "source": "", "row": len(rows), "point": point.key(dtype)})
    frame = pd.DataFrame(rows, columns=[*COLUMNS, "point"])
    return frame.astype({"time_s": float})


class JournalMeasure:
    """``measure(points) -> seconds`` for the adaptive loop: times each new point with the
    operator sampler, journals it, and answers repeated asks (and a resumed run) from memory."""

    def __init__(
        self,
        points: Sequence[GridPoint],
        settings: Any,
        store: RecordStore,
        progress: Callable[[str, str], None] | None = None,
    ) -> None:
        self.points = {p.key(d): (p, d) for p in points for d in settings.dtypes}
        self.settings = settings
        self.store = store
        self.progress = progress
        self.measured = 0
        self.skipped = 0
        self.times: dict[str, dict[str, float] | None] = {}
        for entry in store.entries():
            rows = entry.get("rows")
            self.times[entry["key"]] = {r["phase"]: float(r["time_s"]) for r in rows} if rows else None

    def __call__(self, frame: Any) -> np.ndarray:
        out = []
        for key, phase in zip(frame["point"], frame["phase"], strict=True):
            if key not in self.times:
                self.times[key] = self._measure(key)
            times = self.times[key]
            out.append(times.get(phase, np.nan) if times else np.nan)
        return np.asarray(out, dtype=float)

    def _measure(self, key: str) -> dict[str, float] | None:
        from paraplan.profile.ops import Unsupported, measure_point

        point, dtype = self.points[key]
        try:
            rows, extra = measure_point(point, dtype, self.settings)
        except Unsupported as exc:
            self.store.skip(key, str(exc))
            self.skipped += 1
            outcome, times = f"skipped: {exc}", None
        else:
            self.store.append(rows, key=key, extra=extra)
            self.measured += 1
            outcome, times = "measured", {r["phase"]: float(r["time_s"]) for r in rows}
        if self.progress is not None:
            self.progress(key, outcome)
        return times


def run_adaptive_sweep(
    points: Sequence[GridPoint],
    measure: JournalMeasure,
    *,
    target_error: float,
    batch_size: int = 8,
    random_state: int = 0,
    hardware: Any = None,
    stop: str = "holdout",
    order: str = "adaptive",
    deadline: float | None = None,
) -> list[AdaptiveRun | None]:
    """One adaptive run per regressor pool of ``points`` (None where the pool was measured whole
    because it had fewer than :data:`MIN_POOL` shapes). ``hardware``: GPUs outside the catalog
    (:class:`paraplan.costmodel.fitting.Hardware`). ``stop`` and ``order``: as
    :func:`~paraplan.profile.adaptive.sample_adaptively`'s; ``stop="oob"`` measures no held-out
    set. ``deadline`` (a :func:`time.monotonic` time): no batch starts after it; the pools not
    reached by then come back as runs with no shape measured, stopped with "time budget spent"."""
    frame = candidate_samples(points, measure.settings.dtypes, measure.settings.device_name)
    runs: list[AdaptiveRun | None] = []
    for pool in pools_from_samples(frame, hardware):
        if deadline is not None and time.monotonic() >= deadline:
            runs.append(AdaptiveRun(pool.key, order, target_error, np.empty(0, dtype=int), np.empty(0), stop=stop,
                                    stop_reason=BUDGET_SPENT))
            continue
        if len(pool) < MIN_POOL:
            measure(pool.points)
            runs.append(None)
            continue
        options = {"target_error": target_error, "batch_size": batch_size, "growth": 0.1,
                   "random_state": random_state, "order": order, "stop": stop, "deadline": deadline}
        if stop == "oob":
            runs.append(sample_adaptively(pool, measure, None, **options))
            continue
        candidates, held = split_pool(pool, 0.2, random_state)
        heldout = HeldOut.measured(held, measure)
        if len(heldout.time_s) == 0:
            measure(candidates.points)
            runs.append(None)
            continue
        runs.append(sample_adaptively(candidates, measure, heldout, **options))
    return runs
