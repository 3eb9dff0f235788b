"""A job written back to a file (search --save-best) names its hardware and model from the
catalog, writes out only what the job changed, and resolves back to the same job."""

from __future__ import annotations

import pytest
import yaml

from paraplan.catalog import resolve_job
from paraplan.catalog.jobfile import job_mapping

SLOW_NET = {"bandwidth": "10 Gb/s", "latency": "10 us"}
H800 = {"name": "H800", "peak_flops": {"bf16": "989 TFLOPS"}, "hbm_bytes": "80 GiB", "hbm_bandwidth": "3.35 TB/s",
        "intra_node": {"bandwidth": "200 GB/s"}}


def _written(raw):
    job = resolve_job({"model": "llama-3-8b", "parallel": {"tp": 2}, **raw})
    text = yaml.safe_dump(job_mapping(job), sort_keys=False, default_flow_style=None)
    assert resolve_job(yaml.safe_load(text)) == job
    return yaml.safe_load(text), text


@pytest.mark.parametrize(
    ("raw", "cluster"),
    [
        ({"cluster": {"name": "dgx-h100", "num_nodes": 2}}, {"name": "dgx-h100", "num_nodes": 2}),
        ({"cluster": {"gpu": "H100", "num_nodes": 2}}, {"name": "dgx-h100", "num_nodes": 2}),
        ({"cluster": {"gpu": "GH200", "num_nodes": 4}}, {"name": "vista-gh200", "num_nodes": 4}),
        ({"cluster": {"name": "dgx-h100", "gpu": "H200"}}, {"name": "dgx-h100", "num_nodes": 1, "gpu": "H200-SXM-141GB"}),
    ],
)
def test_a_catalog_cluster_is_written_by_name_with_only_what_the_job_changed(raw, cluster):
    mapping, text = _written(raw)
    assert mapping["cluster"] == cluster
    assert mapping["model"] == "llama-3-8b"
    assert len(text.splitlines()) < 10


def test_a_changed_network_is_written_as_the_catalog_cluster_and_its_new_link():
    mapping, _ = _written({"cluster": {"name": "aws-p5.48xlarge", "num_nodes": 4, "inter_node": SLOW_NET}})
    assert set(mapping["cluster"]) == {"name", "num_nodes", "inter_node"}
    assert mapping["cluster"]["name"] == "aws-p5.48xlarge"
    assert mapping["cluster"]["inter_node"] == {"bandwidth": "1.25 GB/s", "latency": "10 us"}  # in units


def test_a_catalog_model_with_a_field_changed_is_written_as_its_name_and_that_field():
    mapping, _ = _written({"model": {"name": "llama-3-8b", "seq_length": 4096}, "cluster": "dgx-h100"})
    assert mapping["model"] == {"name": "llama-3-8b", "seq_length": 4096}


def test_a_gpu_the_catalog_lacks_is_described_without_its_default_fields():
    mapping, text = _written({"cluster": {"gpu": H800, "gpus_per_node": 8}})
    assert mapping["cluster"]["gpu"]["name"] == "H800"
    assert "efficiency" not in mapping["cluster"]["gpu"]
    assert len(text.splitlines()) < 25


@pytest.mark.parametrize(
    "parallel",
    [
        {"tp": 1, "pp": 4, "ep": 8, "expert_load_imbalance": 1.2, "global_batch_size": 256},
        {"tp": 2, "pp": 2, "ep": 4, "etp": 1, "sequence_parallel": True, "global_batch_size": 64},
        {"tp": 2, "pp": 4, "vpp": 2, "overlap_p2p_comm": True, "tp_comm_overlap": True, "sequence_parallel": True,
         "global_batch_size": 64},
        {"tp": 1, "zero_stage": 2, "framework": "deepspeed", "offload_optimizer": "cpu", "global_batch_size": 64},
    ],
    ids=["ep-imbalance", "etp", "interleaved-overlaps", "deepspeed-offload"],
)
def test_every_plan_setting_survives_the_round_trip_through_a_job_file(parallel):
    model = "mixtral-8x7b" if "ep" in parallel else "llama-3-8b"
    job = resolve_job({"model": model, "cluster": {"name": "dgx-h100", "num_nodes": 8}, "parallel": parallel})
    mapping = yaml.safe_load(yaml.safe_dump(job_mapping(job), sort_keys=False))
    assert resolve_job(mapping) == job
    for key in parallel:
        assert key in mapping["parallel"], key
