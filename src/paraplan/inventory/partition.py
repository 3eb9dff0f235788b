"""How transformer layers are split across pipeline stages."""

from __future__ import annotations

from paraplan.specs import ModelSpec, ParallelPlan


def count_layers_per_stage(model: ModelSpec, plan: ParallelPlan) -> tuple[int, ...]:
    """The job's explicit ``layers_per_stage``, or Megatron-LM's even split.

    Megatron-LM gives every stage num_layers/pp layers (it requires divisibility); when the
    layers do not divide evenly (as DeepSpeed allows) the first stages get one more layer.
    """
    if plan.layers_per_stage is not None:
        return plan.layers_per_stage
    base, extra = divmod(model.num_layers, plan.pp)
    return tuple(base + (1 if i < extra else 0) for i in range(plan.pp))
