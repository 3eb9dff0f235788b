"""The plan search: exhaustive over its space, memory-aware, and honest about what it excluded."""

import itertools
import json

import pytest
from typer.testing import CliRunner

from paraplan.catalog import load_cluster, load_model, resolve_job
from paraplan.cli.app import app
from paraplan.prediction import predict
from paraplan.search import SearchSpace, search_plans
from paraplan.specs import ConfigError, Precision

SPACE = SearchSpace(micro_batch_size=(1, 2), zero_stage=(0, 1))


def small():
    return load_model("gpt3-1.3b"), load_cluster("dgx-a100", num_nodes=2)


def test_the_best_plan_equals_brute_force_over_the_same_space():
    model, cluster = small()
    result = search_plans(model, cluster, 64, Precision.BF16, SPACE)
    best = None
    for tp, pp, mbs, zero, rc in itertools.product((1, 2, 4, 8), (1, 2, 4, 8, 16), (1, 2), (0, 1), ("none", "selective", "full")):
        try:
            job = resolve_job({
                "model": "gpt3-1.3b", "cluster": {"name": "dgx-a100", "num_nodes": 2}, "precision": "bf16",
                "parallel": {"tp": tp, "pp": pp, "micro_batch_size": mbs, "global_batch_size": 64,
                             "zero_stage": zero, "recompute": rc, "sequence_parallel": tp > 1},
            })
        except ConfigError:
            continue
        if model.num_layers % pp:
            continue
        pred = predict(job)
        if pred.fits and (best is None or pred.tokens_per_s > best.tokens_per_s):
            best = pred
    assert result.ranked[0].tokens_per_s == pytest.approx(best.tokens_per_s)
    assert result.ranked[0].job.parallel == best.job.parallel


def test_every_ranked_plan_fits_and_every_excluded_plan_is_counted_under_a_reason():
    model, cluster = small()
    result = search_plans(model, cluster, 64, Precision.BF16, SPACE)
    assert all(p.fits for p in result.ranked)
    assert len(result.ranked) + sum(result.excluded.values()) == result.considered
    assert result.ranked == sorted(result.ranked, key=lambda p: -p.tokens_per_s)


def test_plans_that_do_not_fit_are_excluded_with_the_memory_reason():
    model, cluster = load_model("llama-2-70b"), load_cluster("dgx-a100", num_nodes=1)
    result = search_plans(model, cluster, 8, Precision.BF16, SearchSpace(micro_batch_size=(1,), zero_stage=(0,)))
    assert result.ranked == []
    # 80 GiB less the 5 % headroom
    assert result.excluded["does not fit in 76.00 GiB per GPU (its memory less the headroom)"] > 0


def test_a_deadline_and_a_budget_filter_plans_and_cost_needs_a_price():
    model, cluster = small()
    priced = load_cluster("aws-p4de.24xlarge", num_nodes=2)
    fast = search_plans(model, priced, 64, Precision.BF16, SPACE, objective="cost", train_tokens=1e9)
    assert fast.ranked and fast.ranked[0].usd_per_million_tokens <= fast.ranked[-1].usd_per_million_tokens
    none = search_plans(model, priced, 64, Precision.BF16, SPACE, train_tokens=1e12, deadline_s=1.0)
    assert none.ranked == [] and none.excluded["misses the deadline"] > 0
    with pytest.raises(ConfigError, match="objective: 'cost' needs a price"):
        search_plans(model, cluster, 64, Precision.BF16, SPACE, objective="cost")
    with pytest.raises(ConfigError, match="train_tokens"):
        search_plans(model, priced, 64, Precision.BF16, SPACE, budget_usd=1000.0)


def test_search_command_prints_plans_and_rejects_bad_objectives():
    runner = CliRunner()
    result = runner.invoke(app, ["search", "--model", "gpt3-1.3b", "--cluster", "dgx-a100", "--num-nodes", "2",
                                 "--global-batch-size", "64", "--format", "json", "--top", "3"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert len(data["plans"]) == 3 and data["plans"][0]["rank"] == 1
    bad = runner.invoke(app, ["search", "--model", "gpt3-1.3b", "--objective", "speed"])
    assert bad.exit_code == 2
    assert "objective: 'speed' is not one of time, cost" in bad.output


def test_the_pareto_front_keeps_exactly_the_undominated_points():
    from paraplan.search import pareto_front

    points = [(1, 9), (2, 5), (3, 6), (4, 1), (2, 7), (5, 1)]
    front = pareto_front(points, lambda p: p[0], lambda p: p[1])
    assert front == [(1, 9), (2, 5), (4, 1)]
    for p in points:
        dominated = any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in points)
        assert (p in front) == (not dominated)


def test_cluster_sizing_compares_sizes_and_writes_a_pareto_chart(tmp_path):
    runner = CliRunner()
    chart = tmp_path / "pareto.png"
    result = runner.invoke(app, ["search", "--model", "gpt3-1.3b", "--cluster", "aws-p4de.24xlarge", "--sizes", "1,2",
                                 "--global-batch-size", "64", "--train-tokens", "10B", "--pareto", str(chart),
                                 "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {p["gpus"] for p in data["plans"]} <= {"8 x A100-SXM4-80GB", "16 x A100-SXM4-80GB"}
    assert data["pareto"] and chart.stat().st_size > 10_000


def test_the_search_table_shows_why_plans_were_excluded():
    runner = CliRunner()
    result = runner.invoke(app, ["search", "--model", "llama-2-70b", "--cluster", "dgx-a100", "--num-nodes", "1",
                                 "--global-batch-size", "64"], env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output  # no plan fits: exit 1, the bound and the nearest plan said
    assert "Excluded plans" in result.output
    assert "does not fit in 76.00 GiB per GPU (its memory less the headroom)" in result.output
    assert "Nearest plan (does not fit)" in result.stdout
    assert "no plan fits in the GPU's memory" in result.stderr and "more GPUs" in result.stderr


def test_the_processes_executor_returns_the_same_results_as_serial():
    from paraplan.search.executors import run_searches

    model = load_model("gpt3-1.3b")
    searches = [
        dict(model=model, cluster=load_cluster("dgx-a100", num_nodes=n), global_batch_size=64, space=SPACE)
        for n in (1, 2)
    ]
    serial = run_searches(searches, "serial")
    parallel = run_searches(searches, "processes", workers=2)
    for a, b in zip(serial, parallel, strict=True):
        assert [p.job.parallel for p in a.ranked] == [p.job.parallel for p in b.ranked]
        assert [p.iteration_s for p in a.ranked] == [p.iteration_s for p in b.ranked]
        assert a.excluded == b.excluded


def test_an_unknown_or_missing_executor_is_a_one_line_error():
    from paraplan.search.executors import run_searches

    with pytest.raises(ConfigError, match="executor: 'threads' is not one of serial, processes, ray"):
        run_searches([{}, {}], "threads")
    try:
        import ray  # noqa: F401
    except ImportError:
        model = load_model("gpt2")
        with pytest.raises(ConfigError, match="Ray is not installed"):
            run_searches([dict(model=model, cluster=load_cluster("dgx-a100"), global_batch_size=8)] * 2, "ray")
