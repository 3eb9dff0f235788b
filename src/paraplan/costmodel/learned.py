"""The learned cost model: the analytical estimate times a regressor's learned residual.

Regressors are fitted per (GPU, dtype, operator, direction) and per (cluster, collective kind,
intra/inter-node) on sampled timings (``paraplan fit``). Each predicts log(measured /
analytical), so a shape outside the sampled grid degrades to the analytical answer's scale
instead of being clamped. A residual only means something against the baseline it was fitted
on, so regressors are used only when the job's GPU (peaks and efficiency curves) and cluster
(links) have the fingerprints recorded at fit time. Anything not covered falls back to the
analytical estimate, and ``source_of`` / ``notes`` say so. Calls are batched per regressor:
``prepare`` predicts every operator of a job at once.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from paraplan.costmodel.features import (
    cluster_fingerprint,
    collective_features,
    collective_key,
    gpu_fingerprint,
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

    def __init__(
        self,
        cluster: ClusterSpec,
        precision: Precision,
        models: dict[str, Any],
        fingerprints: dict[str, str] | None = None,
        plan: Any = None,
    ) -> None:
        # the roofline it falls back to, with the plan's kernel settings (``AnalyticalCostModel.of_plan``)
        self.analytical = (AnalyticalCostModel(cluster, precision) if plan is None
                           else AnalyticalCostModel.of_plan(cluster, precision, plan))
        self.cluster = cluster
        self.precision = precision
        fingerprints = fingerprints or {}
        gpu, name = cluster.gpu.name, cluster.name
        self.notes: list[str] = []
        self.ops_usable = fingerprints.get(f"gpu/{gpu}") == gpu_fingerprint(cluster.gpu)
        self.colls_usable = fingerprints.get(f"cluster/{name}") == cluster_fingerprint(cluster)
        has_ops = any(k.startswith(f"op/{gpu}/{precision.value}/") for k in models)
        has_colls = any(k.startswith(f"collective/{name}/") for k in models)
        if not has_ops:
            self.notes.append(f"no operator regressors for {gpu} in {precision.value}: operators use the roofline")
        elif not self.ops_usable:
            self.notes.append(
                f"the operator regressors for {gpu} were fitted against other peaks or efficiency curves "
                "than the catalog's now: operators use the roofline (refit)"
            )
        if not has_colls:
            self.notes.append(f"no collective regressors for cluster {name}: collectives use alpha-beta")
        elif not self.colls_usable:
            self.notes.append(
                f"cluster {name} has other links than the one the collective regressors were fitted on: "
                "collectives use alpha-beta"
            )
        self.models = models
        self._op_s: dict[tuple[int, Phase], float] = {}
        self._op_src: dict[tuple[int, Phase], str] = {}
        self._held: list[Op] = []  # keeps cached operators alive so their ids stay unique
        self._coll_s: dict[tuple, float] = {}

    # -- operators -------------------------------------------------------------------------
    def _model_for(self, op: Op, way: str):
        if not self.ops_usable:
            return None
        return self.models.get(op_key(self.cluster.gpu.name, self.precision.value, op.name, way))

    def prepare(self, inv: JobInventory) -> None:
        """Predict every operator of the job with one regressor call per operator kind."""
        ops: dict[int, Op] = {}
        for st in inv.stages:
            for op in (*(o for b in st.blocks for o in b.ops), *st.end_ops, st.optimizer):
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
                if op_feature_names(op) != list(model.feature_names):
                    self._remember(op, way, None, f"roofline ({op.name} {way}: the regressor has other features)")
                    continue
                batches.setdefault(model.key, []).append((op, way, base))
        for key, items in batches.items():
            model = self.models[key]
            X = np.array([op_features(op, way, base) for op, way, base in items])
            ratio = np.exp(model.predict_log_ratio(X))
            outside = model.outside_range(X)
            for (op, way, base), r, out in zip(items, ratio, outside, strict=True):
                source = f"learned ({model.algorithm}{', outside sampled range' if out else ''})"
                self._remember(op, way, base * float(r), source)

    def _baseline(self, op: Op, way: str) -> float:
        if way == "fwd":
            return self.analytical.estimate_op_s(op, Phase.FWD)
        return sum(self.analytical.estimate_op_s(op, ph) for ph in _BACKWARD)

    def _remember(self, op: Op, way: str, seconds: float | None, source: str) -> None:
        self._held.append(op)
        phases = (Phase.FWD, Phase.RECOMPUTE, Phase.OPTIMIZER) if way == "fwd" else _BACKWARD
        for ph in phases:
            self._op_src[(id(op), ph)] = source
        if seconds is None:
            return
        if way == "fwd":
            for ph in phases:
                self._op_s[(id(op), ph)] = seconds
        else:  # the samples time the whole backward; it is booked as input-gradient time
            self._op_s[(id(op), Phase.BWD_INPUT)] = seconds
            self._op_s[(id(op), Phase.BWD_WEIGHT)] = 0.0

    def estimate_op_s(self, op: Op, phase: Phase) -> float:
        hit = self._op_s.get((id(op), phase))
        if hit is not None:
            return hit
        return self.analytical.estimate_op_s(op, phase)

    def source_of(self, op: Op, phase: Phase) -> str:
        hit = self._op_src.get((id(op), phase))
        if hit is not None:
            return hit
        return f"roofline (no regressor for {op.name} on {self.cluster.gpu.name} {self.precision.value})"

    # -- collectives -----------------------------------------------------------------------
    def _collective_model(self, coll: Collective, layout: GroupLayout):
        if not self.colls_usable:
            return None
        return self.models.get(collective_key(self.cluster.name, coll.kind.value, layout))

    def estimate_collective_s(self, coll: Collective, layout: GroupLayout) -> float:
        base = self.analytical.estimate_collective_s(coll, layout)
        if base <= 0.0:
            return base
        cache_key = (coll.kind, coll.bytes, layout)
        hit = self._coll_s.get(cache_key)
        if hit is not None:
            return hit
        model = self._collective_model(coll, layout)
        seconds = base
        if model is not None:
            X = np.array([collective_features(coll, layout, base)])
            seconds = base * math.exp(float(model.predict_log_ratio(X)[0]))
        self._coll_s[cache_key] = seconds
        return seconds

    def collective_last_measured(self, coll: Collective, layout: GroupLayout) -> float | None:
        """None: its regressors price its collectives, not the catalog's measured points."""
        return None

    def collective_source(self, coll: Collective, layout: GroupLayout) -> str:
        model = self._collective_model(coll, layout)
        if model is None:
            base = self.analytical.collective_source(coll, layout)
            return f"{base} (no regressor for {coll.kind.value} on {self.cluster.name})"
        X = np.array([collective_features(coll, layout, self.analytical.estimate_collective_s(coll, layout))])
        return f"learned ({model.algorithm}{', outside sampled range' if model.outside_range(X)[0] else ''})"
