"""The step's memory timeline (``prediction.memory.step_peak_bytes``): each candidate moment holds
the tensors the framework's code has alive then, and the peak is the largest of them."""

import pytest

from paraplan.catalog import resolve_job
from paraplan.prediction import predict
from paraplan.prediction.memory import MOMENTS, step_peak_bytes
from paraplan.specs import ConfigError


def _job(framework: str, model: str = "llama-2-7b", **parallel):
    plan = {"framework": framework, "micro_batch_size": 1, "global_batch_size": 8, "recompute": "none", **parallel}
    return resolve_job({"model": model, "cluster": {"name": "dgx-a100", "num_nodes": 1}, "parallel": plan})


def test_with_set_to_none_the_gradient_shard_is_not_in_the_forward_peak():
    memory = predict(_job("torchtitan-0.1", "llama-3-8b")).memory.worst  # 128k vocabulary: the loss peaks
    assert memory.moment == MOMENTS[0] and memory.gradients_freed
    assert memory.gradients == 0 and memory.logits > 0


def test_the_loss_and_the_reduce_scatter_buffers_are_never_in_the_same_moment():
    for recompute in ("none", "full"):
        m = predict(_job("torchtitan-0.1", recompute=recompute)).memory.worst
        assert m.logits == 0 or m.buffers == 0, recompute


def test_gradients_kept_between_steps_are_in_every_moment_and_predict_more():
    freed = predict(_job("torchtitan-0.1")).memory
    kept = predict(_job("torchtitan-0.1", grads_set_to_none=False)).memory
    assert kept.worst.gradients > 0 and not kept.worst.gradients_freed
    assert kept.total > freed.total


def test_megatron_s_contiguous_grad_buffer_is_in_the_forward_peak():
    m = predict(_job("megatron-core-0.12", zero_stage=1, recompute="full")).memory.worst
    assert not m.gradients_freed and m.gradients > 0


def test_megatron_cannot_free_its_contiguous_gradient_buffer():
    with pytest.raises((ConfigError, ValueError), match="grads_set_to_none"):
        _job("megatron", grads_set_to_none=True)


def test_deepspeed_refuses_set_to_none_which_its_memory_model_does_not_read():
    with pytest.raises((ConfigError, ValueError), match="grads_set_to_none: DeepSpeed"):
        _job("deepspeed", grads_set_to_none=True)
    assert not _job("deepspeed", grads_set_to_none=False).parallel.frees_gradients


def test_a_second_micro_batch_s_forward_sees_the_first_one_s_gradients():
    one = predict(_job("torchtitan-0.1")).memory.worst
    two = predict(_job("torchtitan-0.1", global_batch_size=16)).memory.worst
    assert one.gradients == 0 and two.gradients > 0


def test_the_peak_is_the_largest_moment_and_the_end_of_backward_holds_every_gradient():
    # tiny activations: every freed gradient at the end of the backward outweighs them
    loss, backward, end, step = step_peak_bytes(10.0, 8.0, False, 3.0, 1.0, 0.5, 0.0, 0.0, 2.0, 0.0, 0.0)
    assert (loss, backward, end, step) == (14.0, 15.0, 20.5, 18.0)
    # large activations: the loss (its copies of the logits beyond the layer's working bytes) wins
    loss, backward, end, step = step_peak_bytes(10.0, 8.0, False, 30.0, 4.0, 0.5, 0.0, 0.0, 2.0, 0.0, 0.0)
    assert loss == max(loss, backward, end, step) == 44.0


def test_the_optimizer_step_holds_its_temporaries_beside_every_gradient_once_the_activations_are_freed():
    # without temporaries the step is the end of the backward less its working bytes and buffers
    *_, end, step = step_peak_bytes(10.0, 8.0, False, 3.0, 1.0, 0.5, 0.0, 0.0, 2.0, 0.0, 0.0)
    assert step < end
    # 4 bytes of temporaries outweigh the backward's last working bytes and buffers (2.5)
    *_, end, step = step_peak_bytes(10.0, 8.0, False, 3.0, 1.0, 0.5, 0.0, 0.0, 2.0, 0.0, 0.0, 4.0)
    assert (end, step) == (20.5, 22.0)


def test_the_timeline_is_the_same_on_numbers_and_on_the_screen_s_arrays():
    import numpy as np

    args = (np.array([10.0, 10.0]), np.array([8.0, 0.0]), np.array([False, True]), np.array([3.0, 30.0]),
            np.array([1.0, 4.0]), np.array([0.5, 0.5]), np.array([0.2, 0.2]), np.array([0.0, 1.0]),
            np.array([2.0, 2.0]), np.array([1.0, 1.0]))
    temporaries = np.array([0.0, 40.0])
    arrays = step_peak_bytes(*args, 0.15, temporaries)
    for i in range(2):
        one = step_peak_bytes(*(float(a[i]) if a.dtype != bool else bool(a[i]) for a in args), 0.15,
                              float(temporaries[i]))
        assert [float(m[i]) for m in arrays] == pytest.approx(one)


def test_the_report_names_the_moment_of_the_peak():
    pred = predict(_job("torchtitan-0.1"))
    assert pred.memory.to_dict()["peak_moment"] == pred.memory.worst.moment


def test_the_memory_table_names_the_moment_of_the_peak_within_80_columns():
    from paraplan.report.tables import render_memory
    from readable import assert_readable

    pred = predict(_job("torchtitan-0.1", "llama-3-8b"))
    assert f"peak at {pred.memory.worst.moment}" in " ".join(assert_readable(render_memory(pred))[80].split())


def test_the_backward_s_last_layer_holds_the_tensors_it_kept_for_itself_beside_its_working_bytes():
    from paraplan.inventory import count_job
    from paraplan.prediction.memory import step_memory

    def last_layer(recompute):
        inv = count_job(_job("torchtitan-0.1", recompute=recompute))
        st = inv.stages[0]
        x = inv.shape
        return step_memory(inv, st)[3], sum(op.saved_bytes for op in st.layer_ops), x.e * x.b * x.s * x.h

    held, saved, _ = last_layer("none")  # every activation saved, nothing recomputed
    assert held == pytest.approx(saved) and saved > 0
    held, saved, layer_input = last_layer("full")  # its input kept, its activations recomputed
    assert held == pytest.approx(layer_input + saved)
    worst = predict(_job("torchtitan-0.1", recompute="full", optimizer_impl="fused")).memory.worst
    assert worst.moment == MOMENTS[2] and worst.activations == pytest.approx(held)


def test_the_last_backward_of_a_dense_first_moe_holds_its_first_dense_layer_s_tensors_not_an_expert_layer_s():
    """DeepSeek-V3's first three layers are dense (first_k_dense_replace): the step's last
    backward pass is a dense layer's, whatever its stage's other layers. The search's screen
    computes the same term with the same function (``last_backward_bytes``) from the first
    block's layer (and takes the exact path on models with mixed layers)."""
    from paraplan.inventory import count_job
    from paraplan.inventory.recompute import recompute_cost
    from paraplan.prediction.memory import end_saved_bytes, last_backward_bytes, microbatch_bytes, step_memory

    job = resolve_job({"model": "deepseek-v3", "cluster": {"name": "dgx-h100", "num_nodes": 1},
                       "parallel": {"framework": "megatron", "micro_batch_size": 1, "global_batch_size": 16,
                                    "recompute": "selective", "ep": 8}})
    inv = count_job(job)
    st = inv.stages[0]
    dense, moe = st.blocks
    working = microbatch_bytes(inv, st)[1] - end_saved_bytes(st)
    assert (dense.num_layers, moe.num_layers) == (3, 58)
    held = {b.num_layers: recompute_cost(job.parallel, b.ops, inv.shape, 1).held_bytes for b in (dense, moe)}
    assert held[3] != held[58]
    assert step_memory(inv, st)[3] == last_backward_bytes(held[3], working, 0.0)
    assert step_memory(inv, st)[3] != last_backward_bytes(held[58], working, 0.0)


def _step_temporaries(impl, **parallel):
    from paraplan.inventory import count_job
    from paraplan.inventory.job import params_updated

    inv = count_job(_job("torchtitan-0.1", "llama-3-8b", optimizer_impl=impl, **parallel))
    st = inv.stages[0]
    return st.step_temporaries, params_updated(inv.job, st.params, st.expert_params)


def test_torch_foreach_adamw_allocates_four_bytes_per_shard_parameter_at_the_step():
    temporaries, shard = _step_temporaries("foreach")
    assert shard > 0 and temporaries == pytest.approx(4.0 * shard)


def test_the_fused_adamw_allocates_nothing_at_the_step():
    assert _step_temporaries("fused")[0] == 0.0


def test_an_optimizer_on_the_host_allocates_nothing_on_the_gpu_at_the_step():
    assert _step_temporaries("foreach", offload_optimizer="cpu", offload_param="cpu")[0] == 0.0


def test_foreach_s_temporaries_make_the_optimizer_step_the_peak_of_a_job_with_few_activations():
    """Full recompute keeps few activations: the step's fp32 square roots (4 bytes a shard
    parameter) outweigh the backward's last layer; fused, the same job peaks at the end of the
    backward."""
    def worst(impl):
        return predict(_job("torchtitan-0.1", recompute="full", optimizer_impl=impl)).memory.worst

    foreach, fused = worst("foreach"), worst("fused")
    assert (foreach.moment, fused.moment) == (MOMENTS[3], MOMENTS[2])
    assert foreach.activations == 0 and foreach.optimizer_states > fused.optimizer_states
    assert foreach.total > fused.total


@pytest.mark.parametrize("framework, parallel", [
    ("torchtitan-0.1", {"recompute": "none"}),
    ("torchtitan-0.1", {"recompute": "full"}),  # peaks at the optimizer step (foreach AdamW)
    ("megatron", {"pp": 2, "global_batch_size": 32}),
    ("fsdp", {"zero_stage": 3, "pp": 2}),
    ("fsdp", {"zero_stage": 2, "recompute": "full"}),
    ("deepspeed", {"zero_stage": 2, "global_batch_size": 32}),
])
def test_the_parts_at_the_peak_moment_add_up_to_that_moment_s_total(framework, parallel):
    """``at_peak_moment`` lists the tensors alive at each moment part by part, ``step_peak_bytes``
    (which the screen runs on arrays) adds them up: the two must tell the same timeline."""
    from paraplan.inventory import count_job
    from paraplan.prediction.memory import at_peak_moment, moment_totals, step_memory

    inv = count_job(_job(framework, **parallel))
    for st in inv.stages:
        args = step_memory(inv, st)
        assert at_peak_moment(*args).total == pytest.approx(max(moment_totals(*args)), rel=1e-12)
