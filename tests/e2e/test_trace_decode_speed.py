"""The trace decoder's speed, from a 50 MB replica of a real trace: at that pace a 1 GB trace
decodes in under a minute and in under 2 GB (benchmarks/bench_trace_decode.py --check)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_trace_decode.py"


def test_a_replicated_trace_decodes_at_under_a_minute_per_gigabyte():
    done = subprocess.run([sys.executable, str(BENCH), "--gb", "0.05", "--check"], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| plain |" in done.stdout and "within" in done.stdout
