"""How Megatron-LM and DeepSpeed really parallelise, as the inventory and schedule model it."""

import dataclasses

import pytest

from paraplan.catalog import resolve_job
from paraplan.inventory import CollectiveKind, count_job
from paraplan.prediction import predict
from paraplan.prediction.facade import stage_sends_s
from paraplan.specs import ConfigError


def job(model="llama-2-7b", nodes=4, precision="bf16", **parallel):
    plan = {"micro_batch_size": 1, "global_batch_size": 64, **parallel}
    return resolve_job(
        {"model": model, "cluster": {"name": "dgx-a100", "num_nodes": nodes}, "parallel": plan, "precision": precision}
    )


def test_context_parallel_ranks_share_the_zero_shards_of_the_gradient_group():
    # Megatron-LM reduces gradients and shards the distributed optimizer over dp x cp.
    one = predict(job(tp=2, cp=1, zero_stage=1)).worst_memory
    two = predict(job(tp=2, cp=2, zero_stage=1)).worst_memory
    assert two.optimizer_states == pytest.approx(one.optimizer_states)


def test_context_parallel_ranks_keep_only_their_own_chunk_of_activations():
    one = predict(job(tp=2, cp=1, micro_batch_size=1)).worst_memory.activations
    two = predict(job(tp=2, cp=2, micro_batch_size=1)).worst_memory.activations
    assert two == pytest.approx(one / 2, rel=1e-6)


def test_deepspeed_zero_3_is_not_faster_than_zero_1():
    times = [
        predict(job(model="gpt2-xl", nodes=4, zero_stage=z, framework="deepspeed", global_batch_size=128)).iteration_s
        for z in (1, 2, 3)
    ]
    assert times[0] <= times[1] <= times[2]


def test_deepspeed_pipelines_accept_only_zero_0_or_1():
    with pytest.raises(ConfigError, match=r"parallel\.zero_stage: DeepSpeed's pipeline engine supports ZeRO stage 0 or 1"):
        job(pp=4, zero_stage=2, framework="deepspeed")


@pytest.mark.parametrize(
    ("extra", "divided"),
    [({}, False), ({"sequence_parallel": True}, True), ({"framework": "deepspeed"}, True), ({"scatter_gather_p2p": True}, True)],
)
def test_pipeline_messages_are_split_over_tp_only_when_the_framework_splits_them(extra, divided):
    inv = count_job(job(tp=8, pp=4, **extra))
    full = 2 * 4096 * 4096  # bf16 [s, b=1, h] of llama-2-7b
    assert inv.p2p.bytes == (full / 8 if divided else full)


@pytest.mark.parametrize(("extra", "sends_mask"), [({}, False), ({"framework": "deepspeed"}, True),
                                                   ({"framework": "deepspeed", "pipeline_mask": False}, False)])
def test_deepspeed_forward_sends_carry_the_fp16_causal_mask_and_backward_sends_do_not(extra, sends_mask):
    inv = count_job(job(tp=8, pp=4, global_batch_size=64, **extra))
    assert (inv.p2p_mask is not None) == sends_mask
    if sends_mask:
        assert inv.p2p_mask.bytes == 2 * 4096 * 4096  # [1, 1, s, s] as fp16, for llama-2-7b
    pred = predict(job(tp=8, pp=4, global_batch_size=64, **extra))
    first, m = pred.stages[0], pred.job.parallel.num_microbatches
    assert (first.p2p_fwd_s > first.p2p_s) == sends_mask
    # the first stage sends m activations forward and, being first, no gradient back; under
    # DeepSpeed's TrainSchedule every transfer is a rendezvous, so receiving the m gradients
    # holds it too (the seconds a trace shows it in sends; the breakdown's p2p is what the
    # sends delay the critical stage by, tests/unit/test_breakdown.py)
    receives = m * first.p2p_s if pred.job.parallel.runs_deepspeed_train_schedule else 0.0
    held = stage_sends_s(pred.job, 0, first.p2p_s, first.p2p_mask_s)
    assert held == pytest.approx(m * first.p2p_fwd_s + receives)


def test_gpipe_holds_the_loss_activations_of_every_micro_batch():
    gpipe = predict(job(model="gpt2", nodes=1, pp=2, schedule="gpipe", global_batch_size=32)).memory[-1]
    inv = count_job(job(model="gpt2", nodes=1, pp=2, schedule="gpipe", global_batch_size=32))
    logits_fp32 = next(op for op in inv.stages[-1].end_ops if op.name == "cross_entropy").saved_bytes
    assert gpipe.activations >= 8 * logits_fp32  # 32 / dp=4 = 8 micro-batches in flight


def test_sequence_parallelism_gathers_the_lm_head_input_and_the_embedding_gradient():
    inv = count_job(job(tp=8, pp=2, sequence_parallel=True))
    last = [(c.kind, c.phase.value) for c in inv.stages[-1].end_collectives]
    first = [(c.kind, c.phase.value) for c in inv.stages[0].end_collectives]
    assert (CollectiveKind.ALL_GATHER, "fwd") in last
    assert (CollectiveKind.ALL_GATHER, "bwd_input") in first


def test_a_send_inside_a_direct_link_mesh_gets_one_pair_of_links():
    from paraplan.catalog import load_cluster
    from paraplan.costmodel import estimate_collective_s
    from paraplan.inventory import Collective, GroupLayout, ParallelDim
    from paraplan.specs import Phase

    send = Collective("x", CollectiveKind.SEND_RECV, ParallelDim.PP, 1e9, Phase.FWD)
    pair = GroupLayout(size=2, nodes=1, per_node=2)
    perlmutter = load_cluster("perlmutter")
    switched = perlmutter.model_copy(
        update={"intra_node": perlmutter.intra_node.model_copy(update={"topology": "switch"})}
    )
    mesh = estimate_collective_s(send, pair, perlmutter)
    switch = estimate_collective_s(send, pair, switched)
    assert mesh == pytest.approx(3 * switch, rel=0.01)  # the same 300 GB/s per GPU, split over 3 peers


def test_interleaved_stages_send_once_per_chunk():
    pred = predict(job(model="llama-2-7b", nodes=4, tp=8, pp=4, vpp=2, global_batch_size=32))
    m, v = pred.job.parallel.num_microbatches, 2
    p2p = pred.stages[0].p2p_s
    # the first stage sends every chunk's activation forward and all but its first chunk's
    # gradient back (what it holds in sends, as a trace shows them; not the breakdown's p2p)
    assert stage_sends_s(pred.job, 0, p2p) == pytest.approx(p2p * (m * v + m * v - m))


def test_fp32_training_keeps_no_master_weights_and_megatron_fp16_keeps_fp16_gradients():
    fp32 = predict(job(model="gpt2", nodes=1, precision="fp32")).worst_memory
    assert fp32.optimizer_states == pytest.approx(8 * predict(job(model="gpt2", nodes=1, precision="fp32")).params_total)
    fp16 = count_job(job(model="gpt2", nodes=1, precision="fp16"))
    bf16 = count_job(job(model="gpt2", nodes=1, precision="bf16"))
    assert fp16.grad_bytes == 2.0
    assert bf16.grad_bytes == 4.0  # Megatron-LM accumulates bf16 gradients in fp32


@pytest.mark.parametrize(
    ("parallel", "message"),
    [
        ({"vpp": 2}, "parallel.vpp: interleaving needs pipeline_model_parallel_size >= 2"),
        ({"pp": 2, "vpp": 2, "schedule": "gpipe"}, "parallel.schedule: 'gpipe' does not interleave"),
        ({"tp": 2, "tensor_model_parallel_size": 4}, "parallel.tp: given twice"),
    ],
)
def test_contradictory_plans_are_rejected(parallel, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        job(**parallel)


def _p2p_gathers(**extra):
    inv = count_job(job(tp=8, pp=4, global_batch_size=64, **extra))
    return [
        [(c.phase.value, c.count) for c in st.end_collectives if c.name == "tp_allgather_p2p"] for st in inv.stages
    ]


def test_a_sliced_pipeline_message_is_all_gathered_by_its_receiver():
    """DeepSpeed (PipelineEngine._exec_forward_pass/_exec_backward_pass with tp > 1): a stage
    gathers the activation it received before its forward, and before its backward both the
    gradient it received and its own output, of which it kept a 1/tp slice. Megatron-LM's
    scatter-gather gathers what it receives only; with sequence parallelism nothing is gathered."""
    first, middle, last = ("bwd_input", 2), [("fwd", 1), ("bwd_input", 2)], ("fwd", 1)
    assert _p2p_gathers(framework="deepspeed") == [[first], middle, middle, [last]]
    assert _p2p_gathers(scatter_gather_p2p=True) == [[("bwd_input", 1)], [("fwd", 1), ("bwd_input", 1)],
                                                     [("fwd", 1), ("bwd_input", 1)], [("fwd", 1)]]
    assert _p2p_gathers() == [[], [], [], []]
    assert _p2p_gathers(sequence_parallel=True) == [[], [], [], []]


def test_count_job_gives_stages_with_equal_layer_counts_their_own_index_and_the_same_contents():
    # count_job counts stages alike once: an uneven split repeats counts in the middle and at the end
    split = (6, 5, 6, 5, 5, 5)
    stages = count_job(job(nodes=3, pp=6, layers_per_stage=split)).stages
    assert [s.index for s in stages] == list(range(6))
    assert tuple(s.num_layers for s in stages) == split
    assert dataclasses.replace(stages[3], index=1) == stages[1]
    assert stages[2].params > stages[1].params  # one layer more
    assert stages[5].params > stages[4].params  # the LM head


def test_count_job_tells_stages_of_equal_length_apart_by_their_mixture_of_experts_layers():
    pattern = [0] * 8 + [0, 1] * 4 + [1] * 16
    model = {"name": "mixtral-8x7b", "moe_layer_freq": pattern}
    stages = count_job(job(model=model, pp=4, global_batch_size=64)).stages
    assert [s.num_layers for s in stages] == [8, 8, 8, 8]
    assert [sum(b.num_layers for b in s.blocks if b.moe) for s in stages] == [0, 4, 8, 8]
    assert stages[1].expert_params < stages[2].expert_params
