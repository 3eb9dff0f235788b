"""Mixture of experts and expert parallelism: what the inventory counts, how the plan is
checked, what the prediction costs."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from paraplan.catalog.loader import load_cluster, load_model
from paraplan.inventory import CollectiveKind, ParallelDim, count_job
from paraplan.inventory.partition import split_layers
from paraplan.prediction import predict
from paraplan.prediction.memory import estimate_memory
from paraplan.specs import Job, ModelSpec

SMALL_MOE = dict(num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=2048,
                 vocab_size=32000, activation="swiglu", normalization="rmsnorm",
                 position_embedding="rotary", add_bias_linear=False,
                 untie_embeddings_and_output_weights=True, num_moe_experts=8, moe_router_topk=2,
                 moe_ffn_hidden_size=2048)


def job(model="mixtral-8x7b", nodes=4, **parallel) -> Job:
    m = load_model(model) if isinstance(model, str) else model
    parallel = {"tp": 1, "pp": 1, "micro_batch_size": 1, "global_batch_size": 64, **parallel}
    if m.num_layers % parallel["pp"]:  # Megatron-LM runs an uneven split only when it is given
        parallel.setdefault("layers_per_stage", split_layers(m.num_layers, parallel["pp"]))
    return Job(model=m, cluster=load_cluster("dgx-h100", num_nodes=nodes), parallel=parallel)


def _ops(j: Job, name: str):
    return [op for st in count_job(j).stages for b in st.blocks for op in b.ops if op.name == name]


def test_the_experts_flops_on_a_rank_do_not_depend_on_expert_parallelism_when_balanced():
    one, eight = _ops(job(pp=4, ep=1), "expert_fc1")[0], _ops(job(pp=4, ep=8), "expert_fc1")[0]
    assert one.flops == eight.flops
    assert one.params == 8 * eight.params  # eight experts on a rank against one
    assert dict(eight.dims)["experts"] == 1


def test_a_moe_layer_dispatches_and_combines_with_four_all_to_alls_of_its_token_copies():
    j = job(pp=4, ep=8)
    block = count_job(j).stages[0].blocks[0]
    a2a = [c for c in block.collectives if c.kind is CollectiveKind.ALL_TO_ALL]
    assert sum(c.count for c in a2a) == 4 and {c.dim for c in a2a} == {ParallelDim.EP}
    m = j.model
    assert a2a[0].bytes == 2 * j.parallel.micro_batch_size * m.seq_length * m.moe_router_topk * m.hidden_size


def test_without_expert_parallelism_there_is_no_all_to_all():
    block = count_job(job(pp=4)).stages[0].blocks[0]
    assert not [c for c in block.collectives if c.kind is CollectiveKind.ALL_TO_ALL]


def test_the_busiest_ranks_load_slows_the_layer_and_grows_its_memory():
    even, skewed = job(pp=4, ep=8), job(pp=4, ep=8, expert_load_imbalance=1.5)
    assert predict(skewed).iteration_s > predict(even).iteration_s
    assert estimate_memory(count_job(skewed))[0].activations > estimate_memory(count_job(even))[0].activations


def test_the_busiest_ranks_load_multiplies_its_experts_gemms_and_its_all_to_alls_not_its_attention():
    even, skewed = job(pp=4, ep=8), job(pp=4, ep=8, expert_load_imbalance=1.5)
    for name in ("expert_fc1", "expert_fc2"):
        assert _ops(skewed, name)[0].flops == pytest.approx(1.5 * _ops(even, name)[0].flops, rel=1e-6)
    a2a = [[c.bytes for st in count_job(j).stages[:1] for c in st.blocks[0].collectives
            if c.kind is CollectiveKind.ALL_TO_ALL] for j in (even, skewed)]
    assert a2a[1] == pytest.approx([1.5 * b for b in a2a[0]], rel=1e-6)
    assert _ops(skewed, "linear1")[0].flops == _ops(even, "linear1")[0].flops  # the QKV projection


def test_a_capacity_factor_caps_the_busiest_ranks_load():
    capped = ModelSpec(**SMALL_MOE, moe_expert_capacity_factor=1.25)
    a = _ops(job(capped, nodes=1, ep=8, expert_load_imbalance=3.0), "expert_fc1")[0]
    b = _ops(job(capped, nodes=1, ep=8, expert_load_imbalance=1.25), "expert_fc1")[0]
    assert a.flops == b.flops


def test_an_assumed_balanced_router_is_said_in_the_prediction():
    notes = predict(job(pp=4, ep=8)).uncalibrated
    assert any("expert load assumed perfectly balanced" in n for n in notes)
    assert not any("balanced" in n for n in predict(job(pp=4, ep=8, expert_load_imbalance=1.2)).uncalibrated)


def test_experts_optimizer_states_shard_over_the_expert_data_parallel_ranks():
    # 32 GPUs, pp 4: 8 ranks per stage; ep 8 leaves edp 1, ep 2 leaves edp 4
    few, many = job(pp=4, ep=2, zero_stage=1), job(pp=4, ep=8, zero_stage=1)
    assert few.parallel.edp == 4 and many.parallel.edp == 1
    st_few, st_many = count_job(few).stages[1], count_job(many).stages[1]
    assert st_few.expert_params == 4 * st_many.expert_params
    mem_few, mem_many = estimate_memory(count_job(few))[1], estimate_memory(count_job(many))[1]
    # each rank keeps 4x the experts' weights with ep 2, and a quarter of their optimizer states
    # per expert: the states come out equal
    assert mem_few.optimizer_states == pytest.approx(mem_many.optimizer_states, rel=0.01)
    assert mem_few.weights > 3 * mem_many.weights * 0.9


def test_one_gemm_per_expert_is_slower_than_a_grouped_gemm():
    grouped = ModelSpec(**SMALL_MOE)
    looped = ModelSpec(**SMALL_MOE, moe_grouped_gemm=False)
    assert predict(job(looped, nodes=1)).iteration_s > predict(job(grouped, nodes=1)).iteration_s


def test_a_grouped_gemm_ramps_up_once_per_wave_of_transformer_engines_four_streams():
    many = {**SMALL_MOE, "num_moe_experts": 16}  # 16 local experts at ep 1: 4 waves of 4
    te = _ops(job(ModelSpec(**many), nodes=1), "expert_fc1")[0]
    one_kernel = _ops(job(ModelSpec(**many, moe_grouped_gemm_streams=16), nodes=1), "expert_fc1")[0]
    looped = _ops(job(ModelSpec(**many, moe_grouped_gemm=False), nodes=1), "expert_fc1")[0]
    assert (te.launches, one_kernel.launches, looped.launches) == (4, 1, 16)
    assert te.flops == one_kernel.flops == looped.flops


def test_a_grouped_gemm_on_at_most_four_local_experts_is_one_wave_at_their_summed_size():
    eight = _ops(job(ModelSpec(**SMALL_MOE), nodes=1, ep=2), "expert_fc1")[0]  # 4 local experts
    assert eight.launches == 1


def test_the_grouped_gemms_streams_order_the_prediction_between_one_kernel_and_a_loop():
    many = {**SMALL_MOE, "num_moe_experts": 16}
    seconds = [predict(job(ModelSpec(**many, **extra), nodes=1)).iteration_s
               for extra in ({"moe_grouped_gemm_streams": 16}, {}, {"moe_grouped_gemm": False})]
    assert seconds[0] < seconds[1] < seconds[2]


def test_grouped_gemm_streams_on_a_dense_model_is_refused():
    dense = {k: v for k, v in SMALL_MOE.items() if not k.startswith("moe_") and k != "num_moe_experts"}
    with pytest.raises(ValidationError, match="moe_grouped_gemm_streams"):
        ModelSpec(**dense, moe_grouped_gemm_streams=4)


def test_deepseek_v3_stages_mix_dense_and_moe_layers_as_the_model_orders_them():
    j = job("deepseek-v3", nodes=128, pp=16, ep=64, global_batch_size=1024, recompute="full")
    stages = count_job(j).stages
    assert [(b.num_layers, b.moe) for b in stages[0].blocks] == [(3, False), (1, True)]
    assert [(b.num_layers, b.moe) for b in stages[1].blocks] == [(4, True)]
    assert sum(b.num_layers for s in stages for b in s.blocks if b.moe) == 58


def test_moe_layer_freq_as_an_int_makes_every_nth_layer_moe_from_the_first():
    m = ModelSpec(**{**SMALL_MOE, "num_layers": 6}, moe_layer_freq=2)
    assert m.moe_layers == (True, False, True, False, True, False)
    m = ModelSpec(**{**SMALL_MOE, "num_layers": 4}, moe_layer_freq=(0, 1, 1, 0))
    assert m.moe_layers == (False, True, True, False)


@pytest.mark.parametrize(
    ("model", "parallel", "field"),
    [
        (SMALL_MOE, {"ep": 3}, "parallel.ep"),
        (SMALL_MOE, {"ep": 8, "etp": 3}, "parallel.etp"),
        ({**SMALL_MOE, "num_moe_experts": 16}, {"ep": 16}, "parallel.ep"),  # 16 > 8 ranks of a stage
        ({k: v for k, v in SMALL_MOE.items() if not k.startswith(("num_moe", "moe_"))}, {"ep": 2},
         "parallel.expert_model_parallel_size"),
        (SMALL_MOE, {"tp": 2, "sequence_parallel": False}, "parallel.sequence_parallel"),
    ],
)
def test_expert_parallelism_that_does_not_fit_is_refused_naming_the_field(model, parallel, field):
    with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
        job(ModelSpec(**model), nodes=1, **parallel)


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"moe_router_topk": 9}, "moe_router_topk"),
        ({"moe_layer_freq": (1, 0)}, "moe_layer_freq"),
        ({"num_moe_experts": None, "moe_router_topk": None, "moe_ffn_hidden_size": None, "moe_aux_loss_coeff": 0.1},
         "moe_aux_loss_coeff"),
        ({"q_lora_rank": 64}, "q_lora_rank"),
    ],
)
def test_a_moe_or_mla_field_that_does_not_fit_the_model_is_refused_naming_it(fields, name):
    with pytest.raises(ValidationError, match=name):
        ModelSpec(**{k: v for k, v in {**SMALL_MOE, **fields}.items() if v is not None})


def test_mla_attention_costs_heads_of_192_query_and_128_value_dimensions():
    j = job("deepseek-v3", nodes=128, pp=16, ep=64, global_batch_size=1024)
    core = _ops(j, "flash_atten")[0]
    s, heads = j.model.seq_length, j.model.num_attention_heads
    assert core.flops == 2.0 * heads * s * s * (192 + 128)
    names = [op.name for op in count_job(j).stages[1].blocks[0].ops]
    assert names[:6] == ["RMSlayernorm", "q_down", "q_norm", "q_up", "kv_down", "kv_norm"]


def test_a_dense_model_has_one_block_of_layers_and_no_expert_weights():
    inv = count_job(job("llama-3-8b", nodes=1, pp=2))
    assert all(len(st.blocks) == 1 and st.expert_params == 0 for st in inv.stages)


@settings(max_examples=25, deadline=None)
@given(layers=st.integers(min_value=2, max_value=8), data=st.data(), ep=st.sampled_from([1, 2, 4, 8]))
def test_more_moe_layers_never_take_less_time(layers, data, ep):
    """Replacing a dense layer by a MoE layer of 4x the MLP work per token adds time."""
    first_dense = data.draw(st.integers(min_value=0, max_value=layers - 2))

    def model(k):
        return ModelSpec(**{**SMALL_MOE, "num_layers": layers, "moe_ffn_hidden_size": 4096, "ffn_hidden_size": 2048},
                         moe_first_k_dense=k)
    fewer = predict(job(model(first_dense + 1), nodes=1, ep=ep)).iteration_s
    more = predict(job(model(first_dense), nodes=1, ep=ep)).iteration_s
    assert more >= fewer


HF_CONFIGS = {
    # the fields of each family's config.json that shape the model (values of the published
    # checkpoints: deepseek-ai/DeepSeek-V3, mistralai/Mixtral-8x7B-v0.1, Qwen/Qwen3-30B-A3B)
    "deepseek_v3": ({"hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
                     "num_hidden_layers": 61, "first_k_dense_replace": 3, "moe_layer_freq": 1,
                     "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
                     "scoring_func": "sigmoid", "num_attention_heads": 128, "num_key_value_heads": 128,
                     "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                     "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
                     "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "hidden_act": "silu"},
                    "deepseek-v3"),
    "mixtral": ({"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8,
                 "num_experts_per_tok": 2, "vocab_size": 32000, "rms_norm_eps": 1e-5,
                 "router_aux_loss_coef": 0.02, "tie_word_embeddings": False, "hidden_act": "silu"},
                "mixtral-8x7b"),
    "qwen3_moe": ({"hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
                   "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
                   "moe_intermediate_size": 768, "intermediate_size": 6144, "decoder_sparse_step": 1,
                   "mlp_only_layers": [], "vocab_size": 151936, "tie_word_embeddings": False,
                   "rms_norm_eps": 1e-6, "hidden_act": "silu"},
                  "qwen3-30b-a3b"),
}


@pytest.mark.parametrize("model_type", sorted(HF_CONFIGS))
def test_a_hugging_face_moe_config_reads_as_the_catalog_model_it_describes(model_type, tmp_path):
    import json

    from paraplan.catalog.hf import model_from_hf_config
    from paraplan.inventory.job import _params
    from paraplan.inventory.shapes import shard_shape
    from paraplan.specs import Precision

    fields, name = HF_CONFIGS[model_type]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, **fields}))
    read = ModelSpec(**model_from_hf_config(tmp_path, {"seq_length": 4096}))
    catalog = load_model(name)
    assert read.moe_layers == catalog.moe_layers
    x = shard_shape(read, 1, 1, False, 1, Precision.BF16)
    y = shard_shape(catalog, 1, 1, False, 1, Precision.BF16)
    assert _params(read, x) == _params(catalog, y)
    assert _params(read, x, active=True) == _params(catalog, y, active=True)


def test_the_published_moe_runs_become_moe_jobs_or_are_skipped_with_a_reason():
    from pathlib import Path

    from paraplan.validate.published import measured_from_published
    from paraplan.validate.runs import load_runs

    runs = load_runs(Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "runs_moe_dev.json")
    mixtral = measured_from_published(next(r for r in runs if "mixtral" in r["id"]))
    assert mixtral.job.model.num_moe_experts == 8 and mixtral.job.parallel.ep == 8
    assert mixtral.job.parallel.etp == 1 and mixtral.job.parallel.vpp == 8
    assert any("balanced" in a for a in mixtral.assumed)
    deepseek = next(r for r in runs if r["id"].startswith("megatron-docs-deepseek"))
    from paraplan.validate.records import _experts
    fields = _experts(deepseek, [])
    assert fields["moe_layer_freq"] == (0,) * 3 + (1,) * 58 and fields["multi_latent_attention"]


def test_fp8_training_casts_the_experts_inputs_as_well_as_the_attentions():
    j = Job(model=load_model("mixtral-8x7b"), cluster=load_cluster("dgx-h100", num_nodes=4),
            parallel={"tp": 1, "pp": 4, "ep": 8, "micro_batch_size": 1, "global_batch_size": 64}, precision="fp8")
    ops = count_job(j).stages[0].blocks[0].ops
    cast = next(op for op in ops if op.name == "fp8_cast")
    fp8 = [op.name for op in ops if op.fp8]
    assert {"expert_fc1", "expert_fc2", "linear1", "linear2"} <= set(fp8) and "router" not in fp8
    assert dict(cast.dims)["gemms"] == len(fp8)


def test_the_heterogeneous_search_refuses_a_model_mixing_dense_and_moe_layers_in_one_line():
    from paraplan.catalog.loader import load_any_cluster
    from paraplan.search import search_plans
    from paraplan.specs import ConfigError

    with pytest.raises(ConfigError, match=r"^search: the heterogeneous-cluster search needs every layer alike"):
        search_plans(load_model("deepseek-v3"), load_any_cluster("hetero-a100-a10"), 64)


def test_an_all_to_all_across_nodes_runs_at_each_gpus_own_nic_not_the_nodes_summed():
    from paraplan.costmodel.collectives import estimate_collective_s
    from paraplan.inventory import Collective, GroupLayout
    from paraplan.specs import Phase

    cluster = load_cluster("dgx-h100", num_nodes=8)
    size = 134e6
    coll = Collective("ep_alltoall", CollectiveKind.ALL_TO_ALL, ParallelDim.EP, size, Phase.FWD)
    seconds = estimate_collective_s(coll, GroupLayout(size=64, nodes=8, per_node=8), cluster)
    off_node = size * 56 / 64  # each GPU's bytes for the 56 peers on other nodes, through its NIC
    assert seconds >= off_node / cluster.inter_node.bus_bytes_per_s


def test_mla_under_sequence_parallelism_gathers_its_latents_not_the_hidden_state():
    j = job("deepseek-v3", nodes=128, tp=2, pp=16, ep=64, etp=1, sequence_parallel=True, global_batch_size=1024)
    block = count_job(j).stages[1].blocks[0]
    ops = {op.name: op for op in block.ops}
    own = j.model.seq_length // 2  # micro-batch 1, s / tp tokens on this rank
    assert dict(ops["q_down"].dims)["m"] == own and dict(ops["q_up"].dims)["m"] == j.model.seq_length
    latent = [c for c in block.collectives if c.name == "tp_allgather_latent"]
    assert latent[0].bytes == 2 * j.model.seq_length * (1536 + 512 + 64)


def test_the_router_keeps_the_pre_mlp_norm_output_for_its_weight_gradient():
    j = job(pp=4, ep=8)
    router = _ops(j, "router")[0]
    assert router.saved_bytes == 2 * j.model.seq_length * j.model.hidden_size


def test_hugging_face_moe_layer_steps_count_as_each_family_counts_them(tmp_path):
    import json

    from paraplan.catalog.hf import model_from_hf_config

    qwen = {**HF_CONFIGS["qwen3_moe"][0], "num_hidden_layers": 4, "decoder_sparse_step": 2}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", **qwen}))
    assert ModelSpec(**model_from_hf_config(tmp_path, {"seq_length": 64})).moe_layers == (False, True, False, True)
    deepseek = {**HF_CONFIGS["deepseek_v3"][0], "num_hidden_layers": 6, "first_k_dense_replace": 1, "moe_layer_freq": 2}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "deepseek_v3", **deepseek}))
    pattern = ModelSpec(**model_from_hf_config(tmp_path, {"seq_length": 64})).moe_layers
    assert pattern == (False, False, True, False, True, False)  # layer i MoE when i >= 1 and i % 2 == 0


def test_uneven_layers_let_the_search_split_deepseek_v3s_61_layers_over_pipeline_stages():
    from paraplan.search import SearchSpace, search_plans

    # ep 16: with ep 8 each GPU's share of the experts' bf16 weights and fp32 gradients (36 GiB
    # at 4 layers a stage) no longer fits beside the all-to-all's NCCL buffers, the allocator's
    # fragmentation and the 5 % headroom (issue 24's memory model)
    space = SearchSpace(tp=(1,), pp=(8, 16), ep=(16,), micro_batch_size=(1,), zero_stage=(1,),
                        recompute=("full",), uneven_layers=True)
    result = search_plans(load_model("deepseek-v3"), load_cluster("dgx-h100", num_nodes=32), 1024, space=space)
    assert {p.job.parallel.pp for p in result.ranked} == {16}  # pp 8 holds too much per GPU
    from paraplan.search.space import UNEVEN_NOT_SCREENED
    from paraplan.specs.plan import PP_LAYERS_REASON

    assert not {PP_LAYERS_REASON, UNEVEN_NOT_SCREENED} & set(result.excluded)
    best = result.ranked[0]
    assert sum(s.num_layers for s in best.stages) == 61


def test_zb_v_places_each_stage_on_chunks_i_and_2p_minus_1_minus_i():
    from paraplan.inventory.partition import count_moe_layers_per_stage

    # 8 layers, the first 3 dense: chunks of 2 layers are (d d) (d m) (m m) (m m); pp 2
    model = ModelSpec(**{**SMALL_MOE, "num_layers": 8}, moe_first_k_dense=3)
    v = job(model, nodes=1, pp=2, framework="fsdp", schedule="zb-v", global_batch_size=8).parallel
    flat = job(model, nodes=1, pp=2, framework="fsdp", schedule="zb-h1", global_batch_size=8).parallel
    assert count_moe_layers_per_stage(model, v) == (2, 3)  # chunks 0 + 3 (0 + 2), 1 + 2 (1 + 2)
    assert count_moe_layers_per_stage(model, flat) == (1, 4)


def test_mla_tensor_parallel_ranks_all_reduce_their_duplicated_down_projections_gradients():
    sp = job("deepseek-v3", nodes=128, tp=2, pp=16, ep=64, etp=1, sequence_parallel=True, global_batch_size=1024)
    st = count_job(sp).stages[1]
    dup = [c for c in st.grad_sync if c.name == "tp_allreduce_duplicated"]
    per_layer = 7168 * 1536 + 1536 + 7168 * (512 + 64) + 512  # q_down, q_norm, kv_down, kv_norm
    assert dup and dup[0].bytes == 4 * per_layer * st.num_layers  # fp32 gradients (bf16 training)
    tp1 = job("deepseek-v3", nodes=128, pp=16, ep=64, global_batch_size=1024)
    assert not [c for c in count_job(tp1).stages[1].grad_sync if c.name == "tp_allreduce_duplicated"]


def test_torchtitan_runs_its_experts_as_one_grouped_kernel_and_megatron_in_waves_of_four():
    """torchtitan's GroupedExperts call torch._grouped_mm (one kernel for the local experts);
    Megatron-Core's TEGroupedMLP runs one cuBLAS GEMM per expert on Transformer Engine's 4 streams."""
    from paraplan.catalog import resolve_job
    from paraplan.inventory import count_job

    def fc1(framework):
        job = resolve_job({"model": "qwen3-30b-a3b", "cluster": {"name": "dgx-h100", "num_nodes": 1},
                           "parallel": {"ep": 8, "global_batch_size": 8, "micro_batch_size": 1,
                                        "framework": framework}})
        block = next(b for b in count_job(job).stages[0].blocks if b.moe)
        return next(op for op in block.ops if op.name == "expert_fc1")

    experts = 128 // 8
    assert fc1("megatron").launches == experts // 4
    assert fc1("fsdp").launches == 1
