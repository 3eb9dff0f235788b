"""examples/tiny-cpu/cluster.yaml's cpu-core curves are measured on one CPU core: its roofline
lands near what the profiler times there, so `paraplan fit` keeps the job's own operators."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from paraplan.catalog.jobs import load_cluster_file
from paraplan.cli.app import app
from paraplan.costmodel.roofline import AnalyticalCostModel
from paraplan.inventory.samples import op_for_sample
from paraplan.profile.grid import parse_grid
from paraplan.profile.ops import SweepSettings, measure_point
from paraplan.profile.timing import TimingPolicy
from paraplan.specs import Phase, Precision

pytest.importorskip("torch")

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny-cpu"
TIMING = TimingPolicy(warmup=2, warmup_s=0.0, min_repeats=10, max_repeats=20, budget_s=0.2)


def _roofline_over_measured(name: str, shape: dict) -> float:
    point = parse_grid({name: {k: [v] for k, v in shape.items()}})[0]
    # the fastest of three medians: on a busy 2-core machine a median can sit on time slices
    # the operator waited out (8 ms each), not on the operator
    measured = min(next(r["time_s"] for r in measure_point(point, "fp32", SweepSettings(policy=TIMING))[0]
                        if r["phase"] == "fwd") for _ in range(3))
    model = AnalyticalCostModel(load_cluster_file(TINY / "cluster.yaml"), Precision.FP32, sustained=False)
    return model.estimate_op_s(op_for_sample(name, shape, Precision.FP32), Phase.FWD) / measured


@pytest.mark.parametrize("name, shape", [("linear1", {"mp": 1, "b": 4, "l": 64, "dim": 64}),
                                         ("flash_atten", {"mp": 1, "b": 4, "h": 4, "l": 64, "dim": 64}),
                                         ("gelu", {"mp": 1, "b": 4, "l": 64, "dim": 64})])
def test_the_cpu_core_roofline_of_a_small_operator_is_within_10x_of_a_large_gemms_against_measured(
        name, shape) -> None:
    # A ratio measured in the same run: a large GEMM, whose time the curve's peak sets, is the
    # yardstick, so a busy machine slows both alike; a GPU-sized per-kernel floor (4 GFLOP of
    # start-up, 30 ms on one core) made a small operator's ratio about 460x the large one's.
    # Up to five tries: a loaded 2-core machine (CI beside other jobs) can stall every median of
    # one try on time slices (CI saw 0.0107 once); a wrong curve misses in every try.
    ratios = []
    for _ in range(5):
        small = _roofline_over_measured(name, shape)
        large = _roofline_over_measured("linear1", {"mp": 1, "b": 4, "l": 512, "dim": 512})
        ratios.append(small / large)
        if 0.1 < ratios[-1] < 10.0:
            break
    assert 0.1 < ratios[-1] < 10.0, f"{name}: (roofline / measured) over a large GEMM's = {ratios}"


@pytest.mark.slow
def test_profiling_the_tiny_ddp_job_and_fitting_saves_regressors_for_its_own_operators(tmp_path) -> None:
    samples, models = tmp_path / "s.parquet", tmp_path / "m.ubj"
    runner = CliRunner()
    profile = runner.invoke(app, ["profile", "ops", "--for", str(TINY / "ddp.yaml"), "--out", str(samples)])
    assert profile.exit_code == 0, profile.output
    fit = runner.invoke(app, ["fit", str(samples), "--cluster", str(TINY / "cluster.yaml"), "-o", str(models),
                              "--quick", "-f", "json"])
    assert fit.exit_code == 0, fit.output
    assert models.exists()
    for name in ("linear1", "linear_final", "flash_atten", "gelu", "layernorm"):
        for phase in ("fwd", "bwd"):
            assert f"op/cpu-core/fp32/{name}/{phase}" in fit.stdout
