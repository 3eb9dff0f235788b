"""Memory-bound operators priced by the kinds of streaming kernel their code runs (issue 27):
the inventory names each operator's kinds (``inventory.kernel_mixes``), the GPU's catalog has a
curve per kind where measured (``efficiency.memory_kernels``), the roofline times each kind's
share of the bytes on its curve and falls back to the generic memory curve."""

from __future__ import annotations

import dataclasses

import pytest

from paraplan.catalog.loader import load_gpu
from paraplan.costmodel.calibration import calibration_gaps
from paraplan.costmodel.roofline import estimate_op_s, mixed_memory_curve, op_curves
from paraplan.inventory import Op, OpKind
from paraplan.inventory import kernel_mixes as mixes
from paraplan.specs import MemoryKernel, Phase, Precision

H100 = "H100-SXM5-80GB"


def _stream(mix, traffic: float = 64e6, launches: int = 1) -> Op:
    return Op(name="x", kind=OpKind.ELEMENTWISE, role="x", flops=0.0, bytes=traffic, bwd_flops=0.0,
              bwd_bytes=traffic, launches=launches, memory_kernels=mix)


def test_a_mixed_operator_takes_as_long_as_each_kinds_share_of_its_bytes_on_that_kinds_curve():
    gpu = load_gpu(H100)
    eff, bw = gpu.efficiency, gpu.hbm_bandwidth_bytes_per_s
    traffic, n = 64e6, 3
    for forward, phase in ((True, Phase.FWD), (False, Phase.BWD_INPUT)):
        expected = n * eff.kernel_overhead_s
        for kind, share in mixes.RMSNORM_EAGER.parts(forward):
            curve = eff.memory_kernel_curve(kind)
            expected += (share * traffic + n * share * curve.half_work) / (bw * curve.max_fraction)
        got = estimate_op_s(_stream(mixes.RMSNORM_EAGER, traffic, n), phase, gpu, gpu.flops_for(Precision.BF16))
        assert got == pytest.approx(expected, rel=1e-12)


def test_a_kind_without_a_curve_and_a_gpu_without_kind_curves_take_the_generic_memory_curve():
    h100, a100 = load_gpu(H100).efficiency, load_gpu("A100-SXM4-80GB").efficiency
    assert MemoryKernel.REDUCE not in h100.memory_kernels
    assert mixed_memory_curve(h100, mixes.VECTORIZED, True) is h100.memory_kernels[MemoryKernel.VECTORIZED]
    reduce_only = dataclasses.replace(mixes.STRIDED, name="reduce", fwd=((MemoryKernel.REDUCE, 1.0),))
    assert mixed_memory_curve(h100, reduce_only, True) is h100.memory
    assert not a100.memory_kernels
    for mix in mixes.MIXES.values():
        assert mixed_memory_curve(a100, mix, True) is a100.memory
        assert mixed_memory_curve(a100, mix, False) is a100.memory
    assert mixed_memory_curve(h100, mixes.STRIDED, True) is h100.memory_kernels[MemoryKernel.STRIDED]


def test_an_operators_own_curve_wins_over_its_kernel_kinds():
    eff = load_gpu(H100).efficiency
    rope = dataclasses.replace(_stream(mixes.STRIDED), name="RoPE")
    _, memory, special = op_curves(rope, Phase.FWD, eff)
    assert special and memory is eff.ops["RoPE:fwd"]


def test_on_the_h100_eager_composites_run_slower_than_its_vectorized_curve_and_fused_ones_do_not():
    eff = load_gpu(H100).efficiency
    vectorized = eff.memory_kernels[MemoryKernel.VECTORIZED]
    for mix in (mixes.RMSNORM_EAGER, mixes.ROPE_COMPLEX, mixes.ROPE_ROTATION, mixes.SWIGLU_CHUNKED, mixes.HF_ROPE):
        assert mixed_memory_curve(eff, mix, True).max_fraction < 0.8 * vectorized.max_fraction, mix.name
    assert mixed_memory_curve(eff, mixes.SWIGLU_SEPARATE, True) is vectorized


def test_on_the_h100_an_operator_of_unknown_kinds_says_its_curve_was_measured_on_gh200_and_one_of_measured_kinds_does_not():
    gpu = load_gpu(H100)
    untagged = calibration_gaps(gpu, Precision.BF16, [_stream(None)])
    assert any("memory-bound kernels timed with curves measured on GH200-120GB" in n for n in untagged)
    assert not calibration_gaps(gpu, Precision.BF16, [_stream(mixes.SWIGLU_CHUNKED)])
    assert calibration_gaps(gpu, Precision.BF16, [_stream(mixes.BIAS_ADD)]) == untagged  # its sums: reduce, no curve


def test_a_fused_rotary_embedding_is_not_timed_on_the_curve_of_gpt_neox_multi_kernel_one():
    """The ``RoPE`` curves time GPT-NeoX's apply_rotary_pos_emb as GPUModeling25 sampled it
    (slices, a negation, a concatenation, multiplies): one fused kernel per tensor takes the
    generic memory curve; ``rope_fusion`` off keeps the sampled form and its curve."""
    eff = load_gpu(H100).efficiency
    fused = next(op for role, op in _layer().items() if role.startswith("rotary"))
    unfused = next(op for role, op in _layer(rope_fusion=False).items() if role.startswith("rotary"))
    assert (fused.name, unfused.name) == ("RoPE_fused", "RoPE")
    assert fused.bytes == unfused.bytes
    assert op_curves(fused, Phase.FWD, eff)[1:] == (eff.memory, False)
    assert op_curves(unfused, Phase.FWD, eff)[1:] == (eff.ops["RoPE:fwd"], True)
    h100 = load_gpu(H100)
    slow, fast = (estimate_op_s(op, Phase.FWD, h100, h100.flops_for(Precision.BF16)) for op in (unfused, fused))
    assert slow > 3 * fast


def test_a_kind_curve_measured_on_another_gpu_is_named_in_the_predictions_notes():
    gpu = load_gpu(H100)
    strided = gpu.efficiency.memory_kernels[MemoryKernel.STRIDED].model_copy(update={"transferred_from": "GH200-120GB"})
    moved = gpu.model_copy(update={"efficiency": gpu.efficiency.model_copy(
        update={"memory_kernels": {**gpu.efficiency.memory_kernels, MemoryKernel.STRIDED: strided}})})
    notes = calibration_gaps(moved, Precision.BF16, [_stream(mixes.SWIGLU_CHUNKED)])
    assert any("strided kernels timed with curves measured on GH200-120GB" in n for n in notes)
    assert not any("unrolled" in n for n in notes)
    assert not calibration_gaps(gpu, Precision.BF16, [_stream(mixes.SWIGLU_CHUNKED)])


@pytest.mark.parametrize(("mix", "fwd", "bwd"), [
    (mixes.RMSNORM_EAGER, 28 + 4 * 2, 44 + 6 * 2),  # inventory.layer._eager_rmsnorm at e = 2
    (mixes.ROPE_COMPLEX, 16 + 2 * 2, 16 + 2 * 2),  # layer._EAGER_ROPE_COSTS + 2e
    (mixes.ROPE_ROTATION, 32 + 2 * 2, 32 + 2 * 2),
    (mixes.SWIGLU_CHUNKED, 5, 9),  # layer._eager_swiglu's passes
])
def test_each_eager_composites_kinds_add_up_to_the_bytes_the_inventory_counts(mix, fwd, bwd):
    assert sum(w for _, w in mix.fwd) == fwd
    assert sum(w for _, w in (mix.bwd or mix.fwd)) == bwd
    assert sum(share for _, share in mix.parts(True)) == pytest.approx(1.0)


def _layer(**model):
    from paraplan.catalog.jobs import resolve_job
    from paraplan.inventory import count_job

    job = resolve_job({"model": {"name": "llama-2-7b", "seq_length": 4096, **model}, "cluster": {"name": "dgx-h100"},
                       "parallel": {"global_batch_size": 8}})
    return {op.role: op for op in count_job(job).stages[0].layer_ops}


def test_the_inventory_gives_each_eager_composite_the_kernels_its_code_runs():
    eager = _layer(rmsnorm_fusion=False, swiglu_fusion=False, gate_up_fusion=True, rope_impl="complex")
    assert eager["pre-MLP norm"].memory_kernels is mixes.RMSNORM_EAGER
    assert eager["MLP activation (eager: silu, then multiply)"].memory_kernels is mixes.SWIGLU_CHUNKED
    assert eager["residual add"].memory_kernels is mixes.VECTORIZED
    assert next(op for role, op in eager.items() if role.startswith("rotary")).memory_kernels is mixes.ROPE_COMPLEX
    separate = _layer(swiglu_fusion=False, gate_up_fusion=False)
    assert separate["MLP activation (eager: silu, then multiply)"].memory_kernels is mixes.SWIGLU_SEPARATE
    fused = _layer()
    assert fused["pre-MLP norm"].memory_kernels is None  # a fused norm: its own kernel and curve
    assert fused["MLP activation"].memory_kernels is None  # a fused activation: kind not known
    assert fused["residual add"].memory_kernels is mixes.VECTORIZED


def test_every_mix_name_is_unique_and_traced_modules_map_by_their_type():
    everything = [v for v in vars(mixes).values() if isinstance(v, type(mixes.VECTORIZED))]
    assert len({m.name for m in everything}) == len(everything) == len(mixes.MIXES)
    assert mixes.traced_module_mix("LlamaRMSNorm") is mixes.RMSNORM_EAGER
    assert mixes.traced_module_mix("apply_rotary_pos_emb") is mixes.HF_ROPE
    assert mixes.traced_module_mix("LayerNorm") is None
