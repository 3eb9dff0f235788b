"""The GPU's idle gap between back-to-back queued kernels (issue 27, in-situ effects): measured
in real traces (catalog ``efficiency.queued_gap``), added per kernel only under
``parallel.queued_kernel_gap`` (off by default: every trace ran under CUPTI)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_screen import screen_matches_the_exact_prediction
from tests.hta_traces import hta_trace
from typer.testing import CliRunner

from paraplan.calibrate.kernel_floor import queued_gaps
from paraplan.catalog import load_cluster, load_gpu, load_model, resolve_job
from paraplan.catalog.loader import load_catalog_entry
from paraplan.cli.app import app
from paraplan.costmodel import AnalyticalCostModel
from paraplan.inventory import Op, OpKind
from paraplan.prediction import predict
from paraplan.search import SearchSpace
from paraplan.search.screen import screen_plans, screenable
from paraplan.specs import Phase, Precision, Recompute

ROOT = Path(__file__).resolve().parents[2]
H100_TRACE = ROOT / "benchmarks" / "data" / "gpu" / "h100-2026-11-27" / "run2" / "gpucheck" / "trace" / "rank0.json.gz"


def _job(gpu: str, **parallel) -> dict:
    return {"model": "llama-3-8b", "cluster": {"name": "dgx-h100" if gpu.startswith("H100") else "dgx-a100",
                                               "num_nodes": 1},
            "parallel": {"tp": 2, "micro_batch_size": 1, "global_batch_size": 16, **parallel}, "precision": "bf16"}


def _cluster(gpu: str):
    return resolve_job(_job(gpu)).cluster


def test_every_kernel_waits_the_measured_gap_once_per_launch_when_switched_on():
    cluster = _cluster("H100-SXM5-80GB")
    op = Op(name="x", kind=OpKind.ELEMENTWISE, role="x", flops=0.0, bytes=1e6, bwd_flops=0.0, bwd_bytes=0.0,
            launches=4)
    off = AnalyticalCostModel(cluster, Precision.BF16).estimate_op_s(op, Phase.FWD)
    on = AnalyticalCostModel(cluster, Precision.BF16, queued_gap=True).estimate_op_s(op, Phase.FWD)
    assert on - off == pytest.approx(4 * cluster.gpu.efficiency.queued_gap.seconds, rel=1e-9)


def test_the_gap_is_off_by_default_and_a_prediction_with_it_is_slower_by_at_most_a_few_percent():
    base = predict(resolve_job(_job("H100-SXM5-80GB"))).iteration_s
    assert resolve_job(_job("H100-SXM5-80GB")).parallel.queued_kernel_gap is False
    on = predict(resolve_job(_job("H100-SXM5-80GB", queued_kernel_gap=True))).iteration_s
    assert 1.0 < on / base < 1.05


def test_a_gpu_without_a_measured_gap_says_so_and_adds_nothing():
    job = _job("H100-SXM5-80GB", queued_kernel_gap=True)
    job["cluster"] = {"name": "dgx-h100", "num_nodes": 1, "gpu": "B200"}
    assert load_gpu("B200").efficiency.queued_gap is None
    on = predict(resolve_job(job))
    job["parallel"]["queued_kernel_gap"] = False
    assert on.iteration_s == predict(resolve_job(job)).iteration_s
    assert any("queued_kernel_gap" in note for note in on.uncalibrated)


def test_every_catalog_gap_names_its_trace_or_the_gpu_it_was_taken_from():
    for name in ("H100-SXM5-80GB", "A100-SXM4-80GB", "A100-SXM4-40GB", "A100-PCIE-80GB"):
        gap = load_gpu(name).efficiency.queued_gap
        assert gap is not None and 0.5e-6 < gap.seconds < 3e-6
        assert gap.transferred_from or ".json.gz" in gap.source or "trace" in gap.source
    assert "queued_gap" in load_catalog_entry("gpus", "H100-SXM5-80GB")["efficiency"]


def test_the_h100_catalog_gap_is_the_median_of_our_traces_queued_gaps():
    if not H100_TRACE.exists():
        pytest.skip("the H100 trace is not in this checkout")
    gaps = queued_gaps(H100_TRACE)
    assert float(np.median(gaps)) == pytest.approx(load_gpu("H100-SXM5-80GB").efficiency.queued_gap.seconds,
                                                   abs=0.02e-6)


def test_the_a100_catalog_gap_is_the_median_of_htas_nanosecond_a100_traces_queued_gaps():
    gaps = queued_gaps(hta_trace("B_resnet_nccl_a100"))
    assert len(gaps) > 500
    assert float(np.median(gaps)) == pytest.approx(load_gpu("A100-SXM4-80GB").efficiency.queued_gap.seconds,
                                                   abs=0.03e-6)


def test_the_screen_times_the_gap_as_predict_does_on_every_plan_and_each_plan_is_slower_with_it():
    model, cluster = load_model("llama-3-8b"), load_cluster("dgx-h100", num_nodes=1)
    times = {}
    for on in (False, True):
        space = SearchSpace(pp=(1, 2), micro_batch_size=(1, 2), recompute=(Recompute.NONE, Recompute.SELECTIVE),
                            extra={"queued_kernel_gap": on})
        assert screenable(space, model) and space.queued_kernel_gap is on
        assert screen_matches_the_exact_prediction((model, cluster, Precision.BF16, 32, space))
        times[on] = screen_plans(model, cluster, 32, Precision.BF16, space).iteration_s
    assert len(times[True]) == len(times[False])
    assert all(1.0 < t / f < 1.05 for t, f in zip(times[True], times[False], strict=True))


def _search(job: Path, *flags: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["search", str(job), "--mbs", "1", "-f", "json", *flags], env={"COLUMNS": "80"})
    return result.exit_code, result.stdout, result.stderr


def test_a_job_file_that_switches_the_gap_on_is_searched_with_it_and_its_best_plan_predicts_the_same_time(tmp_path):
    job, best = tmp_path / "job.yaml", tmp_path / "best.yaml"
    top = {}
    for on in (False, True):
        job.write_text(yaml.safe_dump({"model": "llama-3-8b", "cluster": {"name": "dgx-h100", "num_nodes": 1},
                                       "parallel": {"queued_kernel_gap": on, "global_batch_size": 32}}))
        code, out, err = _search(job, "--save-best", str(best), "--force")
        assert code == 0 and "queued_kernel_gap" not in err, err  # kept, not "neither varies nor keeps"
        top[on] = json.loads(out)["plans"][0]["iteration_s"]
    assert yaml.safe_load(best.read_text())["parallel"]["queued_kernel_gap"] is True
    result = CliRunner().invoke(app, ["predict", str(best), "-f", "json"], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    assert json.loads(result.stdout)["iteration_s"] == pytest.approx(top[True], rel=1e-12)
    assert top[True] > top[False]
