"""THE source of FLOPs, bytes, parameters, activations and collective volumes."""

from paraplan.inventory.job import (
    JobInventory,
    LayerBlock,
    StageInventory,
    count_active_params,
    count_job,
    count_params,
)
from paraplan.inventory.layer import count_layer_collectives, count_layer_ops
from paraplan.inventory.ops import Collective, CollectiveKind, KernelMix, Op, OpKind, ParallelDim
from paraplan.inventory.partition import count_layers_per_stage
from paraplan.inventory.placement import GroupLayout, group_layout
from paraplan.inventory.shapes import LocalShape, local_shape, shard_shape

__all__ = [
    "Collective",
    "CollectiveKind",
    "GroupLayout",
    "JobInventory",
    "KernelMix",
    "LayerBlock",
    "LocalShape",
    "Op",
    "OpKind",
    "ParallelDim",
    "StageInventory",
    "count_active_params",
    "count_job",
    "count_layer_collectives",
    "count_layer_ops",
    "count_layers_per_stage",
    "count_params",
    "group_layout",
    "local_shape",
    "shard_shape",
]
