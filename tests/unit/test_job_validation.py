"""Every invalid job ends in a one-line ConfigError that names the field and the reason."""

import pytest

from paraplan.catalog import resolve_job
from paraplan.specs import ConfigError

BASE = {
    "model": "gpt-neox-20b",
    "cluster": {"name": "dgx-a100", "num_nodes": 4},
    "parallel": {"tp": 4, "pp": 4, "micro_batch_size": 1, "global_batch_size": 64},
}


def job(**changes):
    raw = {**BASE, **changes}
    return resolve_job(raw)


def error_of(**changes) -> str:
    with pytest.raises(ConfigError) as info:
        job(**changes)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_valid_job_derives_the_data_parallel_size_from_the_cluster():
    assert job().parallel.dp == 2
    assert job().parallel.num_microbatches == 32


def test_degrees_that_do_not_multiply_to_the_cluster_size_are_rejected():
    assert error_of(parallel={"tp": 4, "pp": 4, "dp": 3}) == "parallel: tp*pp*dp*cp = 48 but the cluster has 32 GPUs"


def test_heads_not_divisible_by_tp_name_the_field():
    message = error_of(
        model={"name": "gpt-neox-20b", "hidden_size": 5120, "num_attention_heads": 40}, parallel={"tp": 16, "pp": 2}
    )
    assert message.startswith("parallel.tp: num_attention_heads=40 is not divisible by 16")


def test_an_unknown_gpu_suggests_the_closest_catalog_name():
    message = error_of(cluster={"gpu": "A1000", "gpus_per_node": 8})
    assert "unknown GPU 'A1000'" in message
    assert "did you mean A100" in message


def test_unknown_keys_and_bad_values_name_the_field():
    assert error_of(parallel={"tp": 4, "pipeline_size": 2}).startswith("parallel.pipeline_size: unknown key")
    assert error_of(parallel={"tp": "four"}).startswith("parallel.tp:")
    assert error_of(precision="fp64").startswith("precision:")
    assert error_of(foo=1).startswith("foo: unknown key")


def test_global_batch_must_be_a_multiple_of_micro_batch_times_dp():
    message = error_of(parallel={"tp": 4, "pp": 4, "micro_batch_size": 3, "global_batch_size": 64})
    assert message == "parallel.global_batch_size: 64 is not divisible by micro_batch_size*dp = 3*2"


def test_interleaving_needs_layers_divisible_by_pp_times_vpp():
    message = error_of(parallel={"tp": 4, "pp": 4, "vpp": 3, "global_batch_size": 64})
    assert message.startswith("parallel.vpp: num_layers=44 is not divisible by pp*vpp = 12")


def test_explicit_layers_per_stage_must_sum_to_the_model_depth():
    message = error_of(parallel={"tp": 4, "pp": 4, "layers_per_stage": [11, 11, 11, 10]})
    assert message.startswith("parallel.layers_per_stage: sums to 43")


def test_unit_strings_are_accepted_for_links_and_prices():
    j = job(
        cluster={
            "gpu": "A100-SXM4-80GB",
            "num_nodes": 4,
            "gpus_per_node": 8,
            "inter_node": {"bandwidth": "200 Gb/s", "latency": "10 us"},
            "price_per_gpu_hour": "2.5 USD",
        }
    )
    assert j.cluster.inter_node.bandwidth_bytes_per_s == pytest.approx(25e9)
    assert j.cluster.price_per_gpu_hour == pytest.approx(2.5)


def test_a_multi_node_cluster_without_a_network_is_rejected():
    message = error_of(cluster={"gpu": "A100-SXM4-80GB", "num_nodes": 4, "gpus_per_node": 8})
    assert message.startswith("cluster.inter_node:")
