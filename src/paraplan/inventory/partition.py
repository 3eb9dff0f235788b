"""How transformer layers are split across pipeline stages."""

from __future__ import annotations

from paraplan.specs import ModelSpec, ParallelPlan, Schedule


def count_layers_per_stage(model: ModelSpec, plan: ParallelPlan) -> tuple[int, ...]:
    """The job's explicit ``layers_per_stage``, or Megatron-LM's even split.

    Megatron-LM gives every stage num_layers/pp layers (it requires divisibility); when the
    layers do not divide evenly (as DeepSpeed allows) the first stages get one more layer.
    """
    if plan.layers_per_stage is not None:
        return plan.layers_per_stage
    base, extra = divmod(model.num_layers, plan.pp)
    return tuple(base + (1 if i < extra else 0) for i in range(plan.pp))


def count_moe_layers_per_stage(model: ModelSpec, plan: ParallelPlan) -> tuple[int, ...]:
    """How many of each stage's layers are mixtures of experts (``ModelSpec.moe_layers``).

    Stage i holds consecutive layers; interleaved (vpp > 1), it holds model chunk i, i + pp,
    i + 2 pp, ... of pp x vpp equal chunks, as Megatron-LM assigns them; under ZB-V, chunks i
    and 2 pp - 1 - i of 2 pp, the V (torchtitan's ``ZBVZeroBubble`` stage placement)."""
    moe = model.moe_layers
    if not any(moe):
        return (0,) * plan.pp
    split = count_layers_per_stage(model, plan)
    p = plan.pp
    if plan.schedule is Schedule.ZB_V and plan.layers_per_stage is None and model.num_layers % (2 * p) == 0:
        size = model.num_layers // (2 * p)
        return tuple(sum(moe[i * size:(i + 1) * size]) + sum(moe[(2 * p - 1 - i) * size:(2 * p - i) * size])
                     for i in range(p))
    if plan.vpp > 1 and plan.layers_per_stage is None:
        size = model.num_layers // (plan.pp * plan.vpp)
        return tuple(
            sum(sum(moe[(c * plan.pp + i) * size:(c * plan.pp + i + 1) * size]) for c in range(plan.vpp))
            for i in range(plan.pp)
        )
    starts = [sum(split[:i]) for i in range(plan.pp)]
    return tuple(sum(moe[a:a + n]) for a, n in zip(starts, split, strict=True))
