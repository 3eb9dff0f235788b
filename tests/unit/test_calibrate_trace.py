"""`paraplan calibrate trace`: a cluster fitted to the operators and collectives of a profiler
trace of the user's own run (issue 16 part 4), on a real trace recorded by
`paraplan trace record --mode ddp --layers 2 --active 2` with record_shapes=True
(tests/fixtures/traces/ddp-shapes)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("scipy")
pytest.importorskip("pandas")

from typer.testing import CliRunner

from paraplan.calibrate.catalog_yaml import cluster_file_yaml
from paraplan.calibrate.curves import MIN_HALF_WORK_LOG10, fit_curve
from paraplan.calibrate.trace import _collective_samples, _points, calibrate_from_trace
from paraplan.catalog import load_job, resolve_job
from paraplan.cli.app import app
from paraplan.inventory import CollectiveKind
from paraplan.prediction import predict
from paraplan.prediction.backends import make_cost_model
from paraplan.specs import ConfigError, Precision
from paraplan.traces.decode import Collective as TracedCollective
from paraplan.traces.decode import RankTrace
from paraplan.traces.ops import op_class, operator_timings
from readable import assert_readable_text

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "traces"
SHAPES = FIXTURES / "ddp-shapes"
JOB = ROOT / "examples" / "tiny-cpu" / "ddp.yaml"
runner = CliRunner()


@pytest.fixture(scope="module")
def job():
    return load_job(JOB)


@pytest.fixture(scope="module")
def calibrated(job):
    return calibrate_from_trace(sorted(SHAPES.glob("rank*.json.gz")), job, date="2026-11-25")


def test_leaf_operators_are_timed_and_their_callers_are_not():
    assert op_class("aten::mm") == ("gemm", False)
    assert op_class("aten::linear") is None  # calls aten::mm: its time would count twice
    assert op_class("aten::gelu_backward") == ("op:gelu:bwd", True)
    assert op_class("aten::_scaled_dot_product_flash_attention_for_cpu_backward") == ("attention", True)


def test_a_trace_with_shapes_yields_gemms_with_their_shapes():
    timings = operator_timings(SHAPES / "rank0.json.gz")
    gemms = [t for t in timings if t.klass == "gemm"]
    assert gemms and all(len(t.dims) == 2 and t.dtype == "float" and t.seconds > 0 for t in gemms)
    assert ((256, 64), (64, 192)) in {t.dims for t in gemms}  # the QKV projection: 4 x 64 tokens


def test_a_trace_without_shapes_yields_no_operator_timings():
    assert operator_timings(FIXTURES / "ddp" / "rank0.json.gz") == []


def test_calibrating_from_a_trace_without_shapes_says_to_record_them(job):
    with pytest.raises(ConfigError, match="record_shapes=True"):
        calibrate_from_trace(sorted((FIXTURES / "ddp").glob("rank*.json.gz")), job)


def test_every_curve_fitted_from_the_trace_predicts_its_calls_better_than_before(calibrated):
    fitted = [row for row in calibrated.curves if row.fit is not None]
    assert {row.kind for row in fitted} >= {"gemm", "memory", "attention", "layernorm", "gelu"}
    for row in fitted:
        assert abs(row.after.median) < abs(row.before.median), row.kind


def test_the_gemm_curve_is_fitted_in_the_jobs_precision(calibrated):
    curves = calibrated.cluster.gpu.efficiency.precisions[Precision.FP32]
    assert curves.gemm is not None and 0.0 < curves.gemm.max_fraction <= 1.0
    assert calibrated.cluster.gpu.efficiency.gemm == calibrated.before.gpu.efficiency.gemm  # bf16 untouched


def test_the_links_efficiency_is_fitted_and_latency_kept_when_sizes_are_alike(calibrated):
    (row,) = calibrated.links
    assert row.side == "intra_node" and row.fitted == ("efficiency",)
    assert "latency kept" in row.note
    assert calibrated.cluster.intra_node.latency_s == calibrated.before.intra_node.latency_s
    assert calibrated.cluster.intra_node.efficiency != calibrated.before.intra_node.efficiency


def test_a_send_pairs_with_its_peers_receive_and_the_call_takes_the_shorter_time(job):
    def rank(kinds_and_times):
        colls = tuple(
            TracedCollective(1, kind, "pp", "default_pg", 65536, 2, float(i), seconds)
            for i, (kind, seconds) in enumerate(kinds_and_times)
        )
        return RankTrace(Path("r"), 0, 2, "gloo", "cpu", "ProfilerStep", (), colls)

    samples, calls = _collective_samples(
        [rank([("send", 0.004), ("recv", 0.001)]), rank([("recv", 0.002), ("send", 0.003)])], job.cluster
    )
    assert calls == 2
    assert [c.kind for c in samples.coll] == [CollectiveKind.SEND_RECV]
    # call 1: min(0.004, 0.002); call 2: min(0.001, 0.003); one size: the median of the two
    assert samples.measured.tolist() == [pytest.approx(0.0015)]


def test_one_size_fits_max_fraction_only_with_half_work_at_its_floor(job):
    timings = [t for t in operator_timings(SHAPES / "rank0.json.gz") if t.klass == "attention"]
    points = _points("attention", timings, job, "test")
    fit = fit_curve(points, job.cluster.gpu, holdout=1e-9, fit_half_work=False)
    assert fit.curve.half_work == pytest.approx(10**MIN_HALF_WORK_LOG10)


def test_the_calibrated_cluster_file_loads_and_predicts_with_its_fitted_curves_not_the_example_ones(calibrated, tmp_path):
    path = tmp_path / "mycluster.yaml"
    path.write_text(cluster_file_yaml(calibrated.cluster, ["test"]), encoding="utf-8")
    before = load_job(JOB)
    after = resolve_job({**_raw_job(), "cluster": str(path)})
    assert after.cluster.gpu.efficiency.precisions[Precision.FP32].gemm.max_fraction == pytest.approx(
        calibrated.cluster.gpu.efficiency.precisions[Precision.FP32].gemm.max_fraction, rel=1e-3)
    t_before = predict(before, make_cost_model(before, "analytical", None)).iteration_s
    t_after = predict(after, make_cost_model(after, "analytical", None)).iteration_s
    # the example's own curves are measured on a CPU core too (no longer generic GPU guesses
    # 100x too slow), so the trace's fit moves the prediction either way, but it moves it
    assert math.isfinite(t_after) and abs(t_after / t_before - 1) > 0.05


def _raw_job() -> dict:
    import yaml

    return yaml.safe_load(JOB.read_text(encoding="utf-8"))


def test_the_command_prints_the_fit_at_80_columns_and_writes_the_cluster_file(tmp_path):
    out = tmp_path / "mycluster.yaml"
    result = runner.invoke(app, ["calibrate", "trace", str(SHAPES), "--job", str(JOB), "-o", str(out),
                                 "--date", "2026-11-25"], terminal_width=80)
    assert result.exit_code == 0, result.output
    assert_readable_text(result.stdout, 80)
    assert "gemm" in result.stdout and "intra_node" in result.stdout
    assert out.read_text(encoding="utf-8").startswith("# tiny-cpu-gloo calibrated by paraplan calibrate trace")
    predicted = runner.invoke(app, ["predict", str(JOB), "--cluster", str(out)], terminal_width=80)
    assert predicted.exit_code == 0, predicted.output


def test_the_command_never_writes_over_a_file_without_force(tmp_path):
    out = tmp_path / "mycluster.yaml"
    out.write_text("mine\n", encoding="utf-8")
    result = runner.invoke(app, ["calibrate", "trace", str(SHAPES), "--job", str(JOB), "-o", str(out)])
    assert result.exit_code == 2
    assert "--force" in result.output and "Traceback" not in result.output
    assert out.read_text(encoding="utf-8") == "mine\n"


def test_a_trace_without_shapes_is_one_line_exit_2():
    result = runner.invoke(app, ["calibrate", "trace", str(FIXTURES / "ddp"), "--job", str(JOB)])
    assert result.exit_code == 2
    assert "record_shapes=True" in result.output and "Traceback" not in result.output


def test_the_per_call_overhead_is_fitted_with_the_memory_curve(calibrated):
    (row,) = [r for r in calibrated.curves if r.kind == "overhead"]
    assert "kernel_overhead_s" in row.reason
    fitted = calibrated.cluster.gpu.efficiency.kernel_overhead_s
    assert 0.0 <= fitted < 1e-3 and fitted != calibrated.before.gpu.efficiency.kernel_overhead_s


def test_validate_trace_predicts_on_the_calibrated_cluster_when_asked(calibrated, tmp_path):
    path = tmp_path / "mycluster.yaml"
    path.write_text(cluster_file_yaml(calibrated.cluster, ["test"]), encoding="utf-8")
    args = ["validate", "trace", str(JOB), str(FIXTURES / "ddp"), "--format", "json"]
    nominal = runner.invoke(app, args)
    on_it = runner.invoke(app, [*args, "--cluster", str(path)])
    assert nominal.exit_code == 0 and on_it.exit_code == 0, on_it.output
    assert nominal.stdout != on_it.stdout


def test_validate_trace_names_an_unknown_cluster_in_one_line():
    result = runner.invoke(app, ["validate", "trace", str(JOB), str(FIXTURES / "ddp"), "--cluster", "no-such"])
    assert result.exit_code == 2
    assert "no-such" in result.output and "Traceback" not in result.output


# -- HTA's real GPU traces (../shared/data/traces/hta; issue 25 part 7) ----------------------

HTA = ROOT.parent / "shared" / "data" / "traces" / "hta"


@pytest.fixture(scope="module")
def a100_fp32_job():
    """An A100 job in fp32 (the element type of these traces' GEMMs); only its cluster and
    precision matter to the fit."""
    import yaml

    raw = yaml.safe_load((ROOT / "examples" / "mistral-7b-one-node.yaml").read_text(encoding="utf-8"))
    return resolve_job({**raw, "precision": "fp32"})


@pytest.mark.shared_data
@pytest.mark.parametrize("folder", ["A_vit128_sampled", "E1_diff_control_a100x8"])
def test_calibrate_fits_a_gemm_curve_from_hundreds_of_linked_gemm_calls_of_a_real_gpu_trace(folder, a100_fp32_job):
    files = sorted((HTA / folder).glob("*.json.gz"))
    if not files:
        pytest.skip(f"../shared/data/traces/hta/{folder} is not present")
    result = calibrate_from_trace(files, a100_fp32_job, date="2026-11-26")
    assert result.linked_fraction > 0.98
    gemms = {row.precision: row for row in result.curves if row.kind == "gemm"}
    assert sum(row.calls for row in gemms.values()) >= 700
    # cuBLAS ran most of these fp32 GEMMs on TF32 tensor cores (cutlass_80_tensorop_s1688gemm_*),
    # the rest as SIMT fp32 kernels (ampere_sgemm_*): one curve each
    tf32 = gemms[Precision.TF32]
    assert tf32.calls >= 600 and tf32.points >= 100 and tf32.fit is not None
    assert abs(tf32.after.median) < abs(tf32.before.median)
    for precision, row in gemms.items():
        written = result.cluster.gpu.efficiency.precisions[precision].gemm
        held = row.fit.points - row.fit.fitted
        assert written == row.fit.curve.model_copy(update={
            "source": result.source, "fitted": row.fit.fitted, "held_out": held,
            "held_out_median_err": round(row.fit.holdout.median_abs / 100, 4) if held else None})
        assert row.fit.curve.max_fraction < 0.9  # a plausible share of that precision's peak


@pytest.mark.shared_data
@pytest.mark.parametrize("folder", ["A_vit128_sampled", "E1_diff_control_a100x8"])
def test_fp32_gemms_on_tf32_tensor_cores_are_impossible_at_the_fp32_peak_and_plausible_at_the_tf32_one(folder,
                                                                                                  a100_fp32_job):
    files = sorted((HTA / folder).glob("*.json.gz"))
    if not files:
        pytest.skip(f"../shared/data/traces/hta/{folder} is not present")
    gpu = a100_fp32_job.cluster.gpu
    on_tf32 = [t for f in files for t in operator_timings(f) if t.klass == "gemm" and t.precision == "tf32"]
    assert len(on_tf32) >= 600 and {t.dtype for t in on_tf32} == {"float"}
    as_fp32 = _points("gemm", on_tf32, a100_fp32_job, "test", Precision.FP32)
    fastest = max(op.flops / s for op, s in zip(as_fp32.ops, as_fp32.seconds, strict=True))
    assert fastest > 1.5 * gpu.flops_for(Precision.FP32)  # beyond what fp32 arithmetic can do
    assert fit_curve(as_fp32, gpu, holdout=1e-9, loss="soft_l1").curve.max_fraction >= 0.999  # stuck at the peak
    as_tf32 = _points("gemm", on_tf32, a100_fp32_job, "test", Precision.TF32)
    assert fastest < 0.8 * gpu.flops_for(Precision.TF32)  # what TF32 tensor cores can do
    assert 0.2 < fit_curve(as_tf32, gpu, holdout=1e-9, loss="soft_l1").curve.max_fraction < 0.6


@pytest.mark.shared_data
def test_calibrate_on_a_real_gpu_trace_without_shapes_says_to_record_them(a100_fp32_job):
    files = sorted((HTA / "B_resnet_nccl_a100").glob("*.json.gz"))
    if not files:
        pytest.skip("../shared/data/traces/hta/B_resnet_nccl_a100 is not present")
    with pytest.raises(ConfigError, match="record_shapes=True"):
        calibrate_from_trace(files, a100_fp32_job)


@pytest.mark.shared_data
def test_the_command_shows_how_many_kernels_it_linked_to_their_operator(tmp_path):
    folder = HTA / "E1_diff_control_a100x8"
    if not folder.is_dir():
        pytest.skip("../shared/data/traces/hta/E1_diff_control_a100x8 is not present")
    job = tmp_path / "a100-fp32.yaml"
    job.write_text((ROOT / "examples" / "mistral-7b-one-node.yaml").read_text(encoding="utf-8")
                   .replace("precision: bf16", "precision: fp32"), encoding="utf-8")
    result = runner.invoke(app, ["calibrate", "trace", str(folder), "--job", str(job), "-o", str(tmp_path / "c.yaml"),
                                 "--date", "2026-11-26"], terminal_width=80)
    assert result.exit_code == 0, result.output
    assert_readable_text(result.stdout, 80)
    assert "kernels linked to the operator that launched them: 8,520 of 8,568 (99.4 %)" in result.stdout


H100_CHECK = ROOT / "benchmarks" / "data" / "gpu" / "h100-2026-11-27" / "run2" / "gpucheck"


def test_an_own_curve_fitted_from_a_trace_is_the_one_the_cost_model_reads_beside_the_catalogs_per_direction_curves():
    """The H100 catalog times RMSNorm with ``RMSlayernorm:fwd``/``:bwd``; the trace's fused
    forward calls (``aten::_fused_rms_norm``) fit the forward curve, which the cost model reads
    before a plain ``RMSlayernorm`` key: a curve written there was never used (+985 % after)."""
    job = load_job(H100_CHECK / "small-llama.yaml")
    result = calibrate_from_trace([H100_CHECK / "trace" / "rank0.json.gz"], job, date="2026-11-27")
    row = next(r for r in result.curves if r.kind == "RMSlayernorm")
    assert row.fit.kind == "RMSlayernorm:fwd"
    assert result.cluster.gpu.efficiency.ops["RMSlayernorm:fwd"].max_fraction == row.fit.curve.max_fraction
    assert abs(row.after.median) < 0.02 < abs(row.before.median)
