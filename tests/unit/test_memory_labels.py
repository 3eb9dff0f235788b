"""One set of memory labels (issue 24, part 2): the table, the picture and the HTML report
name the parts of a GPU's memory from one list, ``prediction.memory_parts``, and the JSON
keys follow its fields."""

from __future__ import annotations

from html import escape

import pytest

from paraplan.catalog import resolve_job
from paraplan.prediction import predict
from paraplan.prediction.memory_parts import MEMORY_PARTS
from readable import assert_readable


@pytest.fixture(scope="module")
def zero3():
    """A ZeRO-3 job whose every memory part is not zero at its peak (DeepSpeed's: gradients kept
    between steps and reduce buckets held all step, beside the loss's copies of the logits)."""
    job = resolve_job({"model": "llama-2-7b", "cluster": {"name": "dgx-a100", "num_nodes": 1},
                       "parallel": {"micro_batch_size": 1, "global_batch_size": 64, "framework": "deepspeed",
                                    "zero_stage": 3, "recompute": "none"}})
    pred = predict(job, keep_timeline=True)
    assert all(getattr(pred.memory.worst, p.field) > 0 for p in MEMORY_PARTS)
    return pred


def test_the_memory_table_names_every_part_by_its_one_label_and_fits_80_columns(zero3):
    from paraplan.report.tables import render_memory

    text = assert_readable(render_memory(zero3))[80]
    for part in MEMORY_PARTS:
        assert part.label in text


def test_the_memory_picture_names_every_part_by_the_same_labels(zero3):
    pytest.importorskip("matplotlib")
    from paraplan.files.pictures import load_pyplot
    from paraplan.report.plots import figure_memory

    fig = figure_memory(zero3)
    try:
        _, labels = fig.axes[0].get_legend_handles_labels()
    finally:
        load_pyplot().close(fig)
    assert [p.label for p in MEMORY_PARTS] == [x for x in labels if x in {p.label for p in MEMORY_PARTS}]


def test_the_html_report_lists_every_part_by_the_same_labels_in_its_own_row(zero3):
    from paraplan.report.html import _memory

    page = _memory(zero3)
    for part in MEMORY_PARTS:
        assert f"<td class=l>{escape(part.label)}</td>" in page


def test_the_json_keys_of_the_memory_parts_are_their_fields(zero3):
    memory = zero3.to_dict()["memory"]
    for part in MEMORY_PARTS:
        assert memory[part.key.removeprefix("memory.")] == getattr(zero3.memory.worst, part.field)


def test_a_part_that_is_zero_everywhere_is_left_out_of_the_table_and_the_picture_but_weights_stay():
    from paraplan.prediction.memory_parts import memory_parts_of

    job = resolve_job({"model": "llama-2-7b", "cluster": {"name": "dgx-a100", "num_nodes": 1},
                       "parallel": {"tp": 8, "micro_batch_size": 1, "global_batch_size": 8,
                                    "framework": "megatron", "zero_stage": 0}})
    shown = {p.field for p in memory_parts_of(predict(job).memory)}
    assert {"weights", "activations"} <= shown and "gathered_params" not in shown
