"""The kernels a framework runs around the sampled operators: unfused biases, layout copies,
partitioned checkpoints. Sources: GPT-NeoX megatron/model/transformer.py (ParallelSelfAttention,
ParallelMLP, ParallelTransformerLayer), DeepSpeed runtime/activation_checkpointing."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.catalog import resolve_job
from paraplan.inventory import CollectiveKind, count_job
from paraplan.inventory.layer import EAGER_RMSNORM, EAGER_RMSNORM_KERNELS, count_layer_ops
from paraplan.inventory.ops import OpKind
from paraplan.prediction import predict
from paraplan.prediction.memory import activations_per_microbatch
from paraplan.specs import ConfigError, MemoryKernel

NEOX_20B = {
    "name": "neox-like", "num_layers": 8, "hidden_size": 6144, "num_attention_heads": 64, "seq_length": 2048,
    "vocab_size": 50257, "position_embedding": "rotary", "rotary_percent": 0.25, "attention": "unfused",
    "parallel_residual": True, "add_bias_linear": True,
}


def job(model=None, **parallel):
    plan = {"tp": 4, "pp": 2, "micro_batch_size": 4, "global_batch_size": 64, "recompute": "full", **parallel}
    return resolve_job({"model": {**NEOX_20B, **(model or {})}, "cluster": {"name": "perlmutter", "num_nodes": 4},
                        "parallel": plan, "precision": "fp16"})


def ops_named(name, **model):
    j = job(model)
    return [op for op in count_job(j).stages[0].layer_ops if op.name == name]


def test_unfused_bias_dropout_gives_each_row_parallel_bias_an_add_kernel_of_its_own():
    biases = ops_named("bias_add", bias_dropout_fusion=False)
    own = [op for op in biases if op.bytes > 0]
    assert [op.role for op in own] == ["attention output bias", "MLP output bias"]
    t, h = 2048 * 4, 6144
    assert own[0].bytes == pytest.approx(2 * (2 * t * h + h))  # read and write [s, b, h] in fp16


def test_a_fused_bias_still_costs_its_gradient_but_no_forward_kernel():
    fused = {op.role: op for op in ops_named("bias_add", bias_dropout_fusion=True, parallel_residual=False)}
    assert all(op.bytes == 0 and op.bwd_weight_bytes > 0 for op in fused.values())
    # GPT-J's parallel residual has nothing to fuse the attention bias into
    gptj = {op.role: op for op in ops_named("bias_add", bias_dropout_fusion=True, parallel_residual=True)}
    assert gptj["attention output bias"].bytes > 0 and gptj["MLP output bias"].bytes == 0


def test_models_without_biases_run_no_bias_kernels_and_mlp_bias_can_differ_from_attention():
    assert ops_named("bias_add", add_bias_linear=False) == []
    mlp_only = ops_named("bias_add", add_bias_linear=False, add_bias_mlp=True)
    assert [op.role for op in mlp_only] == ["MLP up projection bias", "MLP output bias"]


def test_partial_rotary_rejoins_q_and_k_and_full_rotary_does_not():
    assert len(ops_named("rotary_concat")) == 1
    assert ops_named("rotary_concat", rotary_percent=1.0) == []


def test_unfused_attention_copies_the_context_and_flash_attention_does_not():
    assert len(ops_named("context_copy")) == 1
    assert ops_named("context_copy", attention="flash") == []


def test_the_qkv_split_costs_nothing_forward_and_one_cat_backward():
    (split,) = ops_named("qkv_split")
    assert split.bytes == 0 and split.bwd_bytes == pytest.approx(2 * 2 * 2048 * 4 * 3 * 6144 / 4)


def test_partitioned_checkpoints_gather_each_layer_input_once_backward_and_hold_a_tp_slice():
    plain, parted = count_job(job()), count_job(job(partition_activations=True))
    gathers = [c for c in parted.stages[0].layer_collectives if c.name == "tp_allgather_checkpoint"]
    assert len(gathers) == 1 and gathers[0].kind is CollectiveKind.ALL_GATHER and gathers[0].phase.value == "bwd_input"
    held_plain, _ = activations_per_microbatch(plain, plain.stages[0])
    held_parted, _ = activations_per_microbatch(parted, parted.stages[0])
    assert held_parted == pytest.approx(held_plain / 4)
    assert predict(job(partition_activations=True)).iteration_s > predict(job()).iteration_s


def test_partitioning_activations_without_full_recompute_is_a_config_error():
    with pytest.raises(ConfigError, match=r"parallel\.partition_activations: .* needs recompute 'full'"):
        job(recompute="selective", partition_activations=True)


@settings(max_examples=25, deadline=None)
@given(hidden=st.sampled_from([1024, 2048, 4096]), rotary=st.sampled_from([0.25, 0.5, 1.0]),
       residual=st.booleans(), flash=st.booleans())
def test_unfusing_the_bias_kernels_never_makes_a_layer_faster(hidden, rotary, residual, flash):
    def layer_s(fused):
        j = job({"hidden_size": hidden, "num_attention_heads": 16, "rotary_percent": rotary,
                 "parallel_residual": residual, "attention": "flash" if flash else "unfused",
                 "bias_dropout_fusion": fused, "bias_gelu_fusion": fused})
        return sum(o.fwd_s + o.bwd_s for o in predict(j).layer_ops)

    assert layer_s(False) >= layer_s(True)


def test_every_added_kernel_is_memory_bound_and_saves_nothing():
    j = job()
    names = {"bias_add", "rotary_concat", "context_copy", "qkv_split"}
    added = [op for op in count_layer_ops(j.model, count_job(j).shape) if op.name in names]
    assert {op.name for op in added} == names
    assert all(op.saved_bytes == 0 and op.kind.value == "elementwise" for op in added)


def test_deepspeed_adds_each_micro_batch_gradient_to_grad_and_megatron_fuses_it_into_the_gemm():
    def accumulate(**parallel):
        inv = count_job(job(**parallel))
        return [op for op in inv.stages[0].layer_ops + inv.stages[0].end_ops if op.name == "grad_accumulate"]

    assert accumulate(framework="megatron") == []
    layer, _embedding = accumulate(framework="deepspeed")
    params = sum(op.params for op in count_job(job()).stages[0].layer_ops)
    m = 64 // (4 * 2)  # global batch / (micro-batch 4 x dp 2): the first micro-batch steals, 7 add
    assert layer.bwd_weight_bytes == pytest.approx(3 * 2 * params * (m - 1) / m)  # fp16: read 2, write 1
    assert accumulate(framework="deepspeed", global_batch_size=8) == []  # one micro-batch: nothing to add
    assert accumulate(framework="megatron", gradient_accumulation_fusion=False)


def test_the_scaled_scores_cost_two_multiplications_backward_only_for_unfused_attention():
    (scale,) = ops_named("score_scale")
    q = k = 2048 * 4 * 64 // 4 * 96  # [b * heads/tp, s, d] each
    assert scale.bytes == 0 and scale.bwd_bytes == pytest.approx(2 * 2 * (q + k))
    assert ops_named("score_scale", attention="flash") == []


def test_eager_swiglu_moves_the_bytes_of_silu_then_multiply():
    """torchtitan / fms-fsdp run ``silu(w1 x) * w3 x`` eagerly: 5 passes forward and 9 backward
    over [tokens, ffn] against the fused kernel's 3 and 4 (Megatron-Core --bias-swiglu-fusion)."""
    llama = {"name": "llama-2-7b", "seq_length": 4096}
    fused, eager = (
        next(op for op in count_job(resolve_job({"model": {**llama, "swiglu_fusion": f}, "cluster": {"name": "dgx-a100"},
                                                 "parallel": {"global_batch_size": 8}})).stages[0].layer_ops
             if op.name == "swiglu")
        for f in (True, False)
    )
    assert eager.bytes / fused.bytes == pytest.approx(5 / 3)
    assert eager.bwd_bytes / fused.bwd_bytes == pytest.approx(9 / 4)
    assert eager.saved_bytes > fused.saved_bytes
    assert (fused.launches, eager.launches) == (1, 2)  # silu, then the multiply


def test_hf_eager_rmsnorm_keeps_a_float32_copy_of_its_input_and_moves_each_operators_bytes():
    """Hugging Face's LlamaRMSNorm (``rmsnorm_fusion: false``) keeps the float32 copy of its
    input and the 16-bit normalized tensor (6 bytes an element in bf16, the fused kernel's 2)
    and runs six operators forward (36 bytes an element in bf16 against 4)."""
    llama = {"name": "llama-2-7b", "seq_length": 4096}
    fused, eager = (
        [op for op in count_job(resolve_job({"model": {**llama, "rmsnorm_fusion": f}, "cluster": {"name": "dgx-a100"},
                                             "parallel": {"global_batch_size": 8}})).stages[0].layer_ops
         if op.kind is OpKind.NORM]
        for f in (True, False)
    )
    assert len(fused) == len(eager) == 2
    assert {op.name for op in fused} == {"RMSlayernorm"} and {op.name for op in eager} == {EAGER_RMSNORM}
    for a, b in zip(fused, eager, strict=True):
        assert b.saved_bytes == pytest.approx(3 * a.saved_bytes)
        assert b.bytes - 2 * 4096 == pytest.approx(9 * (a.bytes - 2 * 4096))  # beyond the weight's
        assert (b.role, b.flops) == (a.role, a.flops)  # selective recompute finds norms by role


def _norms(gpu_node: str, fusion: bool) -> list:
    job = resolve_job({"model": {"name": "llama-2-7b", "seq_length": 4096, "rmsnorm_fusion": fusion},
                       "cluster": {"name": gpu_node}, "parallel": {"global_batch_size": 8}})
    return job, [op for op in count_job(job).stages[0].layer_ops if op.kind is OpKind.NORM]


@pytest.mark.parametrize("node", ["dgx-a100", "dgx-h100"])
def test_an_eager_rmsnorm_is_timed_as_its_kernels_on_the_memory_curve_and_a_fused_one_on_the_norm_curve(node):
    """The fused norm takes the GPU's ``RMSlayernorm`` curve; the eager one (its own name, which
    no GPU has a curve for) takes the memory curves of its kernels' kinds (on A100, which has
    none per kind, the generic memory curve), each of its kernels ramping on its own: the norm
    curve (on A100 GPT-NeoX's unfused norm as sampled) never prices the eager kernels' extra
    bytes a second time."""
    from paraplan.costmodel.roofline import AnalyticalCostModel, mixed_memory_curve, op_curves
    from paraplan.specs import Phase

    for fusion in (True, False):
        job, norms = _norms(node, fusion)
        gpu = job.cluster.gpu
        cm = AnalyticalCostModel(job.cluster, job.precision)
        for op in norms:
            assert op.launches == (1 if fusion else EAGER_RMSNORM_KERNELS)
            for phase, direction in ((Phase.FWD, "fwd"), (Phase.BWD_INPUT, "bwd")):
                _, memory, special = op_curves(op, phase, gpu.efficiency)
                assert special is fusion
                eager = mixed_memory_curve(gpu.efficiency, op.memory_kernels, direction == "fwd") if not fusion else None
                assert memory is (gpu.efficiency.ops[f"RMSlayernorm:{direction}"] if fusion else eager)
                if not fusion:  # H100 has unrolled and strided curves, slower than its vectorized one
                    kinds = gpu.efficiency.memory_kernels
                    assert (eager is gpu.efficiency.memory) is not bool(kinds)
                    if kinds:
                        assert eager.max_fraction < kinds[MemoryKernel.VECTORIZED].max_fraction
                traffic = op.work(phase)[1]
                expected = (traffic + op.launches * memory.half_work) / (
                    gpu.hbm_bandwidth_bytes_per_s * memory.max_fraction) + op.launches * gpu.efficiency.kernel_overhead_s
                assert cm.estimate_op_s(op, phase) == pytest.approx(expected)
            assert ("RMSlayernorm curve" in cm.source_of(op, Phase.FWD)) is fusion


@pytest.mark.parametrize("target", ["megatron", "torchtitan"])
def test_an_export_of_an_eager_rmsnorm_prediction_says_the_target_runs_rmsnorm_fused(target):
    from paraplan.export import megatron, torchtitan

    def notes(fusion):
        job = resolve_job({"model": {"name": "llama-2-7b", "rmsnorm_fusion": fusion}, "cluster": {"name": "dgx-a100"},
                           "parallel": {"framework": "megatron" if target == "megatron" else "fsdp",
                                        "global_batch_size": 8}})
        return {"megatron": megatron, "torchtitan": torchtitan}[target].notes(job)

    assert any(n.startswith("model.rmsnorm_fusion: ") for n in notes(False))
    assert not any(n.startswith("model.rmsnorm_fusion") for n in notes(True))


def test_an_eager_rmsnorm_on_a_layernorm_model_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"rmsnorm_fusion: only an RMSNorm model .*normalization is layernorm"):
        resolve_job({"model": {"name": "gpt3-125m", "rmsnorm_fusion": False}, "cluster": {"name": "dgx-a100"},
                     "parallel": {"global_batch_size": 8}})


def test_fsdp2_copies_gathered_weights_out_and_gradients_in_every_layer():
    """FSDP2 (torchtitan): split_with_sizes_copy of each gathered unit, forward and backward
    (read and write 2 bytes per weight each time), and _chunk_cat of its bf16 gradients into the
    fp32 reduce-scatter buffer (read 2, write 4); FSDP1's flat parameters copy nothing."""
    def ops(version, zero=3):
        job = resolve_job({"model": "llama-2-7b", "cluster": {"name": "dgx-a100", "num_nodes": 2},
                           "parallel": {"framework": "fsdp", "zero_stage": zero, "global_batch_size": 16,
                                        "fsdp_version": version}})
        return count_job(job).stages[0].layer_ops

    layer = ops(2)
    two = {op.name: op for op in layer}
    params = sum(op.params for op in layer)
    assert two["fsdp_copy"].bytes == pytest.approx(2 * 2 * params)
    assert two["fsdp_copy"].bwd_bytes == pytest.approx(2 * 2 * params + (2 + 4) * params)
    assert not any(op.name == "fsdp_copy" for op in ops(1))
    assert not any(op.name == "fsdp_copy" for op in ops(2, zero=1))
