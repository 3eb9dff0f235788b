"""The search layer turns the words of `paraplan search` into the searches to run; the command
only asks and renders."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from paraplan.search.request import SearchFlags, SearchRequest
from paraplan.search.space import SearchSpace
from paraplan.specs import PLAN_ALIASES, ConfigError, ParallelPlan


def test_every_option_of_the_search_command_is_a_field_of_the_search_flags():
    from paraplan.cli.search import SEARCH_FLAGS

    fields = {f.name for f in dataclasses.fields(SearchFlags)}
    assert {f.key for f in SEARCH_FLAGS} == fields


def test_num_gpus_sizes_the_cluster_in_whole_nodes():
    request = SearchRequest.from_flags(None, SearchFlags(model="llama-3-8b", cluster="dgx-h100", num_gpus=32))
    (search,) = request.searches
    assert search["cluster"].num_nodes == 4


def test_sizes_give_one_search_per_node_count():
    request = SearchRequest.from_flags(None, SearchFlags(model="llama-3-8b", cluster="dgx-h100", sizes="1,2,4"))
    assert [s["cluster"].num_nodes for s in request.searches] == [1, 2, 4]


def test_a_gpu_count_that_is_not_whole_nodes_is_refused_naming_num_gpus():
    with pytest.raises(ConfigError, match=r"^num_gpus: 12 is not a multiple of 8 GPUs per node"):
        SearchRequest.from_flags(None, SearchFlags(model="llama-3-8b", cluster="dgx-h100", num_gpus=12))


def test_list_flags_become_the_axes_of_the_search_space():
    request = SearchRequest.from_flags(None, SearchFlags(tp="2,1,2", zero="0,1", recompute="none,full"))
    space = request.searches[0]["space"]
    assert (space.tp, space.zero_stage, [r.value for r in space.recompute]) == ((2, 1), (0, 1), ["none", "full"])


def test_without_a_job_file_the_request_keeps_the_demo_job_to_say_what_came_from_it():
    assert SearchRequest.from_flags(None, SearchFlags()).demo is not None


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_search_names_no_plan_field_of_a_mixture_of_experts_job_it_varies():
    # the Mixtral job sets tp, pp, vpp, ep, ZeRO and both batch sizes: the space varies every one
    request = SearchRequest.from_flags(EXAMPLES / "mixtral-8x7b-dgx-h100-ep8.yaml", SearchFlags())
    assert request.notes == ()


def test_the_search_names_the_hybrid_sharding_jobs_fields_it_neither_varies_nor_keeps_and_no_other():
    request = SearchRequest.from_flags(EXAMPLES / "llama-2-13b-fsdp-h100-hsdp.yaml", SearchFlags())
    (note,) = request.notes
    assert "job file's grad_reduce_in_fp32, recompute_every;" in note  # the shard axis covers the shard degree


def test_every_axis_of_the_search_space_covers_a_plan_field_or_says_it_covers_none():
    # a new axis names the plan field it sets (by its own name, a short alias or its ``plan``
    # metadata), so the search's note covers it without a list to keep
    plan_fields = set(ParallelPlan.model_fields)
    for axis in dataclasses.fields(SearchSpace):
        name = axis.metadata.get("plan", axis.name)
        assert name is None or PLAN_ALIASES.get(name, name) in plan_fields, axis.name
    space = SearchSpace(extra={"recompute_every": 2})
    assert {"data_parallel_shard_degree", "expert_model_parallel_size", "recompute_every"} <= space.plan_fields()
    assert space.plan_fields() <= plan_fields
