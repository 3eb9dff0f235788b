"""The optimizer step as the frameworks run it (``inventory.optimizer``): torch's foreach AdamW
(``_multi_tensor_adamw``, torch.optim's default) against a fused kernel, torch's gradient clip
that multiplies every gradient each step, and FSDP1's fp32 flat gradients."""

import pytest

from paraplan.catalog import resolve_job
from paraplan.inventory import count_job
from paraplan.inventory.optimizer import foreach_adamw_bytes, foreach_launches, optimizer_op
from paraplan.prediction import predict
from paraplan.specs import ConfigError


def fsdp1(**parallel):
    plan = {"framework": "fsdp", "zero_stage": 3, "global_batch_size": 32, "fsdp_version": 1,
            "grad_reduce_in_fp32": False, **parallel}
    return resolve_job({"model": "llama-2-7b", "cluster": {"name": "dgx-a100", "num_nodes": 2},
                        "parallel": plan, "precision": "bf16"})


def ibm(**parallel):
    """fms-fsdp's 7B run of the PyTorch blog (HSDP over 8-GPU nodes, 128 A100)."""
    return resolve_job({"model": "llama-2-7b", "cluster": {"name": "dgx-a100", "num_nodes": 16},
                        "parallel": {"framework": "fms-fsdp", "micro_batch_size": 2, "global_batch_size": 256,
                                     **parallel}, "precision": "bf16"})


def test_torchs_foreach_adamw_moves_80_bytes_per_parameter_with_fp32_gradients():
    # mul_ p 8, lerp_ m g 12, mul_ v 8, addcmul_ v g 12, sqrt 8, div_ 8, add_ 8, addcdiv_ p m s 16
    assert foreach_adamw_bytes(4.0) == 80.0
    assert foreach_adamw_bytes(2.0) == 76.0


def test_the_fused_step_keeps_the_arithmetic_of_a_gradient_read_for_the_norm_and_one_pass_of_adam():
    op = optimizer_op(1e9, 4.0, 2.0, 12.0)
    assert op.bytes == pytest.approx(1e9 * (2 * 4 + 2 * 12 + 2)) and op.launches == 1


def test_fsdp1s_optimizer_reads_fp32_gradients_and_writes_no_low_precision_weight_copy():
    op = optimizer_op(1e9, 2.0, 2.0, 12.0, fsdp1=True, tensors=33)
    assert op.bytes == pytest.approx(1e9 * (4 + 4 + 2 * 12))  # norm, Adam's read, fp32 p m v read and written
    assert op.launches == 1 + 33  # the fused kernel and one vector_norm per flat gradient


def test_a_clip_that_scales_every_step_reads_and_writes_every_gradient_once_more():
    plain = optimizer_op(1e9, 2.0, 2.0, 12.0, fsdp1=True, tensors=33)
    scaled = optimizer_op(1e9, 2.0, 2.0, 12.0, fsdp1=True, tensors=33, clip_scale=True)
    assert scaled.bytes - plain.bytes == pytest.approx(1e9 * 2 * 4)
    assert scaled.launches - plain.launches == 33  # FSDP1: one mul_ per flat gradient


def test_multi_tensor_apply_launches_a_kernel_per_320_chunks_or_per_full_tensor_list():
    assert foreach_launches(65536 * 320, 1, 1) == 1
    assert foreach_launches(65536 * 320 + 1, 1, 1) == 2
    assert foreach_launches(1000, 200, 1) == 2  # 110 tensors per launch with one list
    assert foreach_launches(1000, 200, 4) == 6  # 36 with four


def test_foreach_adam_over_a_7b_shard_takes_about_three_times_the_fused_step():
    fused = predict(ibm(optimizer_impl="fused", grad_clip_scale=False)).breakdown.optimizer_step_s
    foreach = predict(ibm(optimizer_impl="foreach", grad_clip_scale=False)).breakdown.optimizer_step_s
    assert 2.2 < foreach / fused < 3.0  # 4 + 80 bytes per parameter against 4 + 32


def test_the_fms_fsdp_preset_runs_torchs_foreach_adamw_and_its_clip_scaling():
    job = ibm()
    assert (job.parallel.optimizer_impl, job.parallel.grad_clip_scale) == ("foreach", True)
    assert {"optimizer_impl", "grad_clip_scale"} <= set(job.preset.taken)
    stated = ibm(optimizer_impl="fused")
    assert stated.parallel.optimizer_impl == "fused" and stated.preset.overridden["optimizer_impl"] == (
        "fused", "foreach")


def test_the_stage_inventory_counts_one_flat_parameter_per_fsdp1_unit_and_the_root():
    st = count_job(fsdp1(optimizer_impl="foreach", grad_clip_scale=True)).stages[0]
    per_op = foreach_launches(st.params / 16, st.num_layers + 1, 1)
    assert st.optimizer.launches >= 8 * per_op + 2 * (st.num_layers + 1)


def test_foreach_is_refused_outside_pytorch_fsdp_naming_the_field():
    with pytest.raises((ConfigError, ValueError), match=r"parallel\.optimizer_impl"):
        resolve_job({"model": "llama-2-7b", "cluster": {"name": "dgx-a100", "num_nodes": 1},
                     "parallel": {"framework": "megatron", "optimizer_impl": "foreach"}, "precision": "bf16"})


def test_megatron_jobs_keep_the_fused_step_they_had():
    job = resolve_job({"model": "llama-2-7b", "cluster": {"name": "dgx-a100", "num_nodes": 1},
                       "parallel": {"framework": "megatron", "tp": 2}, "precision": "bf16"})
    st = count_job(job).stages[0]
    updated = st.optimizer.dims[0][1]
    assert st.optimizer.bytes == pytest.approx(updated * (2 * 4 + 2 * 12 + 2), rel=1e-6)


def test_the_installed_torchs_adamw_over_fsdp1_flat_parameters_defaults_to_foreach_and_its_clip_always_scales():
    torch = pytest.importorskip("torch")
    import inspect

    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp._flat_param import FlatParameter
    from torch.optim.optimizer import _foreach_supported_types

    flat = FlatParameter(torch.zeros(4))
    assert type(flat) in _foreach_supported_types  # an nn.Parameter: foreach-eligible on CUDA
    defaults = torch.optim.AdamW([flat]).defaults
    assert defaults["foreach"] is None and defaults["fused"] is None  # left to torch: foreach
    clip = inspect.getsource(FullyShardedDataParallel.clip_grad_norm_)
    # every gradient times the clamped coefficient, with no branch on its value (a host sync)
    assert "clip_coef_clamped = torch.clamp(clip_coef, max=1.0)" in clip and "grad.mul_(clip_coef_clamped" in clip
