"""Two predictions side by side (``paraplan compare``): the arithmetic of the comparison and its
table, CSV and JSON forms."""

from dataclasses import fields

import pytest
from hypothesis import given
from hypothesis import strategies as st

from paraplan.catalog import resolve_job
from paraplan.prediction import Breakdown, predict
from paraplan.prediction.compare import SUMMARY_KEYS, Delta, compare_predictions
from paraplan.report.compare import comparison_rows, render_comparison
from paraplan.report.formats import render_csv, render_json
from readable import assert_readable


def _pred(price=True, **parallel):
    cluster = {"name": "dgx-a100", "num_nodes": 2, **({"price_per_gpu_hour": "2 USD"} if price else {})}
    return predict(resolve_job({
        "model": "gpt-neox-20b",
        "cluster": cluster,
        "parallel": {"tp": 4, "pp": 2, "micro_batch_size": 1, "global_batch_size": 32, **parallel},
        "train_tokens": "1B",
    }))


@pytest.fixture(scope="module")
def tp4_against_tp8():
    return compare_predictions(_pred(tp=4), _pred(tp=8))


def test_every_figure_is_b_minus_a_and_its_share_of_a(tp4_against_tp8):
    cmp = tp4_against_tp8
    time = next(d for d in cmp.summary if d.key == "iteration_s")
    assert (time.a, time.b) == (cmp.a.iteration_s, cmp.b.iteration_s)
    assert time.change == pytest.approx(cmp.b.iteration_s - cmp.a.iteration_s)
    assert time.relative == pytest.approx(cmp.b.iteration_s / cmp.a.iteration_s - 1)
    memory = next(d for d in cmp.summary if d.key == "memory.total_bytes")
    assert (memory.a, memory.b) == (cmp.a.worst_memory.total, cmp.b.worst_memory.total)


def test_every_breakdown_component_is_compared_whatever_fields_the_breakdown_has(tp4_against_tp8):
    keys = [d.key for d in tp4_against_tp8.components]
    assert keys == [f.name for f in fields(Breakdown)] + ["total_s"]
    for d in tp4_against_tp8.components[:-1]:
        assert d.a == getattr(tp4_against_tp8.a.breakdown, d.key)


def test_the_component_changes_add_up_to_the_change_of_the_iteration(tp4_against_tp8):
    *parts, total = tp4_against_tp8.components
    assert sum(d.change for d in parts) == pytest.approx(total.change)
    assert total.change == pytest.approx(tp4_against_tp8.b.iteration_s - tp4_against_tp8.a.iteration_s)


def test_the_settings_that_differ_are_named_with_both_values(tp4_against_tp8):
    differ = {key: (a, b) for key, a, b in tp4_against_tp8.settings}
    assert differ["parallel.tp"] == (4, 8)
    assert differ["parallel.dp"] == (2, 1)  # 16 GPUs over pp 2: dp follows tp
    assert "model" not in differ and "parallel.pp" not in differ


def test_a_job_compared_with_itself_changes_nothing():
    pred = _pred()
    cmp = compare_predictions(pred, pred)
    assert cmp.settings == ()
    assert all(d.change == 0 for d in (*cmp.summary, *cmp.components))


def test_a_figure_one_prediction_lacks_has_no_change():
    cmp = compare_predictions(_pred(price=False), _pred(price=True))
    cost = next(d for d in cmp.summary if d.key == "cost.cost_to_train_usd")
    assert cost.a is None and cost.b > 0
    assert cost.change is None and cost.relative is None


@given(a=st.floats(0, 1e6), b=st.floats(0, 1e6))
def test_a_change_from_zero_has_no_percentage_and_any_other_is_its_ratio(a, b):
    d = Delta("x", a, b)
    assert d.change == b - a
    if a == 0:
        assert d.relative is None
    else:
        assert d.relative == pytest.approx((b - a) / a)


def test_the_table_fits_80_columns_with_every_number_whole(tp4_against_tp8):
    text = assert_readable(render_comparison(tp4_against_tp8, ("a.yaml", "b.yaml")))[80]
    assert "tp 4 -> 8" in text
    assert "TP communication" in text and "pipeline p2p" in text


def test_the_table_leaves_out_a_component_neither_plan_has():
    cmp = compare_predictions(_pred(pp=1), _pred(pp=1, tp=8))
    assert max(cmp.a.breakdown.pipeline_bubble_s, cmp.b.breakdown.pipeline_bubble_s) < 1e-12  # no pipeline
    text = assert_readable(render_comparison(cmp))[200]
    assert "pipeline bubble" not in text and "TP communication" in text


def test_csv_has_one_row_per_figure_with_a_b_and_the_change(tp4_against_tp8):
    rows = comparison_rows(tp4_against_tp8)
    figures = [r["figure"] for r in rows]
    assert figures[:len(SUMMARY_KEYS)] == list(SUMMARY_KEYS)
    assert "memory.fits" in figures and "breakdown.total_s" in figures
    header = render_csv(rows).splitlines()[0]
    assert header == "figure,a,b,change,relative"


def test_json_holds_both_predictions_whole_and_the_differences(tp4_against_tp8):
    import json

    data = json.loads(render_json(tp4_against_tp8.to_dict()))
    assert data["a"]["parallel"]["tp"] == 4 and data["b"]["parallel"]["tp"] == 8
    assert data["settings_that_differ"]["parallel.tp"] == {"a": 4, "b": 8}
    assert data["difference"]["iteration_s"]["change"] == pytest.approx(
        data["b"]["iteration_s"] - data["a"]["iteration_s"])
    assert set(data["difference"]["memory.fits"]) == {"a", "b"}


def test_a_change_from_a_negative_figure_has_no_percentage_that_would_flip_its_sign():
    assert Delta("memory.margin_bytes", -5.0, 30.0).relative is None
    assert Delta("memory.margin_bytes", -5.0, 30.0).change == 35.0


@pytest.fixture(scope="module")
def zero1_against_zero3():
    # with a pipeline, FSDP holds its gathered weights and accumulated gradients all step, so
    # ZeRO-3's peak (at the loss) has every part alive, the loss's logits with the buffers
    # (without one its reduce-scatter buffers live in the backward only, never beside them)
    return compare_predictions(_pred(tp=1, pp=2, framework="fsdp", zero_stage=0, recompute="full"),
                               _pred(tp=1, pp=2, framework="fsdp", zero_stage=3, recompute="full"))


def test_the_table_names_each_memory_part_by_the_label_every_renderer_prints(zero1_against_zero3):
    from paraplan.prediction.memory_parts import MEMORY_PARTS

    text = assert_readable(render_comparison(zero1_against_zero3))[80]
    for part in MEMORY_PARTS:  # every part is in ZeRO-3's plan
        assert getattr(zero1_against_zero3.b.worst_memory, part.field) > 0
        assert f"memory: {part.label}" in text
    assert "memory margin (after headroom)" in text


def test_csv_and_json_give_the_memory_margin_and_every_memory_part_of_a_and_b(zero1_against_zero3):
    from paraplan.prediction.memory_parts import MEMORY_PARTS

    cmp = zero1_against_zero3
    rows = {r["figure"]: r for r in comparison_rows(cmp)}
    margin = rows["memory.margin_bytes"]
    assert (margin["a"], margin["b"]) == (cmp.a.memory.margin, cmp.b.memory.margin)
    for part in MEMORY_PARTS:
        assert rows[part.key]["b"] == getattr(cmp.b.worst_memory, part.field)
        assert part.key in cmp.to_dict()["difference"]
    assert "memory.margin_bytes" in render_csv(list(rows.values()))


def test_a_plan_field_the_json_settings_do_not_show_is_still_named_when_it_differs():
    cmp = compare_predictions(_pred(), _pred(tp_comm_overlap=True, sequence_parallel=True))
    differ = {key: (a, b) for key, a, b in cmp.settings}
    assert differ["parallel.tp_comm_overlap"] == (False, True)
    assert differ["parallel.sequence_parallel"] == (False, True)


def test_two_models_are_named_by_their_names_not_by_every_field():
    other = predict(resolve_job({"model": "llama-2-13b", "cluster": {"name": "dgx-a100", "num_nodes": 2},
                                 "parallel": {"tp": 4, "pp": 2, "micro_batch_size": 1, "global_batch_size": 32}}))
    keys = [key for key, _, _ in compare_predictions(_pred(), other).settings]
    assert "model" in keys and not any(key.startswith("model.") for key in keys)
