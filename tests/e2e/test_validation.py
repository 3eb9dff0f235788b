"""Validation against measured runs (../shared/data; skipped when it is absent).

These tests read measured end-to-end runs only to compare; nothing is fitted to them.
"""

import pytest
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.report.validation import mean_absolute_error
from paraplan.validate import load_runs, validate_runs

pytestmark = pytest.mark.shared_data


def test_the_five_perlmutter_runs_are_predicted_with_per_component_errors(gpumodeling_dir):
    results = validate_runs(load_runs(gpumodeling_dir / "runs_perlmutter.json"))
    assert [r.run_id for r in results] == [
        "GPT_20B_4_4_8_32_4_P",
        "GPT_20B_4_8_4_32_4_P",
        "GPT_20B_8_4_4_32_4_P",
        "llama_13B_4_8_2_16_4_P",
        "llemma_7B_4_2_2_4_4_P",
    ]
    for r in results:
        names = {c.component for c in r.components}
        assert {"encoder_fwd", "encoder_bwd", "stage_fwd", "stage_bwd", "dp_allreduce", "mp_allreduce"} <= names
        assert r.prediction.iteration_s > 0


def test_the_perlmutter_runs_meet_the_analytical_target_of_issue_2(gpumodeling_dir):
    """Issue 2's target for the analytical backend: mean |error| <= 10 % on the five runs
    (the per-run errors are in the README's validation table). Measured 2026-11-24: -3.5 ..
    +5.8 %, mean 3.1 %; the tighter bounds guard that level."""
    results = validate_runs(load_runs(gpumodeling_dir / "runs_perlmutter.json"))
    assert mean_absolute_error(results) <= 0.10
    assert mean_absolute_error(results) <= 0.04
    assert all(abs(r.error) <= 0.07 for r in results), {r.run_id: round(r.error, 3) for r in results}


def test_tensor_parallelism_across_nodes_is_what_makes_the_tp8_runs_slow(gpumodeling_dir):
    """TP=8 spans two 4-GPU Perlmutter nodes: the measured per-call TP all-reduce is ~40x
    the intra-node one, and the prediction must show the same jump (it is not told)."""
    results = {r.run_id: r for r in validate_runs(load_runs(gpumodeling_dir / "runs_perlmutter.json"))}

    def tp_call(run_id):
        return next(c for c in results[run_id].components if c.component == "mp_allreduce")

    intra, inter = tp_call("GPT_20B_4_4_8_32_4_P"), tp_call("GPT_20B_4_8_4_32_4_P")
    assert inter.measured_s / intra.measured_s > 10
    assert inter.predicted_s / intra.predicted_s > 10


def test_published_megatron_runs_validate_from_their_configuration(published_dir):
    results = validate_runs(load_runs(published_dir / "runs_dev.json"))
    assert len(results) == 18
    assert all(r.prediction.iteration_s > 0 for r in results)


def test_validate_command_prints_the_table_and_mean_error(gpumodeling_dir):
    result = CliRunner().invoke(app, ["validate", str(gpumodeling_dir / "runs_perlmutter.json")], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "mean |error|" in result.output
    assert "GPT_20B_4_4_8_32_4_P" in result.output


def test_validate_rejects_a_file_that_is_not_a_run_list(tmp_path):
    bad = tmp_path / "runs.json"
    bad.write_text('{"not": "a list"}')
    result = CliRunner().invoke(app, ["validate", str(bad)])
    assert result.exit_code == 2
    assert "expected a list of run records" in result.output


@pytest.mark.slow
def test_the_learned_backend_predicts_the_five_runs_from_a100_and_perlmutter_samples_alone(gpumodeling_dir, tmp_path):
    """Issue 3, part 4: operator and collective samples only (quick budget), nothing fitted to
    the runs. Measured 2026-11-24: -6.3 .. +6.0 %, mean 4.2 % (default budget: -6.2 .. +4.9 %,
    mean 3.7 %, in the README). Issue 3's target (every run within 5 %, mean <= 3 %) is not
    met; this guards the level."""
    from paraplan.costmodel.fitting import fit_models, fit_tasks, training_metadata
    from paraplan.prediction.backends import load_model_file
    from paraplan.regress.store import save_models
    from paraplan.samples import import_gpumodeling, save_samples

    imported = import_gpumodeling([gpumodeling_dir / "operators_A100", gpumodeling_dir / "nccl_perlmutter"])
    samples, path = tmp_path / "a100.samples", tmp_path / "a100.models"
    save_samples(imported.samples, samples, imported.metadata())
    models = fit_models(fit_tasks(imported.samples), budget="quick")
    save_models(path, models, training_metadata(samples, imported.samples, "quick", 0))
    loaded = load_model_file(path)
    results = validate_runs(load_runs(gpumodeling_dir / "runs_perlmutter.json"), "learned", loaded)
    assert all(abs(r.error) <= 0.08 for r in results), {r.run_id: round(r.error, 3) for r in results}
    assert mean_absolute_error(results) <= 0.05
    for r in results:  # every layer is predicted within 15 % of the traced one
        layers = [c for c in r.components if c.component in ("encoder_fwd", "encoder_bwd")]
        assert layers and all(abs(c.error) <= 0.15 for c in layers), r.run_id


def test_the_modern_published_runs_validate_from_their_configuration(published_dir):
    """runs_dev_modern.json: MLPerf v3.0 GPT-3 (H100, FP8), torchtitan and IBM FSDP runs."""
    results = validate_runs(load_runs(published_dir / "runs_dev_modern.json"))
    assert len(results) == 21
    assert {r.source for r in results} == {"mlperf", "torchtitan", "ibm"}
    assert {r.gpu for r in results} == {"A100-SXM4-80GB", "H100-SXM5-80GB"}
    assert all(r.prediction.iteration_s > 0 for r in results)


def test_validate_takes_several_files_and_prints_errors_per_source_and_gpu(published_dir, gpumodeling_dir):
    files = [str(published_dir / "runs_dev_modern.json"), str(gpumodeling_dir / "runs_perlmutter.json")]
    result = CliRunner().invoke(app, ["validate", *files, "--no-components"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    for word in ("signed median", "p90 |err|", "torchtitan", "H100-SXM5-80GB", "gpumodeling25", "all runs"):
        assert word in result.output
