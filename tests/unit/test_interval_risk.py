"""`paraplan search --risk` (issue 29): plans ranked by the pessimistic end of their interval;
budget and deadline checked at the interval's far end."""

from __future__ import annotations

import json
import math
from dataclasses import replace

from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.cli.loading import load_flagged_job, predict_flagged
from paraplan.uncertainty import interval_for
from paraplan.uncertainty.risk import far_end_checks, pessimistic_score

runner = CliRunner()


def _demo():
    job, _ = load_flagged_job(None, {})
    return predict_flagged(job, "analytical", None)[0]


def test_a_fast_but_uncertain_plan_loses_to_a_slightly_slower_certain_one():
    pred = _demo()
    certain = interval_for(pred, 0.8)
    certain = replace(certain, low=-0.02, high=0.02)
    uncertain = replace(certain, low=-0.02, high=0.30)
    slower = replace(pred, tokens_per_s=pred.tokens_per_s * 0.95)  # 5 % slower, but certain
    assert pessimistic_score(slower, certain, "time") < pessimistic_score(pred, uncertain, "time")


def test_a_deadline_met_by_the_point_prediction_can_fail_at_the_far_end():
    pred = _demo()
    interval = replace(interval_for(pred, 0.8), low=-0.05, high=0.2)
    deadline = pred.time_to_train_s * 1.1  # met by the prediction, not at +22 %
    (bound, far, limit, holds), = far_end_checks(pred, interval, None, deadline)
    assert bound == "deadline" and not holds and limit == deadline
    assert far == pred.time_to_train_s * math.exp(0.2)


def test_search_with_risk_gives_each_plan_its_interval_and_ranks_by_the_slow_end():
    result = runner.invoke(app, ["search", "--top", "5", "--risk", "--format", "json"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    plans = json.loads(result.stdout)["plans"]
    slow_ends = [p["interval"]["tokens_per_s"][0] for p in plans]
    assert slow_ends == sorted(slow_ends, reverse=True)
    risk = json.loads(result.stdout)["interval"]
    assert risk["ranked_by"] == "the slowest tokens/s of each plan's 80 % interval"
    assert risk["widened_for_unstated_settings"] is False
