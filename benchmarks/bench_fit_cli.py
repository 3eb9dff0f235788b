"""Wall time of `paraplan fit` run as the README runs it, whole process, default and --quick.

Run: python benchmarks/bench_fit_cli.py [--runs N] [path/to/shared/data]
Prints a Markdown table of the median (and min-max) wall seconds over N runs (default 3) after
one --quick warm-up run (the file cache, the first imports): the README's "fitting all 37
takes ..." figure; and the median CPU seconds (user + system of the process and its
children), which other work on a shared machine moves much less than the wall time. Each run is a fresh
process (imports, reading the samples, features, fitting, saving, learning curves and their
plot), as a user sees it.
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
args = sys.argv[1:]
RUNS = int(args[args.index("--runs") + 1]) if "--runs" in args else 3
rest = [a for i, a in enumerate(args) if not a.startswith("--") and (i == 0 or args[i - 1] != "--runs")]
DATA = Path(rest[0]) if rest else ROOT.parent / "shared" / "data"
PARAPLAN = [sys.executable, "-m", "paraplan.cli"]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def seconds(command: list[str], cwd: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``command``."""
    cpu, start = _children_cpu(), time.perf_counter()
    subprocess.run(command, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start, _children_cpu() - cpu


def main() -> None:
    gm = DATA / "gpumodeling"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run([*PARAPLAN, "samples", "import", "gpumodeling", str(gm / "operators_A100"),
                        str(gm / "nccl_perlmutter"), "--out", "a100.samples"], cwd=work, check=True,
                       stdout=subprocess.DEVNULL)
        command = [*PARAPLAN, "fit", "a100.samples", "--out", "a100.models",
                   "--learning-curves", "a100-curves.png", "--force"]
        seconds([*command, "--quick"], work)  # warm-up: the file cache, the first imports
        print(f"| `paraplan fit` (A100 samples, learning curves), {RUNS} runs | median wall s | min-max | "
              "median CPU s |")
        print("|---|---|---|---|")
        for label, extra in (("default budget", []), ("--quick", ["--quick"])):
            runs = [seconds([*command, *extra], work) for _ in range(RUNS)]
            walls, cpus = [w for w, _ in runs], [c for _, c in runs]
            print(f"| {label} | {statistics.median(walls):.0f} | {min(walls):.0f}-{max(walls):.0f} | "
                  f"{statistics.median(cpus):.0f} |", flush=True)


if __name__ == "__main__":
    main()
