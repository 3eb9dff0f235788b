"""The learned backend end to end: samples -> paraplan fit -> predict --backend learned."""

import itertools
import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from paraplan.catalog import load_gpu
from paraplan.cli.app import app
from paraplan.costmodel import AnalyticalCostModel
from paraplan.inventory.samples import op_for_sample
from paraplan.specs import ClusterSpec, Phase, Precision

runner = CliRunner()
EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "gpt-neox-20b-perlmutter-pp4-tp4-dp8.yaml")
DISTORTION = 1.3  # the synthetic "GPU" is 30 % slower than the roofline, more on small shapes


def _write_linear1_samples(folder):
    """A GPUModeling-style linear1 file whose times are the roofline's times, distorted."""
    cm = AnalyticalCostModel(ClusterSpec(gpu=load_gpu("A100-SXM4-80GB"), gpus_per_node=1), Precision.FP16)
    lines = ["mp,b,l,dim,F_dur(us),B_dur(us)"]
    for mp, b, seq, dim in itertools.product((1, 2, 4), (2, 4), (1024, 2048, 3072), (2048, 4096, 6144)):
        op = op_for_sample("linear1", {"mp": mp, "b": b, "l": seq, "dim": dim})
        scale = DISTORTION * (1 + 0.2 * math.log10(1e12 / op.flops))
        fwd = cm.estimate_op_s(op, Phase.FWD) * scale * 1e6
        bwd = (cm.estimate_op_s(op, Phase.BWD_INPUT) + cm.estimate_op_s(op, Phase.BWD_WEIGHT)) * scale * 1e6
        lines.append(f"{mp}.0,{b}.0,{seq}.0,{dim}.0,{fwd:.1f},{bwd:.1f}")
    folder.mkdir()
    (folder / "NVIDIAA100-SXM4-80GB_linear1_fp16.csv").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    root = tmp_path_factory.mktemp("learned")
    _write_linear1_samples(root / "operators_A100")
    samples, models = root / "a100.samples", root / "a100.models"
    result = runner.invoke(app, ["samples", "import", "gpumodeling", str(root / "operators_A100"), "--out", str(samples)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["fit", str(samples), "--out", str(models), "--quick", "--format", "json"])
    assert result.exit_code == 0, result.output
    return models, json.loads(result.stdout)


def test_fit_reports_a_held_out_error_better_than_the_analytical_baseline(fitted):
    _, report = fitted
    rows = {r["key"]: r for r in report["models"]}
    fwd = rows["op/A100-SXM4-80GB/fp16/linear1/fwd"]
    assert fwd["holdout_error"] < 0.05
    assert fwd["analytical_holdout_error"] > 0.25


def test_learned_predictions_follow_the_samples_and_say_where_they_fall_back(fitted):
    models, _ = fitted
    args = ["predict", EXAMPLE, "--explain", "--format", "json"]
    analytical = json.loads(runner.invoke(app, args).stdout)
    learned = runner.invoke(app, [*args, "--backend", "learned", "--models", str(models)])
    assert learned.exit_code == 0, learned.output
    data = json.loads(learned.stdout)
    ops = {op["name"]: op for op in data["layer_ops"]}
    base = {op["name"]: op for op in analytical["layer_ops"]}
    assert ops["linear1"]["source"].startswith("learned")
    assert ops["linear1"]["fwd_s"] > 1.2 * base["linear1"]["fwd_s"]
    assert ops["linear2"]["source"].startswith("roofline (no regressor for linear2")
    assert ops["linear2"]["fwd_s"] == pytest.approx(base["linear2"]["fwd_s"])
    assert data["iteration_s"] > analytical["iteration_s"]


def test_a_fitted_file_is_never_overwritten_without_force(fitted, tmp_path):
    models, _ = fitted
    result = runner.invoke(app, ["fit", str(models.parent / "a100.samples"), "--out", str(models), "--quick"])
    assert result.exit_code == 2
    assert "already exists" in result.output


def test_the_learned_backend_needs_a_models_file():
    result = runner.invoke(app, ["predict", "--backend", "learned"])
    assert result.exit_code == 2
    assert "models: the learned backend needs a models file" in result.output


def test_one_batch_predict_returns_microseconds(fitted):
    import paraplan

    models, _ = fitted
    us = paraplan.one_batch_predict(EXAMPLE, models=str(models))
    pred = paraplan.predict(EXAMPLE, models=str(models))
    assert us == pytest.approx(pred.iteration_s * 1e6)
    assert pred.backend == "learned"


def _learned(models_path, job):
    from paraplan.prediction.backends import load_model_file, make_cost_model

    return make_cost_model(job, "learned", load_model_file(models_path))


def test_regressors_are_not_used_for_another_precision(fitted):
    from paraplan.catalog import load_job

    models, _ = fitted
    job = load_job(EXAMPLE).model_copy(update={"precision": Precision.FP32})
    cm = _learned(models, job)
    assert any("no operator regressors for A100-SXM4-80GB in fp32" in n for n in cm.notes)


def test_regressors_are_not_used_when_the_cluster_has_other_links(fitted):
    from paraplan.catalog import load_job, resolve_job

    models, _ = fitted
    same = load_job(EXAMPLE)
    other = resolve_job({
        "model": "gpt2",
        "cluster": {"name": "perlmutter-gpumodeling", "num_nodes": 2, "inter_node": {"bandwidth": "2.5 GB/s"}},
    })
    assert _learned(models, same).ops_usable
    # the synthetic samples have no collectives; a changed link must not match a fingerprint either way
    assert not _learned(models, other).colls_usable


def test_rotary_operators_say_how_much_of_each_head_rotates():
    from paraplan.inventory import count_layer_ops, shard_shape
    from paraplan.specs import ModelSpec

    def rope_dims(percent):
        model = ModelSpec(num_layers=1, hidden_size=1024, num_attention_heads=8, seq_length=128,
                          vocab_size=1000, position_embedding="rotary", rotary_percent=percent)
        op = next(o for o in count_layer_ops(model, shard_shape(model, 1, 1, False, 1, Precision.FP16)) if o.name.startswith("RoPE"))
        return dict(op.dims)

    assert rope_dims(1.0)["d_rot"] == 128 and rope_dims(0.25)["d_rot"] == 32
