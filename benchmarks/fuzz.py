"""Fuzz `paraplan predict` with hostile job files and flag sets (issue 15): the README's counts.

Run: python benchmarks/fuzz.py [--cases 10000] [--workers 2] [--memory-gb 3] [--timeout 20]

The cases and the judge are tests/fuzzing.py's (the CI test runs 300 of them). Each worker is a
fresh process whose address space is capped at its size after start-up plus ``--memory-gb``
(a case that needs more ends in MemoryError: a ``memory`` defect) and each case has a time
limit (``hang``). Prints a Markdown table: answers, rejections (exit 2, one line), valid
questions without an answer (exit 1), each kind of defect (all must be 0), the share of
rejections that name the field the case broke, and the slowest case; then one line per defect.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def _cap_memory(extra_gb: float) -> None:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[0])
    now = pages * resource.getpagesize()
    limit = int(now + extra_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def run_chunk(task: tuple[int, int, float, int]) -> list[dict]:
    seed, n, memory_gb, timeout_s = task
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    import fuzzing
    import paraplan.cli.app  # noqa: F401 (loaded before the cap: imports are not a case)

    _cap_memory(memory_gb)
    results: list[dict] = []

    @hypothesis_seed(seed)
    @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(fuzzing.cases())
    def one(case: fuzzing.Case) -> None:
        o = fuzzing.judge(case, timeout_s=timeout_s)
        results.append({"kind": o.kind, "named": o.names_field, "seconds": o.seconds, "field": case.field,
                        "what": case.what, "args": " ".join(case.args)[:120], "message": o.message[:200],
                        "detail": str(o.detail)[:200]})

    one()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--memory-gb", type=float, default=3.0)
    parser.add_argument("--timeout", type=int, default=20)
    args = parser.parse_args()
    chunk = 250
    tasks = [(1000 + i, min(chunk, args.cases - i * chunk), args.memory_gb, args.timeout)
             for i in range((args.cases + chunk - 1) // chunk)]
    start = time.perf_counter()
    rows: list[dict] = []
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(args.workers, maxtasksperchild=1) as pool:
        for part in pool.imap_unordered(run_chunk, tasks):
            rows.extend(part)
            print(f"\r{len(rows):,} / {args.cases:,} cases", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    wall = time.perf_counter() - start
    from fuzzing import DEFECTS

    count = {k: sum(r["kind"] == k for r in rows) for k in ("answer", "rejected", "no answer", *DEFECTS)}
    refused = [r for r in rows if r["kind"] in ("rejected", "no answer")]
    named = sum(r["named"] for r in refused)
    seconds = [r["seconds"] for r in rows]
    print(f"| `benchmarks/fuzz.py`, {len(rows):,} cases, {args.workers} workers, {wall:.0f} s | count |")
    print("|---|---|")
    for kind, n in count.items():
        label = kind if kind not in DEFECTS else f"**{kind}** (defect)"
        print(f"| {label} | {n:,} |")
    share = 100 * named / len(refused) if refused else 100.0
    print(f"| refusals naming the field they refuse | {named:,} / {len(refused):,} ({share:.1f} %) |")
    print(f"| seconds per case: median / max | {statistics.median(seconds):.3f} / {max(seconds):.2f} |")
    for r in rows:
        if r["kind"] in DEFECTS or (r["kind"] in ("rejected", "no answer") and not r["named"]):
            print(f"- {r['kind']}{'' if r['named'] else ' (field not named)'}: {r['field']} {r['what']} "
                  f"{r['args']} -> {r['message'] or r['detail']}")


if __name__ == "__main__":
    main()
