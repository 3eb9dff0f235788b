"""Speed and memory of the trace decoder on a large trace: `decode_trace` on a ~1 GB file.

Run: python benchmarks/bench_trace_decode.py [--gb 1.0] [--fixture fsdp] [--gzip] [--check]
Target (issue 25, was a minute in issue 16): a 1 GB trace decodes in under 30 s and in under 2 GB of memory.

The big trace is a real recorded fixture's events (tests/fixtures/traces/<fixture>/rank0.json.gz)
written again and again, each copy shifted in time by the fixture's span (plus a gap) and its
ProfilerStep#N markers renumbered, so every copy's iterations stay distinct; each event is
written as Kineto writes it (one indented JSON object). It goes to a temporary directory that is
deleted afterwards. Each file is decoded in a fresh process (imports included in the wall time);
peak RSS is that process's own high-water mark (VmHWM; ru_maxrss where /proc is absent). With --gzip a gzipped copy (level 6) is decoded too.
Prints a Markdown table; with --check exits 1 when a decode is over the budget, scaled to 1 GB.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S_PER_GB = 30.0
BUDGET_RSS_GB = 2.0
GAP_US = 1000.0  # between one copy's last event and the next copy's first
_TS, _STEP = "@@TS@@", "@@STEP@@"
_STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
_CHILD = """
import json, resource, sys, time
from paraplan.traces import decode_trace
start = time.perf_counter()
trace = decode_trace(sys.argv[1])
seconds = time.perf_counter() - start
# this process's own peak: ru_maxrss keeps the parent's peak across fork and exec (Linux stores
# the forked copy's high-water mark at exec), so a child of a large process reports the parent's
peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    with open("/proc/self/status") as f:
        peak_kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
except (OSError, StopIteration):
    pass
print(json.dumps({"decode_s": seconds, "peak_kb": peak_kb, "events": trace.events,
                  "iterations": len(trace.iterations)}))
"""


class Replica:
    """The fixture's events as text templates: each copy fills in shifted times and steps."""

    def __init__(self, fixture: Path) -> None:
        with gzip.open(fixture, "rt") as f:
            data = json.load(f)
        events = data.pop("traceEvents")
        self.header = {k: v for k, v in data.items() if k != "traceName"}
        timed = [e for e in events if "ts" in e]
        first = min(e["ts"] for e in timed)
        self.span_us = max(e["ts"] + e.get("dur", 0.0) for e in timed) - first + GAP_US
        steps = [int(m.group(1)) for e in events if (m := _STEP_NAME.match(str(e.get("name", ""))))]
        self.steps_per_copy = max(steps) - min(steps) + 1 if steps else 0
        self.templates = [_template(e) for e in events]

    def copy(self, k: int) -> str:
        """The k-th copy's events, each on its own indented lines, comma-separated."""
        shift, step_shift = k * self.span_us, k * self.steps_per_copy
        parts = []
        for pieces, ts, step in self.templates:
            text = pieces[0]
            if ts is not None:
                text += f"{ts + shift:.3f}" + pieces[1]
            if step is not None:
                text = text.replace(_STEP, str(step + step_shift))
            parts.append(text)
        return ",\n".join(parts)


def _template(event: dict) -> tuple[list[str], float | None, int | None]:
    event = dict(event)
    ts = event.get("ts")
    if ts is not None:
        event["ts"] = _TS
    m = _STEP_NAME.match(str(event.get("name", "")))
    if m:
        event["name"] = f"ProfilerStep#{_STEP}"
    text = "  " + json.dumps(event, indent=2).replace("\n", "\n  ")
    return text.split(f'"{_TS}"'), ts, int(m.group(1)) if m else None


def build(replica: Replica, path: Path, target_bytes: int, gz_path: Path | None) -> int:
    """Write copies of the fixture until the file holds ``target_bytes``; return the copy count."""
    head = json.dumps(replica.header, indent=2)[:-2] + ',\n  "traceEvents": [\n'
    gz = gzip.open(gz_path, "wb", compresslevel=6) if gz_path else None
    written, copies = 0, 0
    with open(path, "wb") as out:
        while written < target_bytes:
            chunk = (head if copies == 0 else ",\n") + replica.copy(copies)
            data = chunk.encode()
            out.write(data)
            if gz:
                gz.write(data)
            written += len(data)
            copies += 1
        tail = b'\n  ],\n  "traceName": "bench"\n}\n'
        out.write(tail)
        if gz:
            gz.write(tail)
            gz.close()
    return copies


def decode_in_child(path: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _CHILD, str(path)], env=env, check=True,
                          capture_output=True, text=True)
    result = json.loads(done.stdout)
    result["wall_s"] = time.perf_counter() - start
    return result


def row(label: str, plain_bytes: int, path: Path, result: dict) -> tuple[str, bool]:
    """One table row; and whether it is within the budget (seconds scaled to 1 GB of JSON)."""
    gb = plain_bytes / 1e9
    s_per_gb = result["wall_s"] / gb
    rss_gb = result["peak_kb"] * 1024 / 1e9
    ok = s_per_gb < BUDGET_S_PER_GB and rss_gb < BUDGET_RSS_GB
    text = (f"| {label} | {path.stat().st_size / 1e6:,.0f} MB | {result['events']:,} | {result['iterations']:,} "
            f"| {result['wall_s']:.1f} s ({result['decode_s']:.1f} s decoding) | {plain_bytes / 1e6 / result['wall_s']:.1f} "
            f"| {s_per_gb:.1f} s | {rss_gb:.2f} GB |")
    return text, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="size of the plain JSON trace (GB, 1e9 bytes)")
    parser.add_argument("--fixture", default="fsdp", choices=["ddp", "fsdp", "pipeline"])
    parser.add_argument("--gzip", action="store_true", help="also decode a gzipped copy")
    parser.add_argument("--check", action="store_true", help="exit 1 when over 30 s per GB or 2 GB of memory")
    parser.add_argument("--dir", type=Path, default=None, help="where to write the trace (default: a temp dir)")
    args = parser.parse_args(argv)
    target = int(args.gb * 1e9)
    tmp = Path(tempfile.mkdtemp(prefix="paraplan-bench-", dir=args.dir))
    try:
        free = shutil.disk_usage(tmp).free
        if free < 2.5 * target:
            print(f"{tmp}: {free / 1e9:.1f} GB free, too little for a {args.gb} GB trace", file=sys.stderr)
            return 2
        replica = Replica(ROOT / "tests/fixtures/traces" / args.fixture / "rank0.json.gz")
        plain, gz = tmp / "rank0.json", (tmp / "rank0.json.gz" if args.gzip else None)
        start = time.perf_counter()
        copies = build(replica, plain, target, gz)
        size = plain.stat().st_size
        print(f"{args.fixture} fixture x {copies:,} copies: {size / 1e6:,.0f} MB of JSON, "
              f"written in {time.perf_counter() - start:.0f} s", file=sys.stderr)
        rows = [row("plain", size, plain, decode_in_child(plain))]
        if gz:
            rows.append(row("gzip", size, gz, decode_in_child(gz)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("| file | on disk | events | iterations | wall (fresh process) | MB/s of JSON | per GB of JSON | peak RSS |")
    print("|---|---|---|---|---|---|---|---|")
    for text, _ in rows:
        print(text)
    within = all(ok for _, ok in rows)
    print(f"\nbudget: {BUDGET_S_PER_GB:.0f} s per GB of JSON, {BUDGET_RSS_GB:.0f} GB of memory: "
          f"{'within' if within else 'OVER'}")
    return 1 if args.check and not within else 0


if __name__ == "__main__":
    sys.exit(main())
