"""The interface every cost model implements; schedule and predict only see this."""

from __future__ import annotations

from typing import Protocol

from paraplan.inventory import Collective, GroupLayout, Op
from paraplan.specs import Phase


class CostModel(Protocol):
    """Seconds for one operator in one phase, and for one collective call on a group, with what
    priced them."""

    name: str

    def estimate_op_s(self, op: Op, phase: Phase) -> float: ...

    def estimate_collective_s(self, coll: Collective, layout: GroupLayout) -> float: ...

    def source_of(self, op: Op, phase: Phase) -> str:
        """Which model produced the estimate (shown by ``--explain``)."""
        ...

    def collective_source(self, coll: Collective, layout: GroupLayout) -> str:
        """What priced one call of ``coll`` on ``layout`` (shown by ``--explain``)."""
        ...

    def collective_last_measured(self, coll: Collective, layout: GroupLayout) -> float | None:
        """The largest message size measured on ``coll``'s group where ``coll`` is larger (its
        time extrapolated past the measured points), else None (the prediction's notes name it)."""
        ...
