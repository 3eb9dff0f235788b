"""Close the loop on this CPU (issue 17 part 6): sample, fit, predict, run, compare.

Run: python benchmarks/closed_loop.py [--keep DIR] [--active 10] [--quick]

For the small GPT of examples/small-cpu (4 layers, hidden 256, 8 heads, sequence 256,
micro-batch 4, fp32; one process, and two gloo processes in data parallel):

1. calibrates the nominal CPU cluster on the committed tiny-GPT trace
   (tests/fixtures/traces/ddp-shapes, another model: the small GPT's own steps are never read);
2. samples the operators the two-process job and its neighbour plans need
   (`paraplan profile ops --for examples/small-cpu/two.yaml`), and the collectives over 2
   processes (`paraplan profile comm`, when this paraplan has it);
3. fits them (`paraplan fit`);
4. predicts both jobs analytically (the calibrated cluster) and with `--backend learned`;
5. runs the same training steps for real without the profiler (`paraplan trace record
   --no-profile`) and compares with the median step (a step takes its slowest rank's time).

Prints a Markdown table; signed error = predicted / measured - 1.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "small-cpu"
FIXTURE = ROOT / "tests" / "fixtures" / "traces" / "ddp-shapes"
PARAPLAN = [sys.executable, "-m", "paraplan.cli"]
MODEL = ["--layers", "4", "--hidden", "256", "--heads", "8", "--seq", "256", "--micro-batch", "4"]
JOBS = {"one": 1, "two": 2}  # job file -> processes


def _option(name: str, default: str) -> str:
    args = sys.argv[1:]
    return args[args.index(name) + 1] if name in args else default


def run(*args: str, cwd: Path) -> str:
    done = subprocess.run([*PARAPLAN, *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"paraplan {' '.join(args)} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def has_command(*words: str) -> bool:
    done = subprocess.run([*PARAPLAN, *words, "--help"], capture_output=True, text=True)
    return done.returncode == 0


def measured_step_s(directory: Path) -> float:
    """The median step, each step at its slowest rank's time."""
    record = json.loads((directory / "timers.json").read_text())
    ranks = list(record["ranks"].values())
    steps = [max(rank[i]["seconds"] for rank in ranks) for i in range(len(ranks[0]))]
    return statistics.median(steps)


def predicted_s(job: str, cluster: Path, work: Path, *extra: str) -> float:
    per_node = ["--gpus-per-node", str(JOBS[job])]
    args = ["predict", str(EXAMPLES / f"{job}.yaml"), "--cluster", str(cluster), *per_node, *extra, "--format", "json"]
    return float(json.loads(run(*args, cwd=work))["iteration_s"])


def main() -> None:
    keep = _option("--keep", "")
    active = _option("--active", "10")
    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="paraplan-loop-"))
    work.mkdir(parents=True, exist_ok=True)
    cluster = work / "cpu.yaml"
    run("calibrate", "trace", str(FIXTURE), "--job", str(ROOT / "examples" / "tiny-cpu" / "ddp.yaml"),
        "-o", str(cluster), "--force", cwd=work)
    samples = [work / "ops.samples"]
    if not samples[0].exists():
        run("profile", "ops", "--for", str(EXAMPLES / "two.yaml"), "--out", str(samples[0]), cwd=work)
    if has_command("profile", "comm") and not (work / "comm.samples").exists():
        run("profile", "comm", "--nproc-per-node", "2", "--cluster-name", "tiny-cpu-gloo", "--factor", "2",
            "--out", str(work / "comm.samples"), cwd=work)
    if (work / "comm.samples").exists():
        samples.append(work / "comm.samples")
    fit = ["fit", *map(str, samples), "--cluster", str(cluster), "-o", str(work / "cpu.models"), "--force"]
    run(*fit, *(["--quick"] if "--quick" in sys.argv else []), cwd=work)
    print(f"work directory: {work}\n")
    print("| job | measured step (median) | analytical, calibrated | error | learned | error |")
    print("|---|---:|---:|---:|---:|---:|")
    for job, nproc in JOBS.items():
        real = work / f"real-{job}"
        run("trace", "record", "--mode", "ddp", "--nproc", str(nproc), "--no-profile", "--active", active, *MODEL,
            "--out", str(real), "--force", cwd=work)
        measured = measured_step_s(real)
        analytical = predicted_s(job, cluster, work)
        learned = predicted_s(job, cluster, work, "--backend", "learned", "--models", str(work / "cpu.models"))
        label = f"{job} ({nproc} process{'es' if nproc > 1 else ''})"
        print(f"| {label} | {measured * 1e3:,.1f} ms | {analytical * 1e3:,.1f} ms | {analytical / measured - 1:+.1%} "
              f"| {learned * 1e3:,.1f} ms | {learned / measured - 1:+.1%} |")


if __name__ == "__main__":
    main()
