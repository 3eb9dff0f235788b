"""Error and achieved-rate tables of operator samples, as rows of numbers (the report formats
them)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from paraplan.calibrate._common import US, ErrorStats, err_stats
from paraplan.calibrate.operators import BWD, FWD, OpSamples, phase_work
from paraplan.specs import GpuSpec

__all__ = ["AchievedRow", "ErrorRow", "achieved_rows", "error_rows"]


@dataclasses.dataclass(frozen=True)
class AchievedRow:
    """Over the slower half of one (tag, phase) group's samples: the median fraction of peak
    FLOP/s and of HBM bandwidth reached (inventory FLOPs and bytes), and the fastest sample."""

    operator: str
    phase: str
    samples: int
    flops_fraction: float
    bytes_fraction: float
    fastest_us: float


@dataclasses.dataclass(frozen=True)
class ErrorRow:
    """Errors of one (tag, phase) group, or of all samples (``operator`` "ALL") of a phase or
    of both (phase ``"both"``): one ``ErrorStats`` per compared prediction."""

    operator: str
    phase: str
    samples: int
    errors: tuple[ErrorStats, ...]


def _group_masks(samples: OpSamples, *, totals: bool = True) -> list[tuple[str, str, np.ndarray]]:
    """(operator, phase, mask) of every (tag, phase) group, then (``totals``) per phase and
    overall."""
    tags, phases = np.asarray(samples.tag), np.asarray(samples.phase)
    masks: list[tuple[str, str, np.ndarray]] = []
    for tag in dict.fromkeys(samples.tag):
        for ph in (FWD, BWD):
            m = (tags == tag) & (phases == ph)
            if m.any():
                masks.append((tag, ph, m))
    if not totals:
        return masks
    for ph in (FWD, BWD):
        m = phases == ph
        if m.any():
            masks.append(("ALL", ph, m))
    masks.append(("ALL", "both", np.ones(len(samples), dtype=bool)))
    return masks


def error_rows(samples: OpSamples, preds: Sequence[np.ndarray]) -> list[ErrorRow]:
    """Per tag and phase (then per phase and overall): median |err|, mean |err| and median
    signed err of each prediction in ``preds``, side by side."""
    meas = np.asarray(samples.measured)
    return [
        ErrorRow(tag, ph, int(m.sum()), tuple(err_stats(pred[m], meas[m]) for pred in preds))
        for tag, ph, m in _group_masks(samples)
    ]


def achieved_rows(samples: OpSamples, gpu: GpuSpec, peak: float) -> list[AchievedRow]:
    """Per tag and phase, over the larger half of the samples (by measured time): the median
    fraction of peak FLOP/s and of HBM bandwidth the kernel reached, counting the inventory's
    FLOPs and bytes (``Op.work``). Tells which operators one roofline curve can describe."""
    meas = np.asarray(samples.measured)
    flops, traffic = np.empty(len(samples)), np.empty(len(samples))
    for i, (op, ph) in enumerate(zip(samples.ops, samples.phase, strict=True)):
        works = phase_work(op, ph)
        flops[i], traffic[i] = sum(w[0] for w in works), sum(w[1] for w in works)
    rows = []
    for tag, ph, m in _group_masks(samples, totals=False):
        big = m & (meas >= np.median(meas[m]))
        rows.append(
            AchievedRow(
                tag,
                ph,
                int(m.sum()),
                float(np.median(flops[big] / meas[big]) / peak),
                float(np.median(traffic[big] / meas[big]) / gpu.hbm_bandwidth_bytes_per_s),
                float(meas[m].min() / US),
            )
        )
    return rows
