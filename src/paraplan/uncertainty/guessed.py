"""Widening for what was guessed: for each setting the job did not state (a framework preset
filled it, or the plan's default stands), the prediction recomputed over that setting's
plausible values (``catalog/plausible.yaml``), and the spread of the iteration
time, as log-ratios to the prediction. Recomputed, never assumed."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from paraplan.catalog.loader import packaged_yaml
from paraplan.specs import ConfigError, Job

# When a setting matters, read from the plan (catalog data names one of these)
_WHEN: dict[str, Callable[[Any], bool]] = {
    "always": lambda plan: True,
    "tensor_parallel": lambda plan: plan.tp > 1,
    "pipeline_parallel": lambda plan: plan.pp > 1,
    "data_parallel": lambda plan: plan.dp > 1,
    "fsdp": lambda plan: plan.framework.value == "fsdp",
}


@dataclass(frozen=True, slots=True)
class Plausible:
    field: str
    values: tuple[Any, ...]
    when: str
    why: str


@dataclass(frozen=True, slots=True)
class Spread:
    """One unstated setting: its value in the prediction, the plausible values tried, and the
    log-ratios of the fastest and the slowest to the prediction (low <= 0 <= high)."""

    field: str
    used: Any
    tried: tuple[Any, ...]
    low: float
    high: float

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "used": _plain(self.used), "tried": [_plain(v) for v in self.tried],
                "log_ratio": [self.low, self.high]}


def _plain(value: Any) -> Any:
    return getattr(value, "value", value)


@functools.cache
def plausible_settings() -> tuple[Plausible, ...]:
    """The settings widened over, with their plausible values (``catalog/plausible.yaml``)."""
    raw: Mapping[str, Any] = packaged_yaml("plausible.yaml").get("plausible") or {}
    out = []
    for name, spec in raw.items():
        if spec.get("when", "always") not in _WHEN or not spec.get("why"):
            raise ConfigError(f"plausible.yaml: plausible.{name}: unknown 'when' or no 'why'")
        out.append(Plausible(name, tuple(spec["values"]), spec.get("when", "always"), spec["why"]))
    return tuple(out)


def unstated(job: Job) -> list[Plausible]:
    """The plausible-valued settings ``job`` did not state (a preset's defaults count as not
    stated) that matter for its plan."""
    plan = job.parallel
    preset = getattr(job, "preset", None)
    taken = set(preset.taken) if preset is not None else set()
    stated = set(plan.model_fields_set) - taken
    return [p for p in plausible_settings() if p.field not in stated and _WHEN[p.when](plan)]


def _with_value(job: Job, field: str, value: Any) -> Job:
    """``job`` with its plan's ``field`` set to ``value`` (a ConfigError or ValueError if the
    plan refuses it)."""
    plan = type(job.parallel).model_validate({**job.parallel.model_dump(), field: value})
    return job.model_copy(update={"parallel": plan})


def setting_spreads(job: Job, iteration_s: float, predict: Callable[[Job], float]) -> tuple[Spread, ...]:
    """Each unstated setting's spread: ``predict`` (a job's iteration seconds) over its
    plausible values, one setting changed at a time; a value the plan refuses is left out."""
    spreads = []
    for setting in unstated(job):
        used = getattr(job.parallel, setting.field)
        ratios, tried = [0.0], []
        for value in setting.values:
            if _plain(value) == _plain(used):
                continue
            try:
                seconds = predict(_with_value(job, setting.field, value))
            except (ConfigError, ValueError):
                continue
            tried.append(value)
            ratios.append(math.log(seconds / iteration_s))
        if tried:
            spreads.append(Spread(setting.field, used, tuple(tried), min(ratios), max(ratios)))
    return tuple(spreads)


def ratio_spreads(job_a: Job, job_b: Job, predict: Callable[[Job], float]) -> tuple[Spread, ...]:
    """The spread of log(B / A) (iteration seconds) over each setting either job left unstated:
    one framework runs both plans, so a value is set in each job that did not state the
    setting, in both at once; ``used`` is A's value where A left it unstated, else B's."""
    base = math.log(predict(job_b) / predict(job_a))
    loose_a = {p.field: p for p in unstated(job_a)}
    loose_b = {p.field: p for p in unstated(job_b)}
    spreads = []
    for name in [*loose_a, *(f for f in loose_b if f not in loose_a)]:
        setting = loose_a.get(name) or loose_b[name]
        used = getattr((job_a if name in loose_a else job_b).parallel, name)
        ratios, tried = [0.0], []
        for value in setting.values:
            try:
                a = _with_value(job_a, name, value) if name in loose_a else job_a
                b = _with_value(job_b, name, value) if name in loose_b else job_b
                if a is job_a and b is job_b:
                    continue
                ratio = math.log(predict(b) / predict(a)) - base
            except (ConfigError, ValueError):
                continue
            if _plain(value) != _plain(used):
                tried.append(value)
            ratios.append(ratio)
        if tried:
            spreads.append(Spread(name, used, tuple(tried), min(ratios), max(ratios)))
    return tuple(spreads)
