"""One progress bar across every stage of a long command, with the time elapsed and an ETA."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column


class StagedProgress:
    """A bar on stderr over all the stages of a command: what it is doing now, the share of the
    work done, the time elapsed and the time left.

    Work is counted in the caller's units (rough seconds); a later stage's work may be added
    once its size is known (:meth:`add_work`). The ETA is the work left over the speed measured
    since the start, so estimates off by a common factor still give a true ETA. The bar is
    redrawn at every stage change, so no stage passes unseen, and vanishes when done.
    """

    def __init__(self, console: Console, description: str = "starting") -> None:
        self._progress = Progress(
            TextColumn("{task.description}", table_column=Column(min_width=32)),
            BarColumn(bar_width=12),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
            refresh_per_second=4,
            speed_estimate_period=24 * 3600,  # the average speed since the start, not the last 30 s
        )
        self._description = description
        self._task: TaskID | None = None

    def __enter__(self) -> StagedProgress:
        self._progress.start()
        self._task = self._progress.add_task(self._description, total=0.0)
        self._progress.refresh()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.stop()

    @property
    def _id(self) -> TaskID:
        assert self._task is not None, "use StagedProgress in a with statement"
        return self._task

    def add_work(self, work: float) -> None:
        """More work ahead (a stage whose size is now known)."""
        task = self._progress.tasks[0]
        self._progress.update(self._id, total=(task.total or 0.0) + work)

    def stage(self, description: str) -> None:
        """What the command is doing now."""
        self._progress.update(self._id, description=description)
        self._progress.refresh()

    def advance(self, work: float) -> None:
        self._progress.update(self._id, advance=work)
