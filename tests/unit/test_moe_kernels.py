"""The kernels Megatron-Core's MoE layer launches per operator (``inventory.moe_kernels``): code
facts for stated configurations, what the inventory carries, what the host launch wait makes of
them."""

import dataclasses

import pytest
from pydantic import ValidationError

from paraplan.catalog.loader import load_cluster, load_model
from paraplan.inventory import count_job
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
    assert ops["linear1"].host_launches is None  # the attention's operators are left as they were


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
