"""The learned cost model: the analytical estimate times a regressor's learned residual.

Regressors are fitted per (GPU, operator, direction) and per (cluster, collective kind) on
sampled timings (``paraplan fit``). Each predicts log(measured / analytical), so a shape
outside the sampled grid degrades to the analytical answer's scale instead of being clamped.
An operator or collective no regressor covers falls back to the analytical estimate, and
``source_of`` says so (``--explain``). Calls are batched per regressor: ``prepare`` predicts
every operator of a job at once.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from paraplan.costmodel.features import (
    collective_features,
    collective_key,
    direction,
    op_feature_names,
    op_features,
    op_key,
)
from paraplan.costmodel.roofline import AnalyticalCostModel
from paraplan.inventory import Collective, GroupLayout, JobInventory, Op
from paraplan.specs import ClusterSpec, Phase, Precision

_BACKWARD = (Phase.BWD_INPUT, Phase.BWD_WEIGHT)


class LearnedCostModel:
    """Seconds from fitted residual regressors, falling back per operator to the roofline."""

    name = "learned"

    def __init__(self, cluster: ClusterSpec, precision: Precision, models: dict[str, Any]) -> None:
        self.analytical = AnalyticalCostModel(cluster, precision)
        self.cluster = cluster
        self.models = models
        self._op_s: dict[tuple[int, Phase], float] = {}
        self._op_src: dict[tuple[int, Phase], str] = {}
        self._held: list[Op] = []  # keeps cached operators alive so their ids stay unique
        self._coll_s: dict[tuple, float] = {}

    # -- operators -------------------------------------------------------------------------
    def _model_for(self, op: Op, way: str):
        return self.models.get(op_key(self.cluster.gpu.name, op.name, way))

    def prepare(self, inv: JobInventory) -> None:
        """Predict every operator of the job with one regressor call per operator kind."""
        ops: dict[int, Op] = {}
        for st in inv.stages:
            for op in (*st.layer_ops, *st.end_ops, st.optimizer):
                ops[id(op)] = op
        batches: dict[str, list[tuple[Op, str, float]]] = {}
        for op in ops.values():
            for way in ("fwd", "bwd"):
                model = self._model_for(op, way)
                if model is None:
                    continue
                base = self._baseline(op, way)
                if base <= 0.0:
                    continue
                batches.setdefault(model.key, []).append((op, way, base))
        for key, items in batches.items():
            model = self.models[key]
            names = op_feature_names(items[0][0])
            if names != list(model.feature_names):
                continue  # fitted on other features: leave these operators to the roofline
            X = np.array([op_features(op, way, base) for op, way, base in items])
            ratio = np.exp(model.predict_log_ratio(X))
            outside = model.outside_range(X)
            for (op, way, base), r, out in zip(items, ratio, outside, strict=True):
                source = f"learned ({model.algorithm}{', outside sampled range' if out else ''})"
                self._store(op, way, base * float(r), source)

    def _baseline(self, op: Op, way: str) -> float:
        if way == "fwd":
            return self.analytical.estimate_op_s(op, Phase.FWD)
        return sum(self.analytical.estimate_op_s(op, ph) for ph in _BACKWARD)

    def _store(self, op: Op, way: str, seconds: float, source: str) -> None:
        self._held.append(op)
        if way == "fwd":
            for ph in (Phase.FWD, Phase.RECOMPUTE, Phase.OPTIMIZER):
                self._op_s[(id(op), ph)] = seconds
                self._op_src[(id(op), ph)] = source
        else:  # the samples time the whole backward; it is booked as input-gradient time
            self._op_s[(id(op), Phase.BWD_INPUT)] = seconds
            self._op_s[(id(op), Phase.BWD_WEIGHT)] = 0.0
            self._op_src[(id(op), Phase.BWD_INPUT)] = self._op_src[(id(op), Phase.BWD_WEIGHT)] = source

    def estimate_op_s(self, op: Op, phase: Phase) -> float:
        hit = self._op_s.get((id(op), phase))
        if hit is not None:
            return hit
        return self.analytical.estimate_op_s(op, phase)

    def source_of(self, op: Op, phase: Phase) -> str:
        hit = self._op_src.get((id(op), phase))
        if hit is not None:
            return hit
        return f"roofline (no regressor for {op.name} {direction(phase)} on {self.cluster.gpu.name})"

    # -- collectives -----------------------------------------------------------------------
    def estimate_collective_s(self, coll: Collective, layout: GroupLayout) -> float:
        base = self.analytical.estimate_collective_s(coll, layout)
        if base <= 0.0:
            return base
        cache_key = (coll.kind, coll.bytes, layout)
        hit = self._coll_s.get(cache_key)
        if hit is not None:
            return hit
        model = self.models.get(collective_key(self.cluster.name, coll.kind.value))
        if model is None:
            seconds = base
        else:
            X = np.array([collective_features(coll, layout, base)])
            seconds = base * math.exp(float(model.predict_log_ratio(X)[0]))
        self._coll_s[cache_key] = seconds
        return seconds

    def collective_source(self, coll: Collective) -> str:
        if self.models.get(collective_key(self.cluster.name, coll.kind.value)) is None:
            return f"alpha-beta (no regressor for {coll.kind.value} on {self.cluster.name})"
        return "learned"

    def coverage(self) -> tuple[bool, bool]:
        """(any operator regressor for this GPU, any collective regressor for this cluster)."""
        ops = any(k.startswith(f"op/{self.cluster.gpu.name}/") for k in self.models)
        colls = any(k.startswith(f"collective/{self.cluster.name}/") for k in self.models)
        return ops, colls
