"""Predicted peak memory against published runs that report theirs (tests/golden/data/
published_memory.json, each run with its source, the quoted figure and what it measured).

Each run says what its figure is (``measured_kind``) and is compared with the matching
prediction: ``reserved`` (the caching allocator's peak, what torchtitan's and Megatron's logs
report) with ``PlanMemory.reserved``, ``allocated`` (``max_memory_allocated``) with
``PlanMemory.allocated``, ``nvidia_smi`` (the whole process, context and NCCL included) with
``PlanMemory.total``, of the worst stage or of the stage the run names (``measured_stage``: the
pipeline stage of the rank that logged the figure).

The goal (issue 24): the median signed error within 10 % and no run predicted more than 5 %
below what it measured. The second is not met yet: the runs that miss it say why
(``known_optimistic``) and are strict expected failures, so a run that starts passing (or one
that starts failing) shows. Every run must also stay in the band the model is trusted to today.
The constants come from framework code and allocator measurements (``catalog/runtime/
memory.yaml``); these runs only check them.

``python -m pytest tests/golden/test_published_memory.py -s`` prints the table of signed
errors per run and per source."""

import functools
import json
import statistics
from pathlib import Path

import pytest

from paraplan.catalog import resolve_job
from paraplan.prediction import predict

RUNS = json.loads((Path(__file__).parent / "data" / "published_memory.json").read_text())["runs"]
BY_ID = {r["id"]: r for r in RUNS}

# what each kind of measurement is compared with (PlanMemory's attributes)
PREDICTED_FIGURE = {"reserved": "reserved", "allocated": "allocated", "nvidia_smi": "total"}

# The band every run is predicted within today (signed error). Not the goal: what a user can
# rely on now, and what a change to the memory model must not leave.
BAND = (-0.25, 0.40)
GIB = 2**30


@functools.cache
def predicted_gib(run_id: str, kind: str) -> float:
    """The predicted figure of the stage the run measured (``measured_stage``: the pipeline
    stage of the rank that logged it), else of the worst stage."""
    memory = predict(resolve_job(BY_ID[run_id]["job"])).memory
    stage = BY_ID[run_id].get("measured_stage")
    return getattr(memory if stage is None else memory[stage], PREDICTED_FIGURE[kind]) / GIB


def measured_gib(run: dict) -> float:
    """The run's figure: the mean of the reports of the same configuration (ranks, repeats)."""
    return statistics.mean(run["measured_gib"])


def signed_error(run: dict, kind: str | None = None) -> float:
    """(predicted - measured) / measured, of the figure the run measured (or of ``kind``, the
    run's ``also_<kind>_gib``)."""
    if kind is None:
        kind, measured = run["measured_kind"], measured_gib(run)
    else:
        measured = statistics.mean(run[f"also_{kind}_gib"])
    return (predicted_gib(run["id"], kind) - measured) / measured


def framework(run: dict) -> str:
    return run["job"]["parallel"]["framework"]


def error_table(runs: list[dict]) -> str:
    """Signed errors per run, then per source (median, median of the absolute errors, most
    optimistic, most pessimistic)."""
    lines = [f"{'run':<30} {'kind':<9} {'measured':>8} {'predicted':>9} {'error':>7}  note"]
    for key in dict.fromkeys(r["source_key"] for r in runs):
        lines.append(f"{key} ({framework(next(r for r in runs if r['source_key'] == key))})")
        for r in (r for r in runs if r["source_key"] == key):
            kind = r["measured_kind"]
            note = "!" if "known_optimistic" in r else ""
            if "also_allocated_gib" in r:
                note = f"{note} a{signed_error(r, 'allocated'):+.1%}".strip()
            lines.append(f"  {r['label']:<28} {kind:<9} {measured_gib(r):8.2f} "
                         f"{predicted_gib(r['id'], kind):9.2f} {signed_error(r):+7.1%}  {note}")
    lines += ["! more than 5 % below the measurement (known_optimistic); a: the error of the",
              "  peak allocated memory where the run reports it too", "", f"{'source':<32} {'runs':>4} {'median':>7} {'|error|':>7} {'lowest':>7} {'highest':>7}"]
    groups = {}
    for r in runs:
        groups.setdefault(r["source_key"], []).append(signed_error(r))
    groups["all"] = [signed_error(r) for r in runs]
    for key, errors in groups.items():
        lines.append(f"{key:<32} {len(errors):>4} {statistics.median(errors):+7.1%} "
                     f"{statistics.median(abs(e) for e in errors):7.1%} {min(errors):+7.1%} {max(errors):+7.1%}")
    return "\n".join(lines)


def _goal_param(run: dict):
    if "known_optimistic" in run:
        return pytest.param(run, id=run["id"], marks=pytest.mark.xfail(strict=True, reason=run["known_optimistic"]))
    return pytest.param(run, id=run["id"])


@pytest.mark.parametrize("run", [_goal_param(r) for r in RUNS])
def test_no_published_run_is_predicted_more_than_5_percent_below_its_memory(run):
    assert signed_error(run) > -0.05, run["source"]


@pytest.mark.parametrize("run", RUNS, ids=[r["id"] for r in RUNS])
def test_every_published_run_is_predicted_within_the_band_the_model_is_trusted_to(run):
    low, high = BAND
    assert low <= signed_error(run) <= high, (f"{signed_error(run):+.1%}", run["source"])


def test_the_median_memory_error_over_the_published_runs_is_within_10_percent():
    errors = [signed_error(r) for r in RUNS]
    assert abs(statistics.median(errors)) <= 0.10, error_table(RUNS)


def test_the_published_runs_come_from_several_sources_and_frameworks():
    assert len({r["source_key"] for r in RUNS}) >= 4
    assert {framework(r) for r in RUNS} >= {"fsdp", "megatron"}


def test_every_published_run_names_its_source_what_it_measured_and_what_it_left_out():
    for run in RUNS:
        assert run["source"] and run["source_url"].startswith("https://") and run["quote"], run["id"]
        assert run["measured_kind"] in PREDICTED_FIGURE, run["id"]
        assert run["measured_kind"].replace("_", "-") in run["measured"].replace("_", "-").replace(" ", "-"), run["id"]
        assert run["config_source"] and isinstance(run["not_modelled"], list), run["id"]
        assert isinstance(run["inferred_fields"], list) and run["label"], run["id"]
        stage = run.get("measured_stage")
        assert stage is None or 0 <= stage < run["job"]["parallel"].get("pp", 1), run["id"]
    assert len({r["id"] for r in RUNS}) == len(RUNS)


def test_the_error_table_names_every_run_and_source_within_80_columns():
    table = error_table(RUNS)
    print("\n" + table)
    assert all(len(line) <= 80 for line in table.splitlines()), max(table.splitlines(), key=len)
    for run in RUNS:
        assert run["label"] in table and run["source_key"] in table
