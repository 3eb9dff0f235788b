"""Where each free number of an ``EfficiencySpec`` sits in the operator fit's parameter vector.

The vector is [gemm max_fraction, log10 gemm half_work, attention ..., memory ..., kernel
overhead in us], then (max_fraction, log10 half_work) of every per-operator curve in
``ParamLayout.keys`` order.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from paraplan.calibrate._common import US
from paraplan.calibrate.operators import FWD
from paraplan.costmodel.roofline import op_curves
from paraplan.inventory import Op
from paraplan.specs import EfficiencyCurve, EfficiencySpec, Phase

__all__ = ["CURVES", "OVERHEAD", "ParamLayout"]

CURVES = ("gemm", "attention", "memory")
OVERHEAD = 6
_KIND_LOWER = np.array([0.01, 0.0, 0.01, 0.0, 0.01, 0.0, 0.0])
_KIND_UPPER = np.array([1.0, 13.0, 1.0, 13.0, 1.0, 10.0, 100.0])
# A per-operator curve: max_fraction in [0.005, 1] (GPT-NeoX's unfused RMSNorm backward reaches
# ~0.05 of HBM bandwidth on the inventory's bytes), log10 half_work in FLOPs (compute kinds) or
# bytes (memory-bound kinds).
_OP_LOWER = (0.005, 0.0)
_OP_UPPER = {True: (1.0, 13.0), False: (1.0, 10.0)}


@dataclasses.dataclass(frozen=True)
class ParamLayout:
    """Where each free number of an ``EfficiencySpec`` sits in the fit's parameter vector."""

    keys: tuple[str, ...] = ()
    compute: tuple[bool, ...] = ()  # per key: half_work in FLOPs (True) or bytes

    @classmethod
    def for_keys(cls, keys: dict[str, bool]) -> ParamLayout:
        return cls(tuple(keys), tuple(keys.values()))

    @property
    def size(self) -> int:
        return 7 + 2 * len(self.keys)

    @property
    def flops_keys(self) -> list[str]:
        """The per-operator curves whose half_work is in FLOPs."""
        return [k for k, c in zip(self.keys, self.compute, strict=True) if c]

    def index(self, key: str) -> int:
        """Index of the max_fraction of per-operator curve ``key`` (its log10 half_work follows)."""
        return 7 + 2 * self.keys.index(key)

    @property
    def lower(self) -> np.ndarray:
        return np.concatenate([_KIND_LOWER, np.tile(_OP_LOWER, len(self.keys))])

    @property
    def upper(self) -> np.ndarray:
        return np.concatenate([_KIND_UPPER, *(np.array(_OP_UPPER[c]) for c in self.compute)])

    def spec(self, theta: np.ndarray, source: str) -> EfficiencySpec:
        curves = {
            name: EfficiencyCurve(max_fraction=float(theta[2 * i]), half_work=float(10.0 ** theta[2 * i + 1]))
            for i, name in enumerate(CURVES)
        }
        ops = {
            key: EfficiencyCurve(
                max_fraction=float(theta[self.index(key)]),
                half_work=float(10.0 ** theta[self.index(key) + 1]),
            )
            for key in self.keys
        }
        return EfficiencySpec(
            **curves, ops=ops, kernel_overhead_s=float(theta[OVERHEAD]) * US, source=source
        )

    def theta(self, spec: EfficiencySpec, init: dict[str, EfficiencyCurve] | None = None) -> np.ndarray:
        """``spec`` as a parameter vector; a key missing from ``spec.ops`` starts at ``init[key]``."""
        out: list[float] = []
        for name in CURVES:
            curve: EfficiencyCurve = getattr(spec, name)
            out += [curve.max_fraction, math.log10(max(curve.half_work, 1.0))]
        out.append(spec.kernel_overhead_s / US)
        for key in self.keys:
            curve = spec.ops.get(key) or (init or {}).get(key) or spec.memory
            out += [curve.max_fraction, math.log10(max(curve.half_work, 1.0))]
        return np.clip(np.array(out), self.lower, self.upper)

    def sentinel(self) -> EfficiencySpec:
        """A spec whose every curve has a distinct half_work (its parameter index), so that
        ``op_curves`` tells which parameters an operator's time depends on."""
        theta = np.full(self.size, 0.5)
        theta[OVERHEAD] = 1.0
        half_work_idx = [1, 3, 5] + [self.index(key) + 1 for key in self.keys]
        for i in half_work_idx:
            theta[i] = math.log10(i)  # half_work = the parameter index of that half_work
        return self.spec(theta, "sentinel")

    def depends(self, op: Op, phase: str, *, kind_curves_only: bool = False) -> list[int]:
        """Parameter indices the cost model's time of ``op`` in ``phase`` depends on, as
        ``paraplan.costmodel.roofline.op_curves`` picks the curves."""
        eff = self.sentinel()
        if kind_curves_only:
            eff = eff.model_copy(update={"ops": {}})
        phases = [Phase.FWD] if phase == FWD else [Phase.BWD_INPUT, Phase.BWD_WEIGHT]
        idx = {OVERHEAD}
        for ph in phases:
            flops, traffic = op.work(ph)
            compute, memory, _ = op_curves(op, ph, eff)
            if compute is not None and flops > 0:
                i = round(compute.half_work)
                idx |= {i - 1, i}
            if traffic > 0:
                i = round(memory.half_work)
                idx |= {i - 1, i}
        return sorted(idx)

    def names(self) -> list[str]:
        out = []
        for name in CURVES:
            out += [f"{name}.max_fraction", f"{name}.log10_half_work"]
        out.append("kernel_overhead_us")
        for key in self.keys:
            out += [f"ops[{key}].max_fraction", f"ops[{key}].log10_half_work"]
        return out
