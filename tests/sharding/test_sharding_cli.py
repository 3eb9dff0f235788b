"""`paraplan sharding FILE.py:FUNCTION --mesh ...` (issue 5): the plan, its blocks and the check
of the compiled plan, as a table or JSON; bad input is one line and exit code 2."""

import json

import pytest

jax = pytest.importorskip("jax")
from gpt_example import EXAMPLES  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from paraplan.cli.app import app  # noqa: E402
from readable import WIDTHS, assert_readable_text  # noqa: E402

GPT = f"{EXAMPLES / 'gpt_block.py'}:train_step"
SMALL = "num_layers=2,hidden=64,batch=8,seq=16"


def run(*args):
    return CliRunner().invoke(app, ["sharding", *args])


def test_the_json_output_has_every_block_its_strategy_and_the_compiled_check(devices):
    result = run(GPT, "--mesh", "data=2,model=4", "--args", SMALL, "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    plan, check = data["plan"], data["verification"]
    assert plan["mesh"] == {"data": 2, "model": 4} and plan["layers_found"] == 2
    assert [b["weight"] for b in plan["blocks"][:4]] == ["layers.0.qkv", "layers.0.proj", "layers.0.fc1", "layers.0.fc2"]
    assert all(set(b) >= {"strategy", "partition_spec", "comm_bytes", "memory_bytes", "time_s"} for b in plan["blocks"])
    assert plan["fits"] and plan["time_s"] > 0 and plan["tflops_per_device"] > 0
    assert check["matches"] is True and check["flag"] is None
    assert check["analytic_collective_bytes"] == plan["comm_bytes"]


def test_the_table_folds_the_layers_and_reports_the_check(devices):
    result = run(GPT, "--mesh", "data=2,model=4", "--args", SMALL, "--memory-budget", "60GB")
    assert result.exit_code == 0, result.output
    assert "layers.*.qkv" in result.stdout and "numerics: the sharded step equals the unsharded one" in result.stdout


@pytest.mark.parametrize("width", WIDTHS)
def test_the_tables_keep_every_number_and_weight_whole(devices, width):
    """Issue 14: read at 80 and 200 columns, no cell is cut to '…'."""
    result = CliRunner().invoke(app, ["sharding", GPT, "--mesh", "data=2,model=4", "--args", SMALL],
                                env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    plan = json.loads(run(GPT, "--mesh", "data=2,model=4", "--args", SMALL, "--no-verify", "--format", "json").stdout)
    from paraplan.report.sharding import fold_blocks
    from paraplan.units import format_bytes, format_seconds

    rows = fold_blocks(plan["plan"]["blocks"])
    cells = [r["weight"] for r in rows] + [format_bytes(r["memory_bytes"]) for r in rows]
    assert_readable_text(result.stdout, width, cells + [format_seconds(r["time_s"]) for r in rows])


def test_shapes_only_analyses_without_running():
    result = run(GPT, "--args", "num_layers=4,hidden=512,batch=8,seq=128", "--shapes-only", "--no-verify",
                 "--format", "json", "--mesh", "data=8")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["verification"] is None


def test_a_budget_no_plan_meets_is_an_error_after_the_smallest_plan():
    result = run(GPT, "--args", SMALL, "--no-verify", "--memory-budget", "1KB")
    assert result.exit_code == 1
    assert "memory_budget:" in result.stderr and "over the budget" in result.stderr


@pytest.mark.parametrize(("args", "field"), [
    (["--mesh", "data=two"], "mesh:"),
    (["--mesh", "data=2,data=4"], "mesh:"),
    (["--args", "layers"], "args:"),
    (["--args", "no_such_argument=3"], "args:"),
    (["--memory-budget", "lots"], "memory_budget:"),
    (["--precision", "int3"], "precision:"),
    (["--example-args", "missing"], "example_args:"),
])
def test_bad_input_is_one_line_naming_the_field(args, field):
    result = run(GPT, "--no-verify", *args)
    assert result.exit_code == 2, result.output
    assert field in result.stderr and "Traceback" not in result.output


def test_a_target_that_is_not_file_and_function_is_one_line():
    for target in ("examples/sharding/none.py:train_step", "gpt_block.py", f"{EXAMPLES / 'gpt_block.py'}:nothing"):
        result = run(target, "--no-verify")
        assert result.exit_code == 2 and "target:" in result.stderr


@pytest.mark.slow
def test_profile_adds_xla_s_view_of_every_chosen_block(devices):
    result = run(GPT, "--mesh", "data=2,model=4", "--args", SMALL, "--profile", "--no-verify", "--format", "json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)["plan"]
    assert plan["costs"] == "analytic"  # CPU: compiled, not timed
    assert all(b["profile"]["xla_flops"] > 0 and b["profile"]["measured_s"] is None for b in plan["blocks"])


def test_a_budget_no_plan_meets_exits_1_naming_the_nearest_plan_in_stderr_and_json():
    result = run(GPT, "--args", SMALL, "--no-verify", "--memory-budget", "1KB", "--format", "json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["plan"]["fits"] is False
    for said in (data["no_plan"], " ".join(result.stderr.split())):
        assert said.startswith("no plan fits the memory budget") and "the nearest" in said
        assert "layers.*.qkv" in said and "batch sharded over" in said and "needs 256.00 KiB per device" in said


def test_help_says_the_target_s_code_is_run_and_the_exit_codes():
    text = " ".join(run("--help").output.split())
    assert "runs its code" in text and "only on code you trust" in text
    assert "Exit codes: 0 an answer; 1 a valid question with no answer" in text


def test_a_sharded_step_that_computes_something_else_is_an_internal_error_exit_3(monkeypatch):
    from paraplan.sharding.plan import ShardingPlan
    from paraplan.sharding.verify import Verification

    wrong = Verification(0.5, False, {}, {}, None, None, 0.0)
    monkeypatch.setattr(ShardingPlan, "verify", lambda self, fn, args: wrong)
    result = run(GPT, "--args", SMALL, "--mesh", "data=2")
    assert result.exit_code == 3
    assert "internal error:" in result.stderr and "differ from the unsharded" in result.stderr
