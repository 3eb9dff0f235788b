"""HolisticTraceAnalysis's real GPU traces (../shared/data/traces/hta) and hand-made traces, for
the trace tests: where the sets are, the first file of a set (a skip when it is absent), and a
list of events written as a gzipped Kineto trace."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

HTA = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "hta"


def hta_trace(name: str) -> Path:
    """The first ``*.json.gz`` of the set ``name``; the test skips cleanly without it."""
    files = sorted((HTA / name).glob("*.json.gz"))
    if not files:
        pytest.skip(f"../shared/data/traces/hta/{name} is not present")
    return files[0]


def write_trace(events: list[dict], path: Path, **top) -> Path:
    """``events`` as a gzipped trace file at ``path``, after the top-level fields ``top``
    (``distributedInfo``, ``deviceProperties``, ...)."""
    path.write_bytes(gzip.compress(json.dumps({**top, "traceEvents": events}).encode()))
    return path
