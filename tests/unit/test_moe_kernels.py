"""The kernels Megatron-Core's MoE layer launches per operator (``inventory.moe_kernels``): code
facts for stated configurations, what the inventory carries, what the host launch wait makes of
them."""

import dataclasses

import pytest
from pydantic import ValidationError

from paraplan.catalog.loader import load_cluster, load_model
from paraplan.inventory import count_job
from paraplan.inventory import moe_kernels as mk
from paraplan.inventory.moe_kernels import Kernels, MoeKernelConfig, moe_kernels
from paraplan.prediction import predict
from paraplan.specs import Job, ModelSpec
from paraplan.validate.records import job_from_record

# Qwen3-235B-A22B as the Megatron-MoE-ModelZoo ran it on H100 (runs_moe_dev.json): TP4, EP8, ETP1,
# 128 experts (16 on a rank), softmax top-8 with an aux loss, DeepEP, router and permute fusion
QWEN3_TP4_DEEPEP = MoeKernelConfig(router_fusion=True, permute_fusion=True, dispatcher="deepep", ep=8, etp=1,
                                   tp_cp=4, local_experts=16)


def test_the_qwen3_deepep_layer_launches_what_its_code_launches_per_operator():
    assert moe_kernels(QWEN3_TP4_DEEPEP) == {
        "router": Kernels(1, 6),          # TE general_gemm; backward 2 GEMMs on fp32 copies, 4 casts
        "router_topk": Kernels(1, 1),     # TE fused_topk_with_score_function
        "moe_aux_loss": Kernels(7, 5),    # fused scores, sum, TP all-reduce, fused loss, 3 logging
        "moe_permute": Kernels(9, 7),     # topk, DeepEP layout + notify + dispatch, multihot, permute (4)
        "expert_fc1": Kernels(16, 32),    # one cuBLAS GEMM per local expert
        "activation": Kernels(1, 2),
        "expert_fc2": Kernels(16, 32),
        "moe_unpermute": Kernels(3, 3),   # TE unpermute, DeepEP cached notify + combine
    }


def test_the_alltoall_dispatcher_counts_its_bookkeeping_copies_and_all_to_alls():
    # Qwen3 EP8 PP32 with the alltoall dispatcher: 7 bookkeeping kernels (one all-gather), 4 copies
    # to the host, the fused permute (4), tokens' and probabilities' all-to-alls, the chunk sort (2)
    c = dataclasses.replace(QWEN3_TP4_DEEPEP, dispatcher="alltoall", tp_cp=2)
    kernels = moe_kernels(c)
    assert kernels["moe_permute"] == Kernels(7 + 4 + 4 + 2 + 2, 1 + 2 + 1 + 1)
    assert kernels["moe_unpermute"] == Kernels(2 + 1 + 1, 1 + 1 + 1)
    # expert tensor parallelism adds the all-gathers and the reduce-scatter in fp32
    etp = moe_kernels(dataclasses.replace(c, etp=2))
    assert etp["moe_permute"].fwd == kernels["moe_permute"].fwd + 2
    assert etp["moe_unpermute"].fwd == kernels["moe_unpermute"].fwd + 3


def test_without_the_fusions_the_router_and_the_permutation_launch_eager_pytorchs_kernels():
    eager = moe_kernels(dataclasses.replace(QWEN3_TP4_DEEPEP, router_fusion=False, permute_fusion=False))
    assert eager["router_topk"] == Kernels(10, 4)
    assert eager["moe_aux_loss"].fwd == 16  # softmax, top-k, map (5), sum, all-reduce, loss (4), logging (3)
    assert eager["moe_permute"].fwd == 1 + 3 + 18 + 10  # topk, DeepEP, eager multihot, eager permute
    assert eager["moe_unpermute"].fwd == 9 + 2


def test_a_router_reduced_over_one_rank_has_no_all_reduce():
    alone = moe_kernels(dataclasses.replace(QWEN3_TP4_DEEPEP, tp_cp=1))
    assert alone["moe_aux_loss"].fwd == moe_kernels(QWEN3_TP4_DEEPEP)["moe_aux_loss"].fwd - 1
    assert moe_kernels(dataclasses.replace(QWEN3_TP4_DEEPEP, aux_loss=False))["moe_aux_loss"] == Kernels(0, 0)


def test_group_limited_sigmoid_routing_launches_more_than_softmax_unfused_and_the_same_fused():
    sigmoid = dataclasses.replace(QWEN3_TP4_DEEPEP, router_fusion=False, score_function="sigmoid",
                                  group_limited=True)
    assert moe_kernels(sigmoid)["router_topk"].fwd == 13 + 9
    assert moe_kernels(dataclasses.replace(sigmoid, router_fusion=True))["router_topk"] == Kernels(1, 1)


def _job(**model_fields) -> Job:
    m = load_model("mixtral-8x7b").model_copy(update=model_fields)
    parallel = {"tp": 2, "sequence_parallel": True, "pp": 4, "ep": 4, "micro_batch_size": 1, "global_batch_size": 64,
                "moe_token_dispatcher_type": "flex"}
    return Job(model=m, cluster=load_cluster("dgx-h100", num_nodes=4), parallel=parallel)


def _moe_ops(j: Job):
    return next(b.ops for b in count_job(j).stages[0].blocks if b.moe)


def test_the_inventory_carries_the_codes_forward_kernels_on_each_moe_operator():
    ops = {op.name: op for op in _moe_ops(_job(moe_router_fusion=True, moe_permute_fusion=True))}
    # Mixtral 8 experts over EP4: 2 local experts; the router reduces over TP2; the experts' TP is
    # the attention's (2): DeepEP's routing map and probabilities are expanded over it (2 copies)
    assert ops["expert_fc1"].forward_host_launches == 2 and ops["expert_fc1"].launches == 1
    assert ops["router_topk"].forward_host_launches == 1
    assert ops["moe_aux_loss"].forward_host_launches == 7
    assert ops["moe_permute"].forward_host_launches == 2 + 9
    assert ops["moe_unpermute"].forward_host_launches == 3
    assert ops["swiglu"].forward_host_launches == 1
    # the attention's, as Megatron-Core launches them: TP2 with sequence parallelism
    assert ops["linear1"].forward_host_launches == 2 and ops["linear2"].forward_host_launches == 2


def test_a_torchtitan_moe_is_not_counted_as_megatron_cores():
    j = _job()
    j = j.model_copy(update={"parallel": j.parallel.model_copy(update={"framework": "fsdp", "ep": 1, "pp": 1})})
    assert all(op.host_launches is None for op in _moe_ops(j))


def test_a_host_bound_layer_waits_longer_for_the_host_unfused_than_fused():
    # a small fine-grained MoE (64 experts of width 512, 8 on a rank): its kernels are shorter
    # than their launches, so each kernel the code launches is time
    small = ModelSpec(num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=2048, vocab_size=32000,
                      activation="swiglu", normalization="rmsnorm", position_embedding="rotary",
                      add_bias_linear=False, num_moe_experts=64, moe_router_topk=8, moe_ffn_hidden_size=512)

    def wait(**fields) -> float:
        j = Job(model=small.model_copy(update=fields), cluster=load_cluster("dgx-h100", num_nodes=2),
                parallel={"tp": 2, "sequence_parallel": True, "ep": 8, "micro_batch_size": 1,
                          "global_batch_size": 64, "moe_token_dispatcher_type": "alltoall"})
        return predict(j).breakdown.host_wait_s

    fused = wait(moe_router_fusion=True, moe_permute_fusion=True)
    assert 0.0 < fused < wait()


def test_the_fusion_flags_on_a_dense_model_are_refused():
    with pytest.raises(ValidationError, match="moe_router_fusion"):
        ModelSpec(num_layers=2, hidden_size=256, num_attention_heads=4, seq_length=128, vocab_size=1000,
                  moe_router_fusion=True)


def test_a_published_record_stating_the_fusions_gives_them_to_the_model():
    run = {"id": "r", "gpu": "H100-SXM5-80GB", "num_gpus": 8, "gpus_per_node": 8, "precision": "bf16",
           "framework": "Megatron-Core", "recompute": "none",
           "model": {"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "seq_length": 2048,
                     "vocab_size": 32000, "ffn_hidden_size": 4096, "num_moe_experts": 8, "moe_router_topk": 2,
                     "moe_router_fusion": True, "moe_permute_fusion": True},
           "parallel": {"tp": 1, "pp": 1, "dp": 8, "ep": 8, "micro_batch_size": 1, "global_batch_size": 8}}
    model = job_from_record(run).mapping["model"]
    assert model["moe_router_fusion"] is True and model["moe_permute_fusion"] is True


def test_megatrons_attention_block_launches_its_collectives_norms_rope_and_fused_attention():
    qwen3 = mk.attention_kernels(mk.AttentionKernelConfig(tp=4, sp=True, qk_layernorm=True))
    # input norm, all-gather + QKV GEMM, q and k norms, fused RoPE on q and k, TE's RNG unpack +
    # cuDNN attention, output GEMM + reduce-scatter, bias-dropout-add
    assert [qwen3[n] for n in ("RMSlayernorm", "linear1", "qkv_split", "qk_norm", "RoPE", "flash_atten",
                               "linear2", "res_add")] == [1, 2, 0, 2, 2, 2, 2, 1]
    alone = mk.attention_kernels(mk.AttentionKernelConfig())
    assert (alone["linear1"], alone["linear2"]) == (1, 1)  # no tensor parallelism: no collectives
    assert mk.attention_kernels(mk.AttentionKernelConfig(rope_fusion=False))["RoPE"] == 2 * mk.UNFUSED_ROPE_KERNELS


def test_without_rope_fusion_the_layer_waits_longer_for_the_host():
    def rope_launches(**fields) -> int:
        return next(op for op in _moe_ops(_job(**fields)) if op.name.startswith("RoPE")).forward_host_launches

    assert rope_launches() == 2 and rope_launches(rope_fusion=False) == 24


def test_a_dense_megatron_layer_keeps_one_launch_per_operator():
    m = load_model("llama-2-7b")
    j = Job(model=m, cluster=load_cluster("dgx-h100", num_nodes=1),
            parallel={"tp": 2, "sequence_parallel": True, "micro_batch_size": 1, "global_batch_size": 8})
    assert all(op.host_launches is None for op in count_job(j).stages[0].blocks[0].ops)


def _graphed_job(scope, **parallel) -> Job:
    j = _job(moe_router_fusion=True, moe_permute_fusion=True)
    return j.model_copy(update={"parallel": j.parallel.model_copy(update={"cuda_graph_scope": scope, **parallel})})


def test_cuda_graphs_leave_one_launch_for_the_attention_router_and_preprocessing():
    ops = _moe_ops(_graphed_job(("attn", "moe_router", "moe_preprocess")))
    permute = next(i for i, op in enumerate(ops) if op.name == "moe_permute")
    assert sum(op.forward_host_launches for op in ops[:permute]) == 1  # one graph replay
    eager = {op.name: op for op in _moe_ops(_job(moe_router_fusion=True, moe_permute_fusion=True))}
    # DeepEP with ETP 2: the expansion's two copies and the top-k are in the graph
    assert mk.dispatch_preprocess(MoeKernelConfig(dispatcher="deepep", etp=2)) == 3
    assert ops[permute].forward_host_launches == eager["moe_permute"].forward_host_launches - 3
    assert {op.name: op.forward_host_launches for op in ops[permute + 1:] if op.name.startswith("expert")} == {
        "expert_fc1": 2, "expert_fc2": 2}  # the experts stay launched one by one


def test_graphing_the_attention_alone_leaves_the_router_launched():
    ops = {op.name: op for op in _moe_ops(_graphed_job(("attn",)))}
    assert ops["router_topk"].forward_host_launches == 1 and ops["moe_aux_loss"].forward_host_launches == 7


def test_a_graphed_host_bound_layer_waits_less_for_the_host():
    small = ModelSpec(num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=2048, vocab_size=32000,
                      activation="swiglu", normalization="rmsnorm", position_embedding="rotary",
                      add_bias_linear=False, num_moe_experts=64, moe_router_topk=8, moe_ffn_hidden_size=512)

    def wait(scope) -> float:
        j = Job(model=small, cluster=load_cluster("dgx-h100", num_nodes=2),
                parallel={"tp": 2, "sequence_parallel": True, "ep": 8, "micro_batch_size": 1,
                          "global_batch_size": 64, "moe_token_dispatcher_type": "alltoall", "cuda_graph_scope": scope})
        return predict(j).breakdown.host_wait_s

    assert 0.0 < wait(["attn", "moe_router", "moe_preprocess"]) < wait(["attn"]) < wait(None)


@pytest.mark.parametrize("parallel, reason", [
    ({"framework": "fsdp", "cuda_graph_scope": ["attn"]}, "Megatron-Core"),
    ({"cuda_graph_scope": ["attn", "moe_preprocess"]}, "needs moe_router"),
    ({"cuda_graph_scope": ["moe_router"], "model": "llama-2-7b"}, "has no experts"),
], ids=["another-framework", "preprocess-without-router", "router-of-a-dense-model"])
def test_a_cuda_graph_scope_megatron_would_not_run_is_a_one_line_error(parallel, reason):
    model = load_model(parallel.pop("model", "mixtral-8x7b"))
    with pytest.raises(ValidationError, match=f"parallel.cuda_graph_scope: .*{reason}"):
        Job(model=model, cluster=load_cluster("dgx-h100", num_nodes=1),
            parallel={"micro_batch_size": 1, "global_batch_size": 8, **parallel})


def test_the_gb200_record_gives_its_cuda_graph_scope_to_the_plan():
    import json
    from pathlib import Path

    runs = json.loads((Path(__file__).parents[2] / "benchmarks/data/runs_moe_dev.json").read_text())
    run = next(r for r in runs if r["id"] == "megatron-docs-deepseek-v3-gb200-256gpu-mxfp8")
    parallel = job_from_record(run).mapping["parallel"]
    assert parallel["cuda_graph_scope"] == ["attn", "moe_router", "moe_preprocess"]


def test_context_parallelisms_ring_steps_keep_their_own_launches():
    parallel = {"tp": 2, "sequence_parallel": True, "cp": 2, "ep": 4, "micro_batch_size": 1, "global_batch_size": 64,
                "moe_token_dispatcher_type": "flex"}
    j = Job(model=load_model("mixtral-8x7b"), cluster=load_cluster("dgx-h100", num_nodes=4), parallel=parallel)
    cores = [op for op in _moe_ops(j) if op.name == "flash_atten"]
    assert [op.forward_host_launches for op in cores] == [2, cores[1].launches] and cores[1].launches >= 1


@pytest.mark.parametrize("recipe, expert_casts", [("delayed", 1), ("current", 2)])
def test_an_fp8_layer_launches_its_inputs_quantization_with_each_gemm(recipe, expert_casts):
    parallel = {"tp": 2, "sequence_parallel": True, "pp": 4, "ep": 4, "micro_batch_size": 1, "global_batch_size": 64,
                "moe_token_dispatcher_type": "flex", "fp8_recipe": recipe}
    j = Job(model=load_model("mixtral-8x7b"), cluster=load_cluster("dgx-h100", num_nodes=4), parallel=parallel,
            precision="fp8")
    ops = {op.name: op.forward_host_launches for op in _moe_ops(j)}
    # 2 local experts: their GEMMs, then the grouped input's quantization (one fused kernel only
    # under delayed scaling); the QKV projection's input comes quantized from its fused norm
    assert ops["expert_fc1"] == 2 + expert_casts and ops["expert_fc2"] == 2 + expert_casts
    assert (ops["linear1"], ops["linear2"]) == (2, 3)
    assert ops["fp8_cast"] == 0  # counted with the GEMMs
