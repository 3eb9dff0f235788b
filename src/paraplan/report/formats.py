"""Machine-readable output: JSON and CSV of predictions."""

from __future__ import annotations

import csv
import io
import json
from typing import Any


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
    return json.dumps(data, indent=2, sort_keys=False)


def render_csv(rows: list[dict[str, Any]]) -> str:
    """One CSV row per mapping; nested keys are flattened as ``breakdown.forward_compute_s``."""
    flat = [_flatten({k: v for k, v in row.items() if k != "stages"}) for row in rows]
    columns: list[str] = []
    for row in flat:
        columns += [c for c in row if c not in columns]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(flat)
    return buffer.getvalue()
