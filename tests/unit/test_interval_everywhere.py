"""Intervals wherever a time, rate or cost figure is shown (issue 29): the HTML report, the
time pictures, and the search's plan table, JSON and CSV."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.cli.loading import interval_of, load_flagged_job, predict_flagged

runner = CliRunner()


@pytest.fixture(scope="module")
def demo():
    job, _ = load_flagged_job(None, {})
    pred, _ = predict_flagged(job, "analytical", None, keep_timeline=True)
    return pred, interval_of(job, pred, 0.8, "analytical", None)


def _run(*args: str):
    result = runner.invoke(app, list(args), env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result


def test_the_html_report_gives_each_figure_its_interval_and_the_rule(demo, tmp_path):
    pytest.importorskip("matplotlib")
    from paraplan.report.html import render_html

    pred, interval = demo
    page = render_html(pred, interval)
    low, high = interval.time(pred.iteration_s)
    assert f"(80 %: {low:.3g}-{high:.3g} s)" in page
    assert page.count("(80 %: ") >= 7  # time, tokens/s, TFLOP/s, MFU, $ per Mtok, time and cost to train
    assert "80 % interval: " in page and "widened for unstated" in page


def test_the_report_command_takes_the_level(tmp_path):
    pytest.importorskip("matplotlib")
    page = tmp_path / "r.html"
    _run("report", "-o", str(page), "--interval", "0.5")
    assert "(50 %: " in page.read_text(encoding="utf-8")


def test_the_breakdown_picture_shows_the_iteration_interval_as_a_band(demo):
    pytest.importorskip("matplotlib")
    from paraplan.files.pictures import load_pyplot
    from paraplan.report.plots import figure_breakdown

    pred, interval = demo
    fig = figure_breakdown(pred, interval)
    try:
        ax = fig.axes[0]
        low, high = interval.time(pred.iteration_s)
        bands = [p for p in ax.patches if p.get_hatch() == "///"]
        assert len(bands) == 1
        y = [v[1] for v in bands[0].get_path().transformed(bands[0].get_patch_transform()).vertices]
        assert min(y) == pytest.approx(low) and max(y) == pytest.approx(high)  # seconds: the demo's unit
        assert ax.get_ylim()[1] >= high
        assert any("hatched: 80 %" in t.get_text() for t in ax.texts)
    finally:
        load_pyplot().close(fig)


def test_the_search_table_gives_each_plan_its_interval_and_says_it_is_not_widened():
    text = _run("search", "--top", "3").stdout
    header = next(line for line in text.splitlines() if "iter s" in line)
    assert "80 %" in header
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "not widened for the settings the job left unstated" in " ".join(text.split())


def test_search_json_and_csv_give_each_plan_its_interval_without_risk():
    plans = json.loads(_run("search", "--top", "3", "--format", "json").stdout)["plans"]
    for p in plans:
        low, high = p["interval"]["log_ratio"]
        assert p["interval"]["iteration_s"] == pytest.approx([p["iteration_s"] * math.exp(low),
                                                               p["iteration_s"] * math.exp(high)])
    rows = list(csv.DictReader(io.StringIO(_run("search", "--top", "3", "--format", "csv").stdout)))
    assert all(float(r["interval.iteration_s_low"]) < float(r["interval.iteration_s_high"]) for r in rows)


def test_risk_lines_and_far_end_checks_are_in_the_table_and_each_plans_row():
    text = " ".join(_run("search", "--top", "3", "--risk", "--deadline", "46d").stdout.split())
    assert "ranked by risk: the slowest tokens/s" in text and "deadline 46.0 d: does NOT hold" in text
    plans = json.loads(_run("search", "--top", "3", "--risk", "--deadline", "46d", "--format", "json").stdout)["plans"]
    for p in plans:
        assert p["deadline_far_end"] == pytest.approx(p["interval"]["time_to_train_s"][1])
        assert p["deadline_holds_at_far_end"] == (p["deadline_far_end"] <= 46 * 86400)
