"""What each training framework can run: one table, read by the search (its space and its
rules) and by anyone asking whether a plan is one the framework launches.

The prediction models more than the frameworks run (ZeRO-1 under FSDP, interleaving under
DeepSpeed), so that a user can ask "what if"; ``framework_refusal`` says which of those plans
the named framework cannot launch, and the search never returns one. The ``ParallelPlan``
validator keeps the rules that make a plan meaningless for every purpose (the recompute
policies of ``RECOMPUTE_CHOICES``, the zero-bubble schedules of ``ZERO_BUBBLE_FRAMEWORKS``,
DeepSpeed's pipeline ZeRO rule); this table repeats them by reference, not by copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from paraplan.specs.enums import Framework, Recompute, Schedule
from paraplan.specs.errors import ConfigError
from paraplan.specs.plan import RECOMPUTE_CHOICES, ZERO_BUBBLE_FRAMEWORKS, ParallelPlan

if TYPE_CHECKING:
    from paraplan.specs.hetero import HeteroJob
    from paraplan.specs.job import Job

_R = Recompute
_S = Schedule


@dataclass(frozen=True)
class FrameworkOffer:
    """What one framework runs, and what the search tries by default from it."""

    framework: Framework
    label: str  # how messages name it
    zero_stages: tuple[int, ...]  # the ZeRO stages it runs
    zero_names: str  # what those stages are called there
    pipeline_zero: tuple[int, ...]  # the stages it runs with pipeline parallelism (pp > 1)
    hybrid_zero: tuple[int, ...]  # the stages it shards within groups and replicates across
    schedules: tuple[Schedule, ...]  # the pipeline schedules it runs
    context_parallel: bool  # Megatron-style (ring / all-gather) context parallelism
    expert_tensor_parallel: bool  # experts split over tensor-parallel ranks (etp > 1)
    # experts carved out of the data-parallel ranks alone (ep divides dp), not tp x cp x dp
    experts_within_dp: bool
    # replicated data parallelism (ZeRO-0 with dp x cp > 1) only as the sole parallelism
    replicate_alone: bool
    sources: tuple[str, ...]
    # the search's default space ("default") and its whole space ("full")
    search_zero: tuple[int, ...]
    full_zero: tuple[int, ...]
    search_recompute: tuple[Recompute, ...]
    search_shard_nodes: tuple[int | None, ...]  # hybrid shard groups: None whole dp group, k nodes
    full_schedules: tuple[Schedule, ...] | None  # None: the plan's own (1F1B, interleaved with vpp)

    @property
    def recompute(self) -> tuple[Recompute, ...]:
        """The recompute policies it offers: the ParallelPlan validator's ``RECOMPUTE_CHOICES``."""
        return RECOMPUTE_CHOICES[self.framework]


FRAMEWORKS: dict[Framework, FrameworkOffer] = {
    Framework.MEGATRON: FrameworkOffer(
        framework=Framework.MEGATRON,
        label="Megatron-LM",
        zero_stages=(0, 1, 2, 3),
        zero_names="0 DDP, 1 --use-distributed-optimizer, 2/3 Megatron-FSDP optim_grads / optim_grads_params",
        pipeline_zero=(0, 1, 2, 3),
        hybrid_zero=(1,),  # --num-distributed-optimizer-instances
        schedules=(_S.ONE_F_ONE_B, _S.INTERLEAVED),
        context_parallel=True,
        expert_tensor_parallel=True,
        experts_within_dp=False,
        replicate_alone=False,
        sources=(
            "NVIDIA/Megatron-LM megatron/training/arguments.py: --use-distributed-optimizer, "
            "--num-distributed-optimizer-instances, --use-megatron-fsdp, --data-parallel-sharding-strategy "
            "(no_shard | optim | optim_grads | optim_grads_params)",
            "megatron/core/pipeline_parallel/schedules.py: forward_backward_pipelining_without_interleaving "
            "(1F1B) and _with_interleaving; no GPipe, no zero-bubble schedule",
        ),
        search_zero=(0, 1),
        full_zero=(0, 1, 2, 3),
        search_recompute=(_R.NONE, _R.SELECTIVE, _R.FULL),
        search_shard_nodes=(None,),
        full_schedules=None,
    ),
    Framework.DEEPSPEED: FrameworkOffer(
        framework=Framework.DEEPSPEED,
        label="DeepSpeed",
        zero_stages=(0, 1, 2, 3),
        zero_names="zero_optimization.stage 0-3",
        pipeline_zero=(0, 1),
        hybrid_zero=(),
        schedules=(_S.ONE_F_ONE_B,),
        context_parallel=False,
        expert_tensor_parallel=False,
        experts_within_dp=True,
        replicate_alone=False,
        sources=(
            "deepspeedai/DeepSpeed deepspeed/runtime/pipe/engine.py: the pipeline engine asserts "
            "zero_optimization_stage < 2 ('ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism')",
            "deepspeed/runtime/pipe/schedule.py: TrainSchedule, a lock-step 1F1B (no GPipe, no interleaving)",
            "DeepSpeed-Ulysses sequence parallelism is an all-to-all algorithm, not context parallelism; "
            "deepspeed/utils/groups.py carves expert groups out of the data-parallel ranks; its MoE "
            "experts are not tensor-parallel",
        ),
        search_zero=(0, 1, 2, 3),
        full_zero=(0, 1, 2, 3),
        search_recompute=(_R.NONE, _R.SELECTIVE, _R.FULL),
        search_shard_nodes=(None,),
        full_schedules=None,
    ),
    Framework.FSDP: FrameworkOffer(
        framework=Framework.FSDP,
        label="PyTorch FSDP2 (torchtitan)",
        zero_stages=(0, 3),
        zero_names="0 DDP (data_parallel_replicate_degree), 3 FULL_SHARD / HYBRID_SHARD (fully_shard, "
                   "data_parallel_shard_degree)",
        pipeline_zero=(0, 3),
        hybrid_zero=(3,),
        schedules=(_S.ONE_F_ONE_B, _S.INTERLEAVED, _S.GPIPE, _S.ZB_H1, _S.ZB_V),
        context_parallel=True,
        expert_tensor_parallel=False,
        experts_within_dp=False,
        replicate_alone=True,
        sources=(
            "pytorch/torchtitan torchtitan/models/llama3/infra/parallelize.py: fully_shard over the "
            "dp_shard (x cp) mesh, HSDP over [dp_replicate, fsdp]; DDP only when it is the whole world "
            "('DDP has not supported > 1D parallelism'); ZeRO-1/2 are not offered (fsdp_reshard_after_forward "
            "'never' keeps parameters gathered, which is neither)",
            "torchtitan ParallelismConfig.pipeline_parallel_schedule: torch.distributed.pipelining's "
            "1F1B, Interleaved1F1B, GPipe, InterleavedZeroBubble, ZBVZeroBubble",
            "torchtitan ActivationCheckpoint mode none | selective (per-op) | full; 0.3.0 has no "
            "expert_tensor_parallel_degree",
        ),
        search_zero=(0, 3),
        full_zero=(0, 3),
        search_recompute=(_R.NONE, _R.FULL, _R.OP),
        search_shard_nodes=(None, 1),
        full_schedules=(_S.ONE_F_ONE_B, _S.INTERLEAVED, _S.ZB_H1, _S.ZB_V),
    ),
}


def framework_offer(framework: Framework | str) -> FrameworkOffer:
    """The table's row for ``framework`` (a ConfigError naming the field for an unknown one)."""
    try:
        return FRAMEWORKS[Framework(getattr(framework, "value", framework))]
    except ValueError:
        known = ", ".join(f.value for f in Framework)
        raise ConfigError(f"framework: {framework!r} is not one of {known}") from None


def framework_refusal(
    framework: Framework | str,
    *,
    tp: int,
    pp: int,
    cp: int,
    dp: int,
    zero_stage: int,
    schedule: Schedule = Schedule.ONE_F_ONE_B,
    recompute: Recompute = Recompute.NONE,
    hybrid: bool = False,
    moe: bool = False,
    ep: int = 1,
    etp: int = 1,
) -> str | None:
    """Why ``framework`` cannot launch this plan (``None``: it can). The reason names the field
    and the family of plans, not the plan's numbers, so that the search counts a family once."""
    fw = Framework(getattr(framework, "value", framework))
    offer = FRAMEWORKS[fw]
    name = offer.label
    if zero_stage not in offer.zero_stages:
        return (f"parallel.zero_stage: {name} has no ZeRO-{zero_stage} (it runs {offer.zero_names})")
    if pp > 1 and zero_stage not in offer.pipeline_zero:
        stages = " or ".join(map(str, offer.pipeline_zero))
        return f"parallel.zero_stage: {name}'s pipeline engine runs ZeRO stage {stages} only with pp > 1"
    if offer.replicate_alone and zero_stage == 0 and dp * cp > 1 and tp * pp * cp * ep > 1:
        return (f"parallel.zero_stage: {name} replicates (DDP, ZeRO-0) only when data parallelism is the "
                "only parallelism; with tp, pp, cp or ep it shards (ZeRO-3)")
    if hybrid and zero_stage not in offer.hybrid_zero:
        which = " or ".join(f"ZeRO-{z}" for z in offer.hybrid_zero) or "no ZeRO stage"
        return f"parallel.data_parallel_shard_degree: {name} shards within groups with {which}"
    if schedule not in offer.schedules:
        reason = ZERO_BUBBLE_FRAMEWORKS.get(fw) if schedule.splits_backward else None
        if reason is not None:
            return f"parallel.schedule: {schedule.value!r} needs framework 'fsdp' (torchtitan); {reason}"
        runs = ", ".join(s.value for s in offer.schedules)
        return f"parallel.schedule: {name} has no {schedule.value!r} schedule (it runs {runs})"
    if cp > 1 and not offer.context_parallel:
        return f"parallel.cp: {name} has no context parallelism (Ulysses sequence parallelism is another algorithm)"
    if recompute not in offer.recompute:
        choices = ", ".join(c.value for c in offer.recompute)
        return f"parallel.recompute: {fw.value} has no {recompute.value!r} recompute (it has: {choices})"
    if moe and etp > 1 and not offer.expert_tensor_parallel:
        return f"parallel.etp: {name}'s experts are not tensor-parallel (expert_tensor_parallel_size 1)"
    if moe and offer.experts_within_dp and dp % ep:
        return f"parallel.ep: {name} carves expert groups out of the data-parallel ranks, so ep must divide dp"
    return None


def plan_refusal(plan: ParallelPlan, moe: bool = False) -> str | None:
    """``framework_refusal`` of a resolved plan (its dp known)."""
    return framework_refusal(
        plan.framework, tp=plan.tp, pp=plan.pp, cp=plan.cp, dp=plan.dp, zero_stage=plan.zero_stage,
        schedule=plan.schedule, recompute=plan.recompute,
        hybrid=plan.data_parallel_shard_degree is not None and plan.zero_shards < plan.grad_group,
        moe=moe, ep=plan.ep, etp=plan.etp,
    )


def unrunnable_note(job: Job | HeteroJob) -> str | None:
    """The note a prediction of a plan its framework cannot launch carries (None: it can): the
    plan is still predicted, since asking "what if" is legitimate, but the answer says that
    the named framework would not run it, and why (``plan_refusal``)."""
    reason = plan_refusal(job.parallel, moe=job.model.is_moe)
    if reason is None:
        return None
    return f"the framework cannot run this plan (predicted as a what-if): {reason}"
