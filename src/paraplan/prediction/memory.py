"""Per-GPU memory of each pipeline stage, read from the inventory.

Weights, gradients and Adam states follow the ZeRO stages (Rajbhandari et al. 2020):
stage 1 partitions optimizer states over data-parallel ranks, stage 2 also gradients,
stage 3 also weights. Activations are the inventory's saved bytes per micro-batch times the
micro-batches a stage holds at once under its schedule; full recompute keeps only each
layer's input, plus one layer's activations while it is recomputed. Offload (``offload``)
moves optimizer states, the ZeRO-3 parameter shard and some layers' activations to the host.
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.inventory import JobInventory, StageInventory
from paraplan.inventory.job import adam_state_bytes, fp8_weight_params
from paraplan.inventory.recompute import recompute_cost
from paraplan.prediction.offload import count_offload
from paraplan.specs import Recompute, Schedule

# CUDA context, cuBLAS workspaces and NCCL buffers: an allowance, not a measurement.
# PyTorch's CUDA context alone takes 0.3-0.5 GiB; NCCL keeps a few hundred MiB per communicator.
RUNTIME_RESERVE_BYTES = 1.0 * 2**30


@dataclass(frozen=True, slots=True)
class StageMemory:
    stage: int
    weights: float
    gradients: float
    optimizer_states: float
    activations: float
    buffers: float
    in_flight_microbatches: float
    host: float = 0.0  # bytes this GPU keeps in host memory (offload), not counted in ``total``

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer_states + self.activations + self.buffers


def in_flight_microbatches(inv: JobInventory, stage: int) -> float:
    """Micro-batches whose activations a stage holds at its peak (in units of its whole
    layer stack; interleaving holds more, smaller chunks)."""
    plan = inv.job.parallel
    p, m = plan.pp, plan.num_microbatches
    if plan.schedule is Schedule.GPIPE:
        return float(m)
    if plan.schedule is Schedule.INTERLEAVED:
        v = plan.vpp
        chunks = min((p - stage - 1) * 2 + (v - 1) * p + 1, m * v)
        return chunks / v
    return float(min(p - stage, m))


def activations_per_microbatch(inv: JobInventory, st: StageInventory) -> tuple[float, float]:
    """(bytes held per micro-batch in flight, extra working bytes for the one being processed):
    the layers keep what the recompute policy keeps (``inventory.recompute``); the ends keep
    what they save while their micro-batch is processed."""
    rc = recompute_cost(inv.job.parallel, st.layer_ops, inv.shape, st.num_layers)
    end_saved = sum(op.saved_bytes for op in st.end_ops)
    return rc.held_bytes, rc.working_bytes + end_saved


def estimate_stage_memory(inv: JobInventory, st: StageInventory) -> StageMemory:
    plan = inv.job.parallel
    dp, zero = plan.zero_shards, plan.zero_stage
    params = st.params
    held, working = activations_per_microbatch(inv, st)
    flight = in_flight_microbatches(inv, st.index)
    if plan.schedule is Schedule.GPIPE and plan.recompute is not Recompute.FULL:
        # every micro-batch's forward finishes before any backward: the LM head's and the
        # loss's saved tensors are held for all of them, not just the one being processed
        ends = sum(op.saved_bytes for op in st.end_ops)
        held += ends
        working -= ends
    # FP8 layers keep an FP8 copy of their weights and its transpose (one byte each): of the
    # rank's shard under ZeRO-3 (FSDP's float8 all-gathers FP8 shards), plus the layer being
    # gathered and used
    per_layer = 2.0 * fp8_weight_params(st.layer_ops)
    fp8_copies = per_layer * (st.num_layers / dp + 1 if zero >= 3 else st.num_layers)
    weights = params * inv.param_bytes / (dp if zero >= 3 else 1)
    optimizer = params * adam_state_bytes(inv.job.precision) / (dp if zero >= 1 else 1)
    activations = held * flight + working
    off = count_offload(inv, st, weights, optimizer, held * flight)  # what offload moves off the GPU
    return StageMemory(
        stage=st.index,
        weights=weights - off.weights + fp8_copies,
        gradients=params * inv.grad_bytes / (dp if zero >= 2 else 1),
        optimizer_states=optimizer - off.optimizer_states,
        activations=activations - off.activations,
        buffers=RUNTIME_RESERVE_BYTES,
        in_flight_microbatches=flight,
        host=off.on_host(inv.job),
    )


def estimate_memory(inv: JobInventory) -> tuple[StageMemory, ...]:
    """Memory of one GPU of every pipeline stage."""
    return tuple(estimate_stage_memory(inv, st) for st in inv.stages)
