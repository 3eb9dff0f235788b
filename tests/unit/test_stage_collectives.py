"""The collectives a report lists (issue 24): a ZeRO-3 plan with no tensor or context
parallelism still gathers every layer's weights and reduce-scatters its gradients, and the
HTML report and ``predict --explain`` say so instead of "no collectives"."""

from __future__ import annotations

from html import escape

import pytest

from paraplan.catalog import resolve_job
from paraplan.prediction import predict
from paraplan.report.html import render_html
from paraplan.report.tables import NO_LAYER_COLLECTIVES, STAGE_COLLECTIVES_TITLE, render_explain
from readable import assert_readable


def _predict(model="llama-2-7b", nodes=1, **parallel):
    plan = {"micro_batch_size": 1, "global_batch_size": 64, **parallel}
    return predict(resolve_job({"model": model, "cluster": {"name": "dgx-a100", "num_nodes": nodes}, "parallel": plan}),
                   keep_timeline=True)


@pytest.fixture(scope="module")
def zero3():
    return _predict(framework="fsdp", zero_stage=3, recompute="full", tp=1)


def test_a_zero_3_plan_without_tp_or_cp_lists_its_gathers_and_reduce_scatters_each_micro_batch(zero3):
    assert zero3.layer_collectives == ()
    kinds = {(c.kind, c.phase, c.per) for c in zero3.stage_collectives}
    assert {("all_gather", "fwd", "micro-batch"), ("all_gather", "bwd_input", "micro-batch"),
            ("reduce_scatter", "bwd_weight", "micro-batch")} <= kinds
    assert all(c.seconds > 0 and c.dim == "dp" for c in zero3.stage_collectives)


def test_the_html_report_of_a_zero_3_plan_lists_its_gathers_and_never_says_no_collectives_for_tp_cp_1(zero3):
    page = render_html(zero3)
    assert "tp = cp = 1" not in page
    section = page[page.index(escape(STAGE_COLLECTIVES_TITLE)):]
    assert "dp_allgather" in section and "dp_reducescatter" in section and "each micro-batch" in section
    assert f"No collectives within a layer ({NO_LAYER_COLLECTIVES})" in page


def test_explain_lists_the_stage_s_zero_3_collectives_at_80_columns(zero3):
    text = assert_readable(render_explain(zero3))[80]
    assert STAGE_COLLECTIVES_TITLE in text and "dp_allgather" in text and "dp_reducescatter" in text
    assert "tp = cp = 1" not in text


def test_a_data_parallel_plan_lists_its_gradient_all_reduce_once_an_iteration():
    pred = _predict(framework="megatron", zero_stage=0, tp=1)
    [reduce] = [c for c in pred.stage_collectives if c.kind == "all_reduce"]
    assert reduce.per == "iteration" and reduce.dim == "dp"
    assert "bwd_weight, each iteration" in render_html(pred)


def test_an_expert_parallel_plan_lists_its_all_to_alls_among_the_layer_s_collectives():
    pred = _predict(model="mixtral-8x7b", nodes=2, framework="fsdp", zero_stage=3, tp=1, ep=8)
    assert {c.dim for c in pred.layer_collectives if c.kind == "all_to_all"} == {"ep"}
    page = render_html(pred)
    assert "ep_alltoall" in page[page.index("Collectives of one layer"):]
    assert "edp_allgather" in page[page.index(escape(STAGE_COLLECTIVES_TITLE)):]


def test_a_plan_with_one_gpu_has_no_data_parallel_collectives_and_the_report_says_nothing_false():
    pred = predict(resolve_job({"model": "gpt3-125m", "cluster": {"name": "dgx-a100", "num_nodes": 1, "gpus_per_node": 1},
                                "parallel": {"micro_batch_size": 1, "global_batch_size": 8}}), keep_timeline=True)
    assert pred.layer_collectives == () and pred.stage_collectives == ()
    page = render_html(pred)
    assert escape(STAGE_COLLECTIVES_TITLE) not in page and "tp = cp = 1" not in page


def test_predict_explain_json_gives_the_stage_s_collectives_with_how_often_they_run():
    import json

    from typer.testing import CliRunner

    from paraplan.cli.app import app

    result = CliRunner().invoke(app, ["predict", "--framework", "fsdp", "--zero-stage", "3", "--tp", "1", "--recompute", "full",
                                      "--explain", "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {c["per"] for c in data["stage_collectives"]} >= {"micro-batch"}
    assert {c["kind"] for c in data["stage_collectives"]} >= {"all_gather", "reduce_scatter"}
