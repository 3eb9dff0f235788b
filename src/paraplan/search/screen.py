"""The vectorised screen: every plan of a space timed and sized at once with numpy.

Nothing here counts FLOPs, bytes or collective volumes. The space's plans differ along a few
axes, and each quantity the exact prediction uses depends on only some of them, so each is
costed once per distinct value of its axes with the same code the exact path runs:

- a *shard shape* (tp, cp, sequence parallelism, micro-batch; for a mixture of experts also
  ep and etp: the tokens a rank's experts receive, the all-to-all and its group's placement)
  fixes one layer's operators and TP/CP/EP collectives, the embedding and LM-head operators and collectives, the pipeline
  message and the saved activations: one representative Job of the space is inventoried
  (``count_job``) and costed with ``AnalyticalCostModel`` through the prediction's own
  ``LayerCost`` and ``CommCosts``, and its activations through ``memory``'s own function;
- a *layout* (tp, cp, pp, ZeRO stage, hence dp; ep and etp: the experts' parameters per rank
  and their gradient sync over the expert data-parallel group) fixes every stage's parameters, its
  data-parallel collectives (``group_layout``), its optimizer step and its weight, gradient
  and optimizer-state bytes: one representative Job, ``count_job`` and ``estimate_memory``.

A plan that can stand for both a shard shape and a layout does, and is inventoried once; the
representatives reuse the Jobs the validator built (one per combination of the axes its verdict
reads). These fixed costs, not the plans, set the time of a small space.

The remaining axes (pp, dp, ZeRO, schedule, vpp, recompute, global batch, number of micro-batches) are
combined with arrays by the prediction's own stage arithmetic: each stage class's cost terms, read
from the tables, go through the functions ``prediction.stage_timing`` and
``memory.estimate_stage_memory`` call for one stage (``stage_arithmetic.stage_work`` and
``stage_passes``: layers and ends summed, ZeRO-2/3 overlap, ZeRO-Offload's gradient copy, the
exposed gradient sync; ``memory.activations_at_peak`` and ``step_peak_bytes``), with the
micro-batches in flight of ``schedule.closed_form`` and the optimizer step of
``stages.stage_optimizer_s``. Memory is the exact formula: the same bytes as ``estimate_memory``
(tests check it, hence the same verdict). Time equals ``predict``'s to
rounding for one stage, for GPipe (two flow shops, exact), for DeepSpeed's 1F1B and for the
zero-bubble schedules (their task graphs, evaluated per shape for all plans at once; past
``batched_short(p) + 2 p`` micro-batches the middle of a drift bracket between the short
run's last cycle and the slowest stage's pace, kept where it is at most 0.1 % wide, else the
whole task graph: ``schedule.steady.drift_bracket``). Megatron-LM's 1F1B with pp > 1 takes its task graph too (``schedule.one_f_one_b``:
exact up to 8 short runs of micro-batches, and past them where the steady state repeats, else
within 0.1 %). Interleaved plans take their task graph too (``schedule.interleaved_runs``, sends
held by the sending stage, or with overlap_p2p_comm, which the megatron-core and NeMo MLPerf
presets set, each an arrival delay, as ``predict`` simulates them): exact up to
``long_run(p, v)`` micro-batches and past them where the steady state repeats, else within
0.1 %. tests/unit/test_screen.py checks each class on plans that walk every
axis. The search times the screen's shortlist exactly.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from pydantic import ValidationError

from paraplan.costmodel import AnalyticalCostModel
from paraplan.inventory import JobInventory, StageInventory, count_job
from paraplan.inventory.ends import count_end_collectives
from paraplan.inventory.fp8 import is_amax_reduction
from paraplan.inventory.job import count_end_ops
from paraplan.inventory.recompute import recompute_cost
from paraplan.prediction.framework_memory import (
    boundary_bytes,
    deepspeed_pipeline_buffers,
    logit_elements,
    logits_output_bytes,
    pipelines_on_torch,
    torch_pipeline_buffers,
)
from paraplan.prediction.memory import (
    activations_at_peak,
    end_saved_bytes,
    first_layer_held_bytes,
    fragmentation_share,
    framework_buffers,
    freed_gradients,
    grads_at_forward,
    last_backward_bytes,
    microbatch_bytes,
    step_memory,
    step_peak_bytes,
    usable_hbm_bytes,
)
from paraplan.prediction.offload import OffloadCosts, gradient_copy_s
from paraplan.prediction.stage_arithmetic import PassWork, stage_passes, stage_work
from paraplan.prediction.stages import (
    BACKWARD,
    CommCosts,
    LayerCost,
    ops_seconds,
    per_microbatch_dp_s,
    stage_optimizer_s,
)
from paraplan.schedule.closed_form import (
    FIRST,
    LAST,
    MID,
    SCHEDULES,
    chunks_per_stage,
    finish_by_class,
    in_flight,
    paired_shares,
    runs_where,
)
from paraplan.search.space import (
    EP_EXPERTS,
    EP_STAGE,
    HYBRID_DIVIDES,
    OFFLOAD_DEVICES,
    UNEVEN_NOT_SCREENED,
    SearchSpace,
    expert_axes,
    hybrid_shards,
    pipe_axis,
    plan_axes,
    plan_job,
    rejection_reason,
    runs_as_zero,
)
from paraplan.specs import (
    ClusterSpec,
    ConfigError,
    Framework,
    Job,
    ModelSpec,
    ParallelPlan,
    Phase,
    Precision,
    Recompute,
)
from paraplan.specs.frameworks import framework_offer
from paraplan.specs.plan import PP_LAYERS_REASON, pp_layers_problem

#: Keys of ``SearchSpace.extra`` the screen models; any other key sends the search down the
#: exact path (e.g. ``layers_per_stage``: uneven stages).
SCREENABLE_EXTRA = frozenset({"overlap_grad_reduce", "scatter_gather_p2p", "schedule", "expert_load_imbalance",
                              "moe_shared_expert_overlap", "overlap_moe_expert_parallel_comm", "attention_kernel",
                              "cp_comm_type",  # a layer's CP exchange: LayerCost per shard shape
                              "async_tp",  # PyTorch's fused TP matmuls, alike (prediction.async_tp)
                              "moe_token_dispatcher_type", "moe_flex_dispatcher_backend",  # its EP exchange, alike
                              # the loss's copies of the logits: microbatch_bytes per shard shape
                              "cross_entropy_loss_fusion", "compile_loss", "loss_chunks",
                              "pipeline_keeps_outputs",  # torch pipelining's kept outputs, per plan in _combine
                              "fp8_amax_reduce",  # the FP8 amax all-reduces: one chunk's per layout (_layout_table)
                              "queued_kernel_gap"})  # each kernel's idle gap: the cost model's (of_plan)

# every policy's recompute and saved activations are linear in a stage's layers (``inventory.recompute``:
# full recompute with recompute_num_layers is not, and takes the exact path through ``extra``)
_RECOMPUTE = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL, Recompute.LAYER, Recompute.OP)


def screenable(space: SearchSpace, model: ModelSpec | None = None) -> bool:
    """Whether the vectorised screen models every axis of ``space`` (every recompute policy;
    ``extra`` settings such as recompute_num_layers or recompute_every take the exact path)
    and every layer of ``model`` alike (dense and mixture-of-experts layers mixed, as in
    DeepSeek-V3, take the exact path)."""
    if model is not None and len(set(model.moe_layers)) > 1:
        return False
    if model is not None and model.inventory == "traced":
        return False  # the screen's closed forms are the hand-written inventory's
    return set(space.extra) <= SCREENABLE_EXTRA and set(space.recompute) <= set(_RECOMPUTE)


@dataclass
class Screen:
    """Every valid, distinct plan of a space (in enumeration order) with its screened time and
    exact worst-stage memory, plus the plans the rules and the Job validator excluded."""

    model: ModelSpec
    cluster: ClusterSpec
    precision: Precision
    space: SearchSpace
    train_tokens: float | None
    # gbs tp pp dp cp ep etp (raw: 0 as tp) sched (raw: index into SCHEDULES, -1 the plan's own) vpp mbs zero
    # recompute (index) sp (raw: 0 off, 1 on, 2 with tp) offload (OFFLOAD_DEVICES index)
    # shard (hybrid sharding's data_parallel_shard_degree, 0: the whole gradient group)
    plans: dict[str, np.ndarray]
    iteration_s: np.ndarray
    memory_bytes: np.ndarray  # worst stage, bytes per GPU
    excluded: Counter  # reason -> plans removed by the divisibility rules and the Job validator
    considered: int  # points of the space, duplicates counted once
    timings: dict[str, float] = field(default_factory=dict)  # seconds spent per phase

    def __len__(self) -> int:
        return len(self.iteration_s)

    @property
    def seconds_per_token(self) -> np.ndarray:
        return self.iteration_s / (self.plans["gbs"] * self.model.seq_length)

    @property
    def fits(self) -> np.ndarray:
        """Plans whose worst stage fits the GPU's memory less the space's headroom."""
        return self.memory_bytes <= self.memory_limit

    @property
    def memory_limit(self) -> float:
        return usable_hbm_bytes(self.cluster.gpu.hbm_bytes, self.space.memory_headroom)

    def job(self, i: int) -> Job:
        """The Job of plan ``i`` (the same Job ``enumerate_plans`` builds for it)."""
        return _job_at(self.model, self.cluster, self.precision, self.space, self.train_tokens, self.plans, i)


def _codes(values: np.ndarray) -> np.ndarray:
    """Dense integer codes of ``values`` (equal values, equal codes)."""
    if not len(values):
        return np.zeros(values.shape, dtype=np.int64)
    low, high = values.min(), values.max()
    if low == high:  # an axis the space does not vary (ep of a dense model)
        return np.zeros(values.shape, dtype=np.int64)
    if values.dtype.kind == "b":  # both present
        return values.astype(np.int64)
    if values.dtype.kind in "iu" and int(high) - int(low) < 4096:  # small whole numbers: each value's rank
        present = np.zeros(int(high) - int(low) + 1, dtype=np.int64)
        present[values - low] = 1
        return (np.cumsum(present) - 1)[values - low]
    return np.unique(values, return_inverse=True)[1].reshape(values.shape)


def _mix(*codes: np.ndarray) -> np.ndarray:
    """One int64 key per row from several code arrays."""
    key = np.zeros(len(codes[0]), dtype=np.int64)
    for c in codes:
        key = key * (int(c.max(initial=0)) + 1) + c
    return key


def _grid(model: ModelSpec, cluster: ClusterSpec, global_batch_size: int, space: SearchSpace):
    """The space's points after the divisibility and placement rules of ``enumerate_plans``
    (same order, same reasons), as arrays, and the exclusion counts."""
    n, gpn, layers = cluster.num_gpus, cluster.gpus_per_node, model.num_layers
    tps, pps, sps = plan_axes(model, cluster, space)
    eps, etps = expert_axes(model, space, n)
    pipes = pipe_axis(space)
    sched_codes = tuple(-1 if s is None else SCHEDULES.index(s) for s, _ in pipes)
    outer = (space.batch_sizes(global_batch_size), tps, pps, space.cp, eps, tuple(e or 0 for e in etps),
             tuple(range(len(pipes))), space.micro_batch_size, tuple(k or 0 for k in space.shard_nodes))
    rc = tuple(_RECOMPUTE.index(Recompute(r)) for r in space.recompute)
    inner = (space.zero_stage, rc, tuple(2 if s is None else int(s) for s in sps),
             tuple(OFFLOAD_DEVICES.index(o) for o in space.offload_optimizer))
    n_inner = int(np.prod([len(a) for a in inner]))
    idx = np.indices([len(a) for a in outer]).reshape(len(outer), -1)
    gbs, tp, pp, cp, ep, etp, pipe, mbs, nodes = (
        np.asarray(a, dtype=np.int64)[i] for a, i in zip(outer, idx, strict=True))
    vpp = np.asarray([v for _, v in pipes], dtype=np.int64)[pipe]
    sched = np.asarray(sched_codes, dtype=np.int64)[pipe]
    excluded: Counter = Counter()
    alive = np.ones(len(gbs), dtype=bool)

    def rule(mask: np.ndarray, reason: str) -> None:
        hit = alive & mask
        count = int(hit.sum())
        if count:
            excluded[reason] += count * n_inner
            alive[hit] = False

    mp = tp * pp * cp
    rule(n % mp != 0, "tp*pp*cp does not divide the number of GPUs")
    dp = np.where(alive, n // np.maximum(mp, 1), 1)
    if not space.allow_tp_across_nodes:
        rule(tp > cluster.domain_size, f"tp > {cluster.domain_size} crosses the node's NVLink domain")
    rule(gbs % (mbs * dp) != 0, "global batch is not a multiple of micro-batch x dp")
    m = gbs // (mbs * dp)
    rule(
        (vpp > 1) & ((pp < 2) | (layers % (pp * vpp) != 0) | (m % pp != 0)),
        "interleaving needs layers divisible by pp*vpp and micro-batches by pp",
    )
    framework = Framework(space.framework)
    rule(np.isin(pp, [x for x in np.unique(pp) if pp_layers_problem(layers, int(x), framework)]), PP_LAYERS_REASON)
    rule(layers % pp != 0, UNEVEN_NOT_SCREENED)
    if model.is_moe:
        rule((ep > 1) & (model.num_moe_experts % ep != 0), EP_EXPERTS)
        rule((tp * cp * dp) % (ep * np.where(etp == 0, tp, etp)) != 0, EP_STAGE)
    keep = np.flatnonzero(alive)
    inner_idx = np.indices([len(a) for a in inner]).reshape(len(inner), -1)
    o = np.repeat(keep, n_inner)
    k = np.tile(np.arange(n_inner), len(keep))
    named = (("gbs", gbs), ("tp", tp), ("pp", pp), ("dp", dp), ("cp", cp), ("ep", ep), ("etp", etp), ("sched", sched),
             ("vpp", vpp), ("mbs", mbs), ("nodes", nodes))
    plans = {name: a[o] for name, a in named}
    plans["zero"], plans["recompute"], plans["sp"], plans["offload"] = (
        np.asarray(a, dtype=np.int64)[i][k] for a, i in zip(inner, inner_idx, strict=True)
    )
    # hybrid sharding's group, once the ZeRO stage is known (``space.hybrid_shards``)
    shard = hybrid_shards(plans.pop("nodes"), plans["tp"], plans["cp"], plans["dp"] * plans["cp"], plans["zero"],
                          gpn, framework_offer(space.framework).hybrid_zero)
    if (shard < 0).any():
        excluded[HYBRID_DIVIDES] += int((shard < 0).sum())
        plans = {name: a[shard >= 0] for name, a in plans.items()}
        shard = shard[shard >= 0]
    plans["shard"] = np.asarray(shard, dtype=np.int64)
    return plans, excluded


def _job_at(model, cluster, precision, space, train_tokens, plans, i: int, offload: str | None = None) -> Job:
    sp, etp, sched = int(plans["sp"][i]), int(plans["etp"][i]), int(plans["sched"][i])
    return plan_job(
        model, cluster, precision, space, train_tokens,
        global_batch_size=int(plans["gbs"][i]), tp=int(plans["tp"][i]), pp=int(plans["pp"][i]),
        cp=int(plans["cp"][i]), vpp=int(plans["vpp"][i]), micro_batch_size=int(plans["mbs"][i]),
        zero_stage=int(plans["zero"][i]), recompute=_RECOMPUTE[int(plans["recompute"][i])],
        sequence_parallel=None if sp == 2 else bool(sp), ep=int(plans["ep"][i]), etp=etp or None,
        schedule=None if sched < 0 else SCHEDULES[sched],
        offload_optimizer=OFFLOAD_DEVICES[int(plans["offload"][i])] if offload is None else offload,
        dp_shard=int(plans["shard"][i]) or None,
    )


_OFFLOAD_REASONS: list[str] = []  # the offload rejection reasons seen, by code


def _offload_reasons(zero: np.ndarray, offload: np.ndarray, framework: str) -> np.ndarray:
    """Per plan: -1 when ``plan.check_offload`` accepts its (ZeRO stage, offload device), else the
    code of its rejection reason in ``_OFFLOAD_REASONS``."""
    out = np.full(len(zero), -1, dtype=np.int64)
    for z, o in {(int(a), int(b)) for a, b in zip(zero.tolist(), offload.tolist(), strict=True) if b}:
        try:
            ParallelPlan(zero_stage=z, framework=framework, offload_optimizer=OFFLOAD_DEVICES[o])
        except ValidationError as err:
            reason = rejection_reason(err)
            if reason not in _OFFLOAD_REASONS:
                _OFFLOAD_REASONS.append(reason)
            out[(zero == z) & (offload == o)] = _OFFLOAD_REASONS.index(reason)
    return out


def _representatives(key: np.ndarray, prefer: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(index of one plan per distinct key, each plan's key number); with ``prefer``, a plan
    where it is true when the key has one."""
    if prefer is None:
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        return first, inverse
    _, inverse = np.unique(key, return_inverse=True)
    order = np.lexsort((~prefer, inverse))  # by key, preferred plans first, then enumeration order
    starts = np.flatnonzero(np.r_[True, inverse[order][1:] != inverse[order][:-1]])
    return order[starts], inverse


def _shard_table(model: ModelSpec, cm: AnalyticalCostModel, invs: list[JobInventory], comms: list[CommCosts],
                 policies: frozenset[int], wgrad: bool) -> dict[str, np.ndarray]:
    """Per shard shape: one layer's seconds, the ends' seconds, and the activation bytes per
    layer and at the ends under each recompute policy (``comms``: each shape's ``CommCosts``).
    Only what some plan of the space reads is costed: the recompute policies of ``policies``
    (indices into ``_RECOMPUTE``; the others' entries are 0, which ``_combine`` never picks)
    and the ends' weight-gradient pass with ``wgrad`` (zero-bubble plans)."""
    rows: list[dict[str, float]] = []
    for inv, comm in zip(invs, comms, strict=True):
        job = inv.job
        st, x, plan = inv.stages[0], inv.shape, job.parallel
        layer = LayerCost.of(st.blocks[0], cm, comm)
        # the plan under each policy, one object each: ``recompute_cost`` keeps its answers by identity
        plans = {r: plan if plan.recompute is policy else plan.model_copy(update={"recompute": policy})
                 for r, policy in enumerate(_RECOMPUTE) if r in policies}
        row = {
            "layer_f": layer.fwd_total,
            "layer_b": layer.bwd_total,
            "layer_w": layer.wgrad_total,
            "comm_f": layer.comm_fwd,
            "comm_b": layer.comm_bwd,
            "pair_f": layer.ep_paired_fwd,  # what a paired step hides (--overlap-moe-expert-parallel-comm)
            "pair_b": layer.ep_paired_bwd,
            # one layer's recompute under each policy (inventory.recompute, as the prediction)
            **{f"rc_{policy.value}": layer.recompute_s(recompute_cost(plans[r], st.layer_ops, x, 1)) if r in plans
               else 0.0 for r, policy in enumerate(_RECOMPUTE) if r},
        }
        flags = {FIRST: (True, False), MID: (False, False), LAST: (False, True), 3: (True, True)}  # 3: pp = 1
        # the inventory's own stage of a class where it has one (the same count_end_ops and
        # count_end_collectives), the others counted here
        pp = plan.pp
        own = {FIRST: 0 if pp > 1 else None, MID: 1 if pp > 2 else None, LAST: pp - 1 if pp > 1 else None,
               3: 0 if pp == 1 else None}
        ends, end_colls = {}, {}
        for c, (f, la) in flags.items():
            if own[c] is None:
                ends[c] = count_end_ops(job, x, first=f, last=la)
                end_colls[c] = count_end_collectives(model, plan, x, first=f, last=la)
            else:
                ends[c], end_colls[c] = inv.stages[own[c]].end_ops, inv.stages[own[c]].end_collectives
        for c, ops in ends.items():
            # the FP8 amax reductions run once per model chunk: ``_layout_table`` times one
            # region's, ``_combine`` counts each plan's chunks
            colls = tuple(coll for coll in end_colls[c] if not is_amax_reduction(coll))
            row[f"end_f{c}"] = ops_seconds(cm, ops, (Phase.FWD,))
            row[f"end_b{c}"] = ops_seconds(cm, ops, BACKWARD)
            row[f"end_w{c}"] = ops_seconds(cm, ops, (Phase.BWD_WEIGHT,)) if wgrad else 0.0
            row[f"endc_f{c}"] = comm.total(colls, (Phase.FWD,))
            row[f"endc_b{c}"] = comm.total(colls, BACKWARD)
        layer_stage = st.with_layers(1)
        one_layer = {c: dataclasses.replace(layer_stage, end_ops=ops) for c, ops in ends.items()}
        for c, stage in one_layer.items():
            row[f"saved{c}"] = end_saved_bytes(stage)
            f, la = flags[c]
            row[f"pipe_mb{c}"], row[f"pipe_once{c}"] = deepspeed_pipeline_buffers(
                plan, x, logit_elements(stage.end_ops), first=f, last=la, microbatches=1)
            row[f"pipe_many{c}"] = deepspeed_pipeline_buffers(  # with 2+ micro-batches a step
                plan, x, logit_elements(stage.end_ops), first=f, last=la, microbatches=2)[1]
            row[f"logits_out{c}"] = logits_output_bytes(stage, x.e)  # torch pipelining's kept outputs
        row["boundary"] = boundary_bytes(x)  # a tensor sent between pipeline stages
        for r in range(len(_RECOMPUTE)):
            plan_r = plans.get(r)
            if plan_r is None:
                row[f"held{r}"] = row[f"first{r}"] = 0.0
                row.update({f"{k}{r}_{c}": 0.0 for c in one_layer for k in ("work", "logits")})
                continue
            inv_r = inv if plan_r is plan else dataclasses.replace(inv, job=job.model_copy(update={"parallel": plan_r}))
            row[f"first{r}"] = first_layer_held_bytes(inv_r, layer_stage)  # the first block's layer: the last backward's
            for c, stage in one_layer.items():
                held, working, logits = microbatch_bytes(inv_r, stage)
                row[f"held{r}"] = held  # per layer: the same whatever the ends
                row[f"work{r}_{c}"] = working
                row[f"logits{r}_{c}"] = logits
        rows.append(row)
    return {k: np.array([r[k] for r in rows]) for k in rows[0]}


def amax_region_s(st: StageInventory, comm: CommCosts) -> tuple[float, float]:
    """Seconds of one autocast region's FP8 amax all-reduces on stage ``st`` (forward, backward):
    its end collectives' ``is_amax_reduction`` ones, each over its count (the plan's chunks)."""
    colls = [c for c in st.end_collectives if is_amax_reduction(c)]
    return (sum(comm.seconds(c) / c.count for c in colls if c.phase is Phase.FWD),
            sum(comm.seconds(c) / c.count for c in colls if c.phase in BACKWARD))


def _layout_table(cm: AnalyticalCostModel, invs: list[JobInventory], comms: list[CommCosts]) -> dict[str, np.ndarray]:
    """Per layout and stage class: layers, DP communication, optimizer step, and the memory
    that does not depend on the micro-batch: persistent (weights, gradients, optimizer
    states), transient (gathered weights, communication buffers) and outside the allocator
    (``comms``: each layout's ``CommCosts``)."""
    keys = ("layers", "reduce", "gather", "dp_f", "dp_b", "optimizer", "static", "grads_freed", "gathered", "buffers",
            "bwd_buffers", "runtime", "grad_copy", "amax_f", "amax_b", "step_temps")
    out = np.zeros((len(keys), len(invs), 3))
    for j, (inv, comm) in enumerate(zip(invs, comms, strict=True)):
        pp = len(inv.stages)
        rows: dict[int, tuple[float, ...]] = {}  # by stage: one stage is of several classes when pp < 3
        for c, s in ((FIRST, 0), (MID, min(1, pp - 1)), (LAST, pp - 1)):
            if s not in rows:
                st = inv.stages[s]
                mem = step_memory(inv, st)[0]
                rows[s] = (
                    st.num_layers,
                    comm.total(st.grad_sync, (Phase.BWD_WEIGHT,)),  # reduce
                    comm.total(st.grad_sync, (Phase.OPTIMIZER,)),  # gather
                    *per_microbatch_dp_s(st, cm, comm),  # dp_f, dp_b
                    stage_optimizer_s(inv, st, cm),  # offload: the CPU step replaces the GPU's
                    mem.persistent,  # static
                    freed_gradients(mem),  # grads_freed (set to None between steps)
                    # without the pipelines' per-micro-batch buffers (``_combine`` adds them:
                    # DeepSpeed's engine and torch.distributed.pipelining)
                    *framework_buffers(inv, st),
                    mem.runtime,
                    gradient_copy_s(inv, st),
                    *amax_region_s(st, comm),  # amax_f, amax_b: one model chunk's
                    st.step_temporaries,  # step_temps: what the optimizer step allocates
                )
            out[:, j, c] = rows[s]
    return dict(zip(keys, out, strict=True))


def screen_plans(
    model: ModelSpec,
    cluster: ClusterSpec,
    global_batch_size: int,
    precision: Precision = Precision.BF16,
    space: SearchSpace | None = None,
    train_tokens: float | None = None,
) -> Screen:
    """Screen every plan of ``space`` (see the module docstring)."""
    space = space or SearchSpace()
    if len(set(model.moe_layers)) > 1:
        raise ConfigError("search: the screen does not model dense and MoE layers mixed")
    if not screenable(space):
        unknown = sorted(set(space.extra) - SCREENABLE_EXTRA) + sorted(
            r.value for r in set(space.recompute) - set(_RECOMPUTE))
        raise ConfigError(f"search: the screen does not model {unknown}")
    clock = {"start": time.perf_counter()}
    plans, excluded = _grid(model, cluster, global_batch_size, space)
    clock["grid"] = time.perf_counter()
    args = (model, cluster, precision, space, train_tokens)
    tp, pp, cp, zero, vpp = plans["tp"], plans["pp"], plans["cp"], plans["zero"], plans["vpp"]
    sp_on = np.where(plans["sp"] == 2, tp > 1, (plans["sp"] == 1) & (tp > 1))
    ep, etp = plans["ep"], np.where(plans["etp"] == 0, tp, plans["etp"])  # etp unset runs as tp
    # keys of the axes a space may not vary (a dense model: ep 1, etp = tp; one schedule per vpp)
    experts = (_codes(ep), _codes(etp)) if model.is_moe else ()

    # The Job validator: its verdict depends on these axes only (the batch rules ran above). It
    # reads the recompute policy only to refuse one the framework lacks (``framework_refusal``,
    # ``ParallelPlan``; the recompute settings its other rules read are not screenable extras):
    # when the framework offers every policy of the space, one verdict serves them all.
    offered = set(framework_offer(space.framework).recompute)
    refused = {Recompute(r) for r in space.recompute} - offered
    vkey = _mix(_codes(tp), _codes(cp), sp_on.astype(np.int64), _codes(pp), _codes(np.maximum(vpp, 1)), _codes(zero),
                *((_codes(plans["recompute"]),) if refused else ()),
                _codes(plans["sched"]), _codes(ep), _codes(plans["etp"]), _codes(plans["shard"]))
    reps, vinv = _representatives(vkey)
    # Optimizer offload's own rules (ParallelPlan's first validator, so its reason comes first)
    # depend on the ZeRO stage alone: checked once per (stage, device), the rest without offload.
    offload_reason = _offload_reasons(zero, plans["offload"], space.framework)
    ok = np.zeros(len(reps), dtype=bool)
    schedule = np.zeros(len(reps), dtype=np.int64)
    asynchronous = np.zeros(len(reps), dtype=bool)  # overlap_p2p_comm: a preset's, by schedule
    keeps = np.zeros(len(reps), dtype=bool)  # keeps_pipeline_outputs (torch pipelining)
    overlap = fused = True
    lockstep = False  # DeepSpeed's TrainSchedule (a framework setting: the same for the whole space)
    offload_ok = offload_reason < 0
    per_key = np.bincount(vinv[offload_ok], minlength=len(reps))
    reasons = sorted(set(offload_reason[~offload_ok].tolist()))
    for code in reasons:
        excluded[_OFFLOAD_REASONS[code]] += int((offload_reason == code).sum())
    built: dict[int, Job] = {}  # grid index -> its Job, where the validator built that very Job
    for j, i in enumerate(reps):
        try:
            job = _job_at(*args, plans, int(i), offload="none")
        except (ValidationError, ConfigError) as err:
            if per_key[j]:
                excluded[rejection_reason(err)] += int(per_key[j])
            continue
        if plans["offload"][i] == 0:
            built[int(i)] = job
        ok[j] = True
        schedule[j] = SCHEDULES.index(job.parallel.schedule)
        asynchronous[j] = job.parallel.overlap_p2p_comm
        keeps[j] = job.parallel.keeps_pipeline_outputs
        overlap = job.parallel.overlaps_grad_reduce  # the same for every plan of the space
        fused = job.parallel.fuses_gradient_accumulation
        lockstep = lockstep or job.parallel.runs_deepspeed_train_schedule
    valid = ok[vinv] & offload_ok
    sched, sends_async, keeps_outputs = schedule[vinv], asynchronous[vinv], keeps[vinv]
    # Distinct runs, the first valid one kept: sequence parallelism "both" repeats the tp = 1
    # plans, and with dp x cp = 1 ZeRO has nothing to shard (``runs_as_zero``).
    edp = tp * cp * plans["dp"] // np.maximum(ep * etp, 1) if model.is_moe else 1
    runs_as = runs_as_zero(zero, plans["dp"] * cp, precision, edp)
    rkey = _mix(*(_codes(plans[k]) for k in ("gbs", "tp", "pp", "cp", "mbs", "recompute", "offload")), _codes(runs_as),
                _codes(np.maximum(vpp, 1)), sp_on.astype(np.int64), *experts, _codes(plans["shard"]),
                *((_codes(sched),) if space.schedule is not None else ()))
    candidates = np.flatnonzero(valid)
    keep = np.sort(candidates[np.unique(rkey[candidates], return_index=True)[1]])
    plans = {k: v[keep] for k, v in plans.items()}
    sp_on, sched, sends_async, keeps_outputs = sp_on[keep], sched[keep], sends_async[keep], keeps_outputs[keep]
    experts = tuple(c[keep] for c in experts)
    considered = len(keep) + sum(excluded.values())
    clock["validate"] = time.perf_counter()

    tp, pp, cp, zero, mbs = (plans[k] for k in ("tp", "pp", "cp", "zero", "mbs"))
    if len(keep) == 0:
        empty = np.zeros(0)
        return Screen(*args, plans, empty, empty, excluded, considered)
    cm = AnalyticalCostModel.of_plan(cluster, precision, space)  # the space's plan-wide kernel settings
    # a MoE layer's dispatch, experts and their activations follow ep and etp too
    shard_key = _mix(_codes(tp), _codes(cp), sp_on.astype(np.int64), _codes(mbs), *experts)
    if not fused or precision is Precision.FP8:
        # a layer's backward adds its gradients to .grad on all but the first micro-batch;
        # FP8 layers cast their weights once per iteration: both are shared by m micro-batches
        shard_key = _mix(shard_key, _codes(plans["gbs"] // (mbs * plans["dp"])))
    if space.framework == "fsdp":
        # FSDP2 copies gathered weights and gradients in every layer when ZeRO-3 shards them
        shard_key = _mix(shard_key, ((zero >= 3) & (plans["dp"] * cp > 1)).astype(np.int64))
    shard_reps, shard_of = _representatives(shard_key, prefer=pp > 1)
    counted: dict[int, JobInventory] = {}  # kept plan -> its inventory (a plan may represent both tables)

    def inventory(i: int) -> JobInventory:  # the validator's Job where it built this very one
        inv = counted.get(i)
        if inv is None:
            inv = counted[i] = count_job(built.get(int(keep[i])) or _job_at(*args, plans, i))
        return inv

    comms: dict[int, CommCosts] = {}  # kept plan -> its inventory's CommCosts (shared by the two tables)

    def comm_of(i: int) -> CommCosts:
        comm = comms.get(i)
        if comm is None:
            comm = comms[i] = CommCosts(inventory(i), cm)
        return comm

    shard_invs = [inventory(int(i)) for i in shard_reps]
    # what some plan reads: its recompute policy's entries, the W pass with zero-bubble plans
    shards = _shard_table(model, cm, shard_invs, [comm_of(int(i)) for i in shard_reps],
                          frozenset(plans["recompute"].tolist()),
                          bool(runs_where(sched, "splits_backward").any()))
    # the experts' parameters per rank and their gradient sync over the expert data-parallel group
    # FP8: a model chunk's amax all-reduce carries the chunk's amaxes, priced by its bytes
    chunks = _codes(plans["vpp"]) if precision is Precision.FP8 else _codes(np.zeros_like(plans["vpp"]))
    layout_key = _mix(_codes(tp), _codes(cp), _codes(pp), _codes(zero), _codes(plans["offload"]), *experts,
                      _codes(plans["shard"]), chunks)  # hybrid sharding: the ZeRO shards and the replicas' all-reduce
    # a shard shape's representative stands for its layout where it can: counted once for both
    shard_rep = np.zeros(len(layout_key), dtype=bool)
    shard_rep[shard_reps] = True
    layout_reps, layout_of = _representatives(layout_key, prefer=shard_rep)
    layout_invs = [inventory(int(i)) for i in layout_reps]
    layout_comms = [comm_of(int(i)) for i in layout_reps]
    layouts = _layout_table(cm, layout_invs, layout_comms)
    # The pipeline message of a shard shape between neighbouring stages of a layout (its
    # time depends on where the pair of stages lies, hence on pp).
    pairs, pair_of = np.unique(shard_of * len(layout_reps) + layout_of, return_inverse=True)
    p2p_pair, mask_pair = np.zeros(len(pairs)), np.zeros(len(pairs))
    for j, key in enumerate(pairs):
        si, li = divmod(int(key), len(layout_reps))
        message, mask = shard_invs[si].p2p, shard_invs[si].p2p_mask
        if layout_invs[li].job.parallel.pp > 1 and message is not None:
            comm = layout_comms[li]
            p2p_pair[j] = comm.seconds(message)
            mask_pair[j] = comm.seconds(mask) if mask is not None else 0.0
    p2p, p2p_mask = p2p_pair[pair_of], mask_pair[pair_of]
    clock["cost"] = time.perf_counter()

    slowdown = cluster.gpu.efficiency.overlap_slowdown
    iteration, memory = _combine(plans, sched, overlap, shards, shard_of, layouts, layout_of, p2p, p2p_mask, slowdown,
                                 lockstep, sends_async, torch_pipelining=pipelines_on_torch(Framework(space.framework)),
                                 keeps_outputs=keeps_outputs)
    clock["combine"] = time.perf_counter()
    names = ("grid", "validate", "cost", "combine")
    timings = {k: clock[k] - clock[prev] for prev, k in zip(("start", *names), names, strict=False)}
    return Screen(*args, plans, iteration, memory, excluded, considered, timings)


def _combine(plans, sched, overlap, shards, shard_of, layouts, layout_of, p2p, p2p_mask, slowdown, lockstep=False,
             sends_async=None, torch_pipelining=False, keeps_outputs=True):
    """Per plan: iteration seconds and worst-stage memory, from the per-key tables
    (``sends_async``: the plans whose pipeline sends are asynchronous, overlap_p2p_comm;
    ``torch_pipelining``: the pipelines run on ``torch.distributed.pipelining``, torchtitan's;
    ``keeps_outputs``: the plans whose pipeline stages keep every micro-batch's output,
    ``ParallelPlan.keeps_pipeline_outputs``)."""
    rc, zero = plans["recompute"], plans["zero"]
    pp, vpp, gbs, mbs, dp = plans["pp"], plans["vpp"], plans["gbs"], plans["mbs"], plans["dp"]
    m = (gbs // (mbs * dp)).astype(np.float64)
    p = pp.astype(np.float64)
    v = chunks_per_stage(sched, vpp)
    # the chunks each GPU runs (``Schedule.chunks``): v, and ZB-V's two its task graph owns
    chunks = np.where(runs_where(sched, "uses_vpp"), v, np.array([s.chunks(1) for s in SCHEDULES],
                                                                 dtype=np.float64)[sched])
    single = pp == 1
    classes = (FIRST, MID, LAST)
    exists = {FIRST: np.ones(len(pp), dtype=bool), MID: pp >= 3, LAST: pp >= 2}
    full = rc == _RECOMPUTE.index(Recompute.FULL)
    gpipe = runs_where(sched, "forwards_all_first")
    # W costed only when the space has zero-bubble plans
    zero_bubble = bool(runs_where(sched, "splits_backward").any())

    def shard(name: str) -> np.ndarray:  # each plan's entry of its shard shape's row
        return shards[name][shard_of]

    def layout(name: str, c: int) -> np.ndarray:  # each plan's entry of its layout's row, stage class c
        return layouts[name][layout_of, c]

    def ends(name: str, c: int) -> np.ndarray:
        # stage 0 carries both ends when there is one stage
        return np.where(single, shard(f"{name}3"), shard(f"{name}{c}")) if c == FIRST else shard(f"{name}{c}")

    # one layer of each plan's shard shape (the W pass costed only when the space has zero-bubble plans)
    layer = PassWork(shard("layer_f"), shard("layer_b"), shard("layer_w") if zero_bubble else 0.0, shard("comm_f"),
                     shard("comm_b"), np.choose(rc, [np.zeros(len(rc)), *(shard(f"rc_{p.value}") for p in _RECOMPUTE[1:])]),
                     shard("pair_f"), shard("pair_b"))
    share = paired_shares(p, m, v, sched)  # the passes run paired (0 hidden where pair_f and pair_b are)
    held1 = np.choose(rc, [shard(f"held{r}") for r in range(len(_RECOMPUTE))])  # per layer of the shard
    first1 = np.choose(rc, [shard(f"first{r}") for r in range(len(_RECOMPUTE))])  # the first block's layer
    frag = fragmentation_share()
    f, bw, wg, drain_extra, opt, mem = {}, {}, {}, {}, {}, {}
    for c in classes:
        # each stage class's time and memory with the prediction's arithmetic (``stage_passes``,
        # ``activations_at_peak``, ``step_peak_bytes``), its terms read from the tables
        n = layout("layers", c)
        regions = np.maximum(vpp, 1)  # the FP8 amax reductions: one per model chunk (``inventory.fp8``)
        ends_work = PassWork(ends("end_f", c), ends("end_b", c), ends("end_w", c) if zero_bubble else 0.0,
                             ends("endc_f", c) + regions * layout("amax_f", c),
                             ends("endc_b", c) + regions * layout("amax_b", c))
        copy = layout("grad_copy", c)  # ZeRO-Offload's gradient copy
        passes = stage_passes(stage_work(ends_work, ((n, layer),)), n, layout("dp_f", c), layout("dp_b", c),
                              layout("reduce", c), layout("gather", c), slowdown, overlap,
                              OffloadCosts(copy, zero, m) if copy.any() else None, share)
        f[c], bw[c], drain_extra[c], opt[c] = passes.fwd_pass, passes.bwd_pass, passes.exposed_sync, layout("optimizer", c)
        if zero_bubble:
            wg[c] = passes.work.wgrad
        work = np.choose(rc, [ends(f"work{r}_", c) for r in range(len(_RECOMPUTE))])
        logits = np.choose(rc, [ends(f"logits{r}_", c) for r in range(len(_RECOMPUTE))])
        flight = in_flight(c, p, m, v, sched)
        activations, _ = activations_at_peak(n * held1, work, ends("saved", c), gpipe & ~full, flight)
        # DeepSpeed's pipeline send and receive buffers (``framework_memory.deepspeed_pipeline_buffers``)
        buffers = layout("buffers", c) + ends("pipe_mb", c) * flight + np.where(m > 1, ends("pipe_many", c),
                                                                                ends("pipe_once", c))
        if torch_pipelining:  # ``estimate_stage_memory``'s terms of torch.distributed.pipelining
            kept, received = torch_pipeline_buffers(shard("boundary"), ends("logits_out", c), m, flight,
                                                    1.0 if c == FIRST else 0.0, chunks, keeps_outputs)
            activations = activations + np.where(single, 0.0, kept)
            buffers = buffers + np.where(single, 0.0, received)
        # the step's timeline (``memory.step_peak_bytes``): the loss, the backward's first and last
        # layers, the optimizer step
        moments = step_peak_bytes(layout("static", c), layout("grads_freed", c), grads_at_forward(m), activations,
                                  logits, last_backward_bytes(first1, work, ends("saved", c)), layout("gathered", c),
                                  buffers, layout("bwd_buffers", c), layout("runtime", c), frag,
                                  layout("step_temps", c))
        mem[c] = np.maximum.reduce(moments)
    finish = finish_by_class(f, bw, wg, p2p, p2p + p2p_mask, pp, m, v, sched, lockstep, sends_async)
    neg = -np.inf
    drain = np.max([np.where(exists[c], finish[c] + drain_extra[c], neg) for c in classes], axis=0)
    step = np.max([np.where(exists[c], opt[c], neg) for c in classes], axis=0)
    worst = np.max([np.where(exists[c], mem[c], neg) for c in classes], axis=0)
    return drain + step, worst
