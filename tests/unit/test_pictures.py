"""The data the pictures are drawn from, and the pictures themselves (breakdown, timeline,
memory, learning curves)."""

import pytest

from paraplan.catalog import resolve_job
from paraplan.prediction import predict
from paraplan.report.stagebars import COMPONENTS, stage_bars, timeline_bars

PNG = b"\x89PNG\r\n\x1a\n"


def _job(**parallel):
    return resolve_job(
        {
            "model": "llama-3-8b",
            "cluster": {"name": "dgx-a100", "num_nodes": 4},
            "parallel": {"tp": 4, "pp": 4, "micro_batch_size": 1, "global_batch_size": 64, "zero_stage": 1,
                         **parallel},
        }
    )


PLANS = [
    {},
    {"recompute": "full"},
    {"schedule": "interleaved", "vpp": 2},
    {"schedule": "gpipe"},
    {"pp": 1, "tp": 8},
    {"framework": "deepspeed", "zero_stage": 1},
]


@pytest.mark.parametrize("plan", PLANS)
def test_breakdown_bars_of_the_critical_stage_add_up_to_the_iteration(plan):
    pred = predict(_job(**plan), keep_timeline=True)
    bars = stage_bars(pred)
    assert len(bars) == pred.job.parallel.pp
    (crit,) = [b for b in bars if b.critical]
    assert crit.total_s == pytest.approx(pred.iteration_s, rel=1e-9)
    assert crit.as_dict()["pipeline p2p"] == pytest.approx(pred.breakdown.pipeline_p2p_s, rel=1e-9)
    assert crit.as_dict()["pipeline bubble (idle)"] == pytest.approx(pred.breakdown.pipeline_bubble_s, rel=1e-9)


@pytest.mark.parametrize("plan", PLANS)
def test_every_stage_bar_spans_the_iteration_and_its_sends_are_the_schedules(plan):
    pred = predict(_job(**plan), keep_timeline=True)
    m = pred.job.parallel.num_microbatches
    for bar, timing in zip(stage_bars(pred), pred.stages, strict=True):
        assert bar.total_s == pytest.approx(pred.iteration_s, rel=1e-9)
        assert all(s >= 0 for s in bar.seconds)
        parts = bar.as_dict()
        busy = m * timing.busy_mb_s + parts["pipeline p2p"]
        assert busy == pytest.approx(pred.pipeline.busy[bar.stage], rel=1e-9)


def test_the_bars_need_the_schedule_the_prediction_used():
    with pytest.raises(ValueError, match="keep_timeline=True"):
        stage_bars(predict(_job()))


def test_the_timeline_holds_every_task_of_the_schedule_and_ends_with_the_iteration():
    pred = predict(_job(schedule="interleaved", vpp=2), keep_timeline=True)
    bars = timeline_bars(pred)
    m, pp, v = pred.job.parallel.num_microbatches, 4, 2
    assert sum(b.kind == "forward" for b in bars) == m * pp * v
    assert sum(b.kind == "backward" for b in bars) == m * pp * v
    assert sum(b.kind == "optimizer" for b in bars) == pp
    assert max(b.end for b in bars) == pytest.approx(pred.iteration_s, rel=1e-9)
    assert len(COMPONENTS) == 8
