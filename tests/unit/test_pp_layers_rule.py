"""One rule decides whether pp may leave the layers unevenly split, and predict and search
both read it: Megatron-LM needs num_layers % pp == 0 unless the split is given
(--decoder-first/last-pipeline-num-layers, --pipeline-model-parallel-layout); DeepSpeed's and
torchtitan's pipelines give the first stages one more layer by themselves."""

from __future__ import annotations

import pytest

from paraplan.catalog import load_cluster, load_model
from paraplan.search import SearchSpace
from paraplan.search.screen import screen_plans
from paraplan.search.space import UNEVEN_NOT_SCREENED, enumerate_plans
from paraplan.specs import Job, Precision
from paraplan.specs.plan import PP_LAYERS_REASON

# a llama-3-8b with 42 layers (Gemma-2-9B's count), on one DGX H100 node
MODEL = load_model("llama-3-8b").model_copy(update={"num_layers": 42, "name": "llama-42"})
CLUSTER = load_cluster("dgx-h100", num_nodes=1)


def _job(**parallel) -> Job:
    return Job(model=MODEL, cluster=CLUSTER, parallel={"tp": 2, "micro_batch_size": 1, "global_batch_size": 8,
                                                       **parallel})


def test_megatron_refuses_pp_4_on_42_layers_and_says_how_to_give_the_split():
    with pytest.raises(ValueError, match=r"parallel\.pp: Megatron-LM needs num_layers=42 divisible by pp=4 .*"
                                         r"layers_per_stage \(e\.g\. \[11, 11, 10, 10\]"):
        _job(pp=4)


def test_megatron_runs_pp_4_on_42_layers_when_the_split_is_given():
    assert _job(pp=4, layers_per_stage=[11, 11, 10, 10]).parallel.layers_per_stage == (11, 11, 10, 10)


@pytest.mark.parametrize("framework", ["deepspeed", "fsdp"])
def test_deepspeed_and_torchtitan_split_42_layers_over_4_stages_by_themselves(framework):
    assert _job(pp=4, framework=framework, recompute="full").parallel.pp == 4


def _search_space(framework: str) -> SearchSpace:
    return SearchSpace(tp=(2,), pp=(1, 2, 4), micro_batch_size=(1,), zero_stage=(1,), recompute=("full",),
                       framework=framework)


@pytest.mark.parametrize("framework", ["megatron", "deepspeed"])
def test_the_search_excludes_pp_4_on_42_layers_for_the_reason_predict_gives(framework):
    space = _search_space(framework)
    candidates = enumerate_plans(MODEL, CLUSTER, 8, Precision.BF16, space)
    assert sorted(j.parallel.pp for j in candidates.jobs) == [1, 2]
    reason = PP_LAYERS_REASON if framework == "megatron" else UNEVEN_NOT_SCREENED
    assert set(candidates.excluded) == {reason}
    try:  # predict refuses exactly the Megatron-LM plan; the DeepSpeed one is valid, only not screened
        _job(pp=4, framework=framework, recompute="full")
        refused = False
    except ValueError:
        refused = True
    assert refused == (framework == "megatron")


@pytest.mark.parametrize("framework", ["megatron", "deepspeed"])
def test_the_screen_counts_the_same_exclusions_as_the_enumeration(framework):
    space = _search_space(framework)
    enumerated = enumerate_plans(MODEL, CLUSTER, 8, Precision.BF16, space).excluded
    screened = screen_plans(MODEL, CLUSTER, 8, Precision.BF16, space).excluded
    for reason in (PP_LAYERS_REASON, UNEVEN_NOT_SCREENED):
        assert screened.get(reason, 0) == enumerated.get(reason, 0)
