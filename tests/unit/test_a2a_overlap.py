"""Megatron-Core's expert-parallel all-to-all overlap (--overlap-moe-expert-parallel-comm): one
micro-batch's dispatch and combine run beside another micro-batch's computation only in the
schedule's paired (steady 1F1B) steps, each behind one sub-module of the other micro-batch."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.catalog.loader import load_cluster, load_model
from paraplan.inventory import count_job
from paraplan.prediction import predict
from paraplan.prediction.stages import fine_grained_nodes, paired_expert_comm
from paraplan.schedule.closed_form import SCHEDULES, paired_share, paired_shares
from paraplan.specs import Job, Schedule


def job(gbs: int, overlap: bool, nodes: int = 1, **parallel) -> Job:
    """Qwen3-30B-A3B on ``nodes`` DGX H100 nodes, one per pipeline stage (dp 8, ep 8)."""
    return Job(model=load_model("qwen3-30b-a3b"), cluster=load_cluster("dgx-h100", num_nodes=nodes),
               parallel={"tp": 1, "ep": 8, "zero_stage": 1, "micro_batch_size": 1, "global_batch_size": gbs,
                         "moe_token_dispatcher_type": "alltoall", "overlap_moe_expert_parallel_comm": overlap,
                         **parallel})


def _ep_s(pred) -> float:
    return sum(t.ep_fwd_mb_s + t.ep_bwd_mb_s for t in pred.stages)


def test_with_one_micro_batch_nothing_is_hidden():
    """pp = 1 runs the first forward and the last backward alone (``combined_1f1b_schedule_for_no_
    pipelining``): with one micro-batch there is no pair, and the plan costs what it costs without
    the overlap; with two, one pair hides some of it."""
    assert paired_share(Schedule.ONE_F_ONE_B, 1, 1, 1) == 0.0
    alone, overlapped = predict(job(8, False)), predict(job(8, True))
    assert overlapped.iteration_s == alone.iteration_s
    assert _ep_s(overlapped) == _ep_s(alone) > 0
    assert predict(job(16, True)).iteration_s < predict(job(16, False)).iteration_s


@pytest.mark.parametrize(("pp", "vpp"), [(1, None), (2, 2), (4, 3)])
def test_the_hidden_all_to_all_time_grows_with_the_number_of_steady_state_pairs(pp, vpp):
    """The share of paired passes grows with the micro-batches (the warmup's forwards and the
    cooldown's backwards stay alone, as many whatever m), and so does the all-to-all time a plan
    hides per iteration; with pp > 1 Megatron-LM pairs only in the interleaved schedule."""
    schedule = Schedule.INTERLEAVED if vpp else Schedule.ONE_F_ONE_B
    v = vpp or 1
    shares = [paired_share(schedule, pp, m, v) for m in (1, 2, 4, 8, 16, 64, 256)]
    assert all(a <= b for a, b in itertools.pairwise(shares)) and shares[0] == 0.0 < shares[-1] < 1.0
    # interleaved: rank r runs 2 (p - r - 1) + (v - 1) p + 1 forwards alone, p - 1 + (v - 1) p + 1 on the mean
    if vpp:
        assert paired_share(schedule, pp, 64, v) == pytest.approx((64 * v - (pp - 1 + (v - 1) * pp + 1)) / (64 * v))
    assert paired_share(Schedule.ONE_F_ONE_B, 4, 64, 1) == 0.0  # plain 1F1B never calls the combined step
    hidden = []
    for m in (2 * pp, 8 * pp, 32 * pp):
        extra = {"nodes": pp, "pp": pp, "vpp": vpp} if pp > 1 else {}
        alone, overlapped = predict(job(8 * m, False, **extra)), predict(job(8 * m, True, **extra))
        assert overlapped.stages[0].ep_fwd_mb_s < alone.stages[0].ep_fwd_mb_s
        hidden.append(m * (_ep_s(alone) - _ep_s(overlapped)))
    assert all(a < b for a, b in itertools.pairwise(hidden))


@settings(max_examples=300, deadline=None)
@given(attn_f=st.floats(0, 1e-2), mlp_f=st.floats(0, 1e-2), attn_b=st.floats(0, 2e-2), mlp_b=st.floats(0, 2e-2),
       comm_f=st.floats(0, 2e-2), comm_b=st.floats(0, 2e-2), slowdown=st.floats(0, 0.4))
def test_never_more_is_hidden_than_the_paired_compute(attn_f, mlp_f, attn_b, mlp_b, comm_f, comm_b, slowdown):
    """Each all-to-all hides behind one sub-module of the other micro-batch (Megatron-Core's
    ``TransformerLayerSchedulePlan.run``): the forward's dispatch behind the backward's experts,
    its combine behind the backward's attention, the backward's behind the forward's; what a
    pair hides is never more than the all-to-alls nor than the computation beside them."""
    fwd, bwd = paired_expert_comm(attn_f, mlp_f, attn_b, mlp_b, comm_f, comm_b, slowdown)
    hidden_f, hidden_b = comm_f - fwd, comm_b - bwd
    tiny = 1e-15
    assert -tiny <= hidden_f <= min(comm_f, attn_b + mlp_b) + tiny
    assert -tiny <= hidden_b <= min(comm_b, attn_f + mlp_f) + tiny
    # half of each direction's traffic behind each sub-module: no more than either hides
    assert hidden_f <= min(comm_f / 2, mlp_b) + min(comm_f / 2, attn_b) + tiny
    assert hidden_b <= min(comm_b / 2, attn_f) + min(comm_b / 2, mlp_f) + tiny


def test_the_paired_share_of_many_plans_is_each_plans_own():
    """The screen's per-plan shares (numpy arrays over plans) equal the one-plan function's."""
    p = np.array([1.0, 2.0, 4.0, 4.0, 8.0])
    m = np.array([1.0, 16.0, 64.0, 3.0, 128.0])
    v = np.array([1.0, 2.0, 3.0, 1.0, 4.0])
    names = [Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED, Schedule.INTERLEAVED, Schedule.ONE_F_ONE_B,
             Schedule.INTERLEAVED]
    sched = np.array([SCHEDULES.index(s) for s in names])
    want = [paired_share(s, pi, mi, vi) for s, pi, mi, vi in zip(names, p, m, v, strict=True)]
    assert paired_shares(p, m, v, sched) == pytest.approx(want, abs=0)


def _moe_layer_nodes(model: str, dispatcher: dict) -> dict[str, list[str]]:
    """Each operator name of one MoE layer of ``model`` (8 H100, ep 8) and the fine-grained
    schedule's nodes it runs in, in order."""
    j = Job(model=load_model(model), cluster=load_cluster("dgx-h100", num_nodes=1),
            parallel={"tp": 1, "ep": 8, "micro_batch_size": 1, "global_batch_size": 16,
                      "overlap_moe_expert_parallel_comm": True, **dispatcher})
    block = next(b for st in count_job(j).stages for b in st.blocks if b.moe)
    out: dict[str, list[str]] = {}
    for op, node in zip(block.ops, fine_grained_nodes(block.ops, j.parallel.dispatcher), strict=True):
        out.setdefault(op.name, []).append(node)
    return out


def test_each_operator_runs_in_the_node_megatron_core_builds_it_into():
    """``build_transformer_layer_callables`` (fine_grained_callables.py): DeepEP's only permutation
    and unpermutation are the dispatcher's ``dispatch_postprocess`` / ``combine_preprocess``, in the
    experts' node; the alltoall dispatcher's permutation is its ``dispatch_preprocess`` (the
    attention node) and its unpermutation its ``combine_postprocess``, on the communication stream
    after the combine; the layer's last residual add (``mlp_bda``) runs there too, the attention's
    residual add in the attention node."""
    deepep = _moe_layer_nodes("qwen3-30b-a3b", {"moe_token_dispatcher_type": "flex"})
    alltoall = _moe_layer_nodes("qwen3-30b-a3b", {"moe_token_dispatcher_type": "alltoall"})
    assert deepep["moe_permute"] == deepep["moe_unpermute"] == ["mlp"]
    assert alltoall["moe_permute"] == ["attn"] and alltoall["moe_unpermute"] == ["combine"]
    for nodes in (deepep, alltoall):
        assert nodes["res_add"] == ["attn", "combine"]
        assert nodes["expert_fc1"] == nodes["expert_fc2"] == ["mlp"]
        assert nodes["router"] == nodes["flash_atten"] == ["attn"]


def test_the_shared_experts_run_in_the_attention_node():
    """``submodule_attn_forward`` calls ``mlp.shared_experts_compute`` after the pre-MLP norm: the
    shared experts hide the other micro-batch's combine, not its dispatch."""
    nodes = _moe_layer_nodes("deepseek-v3", {"moe_token_dispatcher_type": "flex"})
    assert nodes["shared_fc1"] == nodes["shared_fc2"] == ["attn"]


@settings(max_examples=300, deadline=None)
@given(attn=st.floats(0, 1e-2), mlp=st.floats(0, 1e-2), comm=st.floats(0, 2e-2), kernels=st.floats(0, 1e-3),
       slowdown=st.floats(0, 0.4))
def test_the_combine_nodes_kernels_lengthen_the_communication_stream(attn, mlp, comm, kernels, slowdown):
    """The combine node's kernels run after its all-to-all on the communication stream: they never
    leave less of the all-to-all exposed, nor more than all of it; with no computation beside
    it the all-to-all is all exposed."""
    plain = paired_expert_comm(attn, mlp, attn, mlp, comm, comm, slowdown)
    longer = paired_expert_comm(attn, mlp, attn, mlp, comm, comm, slowdown, combine_kernels_f=kernels,
                                combine_kernels_b=kernels)
    tiny = 1e-15
    for a, b in zip(plain, longer, strict=True):
        assert a - tiny <= b <= comm + tiny
    assert paired_expert_comm(0.0, 0.0, 0.0, 0.0, comm, comm, slowdown, combine_kernels_f=kernels,
                              combine_kernels_b=kernels) == pytest.approx((comm, comm), abs=1e-15)
