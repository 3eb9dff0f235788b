"""The trace decoder's speed and memory on a 50 MB replica of a real trace (built as
benchmarks/bench_trace_decode.py builds its 1 GB one), each decode in a fresh process, imports
included. The bounds are ratios to the standard library's ``json.load`` of the same file, in a
fresh process, measured in this run: the decoder takes at most 3 x as long (1-2 x measured) and
holds less memory. The absolute target (a 1 GB trace in under 30 s and under 2 GB) is the
benchmark's ``--check``, run on an idle machine."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from timing import best_times

pytestmark = pytest.mark.slow
BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_trace_decode.py"
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "fsdp" / "rank0.json.gz"
_JSON_LOAD = """
import json, resource, sys, time
start = time.perf_counter()
with open(sys.argv[1], encoding="utf-8") as f:
    data = json.load(f)
peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:  # this process's own peak (ru_maxrss keeps the parent's across fork and exec on Linux)
    with open("/proc/self/status") as f:
        peak_kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
except (OSError, StopIteration):
    pass
print(json.dumps({"decode_s": time.perf_counter() - start, "events": len(data["traceEvents"]),
                  "peak_kb": peak_kb}))
"""


def _bench():
    spec = importlib.util.spec_from_file_location("bench_trace_decode", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_replicated_trace_decodes_no_slower_than_three_json_loads_and_in_less_memory(tmp_path):
    bench = _bench()
    plain = tmp_path / "rank0.json"
    bench.build(bench.Replica(FIXTURE), plain, int(0.05e9), None)

    decoded: list[dict] = []
    loaded: list[dict] = []

    def json_load() -> None:
        done = subprocess.run([sys.executable, "-c", _JSON_LOAD, str(plain)], capture_output=True, text=True,
                              check=True)
        loaded.append(json.loads(done.stdout))

    ours, reference = best_times(lambda: decoded.append(bench.decode_in_child(plain)), json_load, repeat=2)
    assert ours <= 3 * reference, (ours, reference)
    assert decoded[0]["iterations"] > 0 and decoded[0]["events"] > 0
    assert max(d["peak_kb"] for d in decoded) < min(x["peak_kb"] for x in loaded)
