"""Reading data that a user (or an attacker) wrote: model manifests, metadata."""

from __future__ import annotations

from typing import Any


def json_depth(obj: Any) -> int:
    """Nesting depth of decoded JSON (containers only), computed without recursion."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        elif not isinstance(item, list):
            continue
        deepest = max(deepest, level)
        stack.extend((v, level + 1) for v in item if isinstance(v, (dict, list)))
    return deepest
