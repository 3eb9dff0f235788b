"""Say where a value came from when a job built from a file (or the demo job) and flags is
invalid: a value the user never typed must not look like one they did."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from paraplan.catalog.jobs import _SHORT, apply_overrides, resolve_job
from paraplan.specs import ConfigError, HeteroJob, Job

# parallel keys an error may name (by either name), said by their short name when they have one
_LONG_TO_SHORT = {long: short for short, long in _SHORT.items()}
_NAMED = (*_SHORT, "micro_batch_size", "global_batch_size", "zero_stage", "sequence_parallel",
          "layers_per_stage", "recompute", "schedule")


def resolve_with_flags(
    raw: dict[str, Any], flags: dict[str, Any], base_dir: Path | str = ".", origin: str | None = None
) -> Job | HeteroJob:
    """``resolve_job(apply_overrides(raw, flags))``; when the job is invalid and the error names
    a parallel value that no flag set (while some flag was given), the error says it came from
    ``origin`` ("the demo job", "job.yaml") and which flag sets it."""
    try:
        return resolve_job(apply_overrides(raw, flags), base_dir=base_dir)
    except ConfigError as err:
        flagged = any(v is not None for v in flags.values())  # with no flag, the file is all there is
        blame = blame_origin(str(err), raw, flags, origin) if origin and flagged else ""
        if not blame:
            raise
        raise ConfigError(f"{err}; {blame}") from None


def blame_origin(message: str, raw: dict[str, Any], flags: dict[str, Any], origin: str) -> str:
    """"tp 2 came from the demo job, not from a flag: set --tp" for the parallel values
    ``message`` names that ``raw`` holds and ``flags`` left alone; "" when there are none.
    Degrees of 1 are left out: they never make a plan invalid."""
    parallel = raw.get("parallel") if isinstance(raw.get("parallel"), dict) else {}
    values = {_LONG_TO_SHORT.get(k, k): v for k, v in parallel.items()}
    given = {_LONG_TO_SHORT.get(k, k) for k, v in flags.items() if v is not None}
    named = [key for key in _NAMED if _names(message, key) or (key in _SHORT and _names(message, _SHORT[key]))]
    taken = [k for k in named if k in values and k not in given and not (k in _SHORT and values[k] == 1)]
    if not taken:
        return ""
    what = _listed([f"{k} {_shown(values[k])}" for k in taken], "and")
    fix = _listed(["--" + k.replace("_", "-") for k in taken], "or")
    return f"{what} came from {origin}, not from a flag: set {fix}"


def _names(message: str, key: str) -> bool:
    return re.search(rf"(?<![\w.]){key}(?!\w)|parallel\.{key}\b", message) is not None


def _listed(items: list[str], last: str) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {last} {items[-1]}"


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
