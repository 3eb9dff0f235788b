"""Whether a published MoE run forced its experts' load balance (Megatron-Core's
--moe-router-force-load-balancing), as each record states it from its launch configuration,
and what the records reader says of the balanced load it prices."""

from __future__ import annotations

import copy
from pathlib import Path

from paraplan.validate.records import job_from_record
from paraplan.validate.runs import load_runs

RUNS_MOE = Path(__file__).parents[2] / "benchmarks" / "data" / "runs_moe_dev.json"
GB200 = "megatron-docs-deepseek-v3-gb200-256gpu-mxfp8"


def _megatron_runs() -> list[dict]:
    return [r for r in load_runs(RUNS_MOE) if r["id"].startswith("megatron-")]


def _balance_notes(run: dict) -> list[str]:
    return [a for a in job_from_record(run).assumed if "expert load" in a]


def test_every_megatron_moe_record_states_whether_it_forced_the_balance_and_cites_it():
    runs = _megatron_runs()
    assert len(runs) == 9
    for run in runs:
        assert isinstance(run["parallel"]["moe_router_force_load_balancing"], bool), run["id"]
        assert "Load balancing: " in run["notes"], run["id"]
    forced = [r["id"] for r in runs if r["parallel"]["moe_router_force_load_balancing"]]
    assert forced == [GB200]


def test_a_run_that_forced_the_balance_has_no_balance_assumption():
    run = next(r for r in _megatron_runs() if r["id"] == GB200)
    assert _balance_notes(run) == []


def test_a_dropless_run_with_its_own_router_says_the_balanced_load_is_against_its_source():
    run = next(r for r in _megatron_runs() if r["id"].startswith("megatron-moezoo-qwen3"))
    (note,) = _balance_notes(run)
    assert "routed with its own router" in note and "not published" in note


def test_a_record_silent_on_the_balance_keeps_the_plain_assumption():
    run = copy.deepcopy(next(r for r in _megatron_runs() if r["id"].startswith("megatron-moezoo-qwen3")))
    del run["parallel"]["moe_router_force_load_balancing"]
    assert _balance_notes(run) == ["expert load perfectly balanced (the record gives no imbalance)"]


def test_the_balance_field_changes_no_prediction_input():
    run = next(r for r in _megatron_runs() if r["id"].startswith("megatron-moezoo-qwen3"))
    silent = copy.deepcopy(run)
    del silent["parallel"]["moe_router_force_load_balancing"]
    assert job_from_record(run).mapping == job_from_record(silent).mapping
