"""Recompute as frameworks offer it (inventory.recompute): Megatron-LM's granularity, method and
number of layers (megatron/core/transformer/transformer_config.py), torchtitan's selective layer
and op policies (torchtitan/models/llama/parallelize_llama.py) and fms-fsdp's every n-th block."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.catalog import resolve_job
from paraplan.inventory import OpKind, count_job
from paraplan.inventory.recompute import op_policy_weights, recompute_cost
from paraplan.prediction import predict
from paraplan.prediction.memory import step_memory
from paraplan.specs import ConfigError

MODEL = {"name": "llama-2-7b", "seq_length": 4096, "num_layers": 8}


def job(recompute="none", framework="megatron", **parallel):
    plan = {"micro_batch_size": 1, "global_batch_size": 8, "recompute": recompute, "framework": framework, **parallel}
    return resolve_job({"model": MODEL, "cluster": {"name": "dgx-a100"}, "parallel": plan})


def seconds(j):
    p = predict(j)
    return p.stages[0].forward_mb_s, p.stages[0].recompute_mb_s, p.memory[0].activations


def kept(j):
    """The activations the first stage keeps for the backward pass (all of them, not the peak moment's)."""
    inv = count_job(j)
    return step_memory(inv, inv.stages[0])[0].activations


def test_megatron_block_recomputes_only_its_first_layers():
    _, full_rc, _ = seconds(job("full"))
    _, block_rc, _ = seconds(job("full", recompute_method="block", recompute_num_layers=2))
    assert block_rc == pytest.approx(full_rc * 2 / 8, rel=1e-9)


def test_megatron_uniform_groups_keep_one_input_per_group_and_recompute_every_layer():
    _, rc1, _ = seconds(job("full"))
    _, rc4, _ = seconds(job("full", recompute_method="uniform", recompute_num_layers=4))
    mem1, mem4 = kept(job("full")), kept(job("full", recompute_method="uniform", recompute_num_layers=4))
    assert rc4 == pytest.approx(rc1)
    inv = count_job(job("full"))
    x = inv.shape
    layer_input = x.e * x.b * x.s_norm * x.h
    layer_saved = sum(op.saved_bytes for op in inv.stages[0].layer_ops)
    # 8 inputs + 1 layer's activations vs 2 inputs + 4 layers' activations
    assert mem4 - mem1 == pytest.approx((2 - 8) * layer_input + (4 - 1) * layer_saved, rel=1e-9)


def test_torchtitan_layer_policy_recomputes_every_nth_layer():
    _, full_rc, _ = seconds(job("full", "fsdp"))
    _, half_rc, _ = seconds(job("layer", "fsdp"))
    _, third_rc, _ = seconds(job("layer", "fsdp", recompute_every=4))
    assert half_rc == pytest.approx(full_rc / 2)
    assert third_rc == pytest.approx(full_rc / 4)


# torchtitan's per-op policy counts the aten.mm calls of one block's forward (from 0 in every
# block) and re-runs the even ones, so which GEMMs it re-runs follows the model code's call
# order: torchtitan 0.1 wq wk wv wo w1 w3 w2, torchtitan 0.3 wqkv wo w1 w3 w2, one QKV and one
# gate/up GEMM (the model's defaults) QKV wo up down.
OP_POLICY_RERUNS = [
    ("torchtitan-0.1", ("key projection", "attention output projection", "MLP up projection")),
    ("torchtitan-0.3", ("attention output projection", "MLP up projection")),
    ("fsdp", ("attention output projection", "MLP down projection")),
]


@pytest.mark.parametrize(("framework", "rerun"), OP_POLICY_RERUNS)
def test_torchtitan_op_policy_reruns_every_second_matmul_of_a_layer_in_the_order_its_forward_calls_them(
        framework, rerun):
    p = predict(job("op", framework))
    gemms = [o for o in p.layer_ops if o.kind == OpKind.GEMM.value]
    assert tuple(o.role for o in gemms if o.recompute_s > 0) == rerun
    assert [o.recompute_s > 0 for o in gemms] == [i % 2 == 1 for i in range(len(gemms))]
    assert all(o.recompute_s == o.fwd_s for o in gemms if o.recompute_s > 0)


@pytest.mark.parametrize("framework", ["torchtitan-0.1", "torchtitan-0.3", "fsdp"])
def test_torchtitan_op_policy_reruns_every_elementwise_kernel_but_not_attention(framework):
    p = predict(job("op", framework))
    ops = {o.name: o for o in p.layer_ops}
    # FSDP2's copy-out of the gathered weights runs outside the checkpointed block
    elementwise = [o for o in p.layer_ops if o.kind not in ("gemm", "attention", "bmm", "softmax")
                   and o.name != "fsdp_copy"]
    assert ops["flash_atten"].recompute_s == 0.0
    assert elementwise and all(o.recompute_s == o.fwd_s for o in elementwise)


def _op_policy_held(j):
    """What the op policy keeps per layer (held_bytes of one layer), and the layer's shape."""
    inv = count_job(j)
    return recompute_cost(j.parallel, inv.stages[0].layer_ops, inv.shape, 1).held_bytes, inv.shape


@pytest.mark.parametrize(("framework", "kept"), [
    # Llama 2 7B (MHA, 4,096 wide, ffn 11,008): wq wv w1 w2 outputs kept, attention's output
    ("torchtitan-0.1", 4096 + 4096 + 11008 + 4096 + 4096),
    ("torchtitan-0.3", 3 * 4096 + 11008 + 4096 + 4096),  # wqkv w1 w2, attention's output
    ("fsdp", 3 * 4096 + 2 * 11008 + 4096),  # QKV and gate/up, attention's output
])
def test_torchtitan_op_policy_keeps_the_outputs_of_the_gemms_it_does_not_rerun_and_of_attention(framework, kept):
    """Per layer: its input, the kept GEMMs' outputs, the attention kernel's output and its
    logsumexp (fp32 per head and query); not the q, k, v FlashAttention saves for itself (RoPE
    is re-run from the projections)."""
    held, x = _op_policy_held(job("op", framework))
    tokens = x.b * x.s
    assert held == pytest.approx(2 * tokens * (4096 + kept) + 4 * x.b * x.heads * x.s, rel=1e-12)


def test_torchtitan_op_policy_on_llama_3_8b_keeps_what_half_of_every_gemm_and_q_k_v_did():
    """Llama 3 8B (GQA: K and V 1,024 wide), torchtitan 0.1's separate projections: the kept
    outputs of wq, wv, w1, w2 (23,552 per token) are 2,048 more than half of every GEMM's output
    (21,504), and the attention's output (4,096) is 2,048 less than q, k and v (6,144), so the
    published torchtitan memory (tests/golden/test_published_memory.py) is predicted the same."""
    j = resolve_job({"model": "llama-3-8b", "cluster": {"name": "dgx-a100"},
                     "parallel": {"framework": "torchtitan-0.1", "micro_batch_size": 1, "global_batch_size": 8,
                                  "recompute": "op"}})
    held, x = _op_policy_held(j)
    tokens, lse = x.b * x.s, 4 * x.b * x.heads * x.s
    assert held == pytest.approx(2 * tokens * (4096 + 23552 + 4096) + lse, rel=1e-12)
    assert held == pytest.approx(2 * tokens * (4096 + 43008 / 2 + 6144) + lse, rel=1e-12)


def test_torchtitan_op_policy_with_sequence_parallel_also_keeps_the_two_reduce_scatters_outputs():
    """torchtitan's save set holds ``reduce_scatter_tensor``: the row-parallel projections'
    outputs, reduce-scattered to [b, s/tp, h], are kept besides the GEMM outputs."""
    def kept_over_input(j):
        held, x = _op_policy_held(j)
        return held / (x.e * x.b * x.s_norm * x.h), x
    sp, x = kept_over_input(job("op", "torchtitan-0.1", tp=2, sequence_parallel=True))
    no_sp, _ = kept_over_input(job("op", "torchtitan-0.1", tp=2, sequence_parallel=False))
    # per token of the layer input, the GEMM and attention outputs are the same columns either way
    # (whole sequence, tp's share of the columns), over an input of s / 2 tokens with SP
    assert sp == pytest.approx(2 * (no_sp - 1) + 1 + 2, rel=1e-9)
    assert x.s_norm == x.s // 2


def test_torchtitan_op_policy_reruns_a_moe_layer_s_router_and_routed_experts_and_counts_its_shared_experts():
    """torchtitan 0.3.0: the router's GEMM is re-run by its shape, uncounted
    (``force_recompute_mm_shapes_by_fqns = ["moe.router.gate"]``), the routed experts'
    ``torch._grouped_mm`` is outside the save set and the count, and the shared experts' w1 w3 w2
    continue the count after MLA's five matmuls (wq_a wq_b wkv_a wkv_b wo)."""
    j = resolve_job({"model": "deepseek-v3", "cluster": {"name": "dgx-h100", "num_nodes": 1},
                     "parallel": {"framework": "torchtitan-0.3", "ep": 8, "micro_batch_size": 1,
                                  "global_batch_size": 8, "recompute": "op"}})
    block = next(b for b in count_job(j).stages[0].blocks if any(op.expert for op in b.ops))
    rerun = [op.role for op, w in zip(block.ops, op_policy_weights(block.ops), strict=True)
             if op.kind is OpKind.GEMM and w == 1.0]
    assert rerun == ["query up projection (MLA)", "key-value up projection (MLA)", "MoE router scores",
                     "experts' gate projection (grouped GEMM)", "experts' up projection (grouped GEMM)",
                     "experts' down projection", "shared experts gate projection", "shared experts down projection"]


@settings(max_examples=20, deadline=None)
@given(st.sampled_from([("none", {}), ("op", {}), ("layer", {"recompute_every": 2}), ("layer", {"recompute_every": 3})]))
def test_no_policy_recomputes_more_than_full_or_keeps_more_than_none(case):
    policy, extra = case
    _, rc, _ = seconds(job(policy, "fsdp", **extra))
    _, rc_full, _ = seconds(job("full", "fsdp"))
    _, rc_none, _ = seconds(job("none", "fsdp"))
    assert rc_none <= rc <= rc_full + 1e-12
    # what each keeps: every saved activation, alive together at the backward's start (the
    # step's peak may fall at another moment, the end of the backward, where one layer's are)
    mem, mem_full, mem_none = (kept(j) for j in (job(policy, "fsdp", **extra), job("full", "fsdp"), job("none", "fsdp")))
    assert mem_full <= mem + 1e-6 and mem <= mem_none + 1e-6 and mem_full < mem_none


def test_hardware_flops_count_what_each_policy_recomputes():
    model_flops = predict(job("none", "fsdp")).model_flops_per_iteration
    hw = {p: count_job(job(p, "fsdp")).hardware_flops_per_iteration for p in ("none", "layer", "full")}
    assert model_flops < hw["none"] < 1.05 * model_flops  # FlashAttention's backward recompute
    assert hw["layer"] - hw["none"] == pytest.approx((hw["full"] - hw["none"]) / 2)


@pytest.mark.parametrize(
    ("framework", "policy", "choices"),
    [("megatron", "op", "none, selective, full"), ("fsdp", "selective", "none, full, layer, op")],
)
def test_a_policy_the_framework_lacks_is_refused_with_its_choices(framework, policy, choices):
    with pytest.raises(ConfigError, match=f"has no '{policy}' recompute \\(it has: {choices}\\)"):
        job(policy, framework)


def test_megatron_method_needs_full_recompute():
    with pytest.raises(ConfigError, match="recompute_method"):
        job("selective", recompute_method="block", recompute_num_layers=2)
