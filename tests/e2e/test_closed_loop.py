"""The loop closed on this CPU (issue 17 part 6): paraplan samples the operators a small GPT
needs, fits them, predicts its training step with the learned backend, runs that step for real
and compares.

The bound, 40 %: on an idle 2-core machine the learned prediction of this step was 20 % short
(benchmarks/closed_loop.py, README "Close the loop"), every operator within 5 % of its own
samples; the rest is what the inventory does not list on a CPU (autograd's bookkeeping, the
AdamW step's passes over weights that no longer fit in cache). 20 points more cover the noise
of a shared 2-core CI machine, where the sampling and the run may see different load."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "small-cpu" / "one.yaml"
FIXTURE = ROOT / "tests" / "fixtures" / "traces" / "ddp-shapes"
MODEL = ["--layers", "4", "--hidden", "256", "--heads", "8", "--seq", "256", "--micro-batch", "4"]
BOUND = 0.40


def paraplan(*args: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "paraplan.cli", *args], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_learned_prediction_of_a_real_cpu_training_step_is_within_the_bound(tmp_path):
    paraplan("calibrate", "trace", str(FIXTURE), "--job", str(ROOT / "examples" / "tiny-cpu" / "ddp.yaml"),
             "-o", "cpu.yaml", cwd=tmp_path)
    # the two-process job's grid: its neighbour plans (tp 2) give each operator the 10+ shapes
    # a regressor needs; the one-process job alone has 9
    paraplan("profile", "ops", "--for", str(ROOT / "examples" / "small-cpu" / "two.yaml"), "--out", "ops.samples",
             cwd=tmp_path)
    paraplan("fit", "ops.samples", "--cluster", "cpu.yaml", "-o", "cpu.models", "--quick", cwd=tmp_path)
    paraplan("trace", "record", "--mode", "ddp", "--nproc", "1", "--no-profile", "--active", "5", *MODEL,
             "--out", "real", cwd=tmp_path)
    record = json.loads((tmp_path / "real" / "timers.json").read_text())
    measured = statistics.median(t["seconds"] for t in record["ranks"]["0"])
    predicted = json.loads(paraplan("predict", str(JOB), "--cluster", "cpu.yaml", "--gpus-per-node", "1",
                                    "--backend", "learned", "--models", "cpu.models", "--format", "json",
                                    cwd=tmp_path))["iteration_s"]
    error = predicted / measured - 1
    assert abs(error) < BOUND, f"learned {predicted * 1e3:.1f} ms vs measured {measured * 1e3:.1f} ms ({error:+.1%})"
