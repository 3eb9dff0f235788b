"""The facade: Job -> Prediction (iteration time, breakdown, memory, MFU, cost).

Used by the CLI, the plan search, validation and the Python API (``paraplan.predict``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from paraplan.costmodel import AnalyticalCostModel, CostModel, calibration_gaps, link_gaps
from paraplan.inventory import (
    Collective,
    JobInventory,
    Op,
    OpKind,
    ParallelDim,
    StageInventory,
    count_job,
    group_layout,
)
from paraplan.inventory.recompute import recompute_cost
from paraplan.memory import StageMemory, estimate_memory
from paraplan.schedule import (
    PipelineResult,
    overlapped_s,
    sharded_pass_s,
    simulate_deepspeed_pipeline,
    simulate_pipeline,
    transfer_s,
)
from paraplan.specs import HeteroJob, Job, Phase, Schedule

BACKWARD = (Phase.BWD_INPUT, Phase.BWD_WEIGHT)
_ATTENTION_KINDS = (OpKind.ATTENTION, OpKind.BMM, OpKind.SOFTMAX)


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Where one iteration's seconds go, on its critical path; the parts add up to it."""

    forward_compute_s: float
    backward_compute_s: float
    recompute_s: float
    tp_communication_s: float
    pipeline_p2p_s: float
    pipeline_bubble_s: float
    dp_communication_s: float
    optimizer_step_s: float

    @property
    def total_s(self) -> float:
        return sum(asdict(self).values())


@dataclass(frozen=True, slots=True)
class StageTiming:
    """One micro-batch on one stage (``*_mb_s``) and the once-per-iteration parts."""

    stage: int
    num_layers: int
    forward_mb_s: float
    backward_mb_s: float
    recompute_mb_s: float
    tp_fwd_mb_s: float
    tp_bwd_mb_s: float
    p2p_s: float  # one activation (forward) or gradient (backward) send to a neighbour
    grad_reduce_s: float
    param_gather_s: float
    exposed_dp_s: float
    optimizer_s: float
    p2p_mask_s: float = 0.0  # what a forward send carries besides the activation

    @property
    def p2p_fwd_s(self) -> float:
        return self.p2p_s + self.p2p_mask_s

    @property
    def busy_mb_s(self) -> float:
        """Seconds the stage is busy with one micro-batch: compute, recompute and TP/CP traffic."""
        return self.forward_mb_s + self.backward_mb_s + self.recompute_mb_s + self.tp_fwd_mb_s + self.tp_bwd_mb_s


@dataclass(frozen=True, slots=True)
class OpEstimate:
    """One operator of one layer, with its work and its estimated seconds (``--explain``)."""

    name: str
    role: str
    kind: str
    flops: float
    bytes: float
    params: float
    fwd_s: float
    bwd_s: float
    recompute_s: float
    source: str


@dataclass(frozen=True, slots=True)
class CollectiveEstimate:
    name: str
    kind: str
    dim: str
    bytes: float
    phase: str
    count: int
    group_size: int
    group_nodes: int
    seconds: float
    source: str = "alpha-beta"


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the stages of a plan on a heterogeneous cluster run."""

    cluster: str
    node_order: tuple[str, ...]  # the GPU of every node, in rank order
    stage_gpus: tuple[str, ...]  # the GPU type(s) of every stage, "A100-SXM4-40GB+A10" when mixed
    stage_hbm_bytes: tuple[float, ...]  # the smallest HBM among each stage's GPUs
    gpus: tuple[tuple[str, int], ...]  # (GPU, how many) per node group
    price_per_hour_usd: float | None
    job: HeteroJob | None = field(default=None, repr=False, compare=False)  # the job predicted


@dataclass(frozen=True)
class Prediction:
    """Everything paraplan predicts for one job. ``to_dict()`` gives the JSON form."""

    job: Job
    backend: str
    iteration_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    hfu: float
    bubble_fraction: float
    breakdown: Breakdown
    stages: tuple[StageTiming, ...]
    memory: tuple[StageMemory, ...]
    params_total: float
    model_flops_per_iteration: float
    pipeline: PipelineResult | None = field(default=None, repr=False)
    placement: Placement | None = None
    # kernels timed with generic guesses, not curves measured on the GPU (one note each)
    uncalibrated: tuple[str, ...] = ()
    _explain: Callable[[], tuple[tuple[OpEstimate, ...], tuple[CollectiveEstimate, ...]]] | None = field(
        default=None, repr=False, compare=False
    )

    @functools.cached_property
    def _explained(self) -> tuple[tuple[OpEstimate, ...], tuple[CollectiveEstimate, ...]]:
        return self._explain() if self._explain is not None else ((), ())

    @property
    def layer_ops(self) -> tuple[OpEstimate, ...]:
        """The operators of one layer of the critical stage, with their seconds."""
        return self._explained[0]

    @property
    def layer_collectives(self) -> tuple[CollectiveEstimate, ...]:
        """The collectives of one layer of the critical stage, with their seconds."""
        return self._explained[1]

    @property
    def worst_memory(self) -> StageMemory:
        return max(self.memory, key=lambda m: m.total)

    @property
    def fits(self) -> bool:
        return all(m.total <= hbm for m, hbm in zip(self.memory, self.hbm_bytes, strict=True))

    @property
    def hbm_bytes(self) -> tuple[float, ...]:
        """Each stage's GPU memory (the smallest, for a stage on mixed GPUs)."""
        if self.placement is not None:
            return self.placement.stage_hbm_bytes
        return (self.job.cluster.gpu.hbm_bytes,) * len(self.memory)

    @property
    def gpu_name(self) -> str:
        if self.placement is not None:
            return " + ".join(f"{n} x {gpu}" for gpu, n in self.placement.gpus)
        return self.job.cluster.gpu.name

    @property
    def cost_per_hour_usd(self) -> float | None:
        if self.placement is not None:
            return self.placement.price_per_hour_usd
        price = self.job.cluster.price_per_gpu_hour
        return None if price is None else price * self.job.cluster.num_gpus

    @property
    def usd_per_million_tokens(self) -> float | None:
        hourly = self.cost_per_hour_usd
        return None if hourly is None else hourly / 3600.0 / self.tokens_per_s * 1e6

    @property
    def time_to_train_s(self) -> float | None:
        tokens = self.job.train_tokens
        return None if tokens is None else tokens / self.tokens_per_s

    @property
    def cost_to_train_usd(self) -> float | None:
        hourly, seconds = self.cost_per_hour_usd, self.time_to_train_s
        return None if hourly is None or seconds is None else hourly * seconds / 3600.0

    def plan_dict(self) -> dict:
        """The resolved parallel plan, as JSON keys (also the columns of search results)."""
        plan = self.job.parallel
        return {
            "tp": plan.tp,
            "pp": plan.pp,
            "dp": plan.dp,
            "cp": plan.cp,
            "vpp": plan.vpp,
            "sequence_parallel": plan.sequence_parallel,
            "zero_stage": plan.zero_stage,
            "micro_batch_size": plan.micro_batch_size,
            "global_batch_size": plan.global_batch_size,
            "num_microbatches": plan.num_microbatches,
            "recompute": plan.recompute.value,
            "schedule": plan.schedule.value,
            "framework": plan.framework.value,
            "layers_per_stage": [s.num_layers for s in self.stages],
            **({"node_order": list(self.placement.node_order)} if self.placement is not None else {}),
        }

    def to_dict(self) -> dict:
        """A JSON-ready mapping; keys follow DESIGN.md's vocabulary (documented in the README)."""
        job = self.job
        worst = self.worst_memory
        return {
            "job": job.name,
            "backend": self.backend,
            "model": job.model.name,
            "gpu": self.gpu_name,
            "num_gpus": job.cluster.num_gpus,
            "parallel": self.plan_dict(),
            "precision": job.precision.value,
            "iteration_s": self.iteration_s,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "bubble_fraction": self.bubble_fraction,
            "params_total": self.params_total,
            "model_flops_per_iteration": self.model_flops_per_iteration,
            "breakdown": asdict(self.breakdown),
            "memory": {
                "worst_stage": worst.stage,
                "weights_bytes": worst.weights,
                "gradients_bytes": worst.gradients,
                "optimizer_states_bytes": worst.optimizer_states,
                "activations_bytes": worst.activations,
                "buffers_bytes": worst.buffers,
                "total_bytes": worst.total,
                "hbm_bytes": self.hbm_bytes[worst.stage],
                "fits": self.fits,
                "per_stage_total_bytes": [m.total for m in self.memory],
            },
            "cost": {
                "price_per_gpu_hour_usd": None if self.placement else job.cluster.price_per_gpu_hour,
                "cost_per_hour_usd": self.cost_per_hour_usd,
                "usd_per_million_tokens": self.usd_per_million_tokens,
                "train_tokens": job.train_tokens,
                "time_to_train_s": self.time_to_train_s,
                "cost_to_train_usd": self.cost_to_train_usd,
            },
            "stages": [asdict(s) for s in self.stages],
            "uncalibrated": list(self.uncalibrated),
            **({"placement": _placement_dict(self.placement)} if self.placement is not None else {}),
        }


def _placement_dict(placement: Placement) -> dict:
    return {f: getattr(placement, f) for f in ("cluster", "node_order", "stage_gpus", "stage_hbm_bytes", "gpus",
                                               "price_per_hour_usd")}


def ops_seconds(cm: CostModel, ops: tuple[Op, ...], phases: tuple[Phase, ...]) -> float:
    """Seconds of ``ops`` in ``phases`` (one rank, one micro-batch)."""
    return sum(cm.estimate_op_s(op, ph) for op in ops for ph in phases)


@dataclass(frozen=True, slots=True)
class LayerCost:
    """Seconds of each operator of one layer (the same on every stage), costed once."""

    fwd: tuple[float, ...]
    bwd: tuple[float, ...]
    fwd_total: float
    bwd_total: float
    comm_fwd: float  # the layer's TP/CP collectives
    comm_bwd: float

    @classmethod
    def of(cls, st: StageInventory, cm: CostModel, comm: CommCosts) -> LayerCost:
        ops = st.layer_ops
        fwd = tuple(cm.estimate_op_s(op, Phase.FWD) for op in ops)
        bwd = tuple(cm.estimate_op_s(op, Phase.BWD_INPUT) + cm.estimate_op_s(op, Phase.BWD_WEIGHT) for op in ops)
        tp = tuple(c for c in st.layer_collectives if c.dim is not ParallelDim.CP)
        cp = tuple(c for c in st.layer_collectives if c.dim is ParallelDim.CP)
        # Context parallelism passes K/V chunks around a ring while attention runs on the
        # chunk already there (TransformerEngine overlaps them): the excess is exposed, and
        # attention slows while the transfers run.
        attn_f = sum(t for op, t in zip(ops, fwd, strict=True) if op.kind in _ATTENTION_KINDS)
        attn_b = sum(t for op, t in zip(ops, bwd, strict=True) if op.kind in _ATTENTION_KINDS)
        cp_f = exposed_beside(attn_f, comm.total(cp, (Phase.FWD,)), 0.0, comm.slowdown)
        cp_b = exposed_beside(attn_b, comm.total(cp, BACKWARD), 0.0, comm.slowdown)
        tp_f, tp_b = comm.total(tp, (Phase.FWD,)), comm.total(tp, BACKWARD)
        if comm.plan.tp_comm_overlap:
            # Megatron-LM --tp-comm-overlap (Transformer Engine userbuffers): the sequence-
            # parallel all-gathers and reduce-scatters are split into tp chunks pipelined with
            # the GEMMs they feed or drain; one chunk stays exposed, the GEMMs slow down.
            gemm_f = sum(t for op, t in zip(ops, fwd, strict=True) if op.kind is OpKind.GEMM)
            gemm_b = sum(t for op, t in zip(ops, bwd, strict=True) if op.kind is OpKind.GEMM)
            share = 1.0 / comm.plan.tp
            tp_f = exposed_beside(gemm_f, tp_f, share, comm.slowdown)
            tp_b = exposed_beside(gemm_b, tp_b, share, comm.slowdown)
        return cls(fwd, bwd, sum(fwd), sum(bwd), tp_f + cp_f, tp_b + cp_b)


def exposed_beside(compute_s: float, comm_s: float, exposed_share: float, slowdown: float) -> float:
    """What ``comm_s`` adds to ``compute_s`` when all but ``exposed_share`` of it overlaps
    the computation (which slows while it runs: ``schedule.overlapped_s``)."""
    if comm_s <= 0.0:
        return 0.0
    hidden = comm_s * (1.0 - exposed_share)
    return float(overlapped_s(compute_s, hidden, slowdown)) - compute_s + comm_s * exposed_share


class CommCosts:
    """Collective times for one job, each group's layout computed once."""

    def __init__(self, inv: JobInventory, cm: CostModel) -> None:
        plan, gpn = inv.job.parallel, inv.job.cluster.gpus_per_node
        self.cm = cm
        self.plan = plan
        self.slowdown = cm.cluster.gpu.efficiency.overlap_slowdown
        self.layouts = {dim: group_layout(dim, plan, gpn) for dim in ParallelDim}
        self.pair = group_layout(ParallelDim.PP, plan, gpn, size=2)

    def seconds(self, coll: Collective) -> float:
        layout = self.pair if coll.dim is ParallelDim.PP else self.layouts[coll.dim]
        return self.cm.estimate_collective_s(coll, layout) * coll.count

    def total(self, colls: tuple[Collective, ...], phases: tuple[Phase, ...]) -> float:
        return sum(self.seconds(c) for c in colls if c.phase in phases)


def stage_timing(
    inv: JobInventory, st: StageInventory, cm: CostModel, comm: CommCosts, layer: LayerCost
) -> StageTiming:
    """One stage's seconds per micro-batch and once per iteration (the parts the pipeline
    schedule, the DP overlap and the optimizer step are built from). The plan search costs
    stages with it too (``search.screen``, ``search.hetero``)."""
    plan = inv.job.parallel
    n = st.num_layers
    layer_f, layer_b = layer.fwd_total, layer.bwd_total
    tp_f = n * layer.comm_fwd + comm.total(st.end_collectives, (Phase.FWD,))
    tp_b = n * layer.comm_bwd + comm.total(st.end_collectives, BACKWARD)
    rc = recompute_cost(plan, st.layer_ops, inv.shape, n)
    recompute = n * (sum(w * t for w, t in zip(rc.op_weights, layer.fwd, strict=True)) + rc.comm_weight * layer.comm_fwd)
    forward = n * layer_f + ops_seconds(cm, st.end_ops, (Phase.FWD,))
    backward = n * layer_b + ops_seconds(cm, st.end_ops, BACKWARD)
    slowdown = cm.cluster.gpu.efficiency.overlap_slowdown
    if st.per_microbatch_dp:
        dp_f = comm.total(st.per_microbatch_dp, (Phase.FWD,))
        dp_b = comm.total(st.per_microbatch_dp, BACKWARD)
        if plan.overlaps_grad_reduce:
            # ZeRO-3 prefetches each layer's weights while the previous layer computes, and
            # ZeRO-2/3 reduce-scatter gradient buckets while the backward pass goes on; the
            # first gather and the last reduce-scatter are exposed, and computation slows
            # while NCCL runs beside it.
            units = max(1, n)
            forward = float(sharded_pass_s(forward + tp_f, dp_f, units, slowdown)) - tp_f
            backward = float(sharded_pass_s(backward + tp_b, dp_b, units, slowdown)) - tp_b
        else:
            forward, backward = forward + dp_f, backward + dp_b
    reduce_s = comm.total(st.grad_sync, (Phase.BWD_WEIGHT,))
    gather_s = comm.total(st.grad_sync, (Phase.OPTIMIZER,))
    if plan.overlaps_grad_reduce:
        # Buckets reduce while the last micro-batch's backward runs; the parameter
        # all-gather overlaps the next iteration's first forward (both slowing it down).
        last_b, first_f = backward + recompute + tp_b, forward + tp_f
        exposed = float(overlapped_s(last_b, reduce_s, slowdown) - last_b + overlapped_s(first_f, gather_s, slowdown) - first_f)
    else:
        exposed = reduce_s + gather_s
    return StageTiming(
        stage=st.index,
        num_layers=n,
        forward_mb_s=forward,
        backward_mb_s=backward,
        recompute_mb_s=recompute,
        tp_fwd_mb_s=tp_f,
        tp_bwd_mb_s=tp_b,
        p2p_s=comm.seconds(inv.p2p) if inv.p2p is not None else 0.0,
        grad_reduce_s=reduce_s,
        param_gather_s=gather_s,
        exposed_dp_s=exposed,
        optimizer_s=cm.estimate_op_s(st.optimizer, Phase.OPTIMIZER),
        p2p_mask_s=comm.seconds(inv.p2p_mask) if inv.p2p_mask is not None else 0.0,
    )


def _source(cm: CostModel, op: Op) -> str:
    fwd, bwd = cm.source_of(op, Phase.FWD), cm.source_of(op, Phase.BWD_INPUT)
    return fwd if fwd == bwd or (op.bwd_flops == 0 and op.bwd_bytes == 0) else f"fwd: {fwd}; bwd: {bwd}"


def explain_layer(inv: JobInventory, st: StageInventory, *, cm: CostModel, comm: CommCosts, layer: LayerCost):
    """The operators and collectives of one layer of stage ``st`` with their seconds (``--explain``)."""
    weights = recompute_cost(inv.job.parallel, st.layer_ops, inv.shape, st.num_layers).op_weights
    ops = []
    for op, fwd, bwd, again in zip(st.layer_ops, layer.fwd, layer.bwd, weights, strict=True):
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
            )
        )
    colls = []
    for c in st.layer_collectives:
        layout = comm.pair if c.dim is ParallelDim.PP else comm.layouts[c.dim]
        colls.append(
            CollectiveEstimate(
                name=c.name,
                kind=c.kind.value,
                dim=c.dim.value,
                bytes=c.bytes,
                phase=c.phase.value,
                count=c.count,
                group_size=layout.size,
                group_nodes=layout.nodes,
                seconds=comm.seconds(c),
                source=cm.collective_source(c, layout) if hasattr(cm, "collective_source") else "alpha-beta",
            )
        )
    return tuple(ops), tuple(colls)


def predict(job: Job, cost_model: CostModel | None = None, *, keep_timeline: bool = False) -> Prediction:
    """Predict one training iteration of ``job`` (analytical backend unless one is given)."""
    inv = count_job(job)
    cm = cost_model if cost_model is not None else AnalyticalCostModel(job.cluster, job.precision)
    prepare = getattr(cm, "prepare", None)
    if prepare is not None:  # batched backends estimate the whole job's operators at once
        prepare(inv)
    comm = CommCosts(inv, cm)
    layer = LayerCost.of(inv.stages[0], cm, comm)
    timings = tuple(stage_timing(inv, st, cm, comm, layer) for st in inv.stages)
    crit_explain = functools.partial(explain_layer, inv, cm=cm, comm=comm, layer=layer)
    peak = job.cluster.gpu.flops_for(job.precision) * job.cluster.num_gpus
    gaps = calibration_gaps(job.cluster.gpu, job.precision, all_ops(inv)) + link_gaps(job.cluster)
    return assemble_prediction(
        job, inv, timings, cm.name, peak, crit_explain, keep_timeline=keep_timeline, uncalibrated=gaps
    )


def all_ops(inv: JobInventory) -> list[Op]:
    """Every distinct operator the job runs (each stage's layer, ends and optimizer)."""
    ops = {id(op): op for st in inv.stages for op in (*st.layer_ops, *st.end_ops, st.optimizer)}
    return list(ops.values())


def assemble_prediction(
    job: Job,
    inv: JobInventory,
    timings: tuple[StageTiming, ...],
    backend: str,
    peak_flops_total: float,
    explain: Callable[[StageInventory], tuple[tuple[OpEstimate, ...], tuple[CollectiveEstimate, ...]]],
    *,
    keep_timeline: bool = False,
    placement: Placement | None = None,
    uncalibrated: tuple[str, ...] = (),
) -> Prediction:
    """The iteration from per-stage timings: the pipeline schedule, the critical stage's
    breakdown, memory, MFU. ``peak_flops_total`` is the sum of every GPU's peak;
    ``explain(stage)`` lists the critical stage's operators on demand."""
    plan = job.parallel
    p2p = max(t.p2p_s for t in timings)
    mask = max(t.p2p_mask_s for t in timings)
    fwd = [t.forward_mb_s + t.tp_fwd_mb_s for t in timings]
    bwd = [t.backward_mb_s + t.recompute_mb_s + t.tp_bwd_mb_s for t in timings]
    lockstep = plan.runs_deepspeed_train_schedule and plan.pp > 1
    if lockstep:
        pipe = simulate_deepspeed_pipeline(
            fwd, bwd, p2p, plan.num_microbatches, keep_tasks=keep_timeline, fwd_extra_s=mask
        )
    else:
        pipe = simulate_pipeline(
            fwd, bwd, p2p, plan.num_microbatches, plan.schedule, plan.vpp, keep_tasks=keep_timeline, fwd_extra_s=mask,
            overlap_p2p=plan.overlap_p2p_comm,
        )
    drain = [pipe.finish[i] + timings[i].exposed_dp_s for i in range(plan.pp)]
    crit = max(range(plan.pp), key=drain.__getitem__)
    step = [t.optimizer_s for t in timings]
    opt = max(range(plan.pp), key=step.__getitem__)
    iteration = drain[crit] + step[opt]
    m = plan.num_microbatches
    tc = timings[crit]
    v = plan.vpp if plan.schedule is Schedule.INTERLEAVED else 1
    if lockstep:  # a rendezvous holds the receiver too: every transfer in or out of the stage
        sends = transfer_s(crit, plan.pp, m, p2p, mask)
    else:  # each of the stage's v chunks sends forward and backward, except out of the model's ends
        forward_sends = m * v - (m if crit == plan.pp - 1 else 0)
        sends = (p2p + mask) * forward_sends + p2p * (m * v - (m if crit == 0 else 0))
    if plan.pp == 1 or (plan.overlap_p2p_comm and not lockstep):
        sends = 0.0  # asynchronous sends hold no stage: waiting for them is bubble
    busy = m * tc.busy_mb_s
    breakdown = Breakdown(
        forward_compute_s=m * tc.forward_mb_s,
        backward_compute_s=m * tc.backward_mb_s,
        recompute_s=m * tc.recompute_mb_s,
        tp_communication_s=m * (tc.tp_fwd_mb_s + tc.tp_bwd_mb_s),
        pipeline_p2p_s=sends,
        pipeline_bubble_s=max(0.0, pipe.finish[crit] - busy - sends),
        dp_communication_s=tc.exposed_dp_s,
        optimizer_step_s=step[opt],
    )
    num_gpus = job.cluster.num_gpus
    return Prediction(
        job=job,
        backend=backend,
        iteration_s=iteration,
        tokens_per_s=job.tokens_per_iteration / iteration,
        tflops_per_gpu=inv.model_flops_per_iteration / iteration / num_gpus / 1e12,
        mfu=inv.model_flops_per_iteration / (iteration * peak_flops_total),
        hfu=inv.hardware_flops_per_iteration / (iteration * peak_flops_total),
        bubble_fraction=pipe.bubble_fraction,
        breakdown=breakdown,
        stages=timings,
        memory=estimate_memory(inv),
        params_total=inv.params_total,
        model_flops_per_iteration=inv.model_flops_per_iteration,
        pipeline=pipe if keep_timeline else None,
        placement=placement,
        uncalibrated=uncalibrated,
        _explain=functools.partial(explain, inv.stages[crit]),
    )
