"""An invalid job built from the demo job (or a file) and flags says where each value came from."""

from __future__ import annotations

import pytest

from paraplan.catalog.jobs import demo_job_mapping
from paraplan.catalog.origin import blame_origin, resolve_with_flags
from paraplan.specs import ConfigError


def _error(raw, origin="the demo job", **flags):
    with pytest.raises(ConfigError) as err:
        resolve_with_flags(raw, flags, origin=origin)
    return str(err.value)


def test_a_gh200_node_blames_the_demo_jobs_tp_and_says_which_flag_sets_it():
    message = _error(demo_job_mapping(), gpu="GH200", num_nodes=1)
    assert "does not divide the cluster's 1 GPU " in message
    assert message.endswith("tp 2 came from the demo job, not from a flag: set --tp")


def test_a_tp_the_user_typed_is_not_blamed_on_the_demo_job():
    message = _error(demo_job_mapping(), gpu="GH200", num_nodes=1, tensor_model_parallel_size=2)
    assert "demo job" not in message


def test_every_value_the_error_names_that_no_flag_set_is_listed():
    message = _error(demo_job_mapping(), num_nodes=3, micro_batch_size=1)
    assert message.endswith("tp 2 and global_batch_size 512 came from the demo job, not from a flag: "
                            "set --tp or --global-batch-size")


def test_a_job_file_is_named_as_the_origin_only_when_flags_changed_it():
    raw = {"model": "llama-3-8b", "cluster": "dgx-h100", "parallel": {"tp": 8, "pp": 3}}
    assert "jobs/a.yaml" not in _error(raw, origin="jobs/a.yaml")
    assert "pp 3 came from jobs/a.yaml" in _error(raw, origin="jobs/a.yaml", num_nodes=2)


def test_degrees_of_one_are_never_blamed():
    raw = {"parallel": {"tp": 1, "pp": 1}}
    assert blame_origin("parallel: tp*pp*cp = 1 does not divide", raw, {}, "x.yaml") == ""


def test_switching_the_demo_job_to_fsdp_blames_the_demo_jobs_selective_recompute():
    message = _error(demo_job_mapping(), framework="fsdp", zero_stage=3)
    assert message.endswith("recompute selective came from the demo job, not from a flag: set --recompute")
