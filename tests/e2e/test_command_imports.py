"""A command imports the heavy libraries (scikit-learn, XGBoost, torch, JAX, matplotlib) only
when it uses them: each command runs in a fresh interpreter, on built-in defaults or the repo's
fixtures, and what it left in ``sys.modules`` is read after it ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("sklearn", "xgboost", "torch", "jax", "matplotlib")

pytestmark = pytest.mark.slow  # one fresh interpreter per command, ~1 s each

# runs the CLI with the arguments given, then prints to stderr its exit code and the heavy
# top-level packages imported
_RUN = f"""
import json, sys
from paraplan.cli.app import app
code = 0
try:
    app(sys.argv[1:], prog_name="paraplan")
except SystemExit as exc:
    code = exc.code or 0
heavy = sorted(set({HEAVY!r}) & {{name.partition(".")[0] for name in sys.modules}})
print(json.dumps({{"code": code, "heavy": heavy}}), file=sys.stderr)
"""


def run_command(*args: str) -> dict:
    """Exit code and heavy packages of ``paraplan ARGS`` in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", _RUN, *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "80"}, timeout=300)
    return json.loads(done.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("args", [
    ["predict"],
    ["compare", "--vs", "tp=4"],
    ["search"],
    ["export", "megatron", "examples/mistral-7b-one-node.yaml"],
    ["validate", "runs", "benchmarks/data/runs_moe_dev.json"],
    ["catalog", "gpus"],
    ["trace", "summarize", "tests/fixtures/traces/ddp"],
], ids=" ".join)
def test_a_command_that_draws_and_learns_nothing_imports_no_heavy_library(args):
    assert run_command(*args) == {"code": 0, "heavy": []}


def test_a_command_that_draws_a_picture_imports_matplotlib_and_nothing_else_heavy(tmp_path):
    pytest.importorskip("matplotlib")
    picture = tmp_path / "breakdown.png"
    assert run_command("predict", "--plot", str(picture)) == {"code": 0, "heavy": ["matplotlib"]}
    assert picture.stat().st_size > 0
