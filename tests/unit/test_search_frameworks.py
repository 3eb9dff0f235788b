"""The search honours the framework: its space is what the framework runs (one table,
``specs.frameworks``), every plan it returns is one the framework launches, and predicting that
plan gives the time the search ranked it by."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from paraplan.catalog import load_cluster, load_model, resolve_job
from paraplan.catalog.jobfile import job_mapping
from paraplan.catalog.jobs import demo_job_mapping, load_job
from paraplan.cli.app import app
from paraplan.prediction import predict
from paraplan.search import SearchSpace, search_plans
from paraplan.specs import ConfigError, Precision, Recompute, Schedule
from paraplan.specs.frameworks import FRAMEWORKS, framework_refusal, plan_refusal, unrunnable_note


def _demo():
    return resolve_job(demo_job_mapping())


def test_an_fsdp_search_of_the_demo_job_ranks_zero_3_and_never_zero_1_or_2():
    demo = _demo()
    result = search_plans(demo.model, demo.cluster, demo.parallel.global_batch_size, demo.precision,
                          SearchSpace(framework="fsdp"))
    stages = {p.job.parallel.zero_stage for p in result.ranked}
    assert result.ranked[0].job.parallel.zero_stage == 3
    assert stages <= {0, 3}
    # hybrid sharding within a node is tried: 8 GPUs a node, tp ranks apart
    hybrid = [p.job.parallel for p in result.ranked if p.job.parallel.data_parallel_shard_degree is not None]
    assert hybrid and all(q.zero_shards == 8 // q.tp for q in hybrid)
    # torchtitan's per-op selective recompute is searched, Megatron's selective is not
    assert Recompute.OP in {p.job.parallel.recompute for p in result.ranked}
    assert Recompute.SELECTIVE not in {p.job.parallel.recompute for p in result.ranked}


def test_paraplan_search_framework_fsdp_on_the_demo_job_returns_torchtitan_plans_and_says_so(tmp_path):
    best = tmp_path / "best.yaml"
    result = CliRunner().invoke(app, ["search", "--framework", "fsdp", "--format", "json", "--top", "50",
                                      "--save-best", str(best)])
    assert result.exit_code == 0, result.output
    plans = json.loads(result.stdout)["plans"]
    assert plans[0]["zero_stage"] == 3 and {p["zero_stage"] for p in plans} <= {0, 3}
    assert {p["framework"] for p in plans} == {"fsdp"}
    assert any("data_parallel_shard_degree" in p for p in plans)  # hybrid sharding, named in the row
    saved = load_job(best)  # what --save-best wrote, as predict reads it
    assert saved.parallel.framework.value == "fsdp"
    assert predict(saved).iteration_s == pytest.approx(plans[0]["iteration_s"], rel=1e-12)


def test_predicting_the_plan_an_fsdp_search_returns_gives_the_time_it_was_ranked_by():
    demo = _demo()
    best = search_plans(demo.model, demo.cluster, demo.parallel.global_batch_size, demo.precision,
                        SearchSpace(framework="fsdp", tp=(1, 2), pp=(1,), micro_batch_size=(1, 2))).ranked[0]
    again = resolve_job(job_mapping(best.job))  # the plan as --save-best writes it
    assert again.parallel.framework.value == "fsdp"
    assert predict(again).iteration_s == best.iteration_s


def test_the_same_search_under_megatron_returns_its_distributed_optimizer_instead():
    demo = _demo()
    space = dict(tp=(1, 2), pp=(1,), micro_batch_size=(1, 2))
    megatron = search_plans(demo.model, demo.cluster, 512, demo.precision, SearchSpace(framework="megatron", **space))
    assert {p.job.parallel.zero_stage for p in megatron.ranked} <= {0, 1}
    assert 1 in {p.job.parallel.zero_stage for p in megatron.ranked}


def test_a_deepspeed_search_with_pipelines_never_returns_zero_2_or_3_nor_interleaving():
    model, cluster = load_model("gpt3-1.3b"), load_cluster("dgx-a100", num_nodes=2)
    space = SearchSpace(framework="deepspeed", tp=(1, 2), pp=(1, 2, 4), vpp=(1, 2), micro_batch_size=(1, 2))
    result = search_plans(model, cluster, 64, Precision.BF16, space, shortlist=10_000)
    plans = [p.job.parallel for p in result.ranked]
    assert space.zero_stage == (0, 1, 2, 3)
    assert any(q.pp > 1 for q in plans) and any(q.zero_stage >= 2 for q in plans)  # both kinds are there
    assert all(q.zero_stage <= 1 for q in plans if q.pp > 1)
    assert all(q.vpp == 1 and q.schedule is Schedule.ONE_F_ONE_B for q in plans)
    assert any("pipeline engine runs ZeRO stage 0 or 1" in reason for reason in result.excluded)
    assert any("has no 'interleaved' schedule" in reason for reason in result.excluded)


def test_a_megatron_search_never_returns_fsdp_only_shapes():
    model, cluster = load_model("gpt3-1.3b"), load_cluster("dgx-a100", num_nodes=2)
    space = SearchSpace(framework="megatron", tp=(1, 2), pp=(1, 2), micro_batch_size=(1,), zero_stage=(0, 1, 2, 3),
                        recompute=(Recompute.NONE, Recompute.FULL, Recompute.OP, Recompute.LAYER),
                        schedule=("1f1b", "gpipe", "zb-h1"), shard_nodes=(None, 1))
    result = search_plans(model, cluster, 64, Precision.BF16, space, shortlist=10_000)
    plans = [p.job.parallel for p in result.ranked]
    assert plans
    assert all(q.recompute in (Recompute.NONE, Recompute.FULL) for q in plans)
    assert all(q.schedule is Schedule.ONE_F_ONE_B for q in plans)
    assert all(q.data_parallel_shard_degree is None or q.zero_stage == 1 for q in plans)
    reasons = " | ".join(result.excluded)
    assert "megatron has no 'op' recompute" in reasons and "has no 'gpipe' schedule" in reasons
    assert "needs framework 'fsdp'" in reasons


def test_torchtitan_replicates_with_ddp_only_when_data_parallelism_is_all_there_is():
    kw = dict(pp=1, cp=1, dp=16, zero_stage=0)
    assert framework_refusal("fsdp", tp=1, **kw) is None
    assert "only when data parallelism is the only parallelism" in framework_refusal("fsdp", tp=2, **kw)
    assert framework_refusal("fsdp", tp=2, **{**kw, "zero_stage": 3}) is None
    assert framework_refusal("megatron", tp=2, **kw) is None
    assert framework_refusal("fsdp", tp=8, pp=1, cp=1, dp=1, zero_stage=0) is None  # no data parallelism


def test_each_framework_s_default_and_full_spaces_hold_only_what_it_runs():
    for framework, offer in FRAMEWORKS.items():
        for space in (SearchSpace(framework=framework.value), SearchSpace.full(framework=framework.value)):
            assert set(space.zero_stage) <= set(offer.zero_stages)
            assert set(space.recompute) <= set(offer.recompute)
            assert all(framework_refusal(framework, tp=1, pp=1, cp=1, dp=8, zero_stage=z, recompute=r) is None
                       for z in space.zero_stage if z > 0 for r in space.recompute)
            if space.schedule is not None:
                assert {Schedule(s) for s in space.schedule} <= set(offer.schedules)
    assert SearchSpace.full(framework="deepspeed").vpp == (1,) and SearchSpace.full(framework="deepspeed").cp == (1,)
    assert SearchSpace.full(framework="fsdp").zero_stage == (0, 3)
    assert SearchSpace(framework="megatron").zero_stage == (0, 1)  # today's default space, unchanged


def test_an_unknown_framework_or_a_bad_hybrid_axis_fails_naming_the_field():
    with pytest.raises(ConfigError, match="framework: 'jax'"):
        SearchSpace(framework="jax")
    with pytest.raises(ConfigError, match="shard_nodes"):
        SearchSpace(framework="fsdp", shard_nodes=(0,))


@st.composite
def small_searches(draw):
    framework = draw(st.sampled_from(("megatron", "deepspeed", "fsdp")))
    name, nodes = draw(st.sampled_from((("dgx-a100", 1), ("dgx-a100", 2), ("perlmutter", 4))))
    space = SearchSpace(
        framework=framework,
        pp=draw(st.sampled_from(((1,), (1, 2), (2, 4)))),
        cp=draw(st.sampled_from(((1,), (1, 2)))),
        vpp=draw(st.sampled_from(((1,), (1, 2)))),
        micro_batch_size=draw(st.sampled_from(((1,), (1, 2)))),
        zero_stage=draw(st.sampled_from(((0, 1, 2, 3), None))),
        recompute=draw(st.sampled_from((tuple(Recompute), None))),
        schedule=draw(st.sampled_from((None, ("1f1b", "gpipe", "zb-h1", "zb-v")))),
        shard_nodes=draw(st.sampled_from(((None, 1), None))),
    )
    return load_model(draw(st.sampled_from(("gpt3-125m", "gpt3-1.3b")))), load_cluster(name, num_nodes=nodes), space


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_searches())
def test_every_plan_a_search_returns_is_one_its_framework_runs(case):
    model, cluster, space = case
    result = search_plans(model, cluster, 32, Precision.BF16, space, shortlist=20)
    for pred in result.ranked:
        q = pred.job.parallel
        assert q.framework.value == space.framework
        assert plan_refusal(q, model.is_moe) is None, pred.job.name
        assert resolve_job(job_mapping(pred.job)).parallel == q  # and it validates as a job file


def test_the_screen_times_and_sizes_hybrid_sharding_and_torchtitan_s_recompute_as_predict_does():
    from paraplan.search.screen import screen_plans

    model, cluster = load_model("gpt3-1.3b"), load_cluster("dgx-a100", num_nodes=2)
    space = SearchSpace(framework="fsdp", pp=(1, 2), micro_batch_size=(1, 2), zero_stage=(3,),
                        recompute=(Recompute.OP, Recompute.LAYER, Recompute.FULL), shard_nodes=(None, 1))
    screen = screen_plans(model, cluster, 64, Precision.BF16, space)
    jobs = [screen.job(i) for i in range(len(screen))]
    assert any(j.parallel.data_parallel_shard_degree for j in jobs)
    assert {j.parallel.recompute for j in jobs} == {Recompute.OP, Recompute.LAYER, Recompute.FULL}
    for i, job in enumerate(jobs):
        pred = predict(job)
        assert screen.memory_bytes[i] == pytest.approx(max(m.total for m in pred.memory), rel=1e-12)
        assert screen.iteration_s[i] == pytest.approx(pred.iteration_s, rel=0.005), job.name


def test_shard_nodes_picks_the_hybrid_groups_the_cli_search_tries_and_a_bad_value_is_one_line():
    runner = CliRunner()
    base = ["search", "--model", "gpt3-1.3b", "--cluster", "dgx-a100", "--num-nodes", "4", "--global-batch-size", "64",
            "--framework", "fsdp", "--tp", "1", "--pp", "1", "--mbs", "1", "--zero", "3", "--format", "json"]
    whole = json.loads(runner.invoke(app, [*base, "--shard-nodes", "all"]).stdout)["plans"]
    hybrid = json.loads(runner.invoke(app, [*base, "--shard-nodes", "1,2"]).stdout)["plans"]
    assert not any("data_parallel_shard_degree" in p for p in whole)
    assert {p.get("data_parallel_shard_degree") for p in hybrid} == {8, 16}  # 1 and 2 nodes of 8 ranks
    bad = runner.invoke(app, [*base, "--shard-nodes", "half"])
    assert bad.exit_code == 2 and bad.stderr.strip().count("\n") == 0 and "--shard-nodes" in bad.stderr


def test_a_plan_its_framework_cannot_run_carries_a_note_that_names_the_field_and_the_framework():
    def plan(zero):
        return resolve_job({"model": "llama-3-8b", "cluster": {"name": "dgx-h100", "num_nodes": 1},
                            "parallel": {"framework": "fsdp", "zero_stage": zero, "recompute": "full",
                                         "micro_batch_size": 1, "global_batch_size": 64}})

    note = unrunnable_note(plan(1))
    assert note.startswith("the framework cannot run this plan (predicted as a what-if): parallel.zero_stage: ")
    assert "torchtitan" in note and "ZeRO-1" in note
    assert unrunnable_note(plan(3)) is None


def test_on_one_node_the_default_shard_nodes_all_and_1_consider_as_many_plans_as_all_alone():
    runner = CliRunner()
    base = ["search", "--framework", "fsdp", "--num-nodes", "1", "--format", "json"]
    default = runner.invoke(app, base)
    whole = runner.invoke(app, [*base, "--shard-nodes", "all"])
    assert default.exit_code == 0 and whole.exit_code == 0, default.output + whole.output
    default, whole = json.loads(default.stdout), json.loads(whole.stdout)
    assert default["considered"] == whole["considered"]
    assert default["excluded"] == whole["excluded"]


def test_the_exact_search_on_one_node_counts_shard_nodes_1_as_the_whole_group():
    demo = _demo()
    one_node = demo.cluster.model_copy(update={"num_nodes": 1})
    counts = []
    for nodes in ((None, 1), (None,)):
        space = SearchSpace(framework="fsdp", shard_nodes=nodes, tp=(1, 2, 3), pp=(1,), zero_stage=(3,),
                            recompute=(Recompute.FULL,))
        result = search_plans(demo.model, one_node, demo.parallel.global_batch_size, demo.precision, space,
                              screen=False)
        counts.append((result.considered, dict(result.excluded), len(result.ranked)))
    assert counts[0] == counts[1]


def test_a_shard_group_over_every_node_of_the_cluster_is_full_sharding_and_a_smaller_one_stays():
    space = SearchSpace(framework="fsdp", shard_nodes=(None, 1, 2, 4))
    assert space.on_nodes(1).shard_nodes == (None,)
    assert space.on_nodes(2).shard_nodes == (None, 1)
    assert space.on_nodes(8).shard_nodes == (None, 1, 2, 4)
