"""The sharding layer reads the words of `paraplan sharding` (mesh, memory budget); the command
only asks and renders."""

from __future__ import annotations

import pytest

from paraplan.catalog import load_cluster
from paraplan.sharding.request import ShardingRequest
from paraplan.specs import ConfigError


def _request(**flags):
    return ShardingRequest.from_flags(**{"mesh": "data=2,model=4", "memory_budget": None, "cluster": "dgx-h100",
                                         "precision": "fp32", **flags})


def test_a_mesh_of_data_2_and_model_4_needs_eight_devices():
    request = _request()
    assert request.axes == (("data", 2), ("model", 4)) and request.devices == 8


def test_without_a_memory_budget_the_budget_is_the_cluster_gpus_memory():
    assert _request().memory_budget == float(load_cluster("dgx-h100").gpu.hbm_bytes)


def test_a_memory_budget_of_none_searches_without_a_budget():
    assert _request(memory_budget="none").memory_budget is None


def test_an_unreadable_memory_budget_is_refused_naming_the_flag():
    with pytest.raises(ConfigError, match=r"^memory_budget: "):
        _request(memory_budget="lots")
