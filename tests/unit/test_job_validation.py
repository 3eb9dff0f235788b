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


def test_a_mistyped_gpu_suggests_the_closest_catalog_name():
    message = error_of(cluster={"gpu": "A100-SMX4", "gpus_per_node": 8})
    assert "unknown GPU 'A100-SMX4'" in message
    assert "did you mean A100" in message


def test_unknown_keys_and_bad_values_name_the_field():
    assert error_of(parallel={"tp": 4, "pipeline_size": 2}).startswith("parallel.pipeline_size: unknown key")
    assert error_of(parallel={"tp": "four"}).startswith("parallel.tp:")
    assert error_of(precision="fp64").startswith("precision:")
    assert error_of(foo=1).startswith("foo: unknown key")


def test_global_batch_must_be_a_multiple_of_micro_batch_times_dp():
    message = error_of(parallel={"tp": 4, "pp": 4, "micro_batch_size": 3, "global_batch_size": 64})
    assert message == ("parallel.global_batch_size: 64 is not divisible by micro_batch_size*dp = 3*2 "
                       "(dp = cluster.num_nodes 4 x cluster.gpus_per_node 8 / tp*pp*cp 16)")


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


def test_a_cluster_described_by_its_gpu_takes_the_reference_nodes_network_as_the_gpu_flag_does():
    from paraplan.catalog.jobs import apply_overrides

    described = {"gpu": "A100-SXM4-80GB", "num_nodes": 4, "gpus_per_node": 8}
    from_file = job(cluster=described)
    reference = job(cluster={"name": "dgx-a100", "num_nodes": 4})
    assert (from_file.cluster.intra_node, from_file.cluster.inter_node) == (
        reference.cluster.intra_node, reference.cluster.inter_node)
    assert from_file.cluster.sources == reference.cluster.sources  # measured efficiencies stay measured
    assert from_file.cluster.name == "dgx-a100"  # the reference node with its own GPU: the catalog node
    flags = {"gpu": "A100-SXM4-80GB", "num_nodes": 4, "gpus_per_node": 8}
    from_flags = resolve_job(apply_overrides({k: v for k, v in BASE.items() if k != "cluster"}, flags))
    assert from_flags.cluster == from_file.cluster
    # what the mapping states stays its own; the name says whose network fills the rest
    mine = job(cluster={**described, "name": "my-a100s", "inter_node": {"bandwidth": "25 GB/s"}})
    assert mine.cluster.inter_node.bandwidth_bytes_per_s == pytest.approx(25e9)
    assert mine.cluster.intra_node == reference.cluster.intra_node
    assert mine.cluster.name == "my-a100s (dgx-a100 network)"


def test_a_multi_node_cluster_without_a_network_or_a_reference_node_is_rejected():
    # every catalog GPU has a reference node: a GPU described inline has none
    gpu = {"name": "A800", "peak_flops": {"bf16": "312 TFLOPS"}, "hbm_bytes": "80 GiB",
           "hbm_bandwidth": "2.04 TB/s", "intra_node": {"bandwidth": "200 GB/s"}}
    message = error_of(cluster={"gpu": gpu, "num_nodes": 4, "gpus_per_node": 4}, parallel={"tp": 4, "pp": 4})
    assert message.startswith("cluster.inter_node:") and "no reference node for A800" in message


def test_a_model_may_give_its_padded_vocabulary_alone():
    model = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "seq_length": 512}
    j = job(model={**model, "padded_vocab_size": 51200})
    assert (j.model.vocab_size, j.model.vocab_for(4)) == (51200, 51200)
    message = error_of(model=model)
    assert message.startswith("model.vocab_size: required but missing") and "padded_vocab_size" in message


def test_a_model_flag_renames_the_job_it_changes():
    from paraplan.catalog.jobs import apply_overrides

    raw = {**BASE, "name": "neox-20b-run"}
    assert resolve_job(apply_overrides(raw, {"model": "gpt3-13b"})).name == "neox-20b-run (--model gpt3-13b)"
    assert resolve_job(apply_overrides(raw, {"model": "gpt-neox-20b"})).name == "neox-20b-run"
    assert resolve_job(apply_overrides(raw, {"tensor_model_parallel_size": 2})).name == "neox-20b-run"


def test_a_batch_the_derived_data_parallel_size_does_not_divide_says_where_dp_came_from():
    message = error_of(cluster={"name": "dgx-a100", "num_nodes": 6}, parallel={"tp": 4, "pp": 4, "global_batch_size": 64})
    assert message.endswith("(dp = cluster.num_nodes 6 x cluster.gpus_per_node 8 / tp*pp*cp 16)")


def test_a_yaml_syntax_error_names_the_line_and_column(tmp_path):
    from paraplan.catalog import load_job

    path = tmp_path / "job.yaml"
    path.write_text("model: gpt2\ncluster:\n\tname: dgx-a100\n")
    with pytest.raises(ConfigError, match=r"cannot start any token, line 3\)$"):
        load_job(path)


def test_an_integer_of_thousands_of_digits_is_refused_not_a_traceback(tmp_path):
    from paraplan.catalog import load_job

    path = tmp_path / "job.yaml"
    path.write_text("model: gpt2\ncluster: dgx-a100\ntrain_tokens: " + "9" * 5000 + "\n")
    with pytest.raises(ConfigError, match=r"an integer of more than 4,300 digits, line 3\)$"):
        load_job(path)


def test_a_nul_byte_names_its_line(tmp_path):
    from paraplan.catalog import load_job

    path = tmp_path / "job.yaml"
    path.write_text("model: gpt2\ncluster: dgx-a100\nname: a\x00b\n")
    with pytest.raises(ConfigError, match=r"character U\+0000 is not allowed, line 3\)$"):
        load_job(path)
