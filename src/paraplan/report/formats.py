"""Machine-readable output: JSON and CSV of predictions.

Neither ever holds a non-finite number (JSON has none: Python would print ``Infinity``/``NaN``):
one is a bug upstream, raised as InternalError (exit code 3), never written."""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any

from paraplan.specs import InternalError


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, sub in value.items():
            out.update(_flatten(sub, f"{prefix}{key}."))
        return out
    if isinstance(value, (list, tuple)):
        return {prefix[:-1]: json.dumps(value)}
    return {prefix[:-1]: value}


def render_json(data: Any) -> str:
    try:
        return json.dumps(data, indent=2, sort_keys=False, allow_nan=False)
    except ValueError:
        raise InternalError(f"internal error: a result holds a non-finite number ({_first_non_finite(data)}); "
                            "it is not an answer; please report it to paraplan with the job file") from None


def _first_non_finite(value: Any, path: str = "") -> str:
    """The key path of the first infinity or NaN in ``value`` and the number."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{path or 'value'} = {value!r}"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, sub in items:
        found = _first_non_finite(sub, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return ""


def render_csv(rows: list[dict[str, Any]]) -> str:
    """One CSV row per mapping; nested keys are flattened as ``breakdown.forward_compute_s``."""
    flat = [_flatten({k: v for k, v in row.items() if k != "stages"}) for row in rows]
    bad = next((f"{k} = {v!r}" for row in flat for k, v in row.items()
                if isinstance(v, float) and not math.isfinite(v)), None)
    if bad is not None:
        raise InternalError(f"internal error: a result holds a non-finite number ({bad}); "
                            "it is not an answer; please report it to paraplan with the job file")
    columns: list[str] = []
    for row in flat:
        columns += [c for c in row if c not in columns]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(flat)
    return buffer.getvalue()
