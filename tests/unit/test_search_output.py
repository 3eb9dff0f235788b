"""What `paraplan search` shows (issue 14, part 4): one row per distinct run, the whole space on
the command line, a Pareto front of every non-dominated plan, an empty result that says which
bound excluded everything, and tables that never cut a number at 80 or 200 columns."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from paraplan.catalog import load_cluster, load_model, resolve_job
from paraplan.cli.app import app
from paraplan.prediction import predict
from paraplan.report.pareto import pareto_plans
from paraplan.search import SearchSpace, pareto_front, search_plans
from paraplan.search.pareto import near_front
from paraplan.search.screen import screen_plans
from paraplan.search.space import enumerate_plans, iter_unique, runs_as_zero
from paraplan.specs import Precision, Recompute

runner = CliRunner()
LLAMA_JOB = str(Path(__file__).resolve().parents[2] / "examples" / "llama-3-70b-dgx-h100-tp8-pp4.yaml")


def _invoke(args: list[str], columns: int = 200):
    return runner.invoke(app, ["search", *args], env={"COLUMNS": str(columns)})


# --- one row per run ---------------------------------------------------------------------


def _same_run(a, b) -> bool:
    da, db = a.to_dict(), b.to_dict()
    for d in (da, db):
        d["parallel"].pop("zero_stage")
        d.pop("job", None)
    return da == db


@pytest.mark.parametrize("precision", [Precision.BF16, Precision.FP8])
@pytest.mark.parametrize("framework", ["megatron", "deepspeed", "fsdp"])
def test_with_one_rank_per_gradient_group_zero_1_and_2_run_as_zero_0(precision, framework):
    """The reasoning behind the dedupe, checked on the model itself: with dp x cp = 1 ZeRO
    shards over one rank, so ZeRO-1 and ZeRO-2 predict exactly what ZeRO 0 predicts; ZeRO-3
    too, except in FP8, where it holds the FP8 copy of the layer being gathered."""
    base = {"model": "llama-3-8b", "cluster": {"name": "dgx-h100", "num_nodes": 1}, "precision": precision.value,
            "parallel": {"tp": 4, "pp": 2, "dp": 1, "micro_batch_size": 1, "global_batch_size": 8,
                         "sequence_parallel": True, "framework": framework}}
    preds = {}
    for zero in range(4):
        try:
            preds[zero] = predict(resolve_job({**base, "parallel": {**base["parallel"], "zero_stage": zero}}))
        except Exception:  # DeepSpeed's pipeline engine refuses ZeRO-2/3 with pp > 1
            continue
    for zero, pred in preds.items():
        same = _same_run(pred, preds[0])
        assert same == (runs_as_zero(zero, 1, precision) == 0), (zero, framework, precision)
    # with two ranks every stage is a different run
    assert runs_as_zero(1, 2, Precision.BF16) == 1 and runs_as_zero(3, 2, Precision.FP8) == 3


def test_a_dp_1_plan_is_listed_once_whatever_zero_stages_the_space_holds():
    model, cluster = load_model("gpt3-1.3b"), load_cluster("dgx-a100", num_nodes=1)
    space = SearchSpace(tp=(8,), pp=(1,), micro_batch_size=(1,), zero_stage=(0, 1, 2, 3), recompute=(Recompute.NONE,))
    screen = screen_plans(model, cluster, 8, Precision.BF16, space)
    assert len(screen) == 1 and screen.job(0).parallel.zero_stage == 0  # dp = 1: one run, ZeRO 0 kept
    jobs = list(iter_unique(enumerate_plans(model, cluster, 8, Precision.BF16, space).jobs))
    assert [j.parallel for j in jobs] == [screen.job(0).parallel]
    fp8 = screen_plans(model, load_cluster("dgx-h100", num_nodes=1), 8, Precision.FP8, space)
    assert sorted(int(z) for z in fp8.plans["zero"]) == [0, 3]  # FP8 ZeRO-3 holds one more layer's copy
    # a space without ZeRO 0 keeps its first stage as the label
    only = screen_plans(model, cluster, 8, Precision.BF16, SearchSpace(**{**space.__dict__, "zero_stage": (2, 1)}))
    assert len(only) == 1 and only.job(0).parallel.zero_stage == 2


def test_the_top_plans_of_the_readme_job_hold_no_duplicate_runs():
    result = _invoke([LLAMA_JOB, "--top", "50", "--format", "json"])
    assert result.exit_code == 0, result.output
    plans = json.loads(result.stdout)["plans"]
    keys = [(p["tp"], p["pp"], p["cp"], p["vpp"], p["micro_batch_size"], p["recompute"], p["sequence_parallel"],
             p["zero_stage"] if p["dp"] * p["cp"] > 1 else 0) for p in plans]
    assert len(keys) == len(set(keys)) and any(p["dp"] == 1 for p in plans)


# --- the whole space on the command line --------------------------------------------------


def test_space_full_searches_context_parallel_interleaving_and_zero_2_3():
    result = _invoke(["--model", "llama-3-8b", "--cluster", "dgx-h100", "--num-nodes", "2", "--global-batch-size", "64",
                      "--space", "full", "--top", "400", "--format", "json"])
    assert result.exit_code == 0, result.output
    plans = json.loads(result.stdout)["plans"]
    assert {p["cp"] for p in plans} > {1} and {p["vpp"] for p in plans} > {1}
    assert {p["zero_stage"] for p in plans} >= {2, 3}
    assert {p["micro_batch_size"] for p in plans} <= {1, 2, 4, 8, 16}
    both = _invoke(["--model", "llama-3-8b", "--cluster", "dgx-h100", "--global-batch-size", "64", "--tp", "2",
                    "--pp", "1", "--sp", "on,off", "--top", "100", "--format", "json"])
    assert {p["sequence_parallel"] for p in json.loads(both.stdout)["plans"]} == {True, False}


def test_list_flags_set_each_axis_of_the_space():
    result = _invoke(["--model", "llama-3-8b", "--cluster", "dgx-h100", "--num-nodes", "2", "--global-batch-size",
                      "64,128", "--tp", "2,4", "--pp", "2", "--cp", "1,2", "--vpp", "1,2", "--mbs", "1", "--zero", "0,3",
                      "--recompute", "selective", "--sp", "off", "--top", "500", "--format", "json"])
    assert result.exit_code == 0, result.output
    plans = json.loads(result.stdout)["plans"]
    assert {p["tp"] for p in plans} == {2, 4} and {p["pp"] for p in plans} == {2}
    assert {p["cp"] for p in plans} == {1, 2} and {p["vpp"] for p in plans} == {1, 2}
    assert {p["zero_stage"] for p in plans} == {0, 3} and {p["recompute"] for p in plans} == {"selective"}
    assert {p["sequence_parallel"] for p in plans} == {False}
    assert {p["global_batch_size"] for p in plans} == {64, 128}


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--zero", "0,4", "zero: ZeRO stages are 0, 1, 2 or 3"),
    ("--cp", "0", "cp: expected positive whole numbers"),
    ("--vpp", "two", "vpp: expected comma-separated whole numbers"),
    ("--sp", "maybe", "sp: expected on, off or on,off"),
    ("--recompute", "some", "recompute: some is not one of"),
    ("--space", "huge", "space: 'huge' is not one of default, full"),
    ("--pareto-axis", "power", "pareto_axis: 'power' is not one of cost, memory"),
])
def test_bad_space_flags_are_one_line_errors(flag, value, message):
    result = _invoke(["--model", "gpt3-1.3b", flag, value])
    assert result.exit_code == 2
    assert message in result.stderr and "Traceback" not in result.output


def test_the_help_names_every_axis():
    text = re.sub(r"\s+", " ", runner.invoke(app, ["search", "--help"], env={"COLUMNS": "200"}).stdout)
    for flag in ("--space", "--tp", "--pp", "--cp", "--vpp", "--mbs", "--zero", "--recompute", "--sp", "--shard-nodes",
                 "--pareto-axis"):
        assert flag in text


# --- the Pareto front ---------------------------------------------------------------------


def test_near_front_keeps_the_front_and_with_slack_a_superset():
    rng = np.random.default_rng(1)
    for _ in range(100):
        t, y = rng.random(60), rng.integers(0, 20, 60).astype(float)  # ties in y too
        exact = {int(i) for i in pareto_front(range(60), t.__getitem__, y.__getitem__)}
        assert exact <= set(near_front(t, y, 0.0).tolist())
        noisy = t * (1 + rng.uniform(-0.02, 0.02, 60))  # "screened" times within 2 %
        assert exact <= set(near_front(noisy, y, 0.05).tolist())


CASES = {
    "gpt3-1.3b, 16 A100": ("gpt3-1.3b", "dgx-a100", 2, Precision.BF16, SearchSpace(micro_batch_size=(1, 2, 4))),
    "llama-3-8b, 16 H100, interleaved and ZeRO-3": (
        "llama-3-8b", "dgx-h100", 2, Precision.BF16,
        SearchSpace(vpp=(1, 2, 4), zero_stage=(0, 1, 3), micro_batch_size=(1, 2))),
    "llama-3-8b, 8 H100, fp8": ("llama-3-8b", "dgx-h100", 1, Precision.FP8, SearchSpace(zero_stage=(0, 3))),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_the_memory_front_holds_every_non_dominated_plan_of_the_space(case):
    """Brute force: every plan of the space predicted exactly; the search's front (screened,
    its candidates predicted exactly) is the same set of plans."""
    name, cluster_name, nodes, precision, space = CASES[case]
    model, cluster = load_model(name), load_cluster(cluster_name, num_nodes=nodes)
    brute = search_plans(model, cluster, 64, precision, space, screen=False)
    expected = pareto_front(brute.ranked, lambda p: 1 / p.tokens_per_s, lambda p: p.worst_memory.total)
    fast = search_plans(model, cluster, 64, precision, space, pareto="memory")
    front, to_train = pareto_plans(fast, "memory")
    assert not to_train
    assert [p.job.parallel for p in front] == [p.job.parallel for p in expected]
    assert len(front) > 1  # a trade-off, not the fastest plan alone
    assert len(fast.scored[0].seconds_per_token) == len(brute.ranked)  # every plan that fits is scored


def test_the_cost_front_spans_sizes_and_gpu_types():
    model = load_model("gpt3-1.3b")
    results = [search_plans(model, load_cluster(c, num_nodes=n), 64, Precision.BF16, SearchSpace(),
                            train_tokens=1e10, pareto="cost", screen=screen)
               for c in ("aws-p4de.24xlarge", "aws-p5.48xlarge") for n in (1, 2, 4) for screen in (True,)]
    from paraplan.search import merge_results

    merged = merge_results(results)
    front, to_train = pareto_plans(merged, "cost")
    assert to_train and len(merged.configurations) == 6
    # on one cluster at one size cost is proportional to time: at most one plan per configuration
    configs = [(p.job.cluster.name, p.job.cluster.num_gpus) for p in front]
    assert len(configs) == len(set(configs))
    everything = [p for r in results for p in r.ranked]
    for p in everything:  # nothing the search ranked dominates a front plan
        assert not any(q.time_to_train_s < p.time_to_train_s and q.cost_to_train_usd < p.cost_to_train_usd
                       for q in everything if p in front)


def test_a_single_cluster_pareto_chart_trades_time_against_memory(tmp_path):
    chart = tmp_path / "front.png"
    result = _invoke([LLAMA_JOB, "--pareto", str(chart), "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["pareto_axis"] == "memory" and len(data["pareto"]) > 5
    memory = [p["memory_per_gpu_bytes"] for p in data["pareto"]]
    speed = [p["tokens_per_s"] for p in data["pareto"]]
    assert memory == sorted(memory, reverse=True) and speed == sorted(speed, reverse=True)
    assert chart.stat().st_size > 20_000
    priced = _invoke([LLAMA_JOB, "--pareto", str(chart), "--force",
                      "--pareto-axis", "cost", "--format", "json"])
    assert priced.exit_code == 0 and len(json.loads(priced.stdout)["pareto"]) == 1  # one cluster: the fastest
    unpriced = _invoke(["--model", "gpt3-1.3b", "--cluster", "dgx-a100", "--pareto", str(chart), "--force",
                        "--pareto-axis", "cost"])
    assert unpriced.exit_code == 2 and "price_per_gpu_hour" in unpriced.stderr


# --- nothing left -------------------------------------------------------------------------


def test_an_impossible_deadline_exits_1_naming_the_bound_and_the_nearest_plan():
    result = _invoke(["--deadline", "1d"])
    assert result.exit_code == 1
    assert "no plan meets the deadline" in result.stderr
    assert "the deadline is 24.0 h" in result.stderr and "d to train 1T tokens" in result.stderr
    assert "Nearest plan (misses the deadline)" in result.stdout and "misses the deadline" in result.stdout
    data = json.loads(_invoke(["--deadline", "1d", "--budget", "100USD", "--format", "json"]).stdout)
    assert data["plans"] == [] and data["closest"]["rank"] == 0
    assert set(data["closest"]["misses"]) == {"deadline", "budget"}
    assert data["closest"]["misses"]["budget"]["limit"] == 100.0
    # the nearest plan is the fastest plan: nothing beats its time
    fastest = json.loads(_invoke(["--format", "json", "--top", "1"]).stdout)["plans"][0]
    assert data["closest"]["tokens_per_s"] == pytest.approx(fastest["tokens_per_s"])


def test_no_plan_passing_the_rules_is_said_and_nothing_is_saved(tmp_path):
    best = tmp_path / "best.yaml"
    result = _invoke(["--model", "gpt3-1.3b", "--cluster", "dgx-a100", "--tp", "3", "--save-best", str(best)])
    assert result.exit_code == 1 and not best.exists()
    assert "no plan passes the rules" in result.stderr and "tp*pp*cp does not divide" in result.stderr
    assert f"nothing written to {best}" in re.sub(r"\s+", " ", result.stderr)


def test_the_saved_best_plan_names_its_hardware_and_predicts_the_searchs_best_time(tmp_path):
    import yaml

    from paraplan.catalog import load_job

    job = tmp_path / "slow-net.yaml"
    job.write_text(yaml.safe_dump({
        "model": "llama-3-8b", "parallel": {"global_batch_size": 64},
        "cluster": {"name": "aws-p5.48xlarge", "num_nodes": 2, "inter_node": {"bandwidth": "10 Gb/s", "latency": "10 us"}},
    }))
    best = tmp_path / "best.yaml"
    result = _invoke([str(job), "--top", "1", "--format", "json", "--save-best", str(best)])
    assert result.exit_code == 0, result.stderr
    saved = yaml.safe_load(best.read_text())
    assert saved["model"] == "llama-3-8b" and saved["cluster"]["name"] == "aws-p5.48xlarge"
    assert len(best.read_text().splitlines()) < 15
    searched = json.loads(result.stdout)["plans"][0]["iteration_s"]
    assert predict(load_job(best)).iteration_s == pytest.approx(searched, rel=1e-12)


# --- tables at 80 and 200 columns ---------------------------------------------------------

WIDE_SEARCHES = {
    "sizes and GPU types": ["--model", "gpt3-1.3b", "--sizes", "1,2", "--clusters", "aws-p4de.24xlarge,aws-p5.48xlarge",
                            "--global-batch-size", "64", "--train-tokens", "10B"],
    "node groups": ["--model", "gpt2-xl", "--cluster", "hetero-a100-a10", "--global-batch-size", "64"],
    "full space": ["--model", "llama-3-8b", "--cluster", "dgx-h100", "--num-nodes", "2", "--global-batch-size", "64",
                   "--space", "full", "--price-per-gpu-hour", "2.5 USD", "--train-tokens", "1T"],
}


@functools.cache
def _wide_plans(search: str) -> list[dict]:
    """The search's top 6 as JSON (one search per case, whatever the width of the table)."""
    return json.loads(_invoke([*WIDE_SEARCHES[search], "--top", "6", "--format", "json"]).stdout)["plans"]


@pytest.mark.parametrize("columns", [80, 200])
@pytest.mark.parametrize("search", WIDE_SEARCHES, ids=list(WIDE_SEARCHES))
def test_search_tables_cut_no_number_at_80_or_200_columns(search, columns):
    args = WIDE_SEARCHES[search]
    table = _invoke([*args, "--top", "6"], columns)
    assert table.exit_code == 0, table.output
    text = table.stdout
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= columns
    for p in _wide_plans(search):  # every number and name is printed whole
        assert f"{p['tokens_per_s']:,.0f}" in text and f"{p['iteration_s']:.2f}" in text
        if search == "sizes and GPU types":
            assert p["cluster"] in text
    if search == "sizes and GPU types":  # which cluster, and how many GPUs
        header = next(line for line in text.splitlines() if re.match(r"^\W*#\W", line))
        assert "cluster" in header and "GPUs" in header


def test_a_multi_size_search_shows_cluster_and_gpu_count_even_when_one_size_wins():
    result = _invoke(["--model", "gpt3-1.3b", "--cluster", "aws-p5.48xlarge", "--sizes", "1,2",
                      "--global-batch-size", "64", "--top", "3"])
    assert result.exit_code == 0, result.output
    header = next(line for line in result.stdout.splitlines() if "┃ #" in line)
    assert "cluster" in header and "GPUs" in header
