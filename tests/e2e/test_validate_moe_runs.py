"""`paraplan validate runs benchmarks/data/runs_moe_dev.json`: the published MoE runs whose records
state Megatron-LM's pipeline split are predicted; the one whose split is unpublished says why
it is skipped. Validation only: nothing is fitted to these runs."""

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.specs.pipeline_layout import SPLIT_FIELDS

RUNS_MOE = Path(__file__).parents[2] / "benchmarks" / "data" / "runs_moe_dev.json"


def test_validate_runs_predicts_the_moe_runs_stating_a_split_and_skips_only_the_dualpipe_one():
    result = CliRunner().invoke(app, ["validate", "runs", str(RUNS_MOE)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    stated = [r["id"] for r in json.loads(RUNS_MOE.read_text()) if any(k in r["parallel"] for k in SPLIT_FIELDS)]
    assert len(stated) == 7
    skipped = [line for line in result.output.splitlines() if line.startswith("skipped: ")]
    assert len(skipped) == 1 and "deepseek-v3-report-h800" in skipped[0]
    for run_id in stated:  # each has its signed error in the table
        assert re.search(rf"^{re.escape(run_id)}\s+[+-]\d+\.\d %$", result.output, re.MULTILINE), run_id
