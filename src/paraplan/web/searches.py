"""The searches the page runs: each in a thread, with its progress (the screen, then the
exact stage, configuration by configuration) and a way to cancel it; running and recent ones
kept by key."""

from __future__ import annotations

import math
import secrets
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paraplan.specs import ConfigError
from paraplan.web.state import Keyed, plot_lock

#: Searches run at once; finished ones kept for browsing.
RUNNING_SEARCHES = 2
KEPT_SEARCHES = 16


class Cancelled(Exception):
    """A search the page cancelled."""


#: What a configuration's screen is taken to last before one was timed (the whole-space screen
#: of a large model takes about a second here).
SCREEN_GUESS_S = 1.0


@dataclass
class SearchRun:
    """One search in a thread: its stage and share done, its answer (the CLI's JSON, with the
    CLI's text of each plan row) or its error."""

    request: Any
    top: int
    level: float = 0.8
    risk: bool = False
    state: str = "running"  # running | done | error | cancelled
    stage: str = "screen"  # screen (the whole space, closed form) | exact (the shortlist, predicted)
    index: int = 0  # the configuration being searched
    exact_share: float = 0.0  # of the current configuration's exact stage
    stage_started: float = field(default_factory=time.monotonic)
    screen_s: float = SCREEN_GUESS_S  # how long a screen lasts: the last one timed, or the guess
    started: float = field(default_factory=time.monotonic)
    elapsed_s: float = 0.0
    data: dict[str, Any] | None = None
    shown: dict[str, Any] | None = None
    error: str | None = None
    plans: list[Any] = field(default_factory=list)  # the predictions of data["plans"], in order
    front: list[Any] = field(default_factory=list)
    pareto_png: bytes | None = None
    cancel: threading.Event = field(default_factory=threading.Event)

    @property
    def done(self) -> float:
        """The share done, 0-1: each configuration half screen, half exact. The screen reports
        no progress of its own, so its half moves with its time against the last screen's
        (or :data:`SCREEN_GUESS_S`), never reaching its end before the screen does."""
        if self.state == "done":
            return 1.0
        n = max(len(self.request.searches), 1)
        if self.stage == "screen":
            ran = time.monotonic() - self.stage_started
            part = 0.5 * (1.0 - math.exp(-ran / max(self.screen_s, 1e-3)))
        else:
            part = 0.5 + 0.5 * self.exact_share
        return min(1.0, (self.index + part) / n)

    def _progress(self, i: int, done: int, total: int) -> None:
        if self.cancel.is_set():
            raise Cancelled
        if self.stage == "screen":  # the first call: the screen is over
            self.screen_s = max(time.monotonic() - self.stage_started, 1e-3)
            self.stage = "exact"
        self.exact_share = done / max(total, 1)

    def run(self) -> None:
        from paraplan.cli.search import plan_rows, risk_notes_of, search_data, with_intervals
        from paraplan.search.run import merge_results, search_plans
        from paraplan.web.shown import plans_shown

        searches = list(self.request.searches)
        try:
            results = []
            for i, kwargs in enumerate(searches):
                self.index, self.stage, self.exact_share, self.stage_started = i, "screen", 0.0, time.monotonic()
                results.append(search_plans(**{**kwargs, "progress": lambda d, t, i=i: self._progress(i, d, t)}))
                if self.cancel.is_set():
                    raise Cancelled
            result = merge_results(results)
            result, intervals = with_intervals(result, self.level, self.risk)  # as paraplan search --interval
            risk_notes = risk_notes_of(result, intervals, self.request, self.risk) if result.ranked else None
            front, axis = None, self.request.pareto_axis
            if result.ranked:
                from paraplan.report.pareto import pareto_plans
                from paraplan.uncertainty import interval_for

                front, to_train = pareto_plans(result, axis)
                self.front = list(front)
                self.pareto_png = _pareto_png(result, front, axis, to_train,
                                              [interval_for(p, self.level) for p in front])
            rows = plan_rows(result, self.top, intervals, risk_notes)
            self.plans = list(result.ranked[: len(rows)])
            self.data = search_data(result, rows, front, axis, risk_notes)
            several = len(searches) > 1
            self.shown = {"plans": plans_shown(rows, several),
                          "pareto": plans_shown(self.data.get("pareto") or [], several)}
            self.state = "done"
        except Cancelled:
            self.state = "cancelled"
        except ConfigError as exc:
            self.error, self.state = str(exc), "error"
        except Exception as exc:  # a bug: said on the page in one line, not lost in a thread
            self.error, self.state = f"internal error: {type(exc).__name__}: {exc}", "error"
        finally:
            self.elapsed_s = time.monotonic() - self.started


def _pareto_png(result: Any, front: Any, axis: str, to_train: bool, intervals: Any = None) -> bytes | None:
    from paraplan.report.pareto import plot_pareto

    with plot_lock(), tempfile.TemporaryDirectory(prefix="paraplan-web-") as folder:
        path = Path(folder) / "pareto.png"
        plot_pareto(result, front, path, axis=axis, to_train=to_train, intervals=intervals)
        return path.read_bytes()


class Searches(Keyed[SearchRun]):
    """Running and recent searches by key."""

    GONE = "search: no longer kept by the server; run it again"

    def start(self, request: Any, top: int, level: float = 0.8, risk: bool = False) -> str:
        with self._lock:
            running = sum(r.state == "running" for r in self._items.values())
            if running >= RUNNING_SEARCHES:
                raise ConfigError(f"search: {running} searches are running; wait for one or cancel it")
            key = secrets.token_hex(8)
            run = SearchRun(request, top, level, risk)
            self._items[key] = run
            finished = [k for k, r in self._items.items() if r.state != "running"]
            for old in finished[: max(0, len(self._items) - KEPT_SEARCHES)]:
                del self._items[old]
        threading.Thread(target=run.run, name=f"paraplan-search-{key}", daemon=True).start()
        return key

    def cancel_all(self) -> None:
        with self._lock:
            for run in self._items.values():
                run.cancel.set()
