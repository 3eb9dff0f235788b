"""`paraplan trace summarize` as a user reads it: tables within 80 columns, every number whole,
and a JSON record with the documented keys."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.report.traces import render_trace_summary
from paraplan.traces.summary import summarize
from readable import WIDTHS, assert_readable_text

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
runner = CliRunner()


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("mode", ["ddp", "fsdp", "pipeline"])
def test_the_summary_table_fits_80_and_200_columns_without_cutting_numbers(mode, width):
    result = runner.invoke(app, ["trace", "summarize", str(FIXTURES / mode)], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert_readable_text(result.stdout, width)
    for heading in ("Iteration time", "Noise:", "Per rank", "Straggler:", "fastest iteration", "median iteration"):
        assert heading in result.stdout
    row = next(line for line in lines if re.match(r"\s+iteration\s+\d", line))
    assert all(re.fullmatch(r"\d+\.\d\d", cell) for cell in row.split()[1:])


def test_many_ranks_are_shown_as_min_median_max_over_ranks():
    s = summarize([FIXTURES / "ddp"])
    many = replace(s, ranks=tuple(replace(s.ranks[0], rank=r) for r in range(6)))  # six alike ranks
    console = Console(width=80, record=True)
    console.print(render_trace_summary(many))
    text = console.export_text()
    assert "max rank" in text and max(len(line) for line in text.splitlines()) <= 80


def test_the_json_summary_has_iterations_noise_ranks_and_collectives():
    result = runner.invoke(app, ["trace", "summarize", str(FIXTURES / "pipeline"), "--format", "json"])
    data = json.loads(result.stdout)
    assert data["iterations"]["count"] == 2 and data["iterations"]["steps"] == [3, 4]
    assert set(data["iterations"]) >= {"min_s", "median_s", "mean_s", "p90_s", "max_s", "std_s"}
    assert data["noise_pct"] >= 0 and data["slowest_rank"] in (0, 1)
    assert {r["rank"] for r in data["median"]["ranks"]} == {0, 1}
    assert "comm pp send" in data["fastest"]["ranks"][0]["components_s"]
    assert {c["kind"] for c in data["collectives"]} == {"send", "recv"}
    assert data["device"] == "cpu" and data["backend"] == "gloo"
