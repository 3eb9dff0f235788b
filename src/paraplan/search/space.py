"""The space of parallel plans for one model on one cluster, and the rules that prune it.

The space is a function of the framework: its axes default to what the framework runs
(``specs.frameworks``, one table: FSDP's ZeRO-0 and ZeRO-3 with hybrid sharding, DeepSpeed's
ZeRO 0-3, Megatron-LM's distributed optimizer...), and every candidate is checked against the
same rules Megatron-LM enforces (the Job validator), the framework's own
(``framework_refusal``: what it cannot launch) and the search's placement rule. Each excluded
plan is counted under its reason so the user sees why a whole family of plans is missing.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

import numpy as np
from pydantic import ValidationError

from paraplan.inventory.partition import split_layers
from paraplan.specs import (
    DEFAULT_MEMORY_HEADROOM,
    PLAN_ALIASES,
    AttentionKernel,
    ClusterSpec,
    ConfigError,
    Framework,
    Job,
    ModelSpec,
    ParallelPlan,
    Precision,
    Recompute,
    Schedule,
)
from paraplan.specs.frameworks import framework_offer, framework_refusal
from paraplan.specs.pipeline_layout import SPLIT_FIELDS
from paraplan.specs.plan import PP_LAYERS_REASON, pp_layers_problem

# pp not dividing the layers, under a framework that splits them unevenly itself: a valid plan the
# screen does not time (it times equal stages); the exact partition search times it
UNEVEN_NOT_SCREENED = "pp does not divide the layers: unequal stages are searched with --uneven-layers"


def _powers_of_two(limit: int) -> list[int]:
    out, x = [], 1
    while x <= limit:
        out.append(x)
        x *= 2
    return out


@dataclass(frozen=True)
class SearchSpace:
    """What may vary. Degrees default to powers of two up to the cluster size; ``None`` in a
    list-valued field means "every sensible value".

    Each axis covers the plan field its name says (a ``ParallelPlan`` field or its short alias,
    ``specs.PLAN_ALIASES``) or the one its ``plan`` metadata names (None: no plan field), so
    :meth:`plan_fields` knows what a search varies or keeps without a list beside it."""

    # plan fields the space sets though no axis names them: dp is the GPUs tp x pp x cp leave
    DERIVED_PLAN_FIELDS: ClassVar[tuple[str, ...]] = ("dp",)

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    cp: tuple[int, ...] = (1,)
    micro_batch_size: tuple[int, ...] = (1, 2, 4, 8)
    # ``None``: what the framework offers (``specs.frameworks``; Megatron-LM: ZeRO 0-1 and its
    # three recompute policies, DeepSpeed: ZeRO 0-3, FSDP: ZeRO 0 (DDP) and 3, none / full / op)
    zero_stage: tuple[int, ...] | None = None
    recompute: tuple[Recompute, ...] | None = None
    vpp: tuple[int, ...] = (1,)
    # DeepSpeed's offload_optimizer devices to try ("none", "cpu", "nvme"): ZeRO-Offload on/off
    offload_optimizer: tuple[str, ...] = ("none",)
    # "with_tp": on whenever tp > 1; "both": try on and off; "off"; ``None``: "with_tp", or the preset's
    sequence_parallel: str | None = None
    allow_tp_across_nodes: bool = field(default=False, metadata={"plan": None})
    # an engine (megatron, deepspeed, fsdp) or a framework preset (``catalog/frameworks``: nemo-24.07,
    # or nemo for its newest), which the space runs on its engine (``framework`` is then the engine)
    framework: str = "megatron"
    extra: dict[str, Any] = field(default_factory=dict, metadata={"plan": None})  # its keys: plan fields
    # Let stages hold unequal layer counts, chosen by the exact partition (always on for
    # heterogeneous clusters): pp need not divide the layers, and the embedding and LM-head
    # stages may take fewer.
    uneven_layers: bool = field(default=False, metadata={"plan": "layers_per_stage"})
    # Global batch sizes to try (ranked by tokens/s); ``None``: the one the search is given.
    global_batch_sizes: tuple[int, ...] | None = field(default=None, metadata={"plan": "global_batch_size"})
    # Expert parallelism (mixture-of-experts models; a dense model keeps ep = 1): ``None``:
    # every ep that divides the experts (those that do not divide tp x cp x dp are counted out
    # per plan), smallest first. ``etp``: expert tensor-parallel sizes, ``None`` meaning
    # Megatron-Core's default, etp = tp.
    ep: tuple[int, ...] | None = None
    etp: tuple[int | None, ...] | None = None  # None: (None,), or (1,) where experts are never tensor-parallel
    # Hybrid sharding (FSDP HYBRID_SHARD, torchtitan's data_parallel_shard_degree): ``None`` shards
    # over the whole data-parallel group, k shards over its ranks on k nodes and replicates
    # across; applies to the ZeRO stages the framework shards hybrid (FSDP: 3) with cp = 1, the
    # rest run as full sharding. ``None`` for the axis: the framework's (FSDP: whole group and 1 node).
    shard_nodes: tuple[int | None, ...] | None = field(default=None, metadata={"plan": "dp_shard"})
    # Pipeline schedules to try ("1f1b", "interleaved", "gpipe", "zb-h1", "zb-v"); ``None``:
    # the plan's own (1F1B, interleaved when vpp > 1, or ``extra["schedule"]``). Interleaved
    # plans take the vpp axis's values above 1 (2 when it has none); zb-v runs 2 chunks.
    schedule: tuple[str, ...] | None = None
    # The share of each GPU's memory a plan must leave free (``Job.memory_headroom``).
    memory_headroom: float = field(default=DEFAULT_MEMORY_HEADROOM, metadata={"plan": None})  # a Job field
    # The framework preset the plans take their unstated fields from (its id; ``framework`` may name
    # it instead), and the plan fields the space leaves to it: those of its defaults that the space
    # does not vary and ``extra`` does not state (its overlaps, gradient-reduce dtype, FSDP version;
    # sequence parallelism unless the axis is given; ZeRO, recompute or hybrid sharding only where
    # the engine's default axis is one value: the axis then holds the preset's). Each plan takes
    # them as a job file naming the preset would (``catalog.presets.apply_preset``: a conditional
    # default, e.g. sequence parallelism with tp > 1, per plan); an axis that varies is searched.
    preset: str | None = field(default=None, metadata={"plan": None})
    preset_fields: tuple[str, ...] | None = field(default=None, metadata={"plan": None})
    # the job file's own values of fields the preset would set and no axis varies
    # (``PRESET_STATED``): every plan keeps them over the preset's, as a stated field in a job file
    preset_stated: dict[str, Any] = field(default_factory=dict, metadata={"plan": None})

    def __post_init__(self) -> None:
        if not 0.0 <= self.memory_headroom <= 0.5:
            raise ConfigError(f"memory_headroom: expected a fraction of the GPU's memory from 0 to 0.5, "
                              f"got {self.memory_headroom!r}")
        self._lay_preset()
        if self.sequence_parallel is None:
            object.__setattr__(self, "sequence_parallel", "with_tp")
        offer = framework_offer(self.framework)
        defaults = {"zero_stage": offer.search_zero, "recompute": offer.search_recompute,
                    "etp": (None,) if offer.expert_tensor_parallel else (1,),
                    "shard_nodes": offer.search_shard_nodes}
        for name, value in defaults.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        object.__setattr__(self, "recompute", tuple(Recompute(getattr(r, "value", r)) for r in self.recompute))
        bad_nodes = [k for k in self.shard_nodes if k is not None and (isinstance(k, bool) or k < 1)]
        if bad_nodes or not self.shard_nodes:
            raise ConfigError(f"shard_nodes: expected positive whole numbers of nodes or None, got {self.shard_nodes!r}")
        if self.sequence_parallel not in SEQUENCE_PARALLEL:
            raise ConfigError(f"sequence_parallel: {self.sequence_parallel!r} is not one of {', '.join(SEQUENCE_PARALLEL)}")
        if self.schedule is not None:
            known = [s.value for s in Schedule]
            bad = [s for s in self.schedule if str(getattr(s, "value", s)) not in known]
            if bad or not self.schedule:
                raise ConfigError(f"schedule: {', '.join(map(repr, map(str, bad))) or 'nothing'} is not one of {', '.join(known)}")
            if "schedule" in self.extra:
                raise ConfigError("schedule: give the schedules as the schedule axis or in extra, not both")
        for name in ("ep", "etp"):
            values = getattr(self, name)
            if values is not None and (not values or any(v is not None and (isinstance(v, bool) or v < 1) for v in values)):
                raise ConfigError(f"{name}: expected positive whole numbers, got {values!r}")
        bad = [o for o in self.offload_optimizer if o not in OFFLOAD_DEVICES]
        if bad or not self.offload_optimizer:
            raise ConfigError(f"offload_optimizer: {', '.join(map(repr, bad)) or 'nothing'} is not one of "
                              f"{', '.join(OFFLOAD_DEVICES)}")

    def _lay_preset(self) -> None:
        """Resolve the preset (``framework`` or ``preset``), run its engine, and give the axes
        left to it the preset's value."""
        preset = find_space_preset(self.preset or self.framework)
        bad = sorted(set(self.preset_stated) - set(PRESET_STATED))
        if bad or (self.preset_stated and preset is None):
            raise ConfigError(f"preset_stated: {', '.join(bad) or 'a stated field'} is not a field a framework preset "
                              f"sets that no axis varies ({', '.join(PRESET_STATED)}), or no preset is named")
        if preset is None:
            return
        object.__setattr__(self, "preset", preset.id)
        object.__setattr__(self, "framework", preset.engine.value)
        self._keep_what_preset_runs(preset)
        if self.preset_fields is None:
            # an axis left to the engine's default is the preset's where that default is one value
            # (sequence parallelism's "with tp > 1" rule); the engine's several ZeRO stages, recompute
            # policies or shard groups are searched, as a flag's would be
            offer = framework_offer(preset.engine)
            unset = {"zero_stage": (self.zero_stage, offer.search_zero),
                     "recompute": (self.recompute, offer.search_recompute),
                     "sequence_parallel": (self.sequence_parallel, ()),
                     "data_parallel_shard_degree": (self.shard_nodes, offer.search_shard_nodes)}
            left = [d.field for d in preset.defaults if d.field not in {**self.extra, **self.preset_stated} and (
                d.field not in unset or (unset[d.field][0] is None and len(unset[d.field][1]) <= 1))]
            object.__setattr__(self, "preset_fields", tuple(left))
        for d in preset.defaults:
            if d.field not in self.preset_fields:
                continue
            if d.field == "zero_stage":
                object.__setattr__(self, "zero_stage", (int(d.value),))
            elif d.field == "recompute":
                object.__setattr__(self, "recompute", (Recompute(d.value),))
            elif d.field == "sequence_parallel":  # its rule is "with tp > 1", or always (tp > 1 anyway)
                object.__setattr__(self, "sequence_parallel", "with_tp" if d.value else "off")
            elif d.field == "data_parallel_shard_degree":  # the preset's rule decides per plan
                object.__setattr__(self, "shard_nodes", (None,))

    def _keep_what_preset_runs(self, preset: Any) -> None:
        """The tp, pp, cp, ep and recompute axes cut to the values the preset launches (its
        ``runs``, by ``catalog.presets.runs_problem``, the job validator's rule); a degree left to
        the default is the preset's values, the recompute axis left to it the engine's searched
        policies the preset offers (fms-fsdp: none and full, no per-op policy), and an axis with
        none of them refused as a job naming it would be."""
        from paraplan.catalog.presets import runs_problem

        for axis, (values, _) in preset.runs.items():
            given = getattr(self, axis)
            if given is None and axis == "recompute":
                searched = framework_offer(preset.engine).search_recompute
                given = tuple(r for r in searched if r.value in values) or tuple(Recompute(v) for v in values)
            kept = values if given is None else tuple(v for v in given if runs_problem(preset, axis, v) is None)
            if not kept:
                raise ConfigError(str(runs_problem(preset, axis, given[0])).removeprefix("parallel."))
            object.__setattr__(self, axis, tuple(kept))

    @property
    def attention_kernel(self) -> AttentionKernel | None:
        """The attention kernel every plan of the space runs: ``extra``'s or the job file's,
        else its preset's default (None: the GPU's attention curve)."""
        value = self.extra.get("attention_kernel", self.preset_stated.get("attention_kernel"))
        if value is None and "attention_kernel" in (self.preset_fields or ()):
            value = next(d.value for d in find_space_preset(self.preset).defaults if d.field == "attention_kernel")
        return None if value is None else AttentionKernel(value)

    @property
    def queued_kernel_gap(self) -> bool:
        """Whether every plan of the space waits the GPU's idle gap between queued kernels
        (``parallel.queued_kernel_gap``: ``extra``'s, a job file's through ``JOB_STATED``)."""
        return bool(self.extra.get("queued_kernel_gap", False))

    def plan_fields(self) -> frozenset[str]:
        """The plan fields (``ParallelPlan``'s long names) this space varies or keeps: those its
        axes cover, those derived from them, and ``extra``'s; a job file's other plan fields
        are neither."""
        names = [*self.DERIVED_PLAN_FIELDS, *self.extra]
        names += [f.metadata.get("plan", f.name) for f in fields(self)]
        return frozenset(PLAN_ALIASES.get(n, n) for n in names if n is not None)

    def on_nodes(self, num_nodes: int) -> SearchSpace:
        """This space on a cluster of ``num_nodes`` nodes: a hybrid shard group over that many
        nodes or more reaches the whole data-parallel group, so it is the full-sharding value
        (``None``), counted once (on one node, shard_nodes ``all,1`` is one value, not two)."""
        nodes = tuple(dict.fromkeys(None if k is None or k >= num_nodes else k for k in self.shard_nodes))
        return self if nodes == self.shard_nodes else replace(self, shard_nodes=nodes)

    def batch_sizes(self, global_batch_size: int) -> tuple[int, ...]:
        return self.global_batch_sizes or (global_batch_size,)

    @classmethod
    def full(cls, **changes: Any) -> SearchSpace:
        """Every axis the screen models (the README's "whole space") that the framework runs:
        context parallel 1-8, interleaving 1-8 virtual stages, micro-batch 1-16, ZeRO 0-3
        (FSDP: 0 and 3), the framework's recompute policies, sequence parallelism on and off,
        expert tensor parallelism tp and 1 (mixtures of experts), and for FSDP the zero-bubble
        schedules; ``changes`` replace fields."""
        preset = find_space_preset(changes.get("preset") or changes.get("framework", "megatron"))
        offer = framework_offer(preset.engine if preset is not None else changes.get("framework", "megatron"))
        axes: dict[str, Any] = {**FULL_SPACE, "zero_stage": offer.full_zero}
        if not offer.context_parallel:
            axes["cp"] = (1,)
        if not any(s.uses_vpp for s in offer.schedules):
            axes["vpp"] = (1,)
        if not offer.expert_tensor_parallel:
            axes["etp"] = (1,)
        extra = changes.get("extra") or {}
        if offer.full_schedules is not None and not changes.get("uneven_layers") and "schedule" not in extra:
            axes["schedule"] = tuple(s.value for s in offer.full_schedules)
        return cls(**{**axes, **changes})


def find_space_preset(name: Any) -> Any:
    """The framework preset ``name`` names (``catalog.presets.find_preset``; None for an engine),
    an unknown name refused as the ``framework`` field's."""
    from paraplan.catalog.presets import find_preset

    try:
        return find_preset(name)
    except ConfigError as err:
        raise ConfigError(str(err).removeprefix("parallel.")) from None


def preset_model(model: ModelSpec, space: SearchSpace) -> ModelSpec:
    """``model`` with its space's preset's ``model_defaults`` under the fields it states (an
    eager RMSNorm for fms-fsdp), as a job file naming the preset gets them: every plan of the
    search, screened or predicted, runs the same model."""
    if space.preset is None:
        return model
    from paraplan.catalog.presets import apply_model_defaults

    return apply_model_defaults(model, find_space_preset(space.preset))[0]


def with_preset(plan: dict[str, Any], model: ModelSpec, cluster: Any, space: SearchSpace,
                precision: Any = None) -> tuple[dict[str, Any], Any]:
    """One plan of ``space`` (a job's plan mapping) with its preset's defaults for the fields the
    space leaves to it, and what the preset did (``PresetUse``; None without a preset). The job's
    ``precision`` decides the defaults that hold for one precision only (an FP8 recipe)."""
    if space.preset is None:
        return plan, None
    from paraplan.catalog.presets import apply_preset, model_default_applies

    preset = find_space_preset(space.preset)
    left = set(space.preset_fields or ())
    stated = {k: v for k, v in {**plan, **space.preset_stated}.items() if PLAN_ALIASES.get(k, k) not in left}
    named = {PLAN_ALIASES.get(k, k) for k in stated}
    for d in preset.defaults:  # a field the space varies, at its default in this plan (full sharding)
        if d.field not in left and d.field not in named:
            stated[d.field] = ParallelPlan.model_fields[d.field].default
    _, use = apply_preset(stated, preset, num_gpus=cluster.num_gpus, gpus_per_node=cluster.gpus_per_node,
                          model=model, precision=precision)
    # the model fields the preset sets that the (``preset_model``) model runs at its value
    applies = {d.field for d in preset.model_defaults if model_default_applies(model, d.field)}
    model_taken = {d.field: d.value for d in preset.model_defaults
                   if d.field in applies and getattr(model, d.field) == d.value}
    if model_taken:
        use = use.model_copy(update={"model_taken": model_taken})
    return {**stated, **use.taken}, use  # the plan's own names kept (tp, pp, ...)


#: Fields a framework preset sets that no axis of the space varies and the screen times through
#: its representative Jobs, so that a job file's own value is kept (``SearchSpace.preset_stated``);
#: recompute_every is not among them (the screen takes it linear in the layers).
PRESET_STATED = ("tp_comm_overlap", "tp_comm_overlap_cfg", "async_tp", "overlap_p2p_comm", "scatter_gather_p2p",
                 "overlap_grad_reduce", "grad_reduce_in_fp32", "fsdp_version", "optimizer_impl", "grad_clip_scale",
                 "attention_kernel", "cp_comm_type", "fp8_amax_reduce", "te_fp8_bookkeeping",
                 "cross_entropy_loss_fusion", "compile_loss", "loss_chunks", "pipeline_keeps_outputs", "grads_set_to_none")

#: Plan fields no preset sets and no axis varies that the screen times (``screen.SCREENABLE_EXTRA``,
#: through the cost model: ``AnalyticalCostModel.of_plan``): a job file's value is kept on every
#: plan of ``paraplan search``, as ``SearchSpace.extra`` (``search.request``).
JOB_STATED = ("queued_kernel_gap",)

SEQUENCE_PARALLEL = ("with_tp", "both", "off")
OFFLOAD_DEVICES = ("none", "cpu", "nvme")  # DeepSpeed's offload_optimizer devices

#: The axes of ``SearchSpace.full()`` (tp and pp keep their defaults: powers of two up to the
#: cluster, divisors of the GPU count; ZeRO and recompute are the framework's, ``full_zero``
#: and ``search_recompute`` of ``specs.frameworks``).
FULL_SPACE: dict[str, Any] = dict(
    cp=(1, 2, 4, 8),
    vpp=(1, 2, 3, 4, 6, 8),
    micro_batch_size=(1, 2, 4, 8, 16),
    sequence_parallel="both",
    etp=(None, 1),
)


EP_EXPERTS = "ep does not divide the experts (num_moe_experts)"
EP_STAGE = "ep x etp does not divide the tp x cp x dp ranks of a stage"


@dataclass
class Candidates:
    jobs: list[Job]
    excluded: Counter  # reason -> number of plans


def _reason(message: str) -> str:
    """A reason for a family of plans: the validator's message without the plan's numbers
    where they would split one family into many lines."""
    field_name, _, rest = message.partition(": ")
    return f"{field_name}: {rest}" if rest else message


def plan_axes(
    model: ModelSpec, cluster: ClusterSpec, space: SearchSpace
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[bool | None, ...]]:
    """The tp, pp and sequence-parallel values the space tries (``None``: on with tp > 1)."""
    n = cluster.num_gpus
    tps = space.tp or tuple(_powers_of_two(n))
    pps = space.pp or tuple(p for p in range(1, min(model.num_layers, n) + 1) if n % p == 0)
    return tps, pps, sp_axis(space)


def sp_axis(space: SearchSpace) -> tuple[bool | None, ...]:
    """The sequence-parallel values the space tries (``None``: on with tp > 1)."""
    return {"both": (True, False), "off": (False,)}.get(space.sequence_parallel, (None,))


def expert_axes(
    model: ModelSpec, space: SearchSpace, num_gpus: int
) -> tuple[tuple[int, ...], tuple[int | None, ...]]:
    """The ep and etp values the space tries. A dense model: ep 1 and etp unset (an expert
    axis given for it is refused, the etp axis is ignored). A mixture of experts: ``space.ep`` or every divisor of the
    experts, smallest first. Expert groups fill a node before they cross one whatever ep is
    (the rank order puts ETP then EP innermost, ``inventory.placement``), and the all-to-all
    is costed on the links it crosses; EP across nodes is not pruned (DeepSeek-V3 trained
    with EP 64 over 8 nodes): smaller ep comes first, so of equally fast plans the one whose
    expert group stays within a node ranks first."""
    if not model.is_moe:
        if space.ep is not None and set(space.ep) != {1}:
            raise ConfigError("ep: the model is dense (it has no num_moe_experts); expert parallelism "
                              "applies to mixtures of experts")
        return (1,), (None,)
    experts = model.num_moe_experts or 1
    eps = tuple(space.ep) if space.ep is not None else tuple(
        e for e in range(1, min(experts, num_gpus) + 1) if experts % e == 0)
    return eps, tuple(dict.fromkeys(space.etp))


def pipe_axis(space: SearchSpace) -> tuple[tuple[Schedule | None, int], ...]:
    """The (schedule, vpp) pairs the space tries (schedule ``None``: the plan's own, from the
    vpp and ``extra``)."""
    if space.schedule is None:
        return tuple((None, v) for v in space.vpp)
    out: list[tuple[Schedule | None, int]] = []
    for name in dict.fromkeys(space.schedule):
        sched = Schedule(getattr(name, "value", name))
        if sched.uses_vpp:
            out += [(sched, v) for v in (tuple(v for v in space.vpp if v > 1) or (2,))]
        else:  # zb-v: its 2 chunks are the schedule's own (vpp left unset)
            out.append((sched, 1))
    return tuple(out)


def runs_as_zero(zero, grad_group, precision: Precision, expert_group=1):
    """The ZeRO stage a plan runs as (ints or numpy arrays). ZeRO shards over the gradient
    group (dp x cp ranks, ``ParallelPlan.zero_shards``); with one rank there nothing is sharded
    or communicated: stages 1 and 2 keep every optimizer state and gradient, exchange nothing
    (``inventory.job._grad_sync`` and ``_per_microbatch_dp`` return nothing for a group of
    one) and step over every parameter, as ZeRO 0 does. ZeRO-3 is the same run too except in
    FP8, where the model holds the FP8 copy of the layer being gathered besides the rank's
    shard (``prediction.memory``). Such plans are one run, listed once. A mixture of experts'
    weights also shard over the expert data-parallel group (``expert_group``, tp x cp x dp /
    (ep x etp)), which can hold several ranks when dp x cp is 1: then ZeRO does shard."""
    alone = (np.asarray(grad_group) == 1) & (np.asarray(expert_group) == 1)
    same = alone & ((np.asarray(zero) < 3) | (precision is not Precision.FP8))
    out = np.where(same, 0, zero)
    return int(out) if np.ndim(out) == 0 else out


HYBRID_DIVIDES = "hybrid shard groups (shard_nodes) do not divide the data-parallel group"


def hybrid_shards(nodes, tp, cp, grad_group, zero, gpus_per_node: int, hybrid_zero: tuple[int, ...]):
    """The shard degree (``data_parallel_shard_degree``, in ranks of the gradient group) of
    hybrid shard groups over ``nodes`` nodes (ints or numpy arrays; 0 for ``None``): the
    gradient group's ranks on those nodes (tp ranks apart, ``inventory.placement``). 0 where
    the plan shards over the whole group (no hybrid axis value, a ZeRO stage the framework
    does not shard hybrid, cp > 1, tp spanning nodes, groups of one rank (nothing sharded) or
    as large as the whole gradient group: those plans are the full-sharding ones); -1 where
    the groups do not divide the gradient group."""
    nodes, tp, cp, group, zero = (np.asarray(a) for a in (nodes, tp, cp, grad_group, zero))
    shard = nodes * gpus_per_node // np.maximum(tp, 1)
    applies = ((nodes > 0) & np.isin(zero, hybrid_zero) & (cp == 1) & (gpus_per_node % tp == 0)
               & (shard > 1) & (shard < group))
    out = np.where(applies, np.where(group % np.maximum(shard, 1) == 0, shard, -1), 0)
    return int(out) if np.ndim(out) == 0 else out


def plan_job(
    model: ModelSpec,
    cluster: ClusterSpec,
    precision: Precision,
    space: SearchSpace,
    train_tokens: float | None,
    *,
    global_batch_size: int,
    tp: int,
    pp: int,
    cp: int,
    vpp: int,
    micro_batch_size: int,
    zero_stage: int,
    recompute: Recompute,
    sequence_parallel: bool | None,
    ep: int = 1,
    etp: int | None = None,
    schedule: Schedule | None = None,
    offload_optimizer: str = "none",
    dp_shard: int | None = None,
    layers_per_stage: tuple[int, ...] | None = None,
) -> Job:
    """The Job of one point of the space (raises ValidationError / ConfigError when the Job
    validator rejects it, or ConfigError when the space's framework cannot launch it:
    ``specs.frameworks.framework_refusal``). ``sequence_parallel=None`` means on whenever
    tp > 1; ``etp=None`` expert tensor parallelism as tp; ``schedule=None`` the plan's own;
    ``dp_shard`` hybrid sharding's group (``data_parallel_shard_degree``)."""
    dp = cluster.num_gpus // (tp * pp * cp)
    sp = sequence_parallel
    if offload_optimizer != "none":  # offload's own rules come first, as in the ParallelPlan validator
        ParallelPlan(zero_stage=zero_stage, framework=space.framework, offload_optimizer=offload_optimizer)
    extra_schedule = space.extra.get("schedule")
    runs = schedule or (Schedule(extra_schedule) if extra_schedule is not None else Schedule.for_vpp(vpp))
    refusal = framework_refusal(
        space.framework, tp=tp, pp=pp, cp=cp, dp=dp, zero_stage=zero_stage,
        schedule=runs, recompute=Recompute(getattr(recompute, "value", recompute)), hybrid=dp_shard is not None,
        moe=model.is_moe, ep=ep, etp=tp if etp is None else etp)
    if refusal is not None:
        raise ConfigError(refusal)
    moe: dict[str, Any] = {}
    if ep > 1:
        moe["expert_model_parallel_size"] = ep
    if etp is not None:
        moe["expert_tensor_parallel_size"] = etp
    if schedule is not None:
        moe["schedule"] = schedule.value
    plan = {
        "tp": tp,
        "pp": pp,
        "dp": dp,
        "cp": cp,
        "vpp": vpp if vpp > 1 else None,
        "sequence_parallel": (tp > 1) if sp is None else (sp and tp > 1),
        "micro_batch_size": micro_batch_size,
        "global_batch_size": global_batch_size,
        "zero_stage": zero_stage,
        "recompute": recompute,
        "framework": space.framework,
        **moe,
        **({"offload_optimizer": offload_optimizer} if offload_optimizer != "none" else {}),
        **({"data_parallel_shard_degree": dp_shard} if dp_shard is not None else {}),
        **({"layers_per_stage": layers_per_stage} if layers_per_stage is not None else {}),
        **space.extra,
    }
    plan, preset = with_preset(plan, model, cluster, space, precision)
    name = f"tp{tp}-pp{pp}-dp{dp}" + (f"-cp{cp}" if cp > 1 else "") + (f"-vpp{vpp}" if vpp > 1 else "")
    name += (f"-ep{ep}" if ep > 1 else "") + (f"-etp{etp}" if etp is not None else "")
    name += f"-{schedule.value}" if schedule is not None else ""
    if offload_optimizer != "none":
        name += f"-offload-{offload_optimizer}"
    if dp_shard is not None:
        name += f"-hsdp{dp_shard}"
    if space.global_batch_sizes:
        name += f"-gbs{global_batch_size}"
    return Job(name=name, model=model, cluster=cluster, parallel=plan, precision=precision, train_tokens=train_tokens,
               memory_headroom=space.memory_headroom, **({"preset": preset} if preset is not None else {}))


def rejection_reason(err: ValidationError | ConfigError) -> str:
    """The family reason under which a plan the Job validator rejects is counted."""
    if isinstance(err, ValidationError):
        from paraplan.specs import format_validation_error

        return _reason(format_validation_error(err))
    return _reason(str(err))


def enumerate_plans(
    model: ModelSpec,
    cluster: ClusterSpec,
    global_batch_size: int,
    precision: Precision,
    space: SearchSpace,
    train_tokens: float | None = None,
) -> Candidates:
    """Every plan of ``space`` that passes the divisibility and placement rules (one Job per
    plan; :mod:`paraplan.search.screen` applies the same rules to arrays)."""
    n = cluster.num_gpus
    tps, pps, sps = plan_axes(model, cluster, space)
    eps, etps = expert_axes(model, space, n)
    excluded: Counter = Counter()
    jobs: list[Job] = []
    hybrid_zero = framework_offer(space.framework).hybrid_zero
    # a split the space states in Megatron-LM's terms (``specs.pipeline_layout``): the Job validator judges it
    stated = any(space.extra.get(key) for key in SPLIT_FIELDS)
    for gbs, tp, pp, cp, ep, etp, (schedule, vpp), mbs, nodes, zero, recompute, sp, offload in itertools.product(
        space.batch_sizes(global_batch_size), tps, pps, space.cp, eps, etps, pipe_axis(space),
        space.micro_batch_size, space.shard_nodes, space.zero_stage, space.recompute, sps, space.offload_optimizer,
    ):
        if n % (tp * pp * cp):
            excluded["tp*pp*cp does not divide the number of GPUs"] += 1
            continue
        dp = n // (tp * pp * cp)
        if tp > cluster.domain_size and not space.allow_tp_across_nodes:
            excluded[f"tp > {cluster.domain_size} crosses the node's NVLink domain"] += 1
            continue
        if gbs % (mbs * dp):
            excluded["global batch is not a multiple of micro-batch x dp"] += 1
            continue
        if vpp > 1 and (pp < 2 or (model.num_layers % (pp * vpp) and not stated) or (gbs // (mbs * dp)) % pp):
            excluded["interleaving needs layers divisible by pp*vpp and micro-batches by pp"] += 1
            continue
        # a model mixing dense and MoE layers takes uneven_layers as the split with the first
        # stages one layer longer, stated in the plan (Megatron-LM: --pipeline-model-parallel-layout)
        split = split_layers(model.num_layers, pp) if space.uneven_layers and len(set(model.moe_layers)) > 1 else None
        if pp_layers_problem(model.num_layers, pp, Framework(space.framework), split is not None or stated):
            excluded[PP_LAYERS_REASON] += 1
            continue
        if model.num_layers % pp and split is None and not stated:
            excluded[UNEVEN_NOT_SCREENED] += 1
            continue
        if ep > 1 and model.num_moe_experts % ep:
            excluded[EP_EXPERTS] += 1
            continue
        if model.is_moe and (tp * cp * dp) % (ep * (etp or tp)):
            excluded[EP_STAGE] += 1
            continue
        shard = hybrid_shards(nodes or 0, tp, cp, dp * cp, zero, cluster.gpus_per_node, hybrid_zero)
        if shard < 0:
            excluded[HYBRID_DIVIDES] += 1
            continue
        try:
            jobs.append(
                plan_job(
                    model, cluster, precision, space, train_tokens,
                    global_batch_size=gbs, tp=tp, pp=pp, cp=cp, vpp=vpp, micro_batch_size=mbs,
                    zero_stage=zero, recompute=recompute, sequence_parallel=sp, ep=ep, etp=etp, schedule=schedule,
                    offload_optimizer=offload, dp_shard=shard or None,
                    layers_per_stage=split if model.num_layers % pp else None,
                )
            )
        except (ValidationError, ConfigError) as err:
            excluded[rejection_reason(err)] += 1
    return Candidates(jobs=jobs, excluded=excluded)


def iter_unique(jobs: list[Job]) -> Iterator[Job]:
    """The distinct runs among ``jobs``, first kept (see :func:`runs_as_zero`)."""
    seen = set()
    for job in jobs:
        p = job.parallel
        same = {"zero_stage": runs_as_zero(p.zero_stage, p.grad_group, job.precision,
                                           p.edp if job.model.is_moe else 1),
                "expert_tensor_parallel_size": p.etp}  # etp unset runs as etp = tp
        key = p.model_copy(update=same).model_dump_json()
        if key not in seen:
            seen.add(key)
            yield job
