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
from paraplan.schedule import peak_in_flight
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
    if plan.schedule.splits_backward and p > 1:
        # counted on the schedule's order (``schedule.peak_in_flight``): ZB-H1 holds
        # min(p, m) on every stage (stage i defers i W passes, each keeping its micro-batch's
        # activations: an upper bound, the W pass needs only its GEMMs' inputs), the same
        # peak as 1F1B's stage 0; ZB-V min(2p, m + min(m, i + 1)) half-stage chunks, at most
        # p micro-batches, also 1F1B's peak (Qi et al. 2023, Sections 2.1 and 6)
        return peak_in_flight(plan.schedule, stage, p, m, plan.schedule.chunks(plan.vpp))
    return float(min(p - stage, m))


def activations_per_microbatch(inv: JobInventory, st: StageInventory) -> tuple[float, float]:
    """(bytes held per micro-batch in flight, extra working bytes for the one being processed):
    the layers keep what the recompute policy keeps (``inventory.recompute``); the ends keep
    what they save while their micro-batch is processed."""
    held = working = 0.0
    for block in st.blocks:
        rc = recompute_cost(inv.job.parallel, block.ops, inv.shape, block.num_layers)
        held += rc.held_bytes
        working = max(working, rc.working_bytes)
    end_saved = sum(op.saved_bytes for op in st.end_ops)
    return held, working + end_saved


def estimate_stage_memory(inv: JobInventory, st: StageInventory) -> StageMemory:
    plan = inv.job.parallel
    dp, zero, edp = plan.zero_shards, plan.zero_stage, plan.edp
    params, experts = st.params, st.expert_params
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
    fp8_copies = 0.0
    for block in st.blocks:
        per_layer = 2.0 * fp8_weight_params(block.ops)
        fp8_copies += per_layer * (block.num_layers / dp + 1 if zero >= 3 else block.num_layers)

    def sharded(bytes_per_param: float, from_stage: int) -> float:
        """The stage's weights at ``bytes_per_param``, sharded over the data-parallel ranks
        (the experts' over the expert data-parallel ranks) from ZeRO stage ``from_stage``."""
        if zero < from_stage:
            return (params + experts) * bytes_per_param
        return (params / dp + experts / edp) * bytes_per_param

    weights, gradients = sharded(inv.param_bytes, 3), sharded(inv.grad_bytes, 2)
    optimizer = sharded(adam_state_bytes(inv.job.precision), 1)
    off = count_offload(inv, st, weights, gradients, optimizer, held * flight)  # what offload moves off the GPU
    return StageMemory(
        stage=st.index,
        weights=weights - off.weights + fp8_copies,
        gradients=gradients - off.gradients,
        optimizer_states=optimizer - off.optimizer_states,
        activations=held * flight + working - off.activations,
        buffers=RUNTIME_RESERVE_BYTES,
        in_flight_microbatches=flight,
        host=off.on_host(inv.job),
    )


def estimate_memory(inv: JobInventory) -> tuple[StageMemory, ...]:
    """Memory of one GPU of every pipeline stage."""
    return tuple(estimate_stage_memory(inv, st) for st in inv.stages)
