"""How transformer layers are split across pipeline stages."""

from __future__ import annotations

from paraplan.specs import ModelSpec, ParallelPlan
from paraplan.specs.pipeline_layout import split_given, stage_grid


def count_layers_per_stage(model: ModelSpec, plan: ParallelPlan) -> tuple[int, ...]:
    """The job's explicit ``layers_per_stage``, Megatron-LM's split the plan states
    (``specs.pipeline_layout``: a layout string, first/last stage layers, the embedding or loss
    counted as a layer), or Megatron-LM's even split.

    Megatron-LM gives every stage num_layers/pp layers (it requires divisibility unless the split
    is given: ``specs.plan.pp_layers_problem``); when the layers do not divide evenly (as DeepSpeed
    and torchtitan allow) the first stages get one more layer.
    """
    if plan.layers_per_stage is not None:
        return plan.layers_per_stage
    if split_given(plan):
        return tuple(sum(row) for row in stage_grid(model.num_layers, plan))
    return split_layers(model.num_layers, plan.pp)


def split_layers(num_layers: int, pp: int) -> tuple[int, ...]:
    """``num_layers`` over ``pp`` stages, the first ``num_layers % pp`` stages one layer longer
    (DeepSpeed's partition_uniform; Megatron-LM runs it when the split is given)."""
    base, extra = divmod(num_layers, pp)
    return tuple(base + (1 if i < extra else 0) for i in range(pp))


def count_moe_layers_per_stage(model: ModelSpec, plan: ParallelPlan) -> tuple[int, ...]:
    """How many of each stage's layers are mixtures of experts (``ModelSpec.moe_layers``).

    Stage i holds consecutive layers; with several model chunks per stage (interleaved, ZB-V)
    it holds the chunks the schedule places on it (``Schedule.virtual_stage``), each of the
    size the plan's split gives it (``specs.pipeline_layout.stage_grid``)."""
    return count_marked_layers_per_stage(model, plan, model.moe_layers)


def count_marked_layers_per_stage(model: ModelSpec, plan: ParallelPlan, marked) -> tuple[int, ...]:
    """How many of each stage's layers ``marked`` (one truth value per layer) marks, by the
    stages' layers as ``count_moe_layers_per_stage`` places them."""
    moe = tuple(bool(m) for m in marked)
    if not any(moe):
        return (0,) * plan.pp
    p, chunks = plan.pp, plan.schedule.chunks(plan.vpp)
    if chunks == 1:
        split = count_layers_per_stage(model, plan)
        starts = [sum(split[:i]) for i in range(p)]
        return tuple(sum(moe[a:a + n]) for a, n in zip(starts, split, strict=True))
    grid = stage_grid(model.num_layers, plan)
    size = {plan.schedule.virtual_stage(p, i, c): grid[i][c] for i in range(p) for c in range(chunks)}
    start = {v: sum(size[u] for u in range(v)) for v in size}
    return tuple(sum(sum(moe[start[v]:start[v] + size[v]]) for v in (plan.schedule.virtual_stage(p, i, c)
                                                                   for c in range(chunks))) for i in range(p))
