"""The token dispatcher of a mixture of experts (Megatron-Core's --moe-token-dispatcher-type and
--moe-flex-dispatcher-backend): what each sends where, what it costs, how it is stated and
exported; and the active-parameter convention of each model's authors."""

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from paraplan.catalog.loader import load_cluster, load_model
from paraplan.costmodel.collectives import dispatch_bytes, estimate_collective_s
from paraplan.export.megatron import megatron_args
from paraplan.export.torchtitan import torchtitan_config
from paraplan.inventory import CollectiveKind, ParallelDim, count_job
from paraplan.inventory.job import count_active_params, count_params
from paraplan.inventory.moe import expected_units_touched, expert_routing, most_units_touched
from paraplan.inventory.ops import Collective, ExpertRouting
from paraplan.inventory.placement import GroupLayout
from paraplan.prediction import predict
from paraplan.specs import ConfigError, Job, ModelSpec, Phase
from paraplan.validate.records import job_from_record

DSV3_EXAMPLE = dict(pp=4, layers_per_stage=[16, 15, 15, 15], ep=64, zero_stage=1, micro_batch_size=1,
                    global_batch_size=1024, recompute="full")


def job(model="deepseek-v3", nodes=32, **parallel) -> Job:
    m = load_model(model) if isinstance(model, str) else model
    return Job(model=m, cluster=load_cluster("dgx-h100", num_nodes=nodes), parallel={"tp": 1, **parallel})


def _ep_collectives(j: Job):
    return [c for st in count_job(j).stages for b in st.blocks for c in b.collectives
            if c.dim in (ParallelDim.EP, ParallelDim.ETP)]


@settings(max_examples=200, deadline=None)
@given(per_rank=st.integers(1, 8), topk=st.integers(1, 8), per_node=st.sampled_from([1, 2, 4, 8]),
       nodes=st.sampled_from([1, 2, 3, 4, 8, 16]), grouped=st.booleans(), draw=st.randoms(use_true_random=False))
def test_a_deduplicating_dispatch_never_sends_more_bytes_through_the_nic_than_alltoall_and_none_within_a_node(
        per_rank, topk, per_node, nodes, grouped, draw):
    n = per_node * nodes
    experts = per_rank * n
    topk = min(topk, experts)
    groups = group_topk = None
    if grouped:
        groups = draw.choice([g for g in (1, 2, 4, 8, nodes, n) if experts % g == 0])
        chosen = [t for t in range(1, groups + 1) if t * experts // groups >= topk]
        group_topk = draw.choice(chosen)
    routing = ExpertRouting(experts, topk, groups, group_topk)
    layout = GroupLayout(n, nodes, per_node)
    alltoall = Collective("ep_alltoall", CollectiveKind.ALL_TO_ALL, ParallelDim.EP, 1e6 * topk, Phase.FWD)
    flex = Collective("ep_alltoall", CollectiveKind.ALL_TO_ALL, ParallelDim.EP, 1e6 * topk, Phase.FWD, routing=routing)
    (nic_a, _), (nic_f, nvl_f) = dispatch_bytes(alltoall, layout), dispatch_bytes(flex, layout)
    assert nic_f <= nic_a * (1 + 1e-12)
    assert nvl_f >= 0.0
    if nodes == 1:
        assert nic_f == nic_a == 0.0


def test_deepseek_v3s_group_limited_routing_sends_a_token_to_at_most_4_of_its_8_nodes():
    """8 groups of 32 experts, 4 chosen (config.json n_group / topk_group): on EP 64 over 8 nodes
    a group is a node, so a token crosses to at most 4 of them (the report's "at most 4 nodes");
    3.63 on average, where routing without the limit would reach 5.29 of its 8 top-k."""
    routing = expert_routing(load_model("deepseek-v3"), job(**DSV3_EXAMPLE).parallel.model_copy(
        update={"moe_token_dispatcher_type": "flex"}))
    assert (routing.groups, routing.group_topk) == (8, 4)
    assert most_units_touched(routing, 8) == 4
    assert expected_units_touched(routing, 8) == pytest.approx(3.629, abs=1e-3)
    unlimited = ExpertRouting(256, 8)
    assert most_units_touched(unlimited, 8) == 8 and expected_units_touched(unlimited, 8) == pytest.approx(5.295, abs=1e-3)


@pytest.mark.parametrize(("units", "groups", "group_topk"), [(8, 8, 4), (32, 8, 4), (64, 8, 4), (8, None, None),
                                                             (4, 16, 3)])
def test_the_expected_nodes_a_token_reaches_match_a_sampled_group_limited_router(units, groups, group_topk):
    """The closed form against 20 000 tokens routed as group_limited_topk routes uniform scores."""
    experts, topk, rng = 256, 8, random.Random(0)
    routing = ExpertRouting(experts, topk, groups, group_topk)
    per, reached = experts // units, 0
    for _ in range(20_000):
        if groups:
            size = experts // groups
            pool = [g * size + i for g in rng.sample(range(groups), group_topk) for i in range(size)]
        else:
            pool = range(experts)
        reached += len({e // per for e in rng.sample(pool, topk)})
    assert expected_units_touched(routing, units) == pytest.approx(reached / 20_000, rel=0.01)


def test_the_dispatcher_takes_megatron_cores_names_and_flex_runs_deepep_unless_told_hybridep():
    assert job(**DSV3_EXAMPLE).parallel.dispatcher == "alltoall"
    assert job(**DSV3_EXAMPLE, moe_token_dispatcher_type="allgather").parallel.dispatcher == "allgather"
    assert job(**DSV3_EXAMPLE, moe_token_dispatcher_type="flex").parallel.dispatcher == "deepep"
    hybrid = job(**DSV3_EXAMPLE, moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep")
    assert hybrid.parallel.dispatcher == "hybridep"


@pytest.mark.parametrize(("parallel", "model", "field"), [
    ({"moe_flex_dispatcher_backend": "hybridep"}, "deepseek-v3", "parallel.moe_flex_dispatcher_backend"),
    ({"moe_token_dispatcher_type": "deepep"}, "deepseek-v3", "moe_token_dispatcher_type"),
    ({"moe_token_dispatcher_type": "flex"}, "llama-3-8b", "parallel.moe_token_dispatcher_type"),
    ({"moe_token_dispatcher_type": "allgather", "moe_shared_expert_overlap": True}, "deepseek-v3",
     "parallel.moe_shared_expert_overlap"),
])
def test_a_dispatcher_the_plan_cannot_run_is_refused_in_one_line_naming_the_field(parallel, model, field):
    base = DSV3_EXAMPLE if model == "deepseek-v3" else {"pp": 1, "global_batch_size": 256}
    with pytest.raises(ValidationError) as err:
        job(model, **{**base, **parallel})
    message = str(err.value.errors()[0]["msg"]) + str(err.value.errors()[0]["loc"])
    assert field.split(".")[-1] in message and "\n" not in err.value.errors()[0]["msg"]


def test_deepseek_v3_on_32_dgx_h100_at_ep_64_spends_less_time_in_expert_parallel_exchange_with_deepep():
    """EP 64 over 8 nodes: alltoall sends 7/8 of 8 copies a token through the NIC, DeepEP its 3.63
    nodes' 7/8 (group-limited routing) and forwards within the node; allgather gathers all 64
    ranks' tokens on every rank."""
    ep = {name: predict(job(**DSV3_EXAMPLE, **parallel)).breakdown.ep_communication_s
          for name, parallel in (("alltoall", {}), ("allgather", {"moe_token_dispatcher_type": "allgather"}),
                                 ("deepep", {"moe_token_dispatcher_type": "flex"}))}
    assert ep["deepep"] < 0.6 * ep["alltoall"]  # 3.63 / 8 of the NIC bytes, the NIC the bottleneck
    assert ep["allgather"] > ep["alltoall"]  # 64 ranks' tokens against 8 copies of one's own


def test_the_flex_dispatch_keeps_the_alltoall_buffer_and_only_the_cost_model_deduplicates():
    plain, flex = job(**DSV3_EXAMPLE), job(**DSV3_EXAMPLE, moe_token_dispatcher_type="flex")
    a, f = _ep_collectives(plain), _ep_collectives(flex)
    assert [c.bytes for c in a] == [c.bytes for c in f] and all(c.routing is not None for c in f)
    layout = GroupLayout(64, 8, 8)
    cluster = flex.cluster
    assert estimate_collective_s(f[0], layout, cluster) < estimate_collective_s(a[0], layout, cluster)


def test_the_allgather_dispatcher_gathers_the_ep_groups_tokens_and_reduce_scatters_them_back():
    j = job(**DSV3_EXAMPLE, moe_token_dispatcher_type="allgather")
    colls = [c for c in _ep_collectives(j)][:4]
    kinds = sorted(c.kind.value for c in colls)
    assert kinds == ["all_gather", "all_gather", "reduce_scatter", "reduce_scatter"]
    m = j.model
    assert colls[0].bytes == 2 * m.seq_length * m.hidden_size * 64  # bf16 tokens of 64 ranks


def test_the_megatron_export_passes_the_dispatcher_and_the_group_limited_routing():
    args = " ".join(megatron_args(job(**DSV3_EXAMPLE, moe_token_dispatcher_type="flex",
                                      moe_flex_dispatcher_backend="hybridep")))
    assert "--moe-token-dispatcher-type flex" in args and "--moe-flex-dispatcher-backend hybridep" in args
    assert "--moe-router-num-groups 8 --moe-router-group-topk 4" in args
    deepep = " ".join(megatron_args(job(**DSV3_EXAMPLE, moe_token_dispatcher_type="flex")))
    assert "--moe-token-dispatcher-type flex" in deepep and "--moe-flex-dispatcher-backend" not in deepep  # its default


def test_the_torchtitan_export_refuses_a_dispatcher_its_recipe_cannot_state_in_one_line():
    j = job("qwen3-30b-a3b", nodes=1, pp=1, ep=8, global_batch_size=64, framework="fsdp", zero_stage=3,
            moe_token_dispatcher_type="flex")
    with pytest.raises(ConfigError, match=r"^parallel\.moe_token_dispatcher_type: [^\n]*$"):
        torchtitan_config(j)


RUNS_MOE = Path(__file__).parents[2] / "benchmarks" / "data" / "runs_moe_dev.json"


@pytest.mark.parametrize(("given", "read"), [("flex (DeepEP)", ("flex", "deepep")), ("flex (HybridEP)", ("flex", "hybridep")),
                                             ("alltoall", ("alltoall", None))])
def test_the_runs_reader_reads_the_records_dispatcher(given, read):
    runs = json.loads(RUNS_MOE.read_text())
    record = next(r for r in (runs if isinstance(runs, list) else runs["runs"]) if r["id"].endswith("ep8-fsdp"))
    record = {**record, "parallel": {**record["parallel"], "moe_token_dispatcher_type": given}}
    parallel = job_from_record(record).mapping["parallel"]
    assert (parallel["moe_token_dispatcher_type"], parallel.get("moe_flex_dispatcher_backend")) == read


GPT_OSS_120B = dict(  # openai/gpt-oss-120b config.json (sinks and sliding windows hold no parameters to speak of)
    name="gpt-oss-120b", num_layers=36, hidden_size=2880, num_attention_heads=64, num_query_groups=8, kv_channels=64,
    seq_length=4096, vocab_size=201088, make_vocab_size_divisible_by=1, activation="swiglu", normalization="rmsnorm",
    position_embedding="rotary", untie_embeddings_and_output_weights=True, add_bias_linear=True,
    num_moe_experts=128, moe_router_topk=4, moe_ffn_hidden_size=2880, ffn_hidden_size=2880)


def test_active_parameters_follow_the_convention_the_models_authors_publish():
    """OpenAI's gpt-oss model card (Table 1): 116.83B total, 5.13B active, the unembedding counted
    and the embedding not; Mistral's Mixtral 8x7B: 46.7B / 12.9B, the embedding counted."""
    def counts(model):
        j = job(model, nodes=2, pp=1, ep=8, global_batch_size=256)
        return count_params(j), count_active_params(j)

    openai = ModelSpec(**GPT_OSS_120B, active_params_count_embedding=False)
    total, active = counts(openai)
    assert total == pytest.approx(116.83e9, rel=1e-3)
    assert active == pytest.approx(5.13e9, rel=2e-3)
    assert counts(ModelSpec(**GPT_OSS_120B))[1] == pytest.approx(active + 201088 * 2880)  # with it: 5.71B
    assert counts("mixtral-8x7b")[1] == pytest.approx(12.9e9, rel=5e-3)


@pytest.mark.parametrize(("nodes", "readme_gb_s"), [(4, 58.0), (8, 51.0)])
def test_deepeps_own_benchmark_is_priced_at_the_rdma_bandwidth_its_readme_reports(nodes, readme_gb_s):
    """DeepEP's internode test (tests/test_internode.py: 4096 tokens, hidden 7168, top-8 of 256
    experts in 4 groups, FP8 dispatch) divides every node a token reaches, its own included, by
    the time; its README reads 58 GB/s at EP 32, 51 at EP 64 on H800 with 400 Gb/s NICs. Priced
    on the same NIC, the dispatch's time gives that figure back within 3 %, although NCCL's rate
    through the NIC (0.94 of it) would give 4-8 % more."""
    cluster = load_cluster("hgx-h800", num_nodes=nodes)
    n = 8 * nodes
    routing = ExpertRouting(256, 8, nodes, min(nodes, 4))
    token = 4096 * 7168 * (1 + 4 / 128)  # FP8 with its per-128 scales, as the test counts it
    coll = Collective("ep_alltoall", CollectiveKind.ALL_TO_ALL, ParallelDim.EP, token * 8, Phase.FWD, routing=routing)
    layout = GroupLayout(n, nodes, 8)
    seconds = estimate_collective_s(coll, layout, cluster)
    counted = token * expected_units_touched(routing, nodes)  # num_rdma_token_sent * hidden bytes
    assert counted / seconds / 1e9 == pytest.approx(readme_gb_s, rel=0.03)
    nccl_rate = cluster.inter_node.bus_bytes_per_s / cluster.inter_node.dispatch_bytes_per_s
    assert 1.04 < nccl_rate < 1.09


def test_a_cluster_that_states_no_dispatch_rate_prices_deepep_at_nccls_rate():
    link = load_cluster("dgx-h100").inter_node
    plain = link.model_copy(update={"dispatch_efficiency": None})
    assert plain.dispatch_bytes_per_s == plain.bus_bytes_per_s
    assert link.dispatch_bytes_per_s < link.bus_bytes_per_s
