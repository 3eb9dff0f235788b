"""paraplan's own operator sampler (issue 17): grids (GPUModeling's YAML and paraplan's), grids
derived from a job and its neighbour plans, --parts, every operator run for real on the CPU in
forward and backward, skipped points with their reason, several samples files fitted as one."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from paraplan.catalog.jobs import load_job
from paraplan.cli.app import app
from paraplan.profile.grid import COLUMNS_OF, GridPoint, grid_for_job, load_grid, parse_grid, split
from paraplan.profile.ops import SweepSettings, measure_point, run_sweep
from paraplan.profile.records import RecordStore
from paraplan.profile.timing import TimingPolicy
from paraplan.samples import load_samples, validate_samples
from paraplan.samples.merge import load_many
from paraplan.specs import ConfigError

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny-cpu"
FAST = TimingPolicy(warmup=1, warmup_s=0.0, min_repeats=4, max_repeats=6, budget_s=0.05)

GPUMODELING_STYLE = """{
  "module_name": "target_functions",
  "kernel_name": "linear1",
  "columns_name": ['mp', 'b', 'l', 'dim', 'F_dur(us)', 'B_dur(us)'],
  "first_n_column": 4,
  # mp, b, l, dim
  "starts":[1, 2, 1024, 2048],
  "steps":[2, 2, 512, 512],
  "ends":[16, 8, 5120, 8192],
  "operators":['mul', 'mul', 'add', 'add'],
  "warmup_shapes":[1, 16, 4096, 4096],
  "run": "get_all"
}
"""

#: One small shape of every sampled operator.
SMALL = {
    "linear1": {"mp": 1, "b": 2, "l": 32, "dim": 64},
    "linear2": {"mp": 2, "b": 2, "l": 32, "dim": 64},
    "linear3": {"mp": 1, "b": 2, "l": 32, "dim": 64},
    "linear4": {"mp": 1, "b": 2, "l": 32, "dim": 64},
    "linear_final": {"mp": 1, "b": 2, "l": 32, "dim": 64, "Vp": 256},
    "baddbmm": {"mp": 1, "b": 2, "h": 4, "l": 32, "dim": 64},
    "bmm": {"mp": 1, "b": 2, "h": 4, "l": 32, "dim": 64},
    "softmax": {"mp": 1, "b": 2, "h": 4, "l": 32},
    "flash_atten": {"mp": 2, "b": 2, "h": 4, "l": 32, "dim": 64},
    "layernorm": {"b": 2, "l": 32, "dim": 64},
    "RMSlayernorm": {"b": 2, "l": 32, "dim": 64},
    "RoPE": {"mp": 1, "b": 2, "h": 4, "l": 32, "dim": 64},
    "gelu": {"mp": 1, "b": 2, "l": 32, "dim": 64},
    "res_add": {"b": 2, "l": 32, "dim": 64},
    "embedding": {"mp": 1, "b": 2, "l": 32, "dim": 64, "Vp": 256},
    "cross_entropy": {"mp": 1, "b": 2, "l": 32, "Vp": 256},
}


def test_gpumodeling_grid_is_read_as_its_sampler_enumerated_it(tmp_path: Path) -> None:
    path = tmp_path / "linear1.yml"
    path.write_text(GPUMODELING_STYLE)
    points = load_grid([path])
    # mp 1..16 x2 (5), b 2..8 x2 (3), l 1024..5120 +512 (9), dim 2048..8192 +512 (13), ends inclusive
    assert len(points) == 5 * 3 * 9 * 13
    assert points[0] == GridPoint("linear1", (("mp", 1), ("b", 2), ("l", 1024), ("dim", 2048)))
    assert points[1].values()["dim"] == 2560  # odometer: the last column fastest


def test_the_shared_gpumodeling_grids_parse(gpumodeling_dir: Path) -> None:
    grids = sorted((gpumodeling_dir / "sampling_grids" / "kernel").glob("*.yml"))
    sampled = [g for g in grids if "optimizer" not in g.name and g.name != "fillmask.yml"]
    assert len(load_grid([gpumodeling_dir / "sampling_grids/kernel/baddbmm.yml"])) == 5 * 2 * 9 * 9 * 13
    assert {p.name for p in load_grid(sampled)} >= {"linear1", "cross_entropy", "RoPE", "softmax"}
    with pytest.raises(ConfigError, match=r"fillmask.*not sampled"):
        load_grid([gpumodeling_dir / "sampling_grids/kernel/fillmask.yml"])


def test_paraplan_grid_style_and_its_errors() -> None:
    points = parse_grid({"gelu": {"mp": [1, 2], "b": {"start": 1, "end": 8, "factor": 2}, "l": 64, "dim": [64]}})
    assert [p.values()["b"] for p in points] == [1, 2, 4, 8, 1, 2, 4, 8]
    with pytest.raises(ConfigError, match="needs columns"):
        parse_grid({"linear1": {"mp": [1], "b": [1]}})
    with pytest.raises(ConfigError, match="no column 'h'"):
        parse_grid({"gelu": {"mp": 1, "b": 1, "l": 8, "dim": 8, "h": 2}})
    with pytest.raises(ConfigError, match="unknown operator"):
        parse_grid({"conv2d": {"b": 1}})
    with pytest.raises(ConfigError, match="positive integer"):
        parse_grid({"res_add": {"b": [0], "l": 8, "dim": 8}})


def test_for_job_derives_the_job_and_its_neighbour_plans() -> None:
    job = load_job(TINY / "ddp.yaml")
    own = grid_for_job(job, neighbours=False)
    assert {p.name for p in own} == {"layernorm", "linear1", "linear2", "linear3", "linear4", "flash_atten",
                                     "gelu", "res_add", "embedding", "linear_final", "cross_entropy"}
    assert GridPoint("linear1", (("mp", 1), ("b", 4), ("l", 64), ("dim", 64))) in own
    points = grid_for_job(job)
    assert set(own) <= set(points) and len(points) == len(set(points))
    linears = {(p.values()["mp"], p.values()["b"], p.values()["l"]) for p in points if p.name == "linear1"}
    # tp 2 (the node's two cores), micro-batch 8 only with tp 2 (global batch 8 over dp 2 allows 4)
    assert (2, 8, 64) in linears and (1, 8, 64) not in linears and (1, 4, 128) in linears
    assert all(v >= 10 for v in _distinct_per_op(points).values() if v)  # enough to fit


def _distinct_per_op(points: list[GridPoint]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for p in points:
        counts[p.name] = counts.get(p.name, 0) + 1
    return {k: v for k, v in counts.items() if k != "res_add"}


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 200), parts=st.integers(1, 12))
def test_parts_are_disjoint_and_cover_the_grid(n: int, parts: int) -> None:
    points = [GridPoint("res_add", (("b", 1), ("l", i + 1), ("dim", 8))) for i in range(n)]
    shares = [split(points, parts, k) for k in range(1, parts + 1)]
    assert sorted(p for s in shares for p in s) == sorted(points)
    assert sum(len(s) for s in shares) == n
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_parts_refuse_a_part_outside_the_split() -> None:
    with pytest.raises(ConfigError, match="--part"):
        split([], 8, 9)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_every_operator_runs_forward_and_backward_on_the_cpu(name: str) -> None:
    point = parse_grid({name: {k: [v] for k, v in SMALL[name].items()}})[0]
    rows, extra = measure_point(point, "fp32", SweepSettings(policy=FAST))
    frame = validate_samples(_frame(rows))
    assert list(frame["phase"]) == ["fwd", "bwd"] and set(frame["device"]) == {"cpu-core"}
    assert (frame["time_s"] > 0).all() and set(extra) == {"fwd", "bwd"}
    assert set(COLUMNS_OF) >= {name}


def test_bf16_and_fp16_run_and_fp8_is_skipped_with_the_reason(tmp_path: Path) -> None:
    points = parse_grid({"linear2": {"mp": 1, "b": 1, "l": 16, "dim": 32}, "linear1": {"mp": 3, "b": 1, "l": 8, "dim": 32}})
    settings_ = SweepSettings(dtypes=("bf16", "fp16", "fp8"), policy=FAST)
    with RecordStore(tmp_path / "j") as store:
        result = run_sweep(points, settings_, store)
        skipped = store.skipped()
    assert result.measured == 2 and result.skipped == 4
    assert any("fp8" in r and "CPU" in r for r in skipped)
    assert any("not divisible" in r for r in skipped)  # dim 32 over mp 3: the inventory refuses it


def test_profile_ops_command_writes_resumes_and_fits(tmp_path: Path) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text("gelu: {mp: [1, 2], b: [1, 2, 4], l: [16, 32], dim: [32, 64]}\n")
    out = tmp_path / "cpu.samples"
    runner = CliRunner()
    args = ["profile", "ops", "--grid", str(grid), "--out", str(out), "--format", "json"]
    first = runner.invoke(app, [*args, "--parts", "2", "--part", "1"])
    assert first.exit_code == 0, first.output
    assert len(load_samples(out)) == 24  # half of 24 points, fwd and bwd
    again = runner.invoke(app, [*args, "--parts", "2", "--part", "1"])
    assert again.exit_code == 2 and "already exists (pass --force to replace it)" in again.output
    second = tmp_path / "cpu2.samples"
    done = runner.invoke(app, [*args[:-4], "--out", str(second), "--parts", "2", "--part", "2"])
    assert done.exit_code == 0, done.output
    both = load_many([out, second])
    assert len(both) == 48 and both.attrs["samples_metadata"]["files"] == [str(out), str(second)]
    with pytest.raises(ConfigError, match="given twice"):
        load_many([out, out])
    models = tmp_path / "m.skops"
    fit = runner.invoke(app, ["fit", str(out), str(second), "-o", str(models), "--quick", "--format", "json",
                              "--cluster", str(TINY / "cluster.yaml")])
    assert fit.exit_code == 0, fit.output
    assert models.exists() and "op/cpu-core/fp32/gelu/fwd" in fit.stdout


def test_fit_refuses_conflicting_files(tmp_path: Path) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text("res_add: {b: [1], l: [8], dim: [8]}\n")
    runner = CliRunner()
    for name in ("a.samples", "b.samples"):
        result = runner.invoke(app, ["profile", "ops", "--grid", str(grid), "--out", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
    with pytest.raises(ConfigError, match="conflicts with"):
        load_many([tmp_path / "a.samples", tmp_path / "b.samples"])


def test_profile_ops_errors_are_one_line(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["profile", "ops", "--out", str(tmp_path / "x.samples")])
    assert result.exit_code == 2 and "--grid FILE or --for JOB" in result.output
    result = runner.invoke(app, ["profile", "ops", "--for", str(TINY / "ddp.yaml"), "--device", "tpu",
                                 "--out", str(tmp_path / "x.samples")])
    assert result.exit_code == 2 and "--device" in result.output


@pytest.mark.gpu
def test_cuda_sampler_times_with_events(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    point = parse_grid({"linear1": {"mp": 1, "b": 2, "l": 512, "dim": 1024}})[0]
    rows, _ = measure_point(point, "bf16", SweepSettings(device="cuda", device_name="gpu", dtypes=("bf16",)))
    assert all(r["time_s"] > 0 for r in rows)


def _frame(rows: list[dict]):
    import pandas as pd

    frame = pd.DataFrame(rows)
    frame["source"], frame["row"] = "test", range(len(rows))
    return frame


def test_the_sweep_summary_reads_at_80_columns() -> None:
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from paraplan.report.profile import render_sweep
    from readable import assert_readable

    record = {
        "summary": {"out": "h100.samples", "journal": "h100.samples.journal", "device": "H100-SXM5-80GB",
                    "points": 3, "measured_now": 2, "skipped_now": 1, "resumed": 0, "rows": 4, "wall_s": 1.5,
                    "s_per_point": 0.5, "median_spread": 0.02},
        "operators": [{"operator": "cross_entropy", "dtype": "bf16", "points": 2, "median_fwd_s": 1.25e-4,
                       "median_bwd_s": 2.5e-4}],
        "skipped": [{"reason": "fp8: the sampler has no FP8 kernels yet (Transformer Engine's are not timed)",
                     "points": 1}],
    }
    for table in render_sweep(record).renderables[2:]:
        assert_readable(table)


def test_one_sweep_for_several_jobs_measures_each_shared_shape_once():
    from paraplan.catalog.jobs import load_job
    from paraplan.cli.profile import _grid_points
    from paraplan.profile.grid import grid_for_job

    examples = Path(__file__).resolve().parents[2] / "examples"
    jobs = [examples / "small-cpu" / "one.yaml", examples / "small-cpu" / "two.yaml"]
    both, dtypes = _grid_points(None, jobs, True)
    one, two = (set(grid_for_job(load_job(j))) for j in jobs)
    assert set(both) == one | two and len(both) == len(set(both))
    assert one & two  # they share shapes: measured once, so fit never sees the same point twice
    assert dtypes == ["fp32"]


def test_a_missing_or_binary_grid_or_runs_file_is_one_line_naming_it(tmp_path):
    from paraplan.profile.grid import load_grid
    from paraplan.specs import ConfigError
    from paraplan.validate.runs import load_runs

    binary = tmp_path / "grid.yaml"
    binary.write_bytes(b"\xff\xfe\x00grid")
    with pytest.raises(ConfigError, match=r"grid\.yaml: not a text file \(it is not UTF-8\)"):
        load_grid([binary])
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read the grid \("):
        load_grid([tmp_path / "nope.yaml"])
    with pytest.raises(ConfigError, match=r"runs\.json: cannot read \("):
        load_runs(tmp_path / "runs.json")
