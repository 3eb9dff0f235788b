"""Expert parallelism and pipeline schedules as axes of the search (issue 18, part 5): the
screen models ep and etp for mixtures of experts whose layers are all one kind, with memory
equal to ``estimate_memory``'s and time close to ``predict``'s; a dense model never varies
ep; an ep that does not divide is never a plan; several schedules are searched at once."""

from __future__ import annotations

from collections import Counter

import pytest
from typer.testing import CliRunner

from paraplan.catalog import load_cluster, load_model
from paraplan.cli.app import app
from paraplan.prediction import predict
from paraplan.search import SearchSpace, search_plans
from paraplan.search.screen import screen_plans, screenable
from paraplan.search.space import EP_EXPERTS, EP_STAGE, enumerate_plans, iter_unique
from paraplan.specs import ConfigError, Precision, Schedule

runner = CliRunner()

#: The screen's time against ``predict``: exact for 1F1B plans of equal stages (tests/unit/test_screen.py).
TIME_TOLERANCE = 0.005


def test_the_best_plan_for_mixtral_on_64_h100_uses_expert_parallelism():
    result = search_plans(load_model("mixtral-8x7b"), load_cluster("dgx-h100", num_nodes=8), 256)
    best = result.ranked[0].job.parallel
    assert best.ep > 1
    assert {p.job.parallel.ep for p in result.ranked} > {best.ep}  # the search compared several degrees


def test_a_mixture_of_experts_search_tries_every_ep_dividing_the_experts_smallest_first():
    model, cluster = load_model("mixtral-8x7b"), load_cluster("dgx-h100", num_nodes=2)
    space = SearchSpace(micro_batch_size=(1,), recompute=("full",), zero_stage=(1,))
    screen = screen_plans(model, cluster, 64, Precision.BF16, space)
    eps = screen.plans["ep"].tolist()
    assert sorted(set(eps)) == [1, 2, 4, 8]
    tp8 = [e for e, t, p in zip(eps, screen.plans["tp"].tolist(), screen.plans["pp"].tolist(), strict=True)
           if t == 1 and p == 1]
    assert tp8 == sorted(tp8)  # within one (tp, pp), ep ascends: ties go to the expert group within a node


@pytest.mark.parametrize("model_name", ["llama-3-8b", "gpt3-1.3b"])
def test_a_dense_model_search_never_varies_ep(model_name):
    model, cluster = load_model(model_name), load_cluster("dgx-h100", num_nodes=2)
    screen = screen_plans(model, cluster, 64, Precision.BF16, SearchSpace.full(micro_batch_size=(1,)))
    assert set(screen.plans["ep"].tolist()) == {1}
    cands = enumerate_plans(model, cluster, 64, Precision.BF16, SearchSpace(micro_batch_size=(1,)))
    assert cands.jobs and {job.parallel.ep for job in cands.jobs} == {1}
    assert not any("ep" in reason for reason in cands.excluded)
    with pytest.raises(ConfigError, match=r"^ep: the model is dense"):
        screen_plans(model, cluster, 64, Precision.BF16, SearchSpace(ep=(1, 2)))


@pytest.mark.parametrize(("model_name", "nodes", "schedules", "framework"), [
    ("mixtral-8x7b", 1, None, "megatron"),
    ("mixtral-8x7b", 2, ("1f1b", "zb-h1"), "fsdp"),
    ("qwen3-30b-a3b", 2, None, "megatron"),
])
def test_screen_memory_equals_predict_memory_for_moe_plans(model_name, nodes, schedules, framework):
    model, cluster = load_model(model_name), load_cluster("dgx-h100", num_nodes=nodes)
    space = SearchSpace(micro_batch_size=(1, 2), recompute=("none", "full"), zero_stage=(1, 3), etp=(None, 1),
                        pp=(1, 2), schedule=schedules, framework=framework)
    screen = screen_plans(model, cluster, 64, Precision.BF16, space)
    cands = enumerate_plans(model, cluster, 64, Precision.BF16, space)
    jobs = list(iter_unique(cands.jobs))
    assert screen.excluded == Counter(cands.excluded)
    assert len(screen) == len(jobs) > 0
    assert {job.parallel.ep for job in jobs} >= {1, 2, 4, 8}
    for i, job in enumerate(jobs):
        assert screen.job(i).parallel == job.parallel
        pred = predict(job)
        assert screen.memory_bytes[i] == max(m.total for m in pred.memory), job.name
        if not job.parallel.schedule.splits_backward:  # zero-bubble: a closed-form estimate (test_zero_bubble)
            assert screen.iteration_s[i] == pytest.approx(pred.iteration_s, rel=TIME_TOLERANCE), job.name


def test_moe_plans_with_optimizer_offload_screen_exactly_as_predicted():
    model, cluster = load_model("mixtral-8x7b"), load_cluster("dgx-h100", num_nodes=1)
    space = SearchSpace(micro_batch_size=(1,), recompute=("full",), zero_stage=(1, 2), etp=(None, 1), pp=(1, 2),
                        offload_optimizer=("none", "cpu"))
    screen = screen_plans(model, cluster, 64, Precision.BF16, space)
    jobs = list(iter_unique(enumerate_plans(model, cluster, 64, Precision.BF16, space).jobs))
    assert len(screen) == len(jobs)
    assert {(job.parallel.ep > 1, job.parallel.offload_optimizer) for job in jobs} == {
        (False, "none"), (False, "cpu"), (True, "none"), (True, "cpu")}
    for i, job in enumerate(jobs):
        assert screen.job(i).parallel == job.parallel
        pred = predict(job)
        assert screen.memory_bytes[i] == max(m.total for m in pred.memory), job.name
        assert screen.iteration_s[i] == pytest.approx(pred.iteration_s, rel=TIME_TOLERANCE), job.name


def test_an_ep_that_does_not_divide_is_never_enumerated():
    model, cluster = load_model("mixtral-8x7b"), load_cluster("dgx-h100", num_nodes=1)
    space = SearchSpace(ep=(1, 3, 8, 16), etp=(None, 1), micro_batch_size=(1,), recompute=("full",), zero_stage=(1,))
    screen = screen_plans(model, cluster, 64, Precision.BF16, space)
    cands = enumerate_plans(model, cluster, 64, Precision.BF16, space)
    for plan in [screen.job(i).parallel for i in range(len(screen))] + [job.parallel for job in cands.jobs]:
        assert model.num_moe_experts % plan.ep == 0
        assert (plan.tp * plan.cp * plan.dp) % (plan.ep * plan.etp) == 0
    assert {screen.job(i).parallel.ep for i in range(len(screen))} == {1, 8}
    assert screen.excluded[EP_EXPERTS] == cands.excluded[EP_EXPERTS] > 0  # ep 3 and 16
    assert screen.excluded[EP_STAGE] == cands.excluded[EP_STAGE] > 0  # ep 8 with etp = tp = 2


def test_dense_and_moe_layers_mixed_take_the_exact_path_with_ep():
    model, cluster = load_model("deepseek-v3"), load_cluster("dgx-h100", num_nodes=4)
    space = SearchSpace(tp=(8,), pp=(1,), etp=(1,), micro_batch_size=(1,), recompute=("full",), zero_stage=(1,))
    assert not screenable(space, model)
    cands = enumerate_plans(model, cluster, 512, Precision.BF16, space)
    assert {job.parallel.ep for job in cands.jobs} == {1, 2, 4, 8, 16, 32}


def test_a_search_with_several_schedules_returns_plans_of_each():
    model, cluster = load_model("gpt3-1.3b"), load_cluster("dgx-h100", num_nodes=1)
    space = SearchSpace(tp=(1,), pp=(2, 4), micro_batch_size=(1,), recompute=("none",), zero_stage=(3,),
                        framework="fsdp", schedule=("1f1b", "interleaved", "zb-h1", "zb-v"))
    want = {Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED, Schedule.ZB_H1, Schedule.ZB_V}
    screened = search_plans(model, cluster, 64, Precision.BF16, space, shortlist=1000)
    exact = search_plans(model, cluster, 64, Precision.BF16, space, screen=False)
    for result in (screened, exact):
        assert {p.job.parallel.schedule for p in result.ranked} == want
    assert [p.job.parallel for p in screened.ranked] == [p.job.parallel for p in exact.ranked]


def test_zero_bubble_schedules_are_refused_per_plan_outside_fsdp():
    model, cluster = load_model("gpt3-1.3b"), load_cluster("dgx-h100", num_nodes=1)
    space = SearchSpace(tp=(1,), pp=(2,), micro_batch_size=(1,), recompute=("none",), zero_stage=(1,),
                        schedule=("1f1b", "zb-h1"))
    screen = screen_plans(model, cluster, 64, Precision.BF16, space)
    assert {screen.job(i).parallel.schedule for i in range(len(screen))} == {Schedule.ONE_F_ONE_B}
    assert any("needs framework 'fsdp'" in reason for reason in screen.excluded)


def test_an_unknown_schedule_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"^schedule: 'zb-x' is not one of"):
        SearchSpace(schedule=("1f1b", "zb-x"))


def test_the_cli_restricts_ep_and_shows_it():
    args = ["search", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--num-nodes", "2",
            "--global-batch-size", "64", "--recompute", "full", "--mbs", "1", "--format", "json"]
    import json

    plans = json.loads(runner.invoke(app, [*args, "--ep", "2,4"]).stdout)["plans"]
    assert plans and {p["ep"] for p in plans} <= {2, 4}
    table = runner.invoke(app, args[:-2], env={"COLUMNS": "200"}).stdout
    assert " ep " in table


@pytest.mark.parametrize(("flags", "message"), [
    (["--model", "llama-3-8b", "--ep", "2"], "ep: the model is dense"),
    (["--model", "llama-3-8b", "--etp", "1"], "etp: the model is dense"),
    (["--model", "mixtral-8x7b", "--schedule", "1f1b,dualpipe"], "schedule: 'dualpipe' is not one of"),
    (["--model", "mixtral-8x7b", "--etp", "tp,x"], "--etp: expected"),
])
def test_bad_expert_and_schedule_flags_are_one_line_errors(flags, message):
    result = runner.invoke(app, ["search", "--cluster", "dgx-h100", *flags])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(("axis", "message"), [({"schedule": ("1f1b", "zb-h1")}, r"^schedule: the uneven-stage"),
                                               ({"ep": (2,)}, r"^ep: the uneven-stage")])
def test_the_uneven_stage_search_refuses_the_axes_it_does_not_vary(axis, message):
    space = SearchSpace(uneven_layers=True, **axis)
    with pytest.raises(ConfigError, match=message):
        search_plans(load_model("mixtral-8x7b"), load_cluster("dgx-h100", num_nodes=1), 64, Precision.BF16, space)


@pytest.mark.parametrize("screen", [True, False])
def test_zero_still_shards_the_experts_when_dp_x_cp_is_one(screen):
    """tp 8 on 8 GPUs leaves dp x cp = 1, but ep 2 x etp 1 leaves an expert data-parallel group
    of 4 that ZeRO-1 shards the experts' optimizer states over: ZeRO 0 and 1 are two runs."""
    model, cluster = load_model("mixtral-8x7b"), load_cluster("dgx-h100", num_nodes=1)
    space = SearchSpace(tp=(8,), pp=(1,), ep=(2,), etp=(1,), zero_stage=(0, 1), micro_batch_size=(1,),
                        recompute=("full",))
    result = search_plans(model, cluster, 8, space=space, screen=screen)
    assert len(result.ranked) + sum(result.excluded.values()) == 2
