"""The search layer turns the words of `paraplan search` into the searches to run; the command
only asks and renders."""

from __future__ import annotations

import dataclasses

import pytest

from paraplan.search.request import SearchFlags, SearchRequest
from paraplan.specs import ConfigError


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
