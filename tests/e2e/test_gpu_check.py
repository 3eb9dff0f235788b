"""benchmarks/gpu/check.sh, the prepared GPU check, run as its CPU dry run: every step runs and
writes what the GPU run will, and a directory that holds files is never written over."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "benchmarks/gpu/check.sh"
STEPS = ["env", "sustained", "tests", "jobs", "profile", "fp8", "trace", "summarize", "calibrate", "validate"]


def check(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(CHECK), *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_its_help_names_every_step_and_bad_arguments_get_one_line_and_exit_2(tmp_path: Path) -> None:
    shown = check("--help")
    assert shown.returncode == 0
    assert all(name in shown.stdout for name in [*STEPS, "--out", "--wheels", "--device", "--quick"])
    for args, says in ((["--device", "cpu"], "--out DIR is required"),
                       (["--out", str(tmp_path / "x"), "--device", "tpu"], "--device 'tpu'"),
                       (["--out", str(tmp_path / "x"), "--wheels", str(tmp_path / "none")], "--wheels"),
                       (["--out", str(tmp_path / "x"), "--profile-time", "soon"], "--profile-time 'soon'"),
                       (["--bogus"], "unknown argument '--bogus'")):
        bad = check(*args)
        assert bad.returncode == 2 and says in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_the_cpu_dry_run_runs_every_step_and_writes_sane_outputs(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    out = tmp_path / "check"
    done = check("--device", "cpu", "--quick", "--out", str(out), "--python", sys.executable)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    manifest = json.loads((out / "manifest.json").read_text())
    assert [s["step"] for s in manifest["steps"]] == STEPS and manifest["failed"] == []
    assert all(s["rc"] == 0 and s["seconds"] >= 0 for s in manifest["steps"])
    assert manifest["env"]["device_name"] == "cpu-core" and manifest["env"]["torch"]
    assert "trace/rank0.json.gz" in manifest["files"] and "check.log" in manifest["files"]
    assert "=== validate: exit 0" in (out / "check.log").read_text()
    results = manifest["results"]
    assert results["validate"]["measured_iteration_s"] == results["validate-calibrated"]["measured_iteration_s"] > 0
    assert results["trace"]["iterations"]["count"] == 3 and results["profile"]["rows"] > 0

    # the GPU-marked tests were found and ran (here they skip)
    assert "skipped" in (out / "tests.log").read_text()
    # the profile wrote samples, and says where they went
    adaptive = json.loads((out / "profile/adaptive.json").read_text())
    assert adaptive["summary"]["rows"] > 0 and (out / "profile/ops.samples").stat().st_size > 0
    fp8 = json.loads((out / "profile/fp8_gemm.json").read_text())
    assert [g["gemm"] for g in fp8["gemms"]] == ["qkv", "attn_out", "gate_up", "down"]
    assert all(g["bf16_s"] > 0 for g in fp8["gemms"]) and fp8["fp8"]
    # GEMMs timed in a burst and held, bf16 and (where torch runs it) fp8, on randn and zeros
    held = json.loads((out / "profile/sustained_gemm.json").read_text())
    assert {g["data"] for g in held["gemms"]} == {"randn", "zeros"} and held["fp8"]
    assert {g["precision"] for g in held["gemms"]} >= {"bf16"}
    assert all(g["burst_s"] > 0 and g["sustained_s"] > 0 for g in held["gemms"])
    assert any(g["gemm"].startswith("gpt3-tp4") for g in held["gemms"])
    # a real profiler trace with shapes, and the loop's own timers beside it
    with gzip.open(out / "trace/rank0.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    assert any(e.get("name") == "aten::scaled_dot_product_attention" for e in events)
    assert any("Input Dims" in e.get("args", {}) for e in events)
    timers = json.loads((out / "trace/timers.json").read_text())
    assert len(timers["ranks"]["0"]) == 3
    # decoded, calibrated and validated
    summary = json.loads((out / "trace-summary.json").read_text())
    assert summary["iterations"]["count"] == 3 and summary["iterations"]["min_s"] > 0
    assert "gemm" in (out / "calibrated-cluster.yaml").read_text()
    for name in ("validate.json", "validate-calibrated.json"):
        record = json.loads((out / name).read_text())
        assert record["measured_iteration_s"] > 0 and record["predicted_iteration_s"] > 0
        assert {c["component"] for c in record["components"]} >= {"gemm", "attention", "iteration"}

    # a directory that holds files is refused, and left as it was
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    again = check("--device", "cpu", "--quick", "--out", str(out), "--python", sys.executable)
    assert again.returncode == 2 and "is not empty" in again.stderr
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before
