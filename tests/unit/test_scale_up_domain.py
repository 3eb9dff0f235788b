"""Rack-scale NVLink domains (GB200/GB300 NVL72: 72 GPUs on 18 hosts of 4) and the 2025-26
hardware in the catalog: a group inside the scale-up domain runs on NVLink, one that leaves it
on the network, whatever the host node's size."""

from __future__ import annotations

import pytest

from paraplan import predict
from paraplan.catalog import load_cluster, load_gpu
from paraplan.catalog.loader import load_catalog_entry, load_model
from paraplan.inventory import ParallelDim, group_layout
from paraplan.search.space import SearchSpace, enumerate_plans
from paraplan.specs import ClusterSpec, ConfigError, Job, ParallelPlan, Precision

NEW_GPUS = ("GB200", "GB300", "B300", "H800")
NEW_NODES = ("gb200-nvl72", "gb300-nvl72", "dgx-b300", "hgx-h800")


@pytest.mark.parametrize("name", NEW_GPUS)
def test_each_new_gpu_loads_with_a_source_for_every_number_and_a_reference_node(name):
    gpu = load_gpu(name)
    for field in ("peak_flops", "hbm_bytes", "hbm_bandwidth", "intra_node"):
        assert gpu.sources.get(field, "").strip(), f"{name}: no source for {field}"
    assert gpu.reference_node in NEW_NODES
    assert load_cluster(gpu.reference_node).gpu.name == gpu.name


@pytest.mark.parametrize("name", NEW_NODES)
def test_each_new_node_loads_with_a_source_for_its_links(name):
    cluster = load_cluster(name)
    cited = set(load_catalog_entry("clusters", name)["sources"])
    assert "inter_node" in cited and ("intra_node" in cited or "gpu" in cited)
    assert cluster.inter_node.bandwidth_bytes_per_s < cluster.intra_node.bandwidth_bytes_per_s


@pytest.mark.parametrize(("name", "gpu"), [("gb200-nvl72", "GB200"), ("gb300-nvl72", "GB300")])
def test_an_nvl72_rack_is_eighteen_hosts_of_four_gpus_in_one_72_gpu_nvlink_domain(name, gpu):
    rack = load_cluster(name)
    assert (rack.gpu.name, rack.gpus_per_node, rack.num_nodes, rack.domain_size) == (gpu, 4, 18, 72)
    assert rack.intra_node.bandwidth_bytes_per_s == 900e9  # NVLink 5: 1.8 TB/s bidirectional per GPU
    # XLA measured its collectives in groups of up to the whole rack
    assert max(rack.intra_node.collectives["all_reduce"].bus_bytes_per_s) == 72


def test_a_cluster_without_a_scale_up_domain_keeps_its_node_as_the_domain():
    assert load_cluster("dgx-b200", num_nodes=8).domain_size == 8
    assert load_cluster("dgx-h100").scale_up_domain is None


def test_a_job_smaller_than_the_rack_has_a_domain_of_its_own_gpus():
    assert load_cluster("gb200-nvl72", num_nodes=2).domain_size == 8
    assert load_cluster("gb200-nvl72", num_nodes=36).domain_size == 72  # two racks


def test_a_scale_up_domain_must_join_whole_nodes():
    with pytest.raises(ConfigError, match="scale_up_domain: 6 GPUs is not a whole number"):
        load_cluster("gb200-nvl72", scale_up_domain=6)


def _plan(tp: int, dp: int, **more) -> ParallelPlan:
    return ParallelPlan(tp=tp, dp=dp, **more)


def test_a_tp16_group_stays_inside_the_rack_but_crosses_two_dgx_b200_nodes():
    plan = _plan(16, 4)
    rack, dgx = load_cluster("gb200-nvl72", num_nodes=16), load_cluster("dgx-b200", num_nodes=8)
    assert not group_layout(ParallelDim.TP, plan, rack.domain_size).crosses_nodes
    assert group_layout(ParallelDim.TP, plan, dgx.domain_size).crosses_nodes


def test_a_group_that_straddles_two_domains_is_costed_by_its_smaller_side():
    """tp=16 on two 72-GPU racks: the group of ranks 64-79 has 8 GPUs in each rack."""
    layout = group_layout(ParallelDim.TP, _plan(16, 9), 72)
    assert (layout.nodes, layout.per_node) == (2, 8)
    assert not group_layout(ParallelDim.TP, _plan(8, 18), 72).crosses_nodes  # 8 tiles 72


def _job(cluster: ClusterSpec, model: str, **parallel) -> Job:
    plan = ParallelPlan(global_batch_size=64, sequence_parallel=True, zero_stage=1, **parallel)
    return Job(model=load_model(model), cluster=cluster, parallel=plan)


def test_tp16_on_gb200_nvl72_spends_less_on_tp_communication_than_the_same_gpus_in_hosts_of_four():
    """The same GPUs and links, the NVLink domain the only change: tp=16 inside the rack's
    domain runs on NVLink, across 4-GPU hosts it runs on the NICs."""
    rack = load_cluster("gb200-nvl72", num_nodes=16)
    hosts = rack.model_copy(update={"scale_up_domain": 4})
    on_nvlink = predict(_job(rack, "gpt3-175b", tp=16, pp=4))
    on_nics = predict(_job(hosts, "gpt3-175b", tp=16, pp=4))
    assert on_nvlink.breakdown.tp_communication_s < 0.5 * on_nics.breakdown.tp_communication_s
    assert on_nvlink.iteration_s < on_nics.iteration_s


def test_tp16_is_faster_on_64_gb200_in_a_rack_than_on_64_b200_in_dgx_nodes():
    rack = predict(_job(load_cluster("gb200-nvl72", num_nodes=16), "gpt3-175b", tp=16, pp=4))
    dgx = predict(_job(load_cluster("dgx-b200", num_nodes=8), "gpt3-175b", tp=16, pp=4))
    # TP on the rack's NVLink, priced at XLA's measured GB200 points for 16 GPUs (a 48 MiB
    # all-gather 151 us, 311 GB/s bus), against two DGX nodes' NICs (275 us): 2.02 s against
    # 3.84 s. Not under half any more: the fitted curve alone (114 us a call) said 1.44 s.
    assert rack.breakdown.tp_communication_s < dgx.breakdown.tp_communication_s
    assert rack.iteration_s < dgx.iteration_s


def test_ep32_all_to_all_stays_on_nvlink_in_the_rack_and_crosses_the_network_on_dgx_b200():
    rack = load_cluster("gb200-nvl72", num_nodes=16)
    hosts = rack.model_copy(update={"scale_up_domain": 4})
    plan = {"tp": 1, "pp": 1, "ep": 32}
    assert not group_layout(ParallelDim.EP, _plan(1, 64, ep=32), rack.domain_size).crosses_nodes
    on_nvlink = predict(_job(rack, "qwen3-30b-a3b", **plan))
    on_nics = predict(_job(hosts, "qwen3-30b-a3b", **plan))
    assert on_nvlink.breakdown.ep_communication_s < on_nics.breakdown.ep_communication_s


def _excluded(cluster: ClusterSpec, tp: int) -> list[str]:
    space = SearchSpace(tp=(tp,), pp=(1, 2, 4), micro_batch_size=(1,), zero_stage=(1,), recompute=("selective",))
    found = enumerate_plans(load_model("gpt3-175b"), cluster, 64, Precision.BF16, space)
    return [reason for reason in found.excluded if "NVLink domain" in reason]


def test_the_search_allows_tp_up_to_the_racks_nvlink_domain_but_not_beyond_a_dgx_node():
    assert _excluded(load_cluster("gb200-nvl72", num_nodes=16), 16) == []
    assert _excluded(load_cluster("dgx-b200", num_nodes=8), 16) == ["tp > 8 crosses the node's NVLink domain"]
    assert _excluded(load_cluster("gb200-nvl72", num_nodes=16), 64) == []


def test_a_gpu_not_built_into_a_racks_nvlink_domain_is_refused_on_that_rack():
    with pytest.raises(ConfigError, match=r"B200 is not built into gb200-nvl72's 72-GPU NVLink domain; its own node is dgx-b200"):
        load_cluster("gb200-nvl72", gpu="B200")


def test_a_gpu_whose_own_node_is_a_72_gpu_rack_takes_the_other_racks_domain_with_its_own_link():
    blackwell_ultra = load_cluster("gb200-nvl72", gpu="GB300")
    assert blackwell_ultra.domain_size == 72
    assert blackwell_ultra.intra_node == load_gpu("GB300").intra_node  # its own measured NVLink
    assert blackwell_ultra.inter_node == load_cluster("gb200-nvl72").inter_node  # the rack's NICs stay


def test_a_rack_gpu_named_on_an_eight_gpu_node_gets_that_nodes_domain():
    assert load_cluster("dgx-b200", gpu="GB200").domain_size == 8


def test_the_catalog_lists_the_new_hardware_and_the_racks_72_gpu_domain_within_80_columns():
    from typer.testing import CliRunner

    from paraplan.cli.app import app

    for kind, names in (("gpus", NEW_GPUS), ("clusters", NEW_NODES)):
        text = CliRunner().invoke(app, ["catalog", kind], env={"COLUMNS": "80"}).stdout
        assert max(len(line) for line in text.splitlines()) <= 80
        assert all(name in text for name in names)
    domains = [line.split() for line in text.splitlines() if line.startswith("gb200-nvl72 ")]
    assert ["gb200-nvl72", "72"] in domains  # under the table: GPUs per NVLink domain by name
