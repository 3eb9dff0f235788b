"""What one stage costs per micro-batch: each layer's operators and collectives costed once,
communication overlapped with computation as the framework overlaps it, recompute, the DP and
ZeRO traffic and the optimizer step (``stage_timing``). The arithmetic that turns a stage's cost
terms into its passes is ``stage_arithmetic``'s, which the plan screen calls on arrays
(``search.screen``); the heterogeneous search calls ``stage_timing`` itself (``search.hetero``).
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.catalog import load_host_launch
from paraplan.costmodel import CostModel
from paraplan.inventory import (
    Collective,
    CollectiveKind,
    GroupLayout,
    JobInventory,
    LayerBlock,
    Op,
    OpKind,
    ParallelDim,
    StageInventory,
    group_layout,
)
from paraplan.inventory.fp8 import is_amax_reduction
from paraplan.inventory.moe import is_shared_expert
from paraplan.inventory.ops import DISPATCH_BACKENDS
from paraplan.inventory.recompute import RecomputeCost, recompute_cost
from paraplan.prediction.async_tp import async_tp_layer, runs_async_tp
from paraplan.prediction.host_sync import host_wait_s
from paraplan.prediction.memory import activations_per_microbatch
from paraplan.prediction.offload import offload_costs, optimizer_step_s
from paraplan.prediction.result import CollectiveEstimate, OpEstimate, StageTiming
from paraplan.prediction.sp_backward import async_linears_backward, runs_async_linears
from paraplan.prediction.stage_arithmetic import PassWork, stage_passes, stage_work
from paraplan.prediction.userbuffers import runs_userbuffers, userbuffers_layer
from paraplan.schedule import exposed_beside
from paraplan.schedule.closed_form import paired_share
from paraplan.specs import Framework, ParallelPlan, Phase
from paraplan.units import format_bytes

BACKWARD = (Phase.BWD_INPUT, Phase.BWD_WEIGHT)
_ATTENTION_KINDS = (OpKind.ATTENTION, OpKind.BMM, OpKind.SOFTMAX)
_EXPERT_DIMS = (ParallelDim.EP, ParallelDim.ETP)


def ops_seconds(cm: CostModel, ops: tuple[Op, ...], phases: tuple[Phase, ...]) -> float:
    """Seconds of ``ops`` in ``phases`` (one rank, one micro-batch)."""
    return sum(cm.estimate_op_s(op, ph) for op in ops for ph in phases)


def ops_passes(cm: CostModel, ops: tuple[Op, ...]) -> tuple[float, float, float]:
    """``ops_seconds`` of ``ops`` forward, backward and in the weight gradients (a part of the
    backward), each operator's weight gradient costed once."""
    costs = [(cm.estimate_op_s(op, Phase.FWD), cm.estimate_op_s(op, Phase.BWD_INPUT),
              cm.estimate_op_s(op, Phase.BWD_WEIGHT)) for op in ops]
    return (sum(f for f, _, _ in costs), sum(t for _, i, w in costs for t in (i, w)),
            sum(w for _, _, w in costs))


def _ep_weight(rc: RecomputeCost) -> float:
    """How often a recompute re-runs the layer's expert-parallel collectives (the "moe" module's
    dispatch and combine; otherwise as the layer's other collectives)."""
    return rc.comm_weight if rc.ep_comm_weight is None else rc.ep_comm_weight


@dataclass(frozen=True, slots=True)
class LayerCost:
    """Seconds of each operator of one layer (the same on every stage), costed once, and what
    its TP, CP and expert (EP, ETP) collectives add to its passes."""

    fwd: tuple[float, ...]
    bwd: tuple[float, ...]
    fwd_total: float
    bwd_total: float
    tp_fwd: float
    tp_bwd: float
    cp_fwd: float = 0.0
    cp_bwd: float = 0.0
    ep_fwd: float = 0.0
    ep_bwd: float = 0.0
    wgrad_total: float = 0.0  # the weight-gradient operators' part of bwd_total
    # of ep_fwd and ep_bwd, what a paired step hides (--overlap-moe-expert-parallel-comm)
    ep_paired_fwd: float = 0.0
    ep_paired_bwd: float = 0.0
    # of fwd_total, what the host's kernel launches add after a MoE dispatcher's sync
    # (``prediction.host_sync``; ParallelPlan.moe_host_sync): the breakdown's host launch wait
    host_fwd: float = 0.0
    # of tp_fwd, the all-gathers' (a recompute re-running them alone: ``RecomputeCost.gather_weight``)
    tp_gather_fwd: float = 0.0

    @property
    def comm_fwd(self) -> float:
        """The layer's collectives, forward (TP, CP and expert)."""
        return self.tp_fwd + self.cp_fwd + self.ep_fwd

    @property
    def comm_bwd(self) -> float:
        return self.tp_bwd + self.cp_bwd + self.ep_bwd

    def recompute_s(self, rc: RecomputeCost) -> float:
        """Seconds one layer spends recomputing under ``rc`` (its operators' and
        collectives' forward, each as often as the policy re-runs it)."""
        return (self.recompute_kernels_s(rc) + rc.comm_weight * (self.tp_fwd + self.cp_fwd)
                + rc.gather_weight * self.tp_gather_fwd
                + _ep_weight(rc) * self.ep_fwd)

    def work(self, rc: RecomputeCost) -> PassWork:
        """The layer's seconds per micro-batch as ``stage_work`` sums them, recomputing under ``rc``."""
        return PassWork(self.fwd_total, self.bwd_total, self.wgrad_total, self.comm_fwd, self.comm_bwd,
                        self.recompute_s(rc), self.ep_paired_fwd, self.ep_paired_bwd)

    def recompute_kernels_s(self, rc: RecomputeCost) -> float:
        """The operators' part of ``recompute_s``; the collectives' part is
        ``rc.comm_weight`` times each of ``tp_fwd``, ``cp_fwd`` and ``ep_fwd``."""
        return sum(w * t for w, t in zip(rc.op_weights, self.fwd, strict=True))

    @classmethod
    def of(cls, block: LayerBlock, cm: CostModel, comm: CommCosts) -> LayerCost:
        ops = block.ops
        fwd = tuple(cm.estimate_op_s(op, Phase.FWD) for op in ops)
        weight = tuple(cm.estimate_op_s(op, Phase.BWD_WEIGHT) for op in ops)
        bwd = tuple(cm.estimate_op_s(op, Phase.BWD_INPUT) + w for op, w in zip(ops, weight, strict=True))
        tp = tuple(c for c in block.collectives if c.dim is ParallelDim.TP and not is_amax_reduction(c))
        # an FP8 quantizer's amax all-reduce waits on the compute stream, never overlapped
        amax = tuple(c for c in block.collectives if is_amax_reduction(c))
        if runs_async_tp(comm):  # PyTorch's fused all-gather/reduce-scatter matmuls
            fwd, bwd, tp_f, tp_b = async_tp_layer(ops, fwd, bwd, weight, tp, cm, comm)
        else:
            tp_f, tp_b = comm.total(tp, (Phase.FWD,)), comm.total(tp, BACKWARD)
        beside_b = 0.0  # Megatron's and TE's linears: backward collectives beside their own GEMMs
        if runs_async_linears(comm):
            beside_b, rest_b = async_linears_backward(ops, bwd, weight, tp, comm)
            tp_b = beside_b + rest_b
        cp = tuple(c for c in block.collectives if c.dim is ParallelDim.CP)
        ep = tuple(c for c in block.collectives if c.dim in _EXPERT_DIMS)
        cp_f, cp_b = context_comm(attention_steps(ops, fwd), attention_steps(ops, bwd), cp, comm)
        if runs_userbuffers(comm):  # Transformer Engine's userbuffers as its configuration runs them
            fwd, bwd, weight, tp_f, tp_b = userbuffers_layer(ops, fwd, bwd, weight, tp, cm, comm)
        elif comm.plan.tp_comm_overlap:
            gemm_f = sum(t for op, t in zip(ops, fwd, strict=True) if op.kind is OpKind.GEMM)
            gemm_b = sum(t for op, t in zip(ops, bwd, strict=True) if op.kind is OpKind.GEMM)
            tp_f, tp_b = tp_overlapped(gemm_f, tp_f, comm), beside_b + tp_overlapped(gemm_b, tp_b - beside_b, comm)
        ep_f, ep_b, paired_f, paired_b = _expert_comm(ops, fwd, bwd, ep, comm, tp_f, tp_b)
        # the amax all-reduces block the compute stream (async_op=False): never paired or hidden
        tp_f, tp_b = tp_f + comm.total(amax, (Phase.FWD,)), tp_b + comm.total(amax, BACKWARD)
        # the kernels wait for their launches after a MoE dispatcher's sync: part of the
        # forward's kernel time, from the kernels alone (the collectives' kernels would hide some
        # launches; leaving them out keeps the network's time apart from the kernels')
        host_f = host_wait_s(ops, fwd, comm.host_launch_s) if block.moe and comm.host_launch_s else 0.0
        gather_f = comm.total(tuple(c for c in tp if c.kind is CollectiveKind.ALL_GATHER), (Phase.FWD,))
        return cls(fwd, bwd, sum(fwd) + host_f, sum(bwd), tp_f, tp_b, cp_f, cp_b, ep_f, ep_b, sum(weight),
                   paired_f, paired_b, host_f, min(gather_f, tp_f))


def attention_steps(ops: tuple[Op, ...], seconds: tuple[float, ...]) -> tuple[float, float]:
    """(the attention over the rank's own K/V chunk, all the ring steps over the others) of one
    layer, in seconds: a ring's second core (dims ``ring``, ``inventory.layer.context_parallel_core``)
    is the ring steps; without one (unfused or gathered attention) all of it is the first."""
    own = ring = 0.0
    for op, t in zip(ops, seconds, strict=True):
        if op.kind in _ATTENTION_KINDS:
            if dict(op.dims).get("ring"):
                ring += t
            else:
                own += t
    return own, ring


def context_comm(attn_f: tuple[float, float], attn_b: tuple[float, float], colls: tuple[Collective, ...],
                 comm: CommCosts) -> tuple[float, float]:
    """Exposed seconds of one layer's context-parallel communication (forward, backward), as
    ``plan.cp_comm`` runs it (``inventory.layer.context_parallel_collectives`` lists it).
    ``attn_f`` and ``attn_b``: the attention's seconds (``attention_steps``), over the rank's
    own chunk and over the ring steps.

    The attention of a rank's queries against the whole sequence runs in cp steps, one K/V chunk
    each (causal load balancing, each rank holding chunks i and 2cp-1-i: the own chunk's causal
    square, then half-squares; ``inventory.layer.context_parallel_core`` prices them as their
    own launches; an attention not split so, unfused, counts as cp equal steps). What a step's
    transfer does not hide is exposed, attention slowing while it runs (``exposed_beside``):

    - p2p: step i's attention runs beside the send of step i+1's chunk (cp - 1 of them; the last
      step has nothing to send), step 0 the own chunk's; backward alike, and the last dK/dV hop
      back to its owner has no step after it. Transformer Engine runs the backward in reverse,
      the own chunk last (its sends beside ring steps only), PyTorch in the forward's order;
    - allgather, Transformer Engine: the gathers and the dK/dV reduce-scatter are exposed
      ("KV all-gather between CP ranks is exposed", Llama 3 section 3.3.2); PyTorch's ring
      (torchtitan) issues the gather before step 0 and waits for it at step 1, and rotates
      dK/dV hop by hop beside the next step, the last hop exposed;
    - a2a: the all-to-alls come before and after the attention, exposed.
    """
    if not colls:
        return 0.0, 0.0
    plan, slow = comm.plan, comm.slowdown
    steps = plan.cp
    (own_f, step_f), (own_b, step_b) = (_steps(*attn_f, steps), _steps(*attn_b, steps))

    def each(name: str, phases: tuple[Phase, ...]) -> float:  # seconds of one call
        return sum(comm.seconds(c) / c.count for c in colls if c.name == name and c.phase in phases)

    kind = plan.cp_comm
    if kind == "p2p":
        send_f, send_b = each("cp_p2p", (Phase.FWD,)), each("cp_p2p", BACKWARD)
        fwd = exposed_beside(own_f, send_f, 0.0, slow) + (steps - 2) * exposed_beside(step_f, send_f, 0.0, slow)
        first_b = step_b if plan.framework is not Framework.FSDP else own_b  # TE: own chunk last
        bwd = (exposed_beside(first_b, send_b, 0.0, slow) + (steps - 2) * exposed_beside(step_b, send_b, 0.0, slow)
               + each("cp_p2p_dkv_last", BACKWARD))
        return fwd, bwd
    if kind == "allgather" and plan.framework is Framework.FSDP:
        hop = each("cp_dkv_ring", BACKWARD)
        fwd = exposed_beside(own_f, each("cp_allgather", (Phase.FWD,)), 0.0, slow)
        bwd = (exposed_beside(own_b, each("cp_allgather", BACKWARD), 0.0, slow)
               + (steps - 1) * exposed_beside(step_b, hop, 0.0, slow) + hop)
        return fwd, bwd
    return comm.total(colls, (Phase.FWD,)), comm.total(colls, BACKWARD)


def _steps(own: float, ring: float, steps: int) -> tuple[float, float]:
    """(the own chunk's step, one ring step) in seconds: cp equal steps where no ring steps
    were priced apart."""
    if ring <= 0.0 or steps <= 1:
        return own / steps, own / steps
    return own, ring / (steps - 1)


def _expert_comm(
    ops: tuple[Op, ...], fwd: tuple[float, ...], bwd: tuple[float, ...], colls: tuple[Collective, ...], comm: CommCosts,
    tp_f: float = 0.0, tp_b: float = 0.0,
) -> tuple[float, float, float, float]:
    """Exposed seconds of a MoE layer's dispatch and combine (forward, backward) and, of them,
    what a paired step hides (forward, backward). Without an overlap they hold the layer up
    (the experts wait for their tokens). Megatron-Core's --moe-shared-expert-overlap runs the
    shared experts beside them. Its --overlap-moe-expert-parallel-comm (DeepSeek-V3's DualPipe
    idea, section 3.2.1) overlaps nothing within a micro-batch: a paired step runs one micro-
    batch's forward beside another's backward, layer by layer (``paired_expert_comm``), and
    only the schedule's steady steps are pairs (``schedule.closed_form.paired_share``). The
    layer's tensor-parallel collectives ``tp_*`` (what they add to its passes) run on the
    computation stream inside the attention node (``_forward_attention``: sequence parallelism's
    all-gather and reduce-scatter), beside the other micro-batch's all-to-all."""
    if not colls:
        return 0.0, 0.0, 0.0, 0.0
    f, b = comm.total(colls, (Phase.FWD,)), comm.total(colls, BACKWARD)
    plan = comm.plan
    if plan.overlap_moe_expert_parallel_comm:
        nodes = fine_grained_nodes(ops, plan.dispatcher)
        attn_f, mlp_f, comb_f = (sum(t for n, t in zip(nodes, fwd, strict=True) if n == k) for k in _NODES)
        attn_b, mlp_b, comb_b = (sum(t for n, t in zip(nodes, bwd, strict=True) if n == k) for k in _NODES)
        pair_f, pair_b = paired_expert_comm(attn_f + tp_f, mlp_f, attn_b + tp_b, mlp_b, f, b, comm.slowdown,
                                            combine_kernels_f=comb_f, combine_kernels_b=comb_b)
        return f, b, f - pair_f, b - pair_b
    if plan.moe_shared_expert_overlap:
        shared = [is_shared_expert(op) for op in ops]
        beside_f = sum(t for s, t in zip(shared, fwd, strict=True) if s)
        beside_b = sum(t for s, t in zip(shared, bwd, strict=True) if s)
        return (exposed_beside(beside_f, f, 0.0, comm.slowdown), exposed_beside(beside_b, b, 0.0, comm.slowdown),
                0.0, 0.0)
    return f, b, 0.0, 0.0


_NODES = ("attn", "mlp", "combine")


def fine_grained_nodes(ops: tuple[Op, ...], dispatcher: str) -> tuple[str, ...]:
    """The node of Megatron-Core's fine-grained schedule that runs each of a MoE layer's ``ops``
    (``build_transformer_layer_callables``, megatron/core/models/gpt/fine_grained_callables.py
    @ 00c58ba): "attn" and "mlp" on the computation stream, "combine" on the communication
    stream after the combine all-to-all.

    - attn (``submodule_attn_forward``): attention, the pre-MLP norm, the shared experts
      (``shared_experts_compute``), the router and ``mlp.preprocess``, the dispatcher's
      ``dispatch_preprocess``: the alltoall dispatcher's first permutation, which paraplan's
      one permutation stands for;
    - mlp (``submodule_moe_forward``: ``routed_experts_compute``): the routed experts between
      the dispatcher's ``dispatch_postprocess`` and ``combine_preprocess``: under the flex
      dispatcher (DeepEP, HybridEP) these are its only permutation and unpermutation
      (``get_permuted_hidden_states_by_experts`` / ``get_restored_hidden_states_by_experts``);
    - combine (``submodule_combine_forward``, on the communication stream): ``mlp.combine``,
      whose ``combine_postprocess`` is the alltoall dispatcher's unpermutation (the flex
      dispatcher's only reshapes), then ``mlp_bda``, the layer's last residual add."""
    flex = dispatcher in DISPATCH_BACKENDS
    last_expert = max((i for i, op in enumerate(ops) if op.expert or op.role.startswith("experts'")), default=-1)
    nodes = []
    for i, op in enumerate(ops):
        if op.expert or op.role.startswith("experts'"):
            nodes.append("mlp")
        elif op.name == "moe_permute":
            nodes.append("mlp" if flex else "attn")
        elif op.name == "moe_unpermute":
            nodes.append("mlp" if flex else "combine")
        elif op.name == "res_add" and 0 <= last_expert < i:
            nodes.append("combine")
        else:
            nodes.append("attn")
    return tuple(nodes)


def paired_expert_comm(attn_f: float, mlp_f: float, attn_b: float, mlp_b: float, comm_f: float, comm_b: float,
                       slowdown: float, *, combine_kernels_f: float = 0.0,
                       combine_kernels_b: float = 0.0) -> tuple[float, float]:
    """Exposed seconds of one MoE layer's all-to-alls in a paired step (forward's, backward's):
    ``comm_f`` forward (dispatch and combine, half each), ``comm_b`` backward, beside the other
    micro-batch's layer of ``attn_*`` and ``mlp_*`` seconds of computation. Megatron-Core's
    ``TransformerLayerSchedulePlan.run`` (models/common/model_chunk_schedule_plan.py @ 01cf4fb)
    puts on the two streams

        comm: combine_bwd | dispatch_fwd -> dispatch_bwd    | combine_fwd
        comp: attn_fwd    | mlp_bwd -> mlp_bwd_dw -> mlp_fwd | attn_bwd

    each node waiting on its micro-batch's event (``ScheduleNode``'s ``stream_acquire_context``,
    pipeline_parallel/utils.py), so each all-to-all hides behind one sub-module only: the
    forward's dispatch behind the backward's experts, its combine behind the backward's
    attention, the backward's combine behind the forward's attention, its dispatch behind the
    forward's experts; what is longer than its sub-module stays exposed, the sub-module slowing
    while it runs (``exposed_beside``). The combine node's own kernels (``combine_kernels_*``,
    ``fine_grained_nodes``: the residual add, the alltoall dispatcher's unpermutation) run on the
    communication stream after its all-to-all and lengthen it; they are counted as kernels
    elsewhere, so the combine's exposed part is what it adds to them (``_combine_exposed``).
    Never more is hidden than the paired computation."""
    half_f, half_b = comm_f / 2.0, comm_b / 2.0
    fwd = (exposed_beside(mlp_b, half_f, 0.0, slowdown)
           + _combine_exposed(attn_b, half_f, combine_kernels_f, slowdown))
    bwd = (_combine_exposed(attn_f, half_b, combine_kernels_b, slowdown)
           + exposed_beside(mlp_f, half_b, 0.0, slowdown))
    return fwd, bwd


def _combine_exposed(compute_s: float, a2a_s: float, kernels_s: float, slowdown: float) -> float:
    """The combine all-to-all's exposed seconds beside ``compute_s``, its node's ``kernels_s``
    after it on the communication stream: what the all-to-all adds to what the kernels alone
    would leave exposed (the kernels are counted elsewhere, as kernels). It lies between what the
    all-to-all leaves exposed without them and all of it (``overlapped_s`` grows ever faster with
    the communication beside the computation)."""
    if a2a_s <= 0.0:
        return 0.0
    return (exposed_beside(compute_s, a2a_s + kernels_s, 0.0, slowdown)
            - exposed_beside(compute_s, kernels_s, 0.0, slowdown))


def layer_costs(inv: JobInventory, cm: CostModel, comm: CommCosts) -> dict[tuple[bool, str], LayerCost]:
    """Each kind of layer's cost (dense, mixture of experts), costed once for every stage."""
    out: dict[tuple[bool, str], LayerCost] = {}
    for st in inv.stages:
        for block in st.blocks:
            if block.key not in out:
                out[block.key] = LayerCost.of(block, cm, comm)
    return out


def tp_overlapped(gemm_s: float, tp_s: float, comm: CommCosts) -> float:
    """What one pass's tensor-parallel collectives ``tp_s`` add to its GEMMs ``gemm_s`` under
    Megatron-LM's --tp-comm-overlap (Transformer Engine userbuffers): the sequence-parallel
    all-gathers and reduce-scatters are split into tp chunks pipelined with the GEMMs they feed
    or drain; one chunk stays exposed, the GEMMs slow by ``overlap_slowdown`` while the rest
    runs beside them.

    Where the GPU has an operator-level measurement (``efficiency.tp_overlap``), no overlap
    leaves less exposed than it: its ``exposed_fraction`` comes from the best fused kernel
    measured (Flux), which hides more than userbuffers' chunks, so it is a floor, and a
    collective longer than its GEMMs stays the critical path. The result lies between
    ``exposed_fraction * tp_s`` and ``tp_s``."""
    chunked = exposed_beside(gemm_s, tp_s, 1.0 / comm.plan.tp, comm.slowdown)
    measured = comm.tp_overlap
    if measured is None:
        return chunked
    return max(chunked, exposed_measured(gemm_s, tp_s, measured.exposed_fraction))


def exposed_measured(compute_s: float, comm_s: float, exposed_fraction: float) -> float:
    """What ``comm_s`` adds to ``compute_s`` when an operator-level measurement says
    ``exposed_fraction`` of it stays exposed beside the computation (contention included),
    and the computation cannot hide more than itself."""
    if comm_s <= 0.0:
        return 0.0
    return min(comm_s, max(exposed_fraction * comm_s, comm_s - compute_s))


class CommCosts:
    """Collective times for one job, each group's layout computed once."""

    def __init__(self, inv: JobInventory, cm: CostModel) -> None:
        plan, gpn = inv.job.parallel, inv.job.cluster.domain_size
        self.cm = cm
        self.plan = plan
        self.slowdown = cm.cluster.gpu.efficiency.overlap_slowdown
        self.tp_overlap = cm.cluster.gpu.efficiency.tp_overlap
        # the host's CPU seconds per launched kernel where a MoE dispatcher syncs the host
        # (``prediction.host_sync``); None for a dense model or a sync-free path (no catalog read)
        self.host_launch_s = load_host_launch().launch_s if plan.moe_host_sync and inv.job.model.is_moe else None
        self.layouts = {dim: group_layout(dim, plan, gpn) for dim in ParallelDim}
        self.pair = group_layout(ParallelDim.PP, plan, gpn, size=2)

    def layout_of(self, coll: Collective) -> GroupLayout:
        """The group ``coll`` runs on: a pipeline send/recv's pair of neighbouring stages, else its dimension's group."""
        return self.pair if coll.dim is ParallelDim.PP else self.layouts[coll.dim]

    def call_s(self, coll: Collective) -> float:
        """Seconds of one of ``coll``'s calls."""
        return self.cm.estimate_collective_s(coll, self.layout_of(coll))

    def seconds(self, coll: Collective) -> float:
        """Seconds of all ``coll.count`` of ``coll``'s calls."""
        return self.call_s(coll) * coll.count

    def total(self, colls: tuple[Collective, ...], phases: tuple[Phase, ...]) -> float:
        return sum(self.seconds(c) for c in colls if c.phase in phases)

    def extrapolated_notes(self, inv: JobInventory) -> tuple[str, ...]:
        """One note per collective kind with a call beyond the sizes the intra-node curve measured
        on its group, naming the largest of those measured sizes: what the cost model's pricing
        says of each call (``collective_last_measured``; none from a learned one's regressors)."""
        intra = self.cm.cluster.intra_node
        if intra is None:
            return ()
        # the smallest last measured size per kind: a call not above it is inside every group's points
        floor = {kind: min(max(p) for p in curve.points.values())
                 for kind, curve in intra.collectives.items() if curve.points}
        if not floor:
            return ()
        calls = {id(c): c for st in inv.stages
                 for c in (*(c for b in st.blocks for c in b.collectives), *st.per_microbatch_dp, *st.grad_sync)}
        calls.update({id(c): c for c in (inv.p2p, inv.p2p_mask) if c is not None})
        last_by_kind: dict[CollectiveKind, float] = {}
        for c in calls.values():
            if c.bytes <= floor.get(c.kind.value, float("inf")):
                continue
            last = self.cm.collective_last_measured(c, self.layout_of(c))
            if last is not None:
                last_by_kind[c.kind] = max(last, last_by_kind.get(c.kind, 0.0))
        # the same words for every plan of a search (its notes are pooled): no call's own size
        return tuple(
            f"{kind.display}: calls larger than {format_bytes(last)}, the largest size measured on their "
            "group, are extrapolated along the fitted curve" for kind, last in last_by_kind.items())


def paired_share_of(plan: ParallelPlan) -> float:
    """Share of the plan's passes that run paired under --overlap-moe-expert-parallel-comm
    (``schedule.closed_form.paired_share``; 0 without it)."""
    if not plan.overlap_moe_expert_parallel_comm:
        return 0.0
    return paired_share(plan.schedule, plan.pp, plan.num_microbatches, plan.vpp)


def stage_optimizer_s(inv: JobInventory, st: StageInventory, cm: CostModel) -> float:
    """The stage's optimizer step: the GPU's, or with optimizer offload the CPU's
    (``offload.optimizer_step_s``). ``stage_timing`` and the plan screen both call it."""
    gpu = cm.estimate_op_s(st.optimizer, Phase.OPTIMIZER)
    step = optimizer_step_s(inv, st)
    return gpu if step is None else step


def per_microbatch_dp_s(st: StageInventory, cm: CostModel, comm: CommCosts) -> tuple[float, float]:
    """Seconds of the stage's data-parallel chain of every micro-batch, forward and backward:
    ZeRO-3's gathers and ZeRO-2/3's reduce-scatters, with the kernels in their streams' chain
    (``side_kernels``: FSDP1's shard casts before each all-gather, its gradient casts and divides
    around each reduce-scatter, ``inventory.fsdp1``). ``stage_timing`` and the plan screen both
    call it."""
    if not st.per_microbatch_dp:
        return 0.0, 0.0
    dp_f = comm.total(st.per_microbatch_dp, (Phase.FWD,))
    dp_b = comm.total(st.per_microbatch_dp, BACKWARD)
    for op in st.side_kernels:
        dp_f += cm.estimate_op_s(op, Phase.FWD)
        dp_b += cm.estimate_op_s(op, Phase.BWD_INPUT)
    return dp_f, dp_b


def stage_timing(
    inv: JobInventory, st: StageInventory, cm: CostModel, comm: CommCosts, layers: dict[tuple[bool, str], LayerCost]
) -> StageTiming:
    """One stage's seconds per micro-batch and once per iteration (the parts the pipeline
    schedule, the DP overlap and the optimizer step are built from), each pass cut into its
    kernels' own seconds and what each kind of communication adds to them. The plan screen
    costs stages with the same arithmetic (``stage_arithmetic``), the heterogeneous search with
    this function (``search.hetero``)."""
    plan = inv.job.parallel
    n = st.num_layers
    # the passes' parts (the breakdown: the kernels' recompute, each kind of collective's share)
    # are summed beside the totals and add up to them
    tp_f = comm.total(st.end_collectives, (Phase.FWD,))
    tp_b = comm.total(st.end_collectives, BACKWARD)
    ends = PassWork(*ops_passes(cm, st.end_ops), tp_f, tp_b)
    blocks = []
    rc_kernels = cp_f = cp_b = ep_f = ep_b = host_f = 0.0
    share = paired_share_of(plan)
    for block in st.blocks:
        k, layer = block.num_layers, layers[block.key]
        rc = recompute_cost(plan, block.ops, inv.shape, k)
        blocks.append((k, layer.work(rc)))
        rc_kernels += k * layer.recompute_kernels_s(rc)
        host_f += k * layer.host_fwd
        # a recomputed forward's collectives run again in the backward pass
        again = rc.comm_weight
        tp_f += k * layer.tp_fwd
        tp_b += k * (layer.tp_bwd + again * layer.tp_fwd + rc.gather_weight * layer.tp_gather_fwd)
        cp_f += k * layer.cp_fwd
        cp_b += k * (layer.cp_bwd + again * layer.cp_fwd)
        ep_f += k * layer.ep_fwd
        ep_b += k * (layer.ep_bwd + _ep_weight(rc) * layer.ep_fwd)
        ep_f -= share * k * layer.ep_paired_fwd  # the paired steps' hidden part, as ``stage_passes`` takes it
        ep_b -= share * k * layer.ep_paired_bwd
    work = stage_work(ends, blocks)
    offload = None
    if plan.offloads:  # host copies the computation does not hide
        offload = offload_costs(inv, st, activations_per_microbatch(inv, st)[0] / n)
    reduce_s = comm.total(st.grad_sync, (Phase.BWD_WEIGHT,))
    gather_s = comm.total(st.grad_sync, (Phase.OPTIMIZER,))
    # ZeRO-3 prefetches each layer's weights while the previous layer computes, and ZeRO-2/3
    # reduce-scatter gradient buckets while the backward pass goes on (``stage_passes``)
    dp_f, dp_b = per_microbatch_dp_s(st, cm, comm)
    passes = stage_passes(work, n, dp_f, dp_b, reduce_s, gather_s, cm.cluster.gpu.efficiency.overlap_slowdown,
                          plan.overlaps_grad_reduce, offload, share)
    return StageTiming(
        stage=st.index,
        num_layers=n,
        # the forward's wait for the host's launches is in its total (``LayerCost.fwd_total``),
        # taken out of its kernels' seconds for the breakdown (waiting is never compute)
        forward_mb_s=work.forward - host_f,
        backward_mb_s=work.backward,
        recompute_mb_s=rc_kernels,
        tp_fwd_mb_s=tp_f,
        tp_bwd_mb_s=tp_b,
        cp_fwd_mb_s=cp_f,
        cp_bwd_mb_s=cp_b,
        ep_fwd_mb_s=ep_f,
        ep_bwd_mb_s=ep_b,
        zero_fwd_mb_s=float(passes.zero_fwd),
        zero_bwd_mb_s=float(passes.zero_bwd),
        offload_fwd_mb_s=float(passes.offload_fwd),
        offload_bwd_mb_s=float(passes.offload_bwd),
        fwd_pass_mb_s=float(passes.fwd_pass),
        bwd_pass_mb_s=float(passes.bwd_pass),
        p2p_s=comm.seconds(inv.p2p) if inv.p2p is not None else 0.0,
        grad_reduce_s=reduce_s,
        param_gather_s=gather_s,
        exposed_dp_s=float(passes.exposed_sync),
        optimizer_s=stage_optimizer_s(inv, st, cm),
        p2p_mask_s=comm.seconds(inv.p2p_mask) if inv.p2p_mask is not None else 0.0,
        wgrad_mb_s=work.wgrad,
        host_wait_mb_s=host_f,
    )


def _source(cm: CostModel, op: Op) -> str:
    fwd, bwd = cm.source_of(op, Phase.FWD), cm.source_of(op, Phase.BWD_INPUT)
    return fwd if fwd == bwd or (op.bwd_flops == 0 and op.bwd_bytes == 0) else f"fwd: {fwd}; bwd: {bwd}"


def explain_layer(
    inv: JobInventory, st: StageInventory, *, cm: CostModel, comm: CommCosts, layers: dict[tuple[bool, str], LayerCost]
):
    """The operators and collectives of one layer of stage ``st`` with their seconds
    (``--explain``): of its mixture-of-experts layers when it has any; then the stage's
    data-parallel collectives (ZeRO-2/3 gathers and reduce-scatters of every micro-batch, over
    the stage's weights, and the gradient reduction once an iteration)."""
    block = st.blocks[-1]
    layer = layers[block.key]
    weights = recompute_cost(inv.job.parallel, block.ops, inv.shape, block.num_layers).op_weights
    ops = []
    for op, fwd, bwd, again in zip(block.ops, layer.fwd, layer.bwd, weights, strict=True):
        ops.append(
            OpEstimate(
                name=op.name,
                role=op.role,
                kind=op.kind.value,
                flops=op.flops,
                bytes=op.bytes,
                params=op.params,
                fwd_s=fwd,
                bwd_s=bwd,
                recompute_s=fwd * again,
                source=_source(cm, op),
                dims=op.dims,
            )
        )
    colls = tuple(_collective_estimate(c, cm, comm) for c in block.collectives)
    stage = tuple(_collective_estimate(c, cm, comm, "micro-batch") for c in st.per_microbatch_dp)
    stage += tuple(_collective_estimate(c, cm, comm, "iteration") for c in st.grad_sync)
    return tuple(ops), colls, stage


def _collective_estimate(c, cm: CostModel, comm: CommCosts, per: str = "layer") -> CollectiveEstimate:
    layout = comm.layout_of(c)
    return CollectiveEstimate(
        name=c.name,
        kind=c.kind.value,
        dim=c.dim.value,
        bytes=c.bytes,
        phase=c.phase.value,
        count=c.count,
        group_size=layout.size,
        group_nodes=layout.nodes,
        seconds=comm.seconds(c),
        source=cm.collective_source(c, layout),
        per=per,
    )


