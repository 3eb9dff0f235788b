"""A real `paraplan profile ops` run killed with SIGKILL mid-sweep and started again with the
same command: every point measured once, none missing, none measured twice (issue 17)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from paraplan.samples import load_samples

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

SRC = Path(__file__).resolve().parents[2] / "src"


def _points_in(journal: Path) -> int:
    try:
        return max(0, len(journal.read_bytes().splitlines()) - 1)
    except FileNotFoundError:
        return 0


def test_a_killed_sweep_resumes_without_duplicates_or_gaps(tmp_path: Path) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text("linear3: {mp: [1, 2], b: [1, 2, 3, 4], l: [32, 64, 96], dim: [64, 128, 192, 256]}\n"
                    "res_add: {b: [1, 2], l: [8, 16], dim: [8]}\n")
    n_points = 2 * 4 * 3 * 4 + 4
    out = tmp_path / "cpu.samples"
    journal = tmp_path / "cpu.samples.journal"
    command = [sys.executable, "-m", "paraplan.cli", "profile", "ops", "--grid", str(grid), "--out", str(out),
               "--format", "json"]
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while _points_in(journal) < 15 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the sweep finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = _points_in(journal)
    assert 15 <= killed_at < n_points and not out.exists()
    before = [json.loads(line) for line in journal.read_text().splitlines()[1:] if line.endswith("}")]

    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)["summary"]
    assert summary["resumed"] >= killed_at - 1 and summary["resumed"] + summary["measured_now"] == n_points
    samples = load_samples(out)
    assert len(samples) == 2 * n_points
    shape = ["name", "phase", "mp", "b", "l", "dim"]
    assert not samples.duplicated(subset=shape).any()
    # what the killed run measured is kept as it was measured, not measured again
    first = {(r["key"], row["phase"]): row["time_s"] for r in before for row in r.get("rows", [])}
    lines = [json.loads(line) for line in journal.read_text().splitlines()[1:]]
    again = {(r["key"], row["phase"]): row["time_s"] for r in lines for row in r.get("rows", [])}
    assert all(again[k] == t for k, t in first.items())
    assert len({r["key"] for r in lines}) == len(lines) == n_points
