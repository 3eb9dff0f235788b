"""The host's CPU time per launched kernel, measured in real PyTorch profiler traces.

What it measures: on every host thread of a trace that launches kernels (runtime events whose
name says ``launch``: cudaLaunchKernel, cuLaunchKernelEx, hipExtModuleLaunchKernel, ...), the
time from one launch's start to the next one's, and the median of those gaps per trace. Eager
PyTorch issues one kernel per aten op or so, so a gap is what the host spends per kernel
between two launches: Python, the dispatcher, the op's own host code and the launch call. The
median leaves out the long gaps (host waits on the GPU, data loading, the optimizer's Python)
that are not launch cost. Only the traces' own events are read; nothing is fitted to an
end-to-end run.

The catalog entry ``src/paraplan/catalog/runtime/host.yaml`` holds the number this script
prints for the H100 trace (``benchmarks/data/gpu/h100-2026-11-27``, PyTorch 2.11, the host of
our own H100 run) and the HTA traces' medians as the spread across other hosts and models.

    python benchmarks/fit_host_launch.py
"""

from __future__ import annotations

import gzip
import itertools
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HTA = REPO.parent / "shared" / "data" / "traces" / "hta"
H100 = REPO / "benchmarks" / "data" / "gpu" / "h100-2026-11-27" / "run2" / "gpucheck" / "trace" / "rank0.json.gz"
_LAUNCH = re.compile(r"launch", re.I)
_RUNTIME = ("cuda_runtime", "cuda_driver", "hip_runtime")


def traces() -> dict[str, Path]:
    """The traces measured, by name: ours (H100), then HTA's test traces (when present)."""
    out = {}
    if H100.exists():
        out["h100-2026-11-27"] = H100
    if HTA.is_dir():
        for folder in sorted(HTA.iterdir()):
            for f in sorted(folder.glob("*.json.gz")):
                out[f"{folder.name}/{f.name}"] = f
    return out


def launch_gaps_s(path: Path) -> list[float]:
    """Seconds between consecutive kernel launches on each host thread of the trace at ``path``."""
    with gzip.open(path, "rt") as fh:
        events = json.load(fh)
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    starts: dict[tuple, list[float]] = defaultdict(list)
    for ev in events:
        if ev.get("ph") == "X" and ev.get("cat") in _RUNTIME and _LAUNCH.search(ev.get("name", "")):
            starts[(ev.get("pid"), ev.get("tid"))].append(float(ev["ts"]))
    gaps = []
    for ts in starts.values():
        ts.sort()
        gaps += [(b - a) * 1e-6 for a, b in itertools.pairwise(ts)]
    return gaps


def median_launch_s(path: Path) -> tuple[float, int] | None:
    """(median seconds between launches, number of launches) of one trace; None without launches."""
    gaps = launch_gaps_s(path)
    return (statistics.median(gaps), len(gaps) + 1) if gaps else None


def main() -> int:
    found = traces()
    if not found:
        print("no traces found (benchmarks/data/gpu/h100-2026-11-27 or ../shared/data/traces/hta)")
        return 1
    print(f"{'trace':58} {'launches':>8} {'median us':>9}")
    for name, path in found.items():
        got = median_launch_s(path)
        if got is None:
            print(f"{name:58} {'0':>8} {'-':>9}")
            continue
        med, n = got
        print(f"{name:58} {n:8d} {med * 1e6:9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
