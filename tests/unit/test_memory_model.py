"""What the frameworks hold beyond the shards (issue 24): ZeRO-3's gathered weights and
reduce-scatter buffers, FSDP + pipeline parallelism's unsharded weights and gradients, the
loss's copies of the logits, the caching allocator's fragmentation, the CUDA context and
NCCL's buffers, and the headroom a plan must leave."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from paraplan.catalog import load_runtime_memory, resolve_job
from paraplan.inventory import count_job
from paraplan.inventory.job import split_params
from paraplan.inventory.recompute import recompute_cost
from paraplan.prediction import PlanMemory, predict
from paraplan.prediction.framework_memory import (
    deepspeed_pipeline_buffers,
    logit_elements,
    loss_logits_bytes,
    ring_attention_bytes,
    torch_pipeline_buffers,
)
from paraplan.prediction.memory import end_saved_bytes, framework_buffers, microbatch_bytes
from paraplan.specs import ConfigError


def job(model="llama-2-7b", nodes=1, headroom=None, **parallel):
    plan = {"micro_batch_size": 1, "global_batch_size": 64, **parallel}
    raw = {"model": model, "cluster": {"name": "dgx-a100", "num_nodes": nodes}, "parallel": plan}
    if headroom is not None:
        raw["memory_headroom"] = headroom
    return resolve_job(raw)


def layer_params(j) -> float:
    return sum(split_params(count_job(j).stages[0].blocks[0].ops))


def test_fsdp_zero3_holds_the_layer_in_use_and_the_next_one_gathered():
    j = job(framework="fsdp", zero_stage=3, recompute="full")
    inv = count_job(j)
    st = inv.stages[0]
    unit = max(sum(split_params(st.blocks[0].ops)), sum(op.params for op in st.end_ops) / 2)
    mem = predict(j).memory
    # llama-2-7b's embedding and LM head are each 32000 x 4096 = 131M parameters, a layer 202M
    assert unit == layer_params(j)
    assert mem.gathered_params == pytest.approx(2 * 2.0 * unit)  # two bf16 layers
    assert mem.buffers == pytest.approx((2.0 + 4.0) * unit)  # bf16 gradient + fp32 reduce-scatter input


def test_without_zero3_nothing_is_gathered():
    mem = predict(job(framework="megatron", zero_stage=1)).memory
    assert mem.gathered_params == 0 and mem.buffers == 0


def test_fsdp_with_pipeline_parallelism_keeps_the_stage_unsharded_across_micro_batches():
    j = job(framework="fsdp", zero_stage=3, pp=2, recompute="full")
    st = count_job(j).stages[0]
    stage_params = st.params + st.expert_params
    mem = predict(j).memory[0]
    assert mem.gathered_params == pytest.approx(2.0 * stage_params)  # bf16, reshard_after_forward=False
    assert mem.buffers >= 4.0 * stage_params  # fp32 gradients accumulated unsharded
    without_pp = predict(job(framework="fsdp", zero_stage=3, recompute="full")).memory[0]
    assert mem.gathered_params > 5 * without_pp.gathered_params  # 16 layers against 2


def test_deepspeed_zero3_gathers_a_layer_and_its_prefetch_bucket_within_the_live_parameter_limit():
    rt = load_runtime_memory()
    j = job(model="llama-2-70b", nodes=4, framework="deepspeed", zero_stage=3, recompute="full")
    mem = predict(j).memory
    live = layer_params(j) + rt.deepspeed_stage3_prefetch_bucket_size  # 856M + 50M, under the 1e9 limit
    assert live < rt.deepspeed_stage3_max_live_parameters
    assert mem.gathered_params == pytest.approx(2.0 * live)
    assert mem.buffers == pytest.approx(2.0 * rt.deepspeed_reduce_bucket_size)  # bf16 reduce bucket
    wide = job(model="llama-3.1-405b", nodes=8, framework="deepspeed", zero_stage=3, recompute="full")
    assert predict(wide).memory.gathered_params == pytest.approx(2.0 * layer_params(wide))  # one layer over the limit


def test_torchtitans_loss_holds_four_times_the_extra_logit_bytes_of_megatrons():
    """Megatron's vocab-parallel cross entropy: 2 bytes per logit beyond the saved fp32 softmax
    (the bf16 logits beside their fp32 copy); torchtitan's F.cross_entropy(pred.float()): 8 (the
    backward of log_softmax holds its output, the incoming and the outgoing fp32 gradient)."""
    mega = predict(job(framework="megatron", zero_stage=1, recompute="none")).memory
    titan = predict(job(framework="fsdp", zero_stage=1, recompute="none")).memory
    logits = 1 * 4096 * 32000  # micro-batch x sequence x vocabulary of llama-2-7b on one GPU
    assert mega.logits == pytest.approx(2.0 * logits)
    assert titan.logits == pytest.approx(8.0 * logits)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_torchtitans_loss_parallel_holds_twelve_extra_bytes_per_logit_of_the_local_vocabulary_shard(tp):
    """With tensor parallelism torchtitan's loss runs under PyTorch's loss_parallel(): its fused
    backward keeps the saved fp32 log-softmax, zeros_like(x), exp(x) and their sum at once, 16
    bytes per logit of the rank's vocabulary shard, 12 beyond the saved 4 (Megatron's: 2)."""
    j = job(framework="fsdp", zero_stage=1, recompute="none", tp=tp, sequence_parallel=True)
    local = 1 * 4096 * (j.model.vocab_for(tp) // tp)  # micro-batch x sequence x vocabulary shard
    assert predict(j).memory.logits == pytest.approx(12.0 * local)
    mega = predict(job(framework="megatron", zero_stage=1, recompute="none", tp=tp, sequence_parallel=True))
    assert mega.memory.logits == pytest.approx(2.0 * local)


@pytest.mark.parametrize("name", ["linear1", "linear3", "linear_final"])
def test_torchtitans_tp_linears_save_their_all_gathered_input_where_megatron_saves_its_sequence_shard(name):
    """torchtitan gathers the sequence-parallel input of QKV, the MLP's up projection and the LM
    head to Replicate() before nn.Linear runs, so autograd saves the whole sequence; Megatron-LM
    saves the shard and gathers it again in the backward pass."""
    def saved(framework, tp, sp):
        st = count_job(job(framework=framework, zero_stage=1, recompute="none", tp=tp, sequence_parallel=sp)).stages[-1]
        return next(op for op in st.end_ops + st.blocks[0].ops if op.name == name).saved_bytes

    whole = 2.0 * 1 * 4096 * 4096  # bf16 x micro-batch x sequence x hidden of llama-2-7b
    assert saved("fsdp", 4, True) == pytest.approx(whole)
    assert saved("megatron", 4, True) == pytest.approx(whole / 4)
    assert saved("fsdp", 4, False) == saved("megatron", 4, False) == pytest.approx(whole)
    assert saved("fsdp", 1, False) == pytest.approx(whole)


def test_torchtitans_gathered_inputs_enlarge_the_layer_full_recompute_re_creates_but_not_what_it_keeps():
    def layer(framework):
        inv = count_job(job(framework=framework, zero_stage=1, recompute="full", tp=4, sequence_parallel=True))
        block = inv.stages[0].blocks[0]
        return recompute_cost(inv.job.parallel, block.ops, inv.shape, block.num_layers)

    titan, mega = layer("fsdp"), layer("megatron")
    assert titan.held_bytes == mega.held_bytes  # the layer inputs, sequence-sharded in both
    gathered = 2 * (2.0 * 4096 * 4096) * (1 - 1 / 4)  # QKV's and the up projection's inputs, 3/4 more each
    assert titan.working_bytes - mega.working_bytes == pytest.approx(gathered, rel=1e-9)


def test_reserved_memory_adds_fragmentation_to_the_transient_tensors_only():
    m = predict(job(framework="fsdp", zero_stage=3, recompute="full")).memory.worst
    share = load_runtime_memory().allocator_fragmentation
    assert m.fragmentation == pytest.approx(m.transient * share / (1 - share))
    assert m.reserved == pytest.approx(m.allocated + m.fragmentation)
    assert m.total == pytest.approx(m.reserved + m.runtime)


def test_each_parallel_dimension_with_several_ranks_adds_an_nccl_communicator():
    rt = load_runtime_memory()
    dp_only = predict(job(zero_stage=1)).memory.runtime
    tp_and_dp = predict(job(zero_stage=1, tp=2)).memory.runtime
    assert dp_only == pytest.approx(rt.cuda_context_bytes + rt.nccl_communicator_bytes)
    assert tp_and_dp - dp_only == pytest.approx(rt.nccl_communicator_bytes)


def test_the_headroom_is_taken_off_the_gpu_before_fitting_and_the_margin_is_what_is_left():
    loose, tight = predict(job(zero_stage=1, headroom=0.0)), predict(job(zero_stage=1, headroom=0.5))
    hbm = loose.memory.hbm
    assert loose.memory.margin == pytest.approx(hbm - loose.memory.total)
    assert tight.memory.margin == pytest.approx(hbm * 0.5 - tight.memory.total)
    assert loose.memory.total == tight.memory.total
    needed = loose.memory.total / hbm
    assert predict(job(zero_stage=1, headroom=max(0.0, 1 - needed - 0.01))).fits
    assert not predict(job(zero_stage=1, headroom=min(0.5, 1 - needed + 0.01))).fits or needed < 0.49


@pytest.mark.parametrize("bad", [-0.1, 0.7, "lots"])
def test_a_headroom_outside_0_to_half_the_gpu_is_refused_naming_the_field(bad):
    with pytest.raises(ConfigError, match=r"^memory_headroom: "):
        job(headroom=bad)


def test_predict_refuses_a_bad_headroom_flag_in_one_line_with_exit_code_2():
    run = subprocess.run([sys.executable, "-m", "paraplan.cli", "predict", "--memory-headroom", "0.9"],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and "memory_headroom" in run.stderr


def test_pred_memory_is_an_object_with_named_fields_and_the_stages_as_a_sequence():
    pred = predict(job(framework="fsdp", zero_stage=3, pp=2, recompute="full"))
    mem = pred.memory
    assert isinstance(mem, PlanMemory) and len(mem) == 2 and mem[1].stage == 1
    assert mem.total == max(m.total for m in mem) == pred.worst_memory.total
    for name in ("weights", "gradients", "optimizer", "activations", "logits", "gathered_params", "buffers",
                 "allowance", "total", "hbm", "headroom", "margin", "fits", "reserved", "allocated"):
        assert getattr(mem, name) is not None
    data = pred.to_dict()["memory"]
    old_keys = {"worst_stage", "weights_bytes", "gradients_bytes", "optimizer_states_bytes", "activations_bytes",
                "buffers_bytes", "total_bytes", "hbm_bytes", "fits", "per_stage_total_bytes"}
    assert old_keys <= set(data) and data["margin_bytes"] == mem.margin and data["memory_headroom"] == 0.05


def test_deepspeed_zero1_allocates_the_full_reduce_bucket_as_zero2_does():
    """DeepSpeed 0.19.8 ``stage_1_and_2.py`` ``setup_buckets``: ``torch.empty(reduce_bucket_size)``
    whenever ``contiguous_gradients`` is set (its default), ZeRO-1 as well as ZeRO-2, however
    small the model."""
    rt = load_runtime_memory()
    for stage in (1, 2):
        mem = predict(job(model="gpt3-125m", framework="deepspeed", zero_stage=stage)).memory
        assert mem.buffers == pytest.approx(2.0 * rt.deepspeed_reduce_bucket_size)  # one bf16 bucket
    none = predict(job(model="gpt3-125m", framework="deepspeed", zero_stage=0)).memory
    assert none.buffers == 0  # ZeRO-0 runs no ZeRO optimizer


def test_deepspeed_overlap_comm_doubles_the_bucket_except_under_a_pipeline():
    rt = load_runtime_memory()
    bucket = 2.0 * rt.deepspeed_reduce_bucket_size
    overlapped = predict(job(framework="deepspeed", zero_stage=1, overlap_grad_reduce=True)).memory
    assert overlapped.buffers == pytest.approx(2 * bucket)
    # the pipeline engine turns overlap_comm off; reduce_gradients(pipeline_parallel=True) holds one
    inv = count_job(job(framework="deepspeed", zero_stage=1, pp=2, overlap_grad_reduce=True))
    assert all(framework_buffers(inv, st)[1] == pytest.approx(bucket) for st in inv.stages)


def _boundary(inv) -> float:
    """One micro-batch's activation crossing stages, [b, s, h] in the model's dtype."""
    x = inv.shape
    return x.e * x.b * x.s_norm * x.h


def test_deepspeeds_first_stage_keeps_each_in_flight_output_and_a_gradient_buffer():
    inv = count_job(job(framework="deepspeed", zero_stage=1, pp=2, recompute="full"))
    first, last = (predict(inv.job).memory[s] for s in (0, 1))
    a = _boundary(inv)
    bucket = framework_buffers(inv, inv.stages[0])[1]
    assert first.in_flight_microbatches == 2
    assert first.buffers == pytest.approx(bucket + 2 * a + a)  # outputs of 2 micro-batches, grad_layer
    # the last stage: pipe_recv_buf, the received copy beside the forward's clone (one in flight),
    # this micro-batch's logits held by its buffer through its backward and the previous
    # micro-batch's left in the other pipeline buffer
    assert inv.job.parallel.num_microbatches > 1
    logits = inv.shape.e * logit_elements(inv.stages[1].end_ops)
    assert last.buffers == pytest.approx(bucket + a + a + 2 * logits)


def test_deepspeed_partitions_the_pipeline_buffers_over_tensor_parallel_ranks_and_rebuilds_both_for_backward():
    inv = count_job(job(framework="deepspeed", zero_stage=1, pp=2, tp=2, recompute="full"))
    a = _boundary(inv)
    per, once = deepspeed_pipeline_buffers(inv.job.parallel, inv.shape, 0.0, first=True, last=False, microbatches=4)
    assert (per, once) == (pytest.approx(a / 2), pytest.approx(a / 2 + 2 * a))
    per, once = deepspeed_pipeline_buffers(inv.job.parallel, inv.shape, 0.0, first=False, last=False, microbatches=4)
    assert (per, once) == (pytest.approx(a / 2), pytest.approx(a / 2 + a / 2 + 2 * a))


def test_with_sequence_parallelism_deepspeeds_pipeline_buffers_are_whole_sequence_shards_and_nothing_is_rebuilt():
    inv = count_job(job(framework="deepspeed", zero_stage=1, pp=2, tp=2, sequence_parallel=True, recompute="full"))
    x = inv.shape
    shard = x.e * x.b * (x.s // 2) * x.h  # this rank's [b, s/tp, h]: pipe_partitioned is off
    per, once = deepspeed_pipeline_buffers(inv.job.parallel, x, 0.0, first=True, last=False, microbatches=4)
    assert (per, once) == (pytest.approx(shard), pytest.approx(shard))
    per, once = deepspeed_pipeline_buffers(inv.job.parallel, x, 0.0, first=False, last=False, microbatches=4)
    assert (per, once) == (pytest.approx(2 * shard), pytest.approx(2 * shard))


def test_deepspeeds_last_stage_holds_the_previous_micro_batch_s_logits_only_when_a_step_has_two_or_more():
    inv = count_job(job(framework="deepspeed", zero_stage=1, pp=2, recompute="full"))
    x, logits = inv.shape, 1e9
    received = deepspeed_pipeline_buffers(inv.job.parallel, x, 0.0, first=False, last=True, microbatches=1)[1]
    one = deepspeed_pipeline_buffers(inv.job.parallel, x, logits, first=False, last=True, microbatches=1)[1]
    many = deepspeed_pipeline_buffers(inv.job.parallel, x, logits, first=False, last=True, microbatches=8)[1]
    # one micro-batch: its own logits, held by buffer 0 through its backward (the previous step's
    # are released before the loss); two or more: the previous micro-batch's too, in buffer 1
    assert one - received == pytest.approx(x.e * logits)
    assert many - received == pytest.approx(2 * x.e * logits)


def test_the_screen_and_the_prediction_agree_on_deepspeeds_last_stage_with_one_micro_batch_and_with_several():
    from test_screen import screen_matches_the_exact_prediction

    from paraplan.catalog.loader import load_cluster, load_model
    from paraplan.search import SearchSpace
    from paraplan.specs import Precision

    model, cluster = load_model("gpt3-1.3b"), load_cluster("dgx-a100", num_nodes=1)
    for gbs in (4, 32):  # dp 4 at pp 2, micro-batch 1: one micro-batch a step, then eight
        space = SearchSpace(framework="deepspeed", tp=(1,), pp=(2,), zero_stage=(1,), micro_batch_size=(1,))
        screen_matches_the_exact_prediction((model, cluster, Precision.BF16, gbs, space))


def test_only_deepspeeds_pipeline_engine_with_several_stages_keeps_pipeline_buffers():
    inv = count_job(job(framework="deepspeed", zero_stage=1, pp=2))
    one = deepspeed_pipeline_buffers(inv.job.parallel, inv.shape, 1e9, first=True, last=True, microbatches=4)
    assert one == (0.0, 0.0)  # one stage: nothing sent or received
    megatron = count_job(job(framework="megatron", pp=2))
    assert deepspeed_pipeline_buffers(megatron.job.parallel, megatron.shape, 1e9, first=True, last=False,
                                      microbatches=4) == (0.0, 0.0)


def boundary_bytes(j) -> float:
    """A tensor sent between pipeline stages: the layer input [b, s, h] in bf16."""
    x = count_job(j).shape
    return x.e * x.b * x.s_norm * x.h


def test_the_old_torch_pipelining_keeps_every_micro_batchs_output_and_one_gradient_receive_buffer_per_micro_batch():
    """torchtitan's first stage (``torch.distributed.pipelining``) on the torch of 2024-25
    (``pipeline_keeps_outputs``): ``output_chunks`` keeps all 16 outputs until the next step
    and ``_prepare_backward_infra`` allocates 16 gradient receive buffers; Megatron's pipeline
    keeps neither."""
    titan = job(framework="fsdp", zero_stage=1, pp=2, recompute="full", pipeline_keeps_outputs=True)
    mega = job(framework="megatron", zero_stage=1, pp=2, recompute="full")
    m, b = titan.parallel.num_microbatches, boundary_bytes(titan)
    first, first_mega = predict(titan).memory[0], predict(mega).memory[0]
    assert m == 16
    assert first.activations - first_mega.activations == pytest.approx(m * b)
    assert first.buffers == pytest.approx(m * b) and first_mega.buffers == 0


def test_the_old_torch_pipelinings_last_stage_keeps_the_logits_of_every_micro_batch_until_the_next_step():
    """The last stage's outputs are the logits (bf16, the loss casts them): all 16 are kept, and
    15 received activations beyond the one in flight, with their gradients, stay on their
    receive buffers."""
    titan = job(framework="fsdp", zero_stage=1, pp=2, recompute="full", pipeline_keeps_outputs=True)
    mega = job(framework="megatron", zero_stage=1, pp=2, recompute="full")
    m, b = titan.parallel.num_microbatches, boundary_bytes(titan)
    logits = 2.0 * 1 * 4096 * 32000  # bf16 logits of one micro-batch of llama-2-7b
    last, last_mega = predict(titan).memory[1], predict(mega).memory[1]
    assert last.in_flight_microbatches == 1
    assert last.activations - last_mega.activations == pytest.approx(m * logits + (m - 1) * b)
    assert last.buffers == pytest.approx((m - 1) * b)  # activation receive buffers, none for gradients


def test_today_s_torchtitan_pipeline_keeps_no_micro_batch_output_only_those_in_flight_and_its_receive_buffers():
    """Today's torchtitan calls ``step(return_outputs=False)`` (the default of
    ``pipeline_keeps_outputs``): no stage keeps its 16 outputs for the step, the last none of
    its logits; the first holds the outputs of its 2 micro-batches in flight (``fwd_cache``),
    and the receive buffers and received gradients stay as the old torch's."""
    today = job(framework="fsdp", zero_stage=1, pp=2, recompute="full")
    old = job(framework="fsdp", zero_stage=1, pp=2, recompute="full", pipeline_keeps_outputs=True)
    m, b = today.parallel.num_microbatches, boundary_bytes(today)
    logits = 2.0 * 1 * 4096 * 32000
    now, then = predict(today).memory, predict(old).memory
    assert today.parallel.pipeline_keeps_outputs is None and not today.parallel.keeps_pipeline_outputs
    assert now[0].in_flight_microbatches == 2
    assert then[0].activations - now[0].activations == pytest.approx((m - 2) * b)
    assert then[1].activations - now[1].activations == pytest.approx(m * logits)
    assert [s.buffers for s in now] == [s.buffers for s in then]


def test_under_zb_v_each_gpu_runs_two_torch_pipeline_stages_each_with_its_outputs_and_receive_buffers():
    """torchtitan's ZBVZeroBubble puts two stage objects on every GPU (chunks 0 and 2p - 1 on the
    first): each keeps one gradient receive buffer per micro-batch, and the second chunk one
    activation receive buffer per micro-batch beyond those in flight."""
    j = job(framework="fsdp", zero_stage=1, pp=2, recompute="full", schedule="zb-h1")
    one_chunk = predict(j).memory[0]
    two_chunks = predict(job(framework="fsdp", zero_stage=1, pp=2, recompute="full", schedule="zb-v")).memory[0]
    m, b = j.parallel.num_microbatches, boundary_bytes(j)
    assert one_chunk.buffers == pytest.approx(m * b)
    assert two_chunks.buffers == pytest.approx(2 * m * b + (m - two_chunks.in_flight_microbatches) * b)


def test_torch_pipeline_buffers_of_many_plans_at_once_are_each_plans_own():
    """The search's screen calls the same arithmetic on arrays: each entry is the scalar answer."""
    boundary = np.array([1.0, 2.0, 3.0, 5.0])
    logits = np.array([0.0, 0.0, 7.0, 0.0])
    m, flight = np.array([8.0, 8.0, 4.0, 2.0]), np.array([8.0, 3.0, 1.0, 2.0])
    first, chunks = np.array([1.0, 0.0, 0.0, 0.0]), np.array([1.0, 1.0, 1.0, 2.0])
    keeps = np.array([True, False, False, True])
    kept, received = torch_pipeline_buffers(boundary, logits, m, flight, first, chunks, keeps)
    for i in range(len(boundary)):
        assert (kept[i], received[i]) == torch_pipeline_buffers(boundary[i], logits[i], m[i], flight[i], first[i],
                                                                chunks[i], keeps[i])
    kept, received = torch_pipeline_buffers(boundary, logits, m, flight, first, chunks)
    assert (kept[1], received[1]) == (8 * 2 + 5 * 2, 8 * 2 + 5 * 2)  # a middle stage, 5 micro-batches back through it


def test_ring_attention_all_gathers_the_whole_sequences_keys_and_values_in_each_backward_pass():
    """At a fixed 4,096 tokens per rank, each doubling of torchtitan's CP degree adds the K and V
    of as many more tokens (bf16, the query's heads after repeat_kv) to a layer's backward;
    with one rank, or under Megatron (Transformer Engine's attention), there is no such ring."""
    def plan_and_shape(cp, framework="fsdp", **rotate):
        j = job(model={"name": "llama-2-7b", "seq_length": 4096 * cp}, nodes=cp, framework=framework,
                zero_stage=3, cp=cp, recompute="full", **rotate)
        return j.parallel, count_job(j).shape

    elements = 1 * 32 * 4096 * 128  # b x heads x local tokens x head dim
    ring = {cp: ring_attention_bytes(*plan_and_shape(cp)) for cp in (1, 2, 4, 8)}
    assert ring[1] == 0 and ring_attention_bytes(*plan_and_shape(2, "megatron")) == 0
    assert ring[4] - ring[2] == pytest.approx(2 * 2 * 2.0 * elements)  # 2 more ranks' bf16 K and V
    assert ring[8] - ring[4] == pytest.approx(4 * 2 * 2.0 * elements)
    assert ring[2] == pytest.approx((2 * 2 * 2.0 + 28.0) * elements)  # with the fp32 dQ/dK/dV and rotated dK/dV
    # torchtitan's alltoall rotation holds the K/V sent and received, whatever the degree
    shifted = {cp: ring_attention_bytes(*plan_and_shape(cp, cp_comm_type="alltoall")) for cp in (2, 8)}
    assert shifted[8] == shifted[2] == pytest.approx(ring[2])


def test_ring_attention_and_the_loss_do_not_peak_together():
    """The ring's buffers live in a layer's backward pass, after the loss's peak: where the
    loss's copies of the logits are larger (llama-3-8b's 128K vocabulary), the stage's peak
    stays the loss's."""
    j = job(model={"name": "llama-3-8b", "seq_length": 8192}, nodes=2, framework="fsdp", zero_stage=3, cp=2,
            recompute="full")
    inv = count_job(j)
    st = inv.stages[0]
    layer = recompute_cost(j.parallel, st.blocks[0].ops, inv.shape, st.blocks[0].num_layers).working_bytes
    ring, loss = ring_attention_bytes(j.parallel, inv.shape), loss_logits_bytes(j, st)
    _, working, logits = microbatch_bytes(inv, st)
    assert 0 < layer + ring < loss
    assert working - end_saved_bytes(st) == pytest.approx(layer + ring)
    assert working - end_saved_bytes(st) + logits == pytest.approx(loss)
