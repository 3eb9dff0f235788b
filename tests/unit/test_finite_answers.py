"""Issue 15 part 3: an answer is finite and possible, or it is not given.

Inputs that can only produce an infinite or meaningless figure (an infinite half-work, a
denormal peak, a price of 1e308 USD) are rejected by validation naming the field and the value;
a non-finite or negative figure that still reaches the output layer is an internal error (exit
code 3), and JSON never holds ``Infinity`` or ``NaN``.
"""

import dataclasses
import math

import pytest
from typer.testing import CliRunner

from paraplan.catalog import resolve_job
from paraplan.cli.app import app
from paraplan.inventory import count_job
from paraplan.prediction import predict
from paraplan.prediction.sanity import check_possible
from paraplan.report.formats import render_csv, render_json
from paraplan.specs import ConfigError, InternalError

GPU = {"name": "X", "peak_flops": {"bf16": "100 TFLOPS"}, "hbm_bytes": "80 GB", "hbm_bandwidth": "2 TB/s"}
LINK = {"bandwidth": "100 GB/s"}


def _job_with(gpu=None, **cluster):
    return {"model": "gpt2", "cluster": {"gpu": {**GPU, **(gpu or {})}, "gpus_per_node": 2, "intra_node": LINK,
                                         **cluster}}


@pytest.mark.parametrize(("raw", "field", "value"), [
    (_job_with({"efficiency": {"gemm": {"max_fraction": 0.8, "half_work": math.inf}}}),
     "cluster.gpu.efficiency.gemm.half_work", "inf"),
    (_job_with({"efficiency": {"memory": {"max_fraction": 0.8, "half_work": 1e300}}}),
     "cluster.gpu.efficiency.memory.half_work", "1e+300"),
    (_job_with({"efficiency": {"gemm": {"max_fraction": 1e-300, "half_work": 0}}}),
     "cluster.gpu.efficiency.gemm.max_fraction", "1e-300"),
    (_job_with({"peak_flops": {"bf16": 1e-310}}), "cluster.gpu.peak_flops.bf16", "1e-310"),
    (_job_with({"peak_flops": {"bf16": "1e300 TFLOPS"}}), "cluster.gpu.peak_flops.bf16", "1e300 TFLOPS"),
    (_job_with({"hbm_bandwidth": "1e-300 GB/s"}), "cluster.gpu.hbm_bandwidth", "1e-300 GB/s"),
    (_job_with({"hbm_bytes": 10**400}), "cluster.gpu.hbm_bytes", "about 400 digits"),
    (_job_with(intra_node={"bandwidth": "100 GB/s", "latency": "2 d"}), "cluster.intra_node.latency", "2 d"),
    (_job_with(intra_node={"bandwidth": "100 GB/s", "efficiency": 1e-9}), "cluster.intra_node.efficiency", "1e-09"),
    (_job_with(price_per_gpu_hour=1e308), "cluster.price_per_gpu_hour", "1e+308"),
    ({"model": "gpt2", "cluster": "dgx-a100", "train_tokens": "1e300"}, "train_tokens", "1e300"),
])
def test_validation_rejects_quantities_that_can_only_give_a_non_finite_answer(raw, field, value):
    with pytest.raises(ConfigError) as err:
        resolve_job(raw)
    message = str(err.value)
    assert message.startswith(field) and value in message and "\n" not in message


def test_the_catalog_s_own_numbers_are_within_the_bounds():
    for raw in ({"model": "gpt2", "cluster": "dgx-h100", "train_tokens": "15T"},
                {"model": "gpt2", "cluster": "aws-g5.12xlarge"}):
        assert predict(resolve_job(raw)).iteration_s > 0


def _pred_and_inv(price=None):
    job = resolve_job({"model": "gpt2", "cluster": {"name": "dgx-a100", **({"price_per_gpu_hour": price} if price
                                                                           else {})}, "train_tokens": "1T"})
    return predict(job), count_job(job)


def test_a_non_finite_or_negative_memory_figure_is_an_internal_error():
    pred, inv = _pred_and_inv()
    peak = pred.job.cluster.gpu.flops_for(pred.job.precision) * pred.job.cluster.num_gpus
    check_possible(pred, inv, peak)  # the real one is possible
    for bad in (math.nan, math.inf, -1.0):
        memory = (dataclasses.replace(pred.memory[0], activations=bad), *pred.memory[1:])
        with pytest.raises(InternalError, match=r"memory\[0\]\.activations"):
            check_possible(dataclasses.replace(pred, memory=memory), inv, peak)


def test_an_infinite_cost_is_an_internal_error():
    pred, inv = _pred_and_inv(price=2.0)
    peak = pred.job.cluster.gpu.flops_for(pred.job.precision) * pred.job.cluster.num_gpus
    # a price past validation's bound (as a bug in a loader could let through)
    cluster = pred.job.cluster.model_copy(update={"price_per_gpu_hour": 1e308})
    rich = dataclasses.replace(pred, job=pred.job.model_copy(update={"cluster": cluster}))
    with pytest.raises(InternalError, match="cost_per_hour_usd inf"):
        check_possible(rich, inv, peak)


def test_json_and_csv_never_hold_infinity_or_nan():
    for bad in (math.inf, -math.inf, math.nan):
        with pytest.raises(InternalError, match=r"breakdown\.x"):
            render_json({"breakdown": {"x": bad}})
        with pytest.raises(InternalError, match=r"breakdown\.x"):
            render_csv([{"breakdown": {"x": bad}}])


def test_a_non_finite_figure_in_the_json_output_exits_3_without_printing_it(monkeypatch):
    from paraplan.prediction.result import Prediction

    real = Prediction.to_dict
    monkeypatch.setattr(Prediction, "to_dict", lambda self: {**real(self), "bubble_fraction": math.nan})
    result = CliRunner().invoke(app, ["predict", "--format", "json"])
    assert result.exit_code == 3
    assert "NaN" not in result.stdout and "Infinity" not in result.stdout
    assert "internal error" in result.output and "bubble_fraction" in result.output
    assert "Traceback" not in result.output


def test_the_cli_rejects_a_denormal_peak_with_one_line_and_exit_2(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("model: gpt2\ncluster:\n  gpu: {name: X, peak_flops: {bf16: 1e-310}, hbm_bytes: 80 GB,\n"
                    "        hbm_bandwidth: 1 TB/s}\n  gpus_per_node: 1\n")
    result = CliRunner().invoke(app, ["predict", str(path), "--format", "json"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "cluster.gpu.peak_flops.bf16" in lines[0] and "1e-310" in lines[0]
