"""Per-GPU memory of each pipeline stage, read from the inventory.

Weights, gradients and Adam states follow the ZeRO stages (Rajbhandari et al. 2020):
stage 1 partitions optimizer states over data-parallel ranks, stage 2 also gradients,
stage 3 also weights. Activations are the inventory's saved bytes per micro-batch times the
micro-batches a stage holds at once under its schedule; full recompute keeps only each
layer's input, plus one layer's activations while it is recomputed. Offload (``offload``)
moves optimizer states, the ZeRO-3 parameter shard and some layers' activations to the host.

On top of these, what the frameworks really hold (``framework_buffers``, and
``prediction.framework_memory``):

- ZeRO-3 gathers each unit's weights before using it. FSDP2 (torchtitan) keeps the unit in
  use and the next one, prefetched (``fully_shard`` per transformer block, embedding and
  norm + LM head; ``reshard_after_forward`` is False for the LM head); its backward holds the
  unit's unsharded gradient and the reduce-scatter input in the reduce dtype. With pipeline
  parallelism torchtitan does not reshard after the forward pass (``apply_fsdp``:
  ``reshard_after_forward = not pp_enabled``) and PyTorch's pipeline stage turns gradient
  sync and resharding after backward off until the last micro-batch
  (``torch.distributed.pipelining.stage``: ``set_requires_gradient_sync(False)``,
  ``set_reshard_after_backward(False)``): the stage's unsharded weights and its gradients,
  accumulated in the reduce dtype, live across all micro-batches. DeepSpeed's ZeRO-3 keeps
  at most ``stage3_max_live_parameters`` gathered, fetching ``stage3_prefetch_bucket_size``
  ahead; ZeRO 1-3 fill ``reduce_bucket_size`` gradient buckets (``deepspeed_reduce_buckets``;
  defaults in the catalog's ``runtime/memory.yaml``).
- What DeepSpeed's and PyTorch's pipelines keep, the loss's copies of the logits, ring
  attention's buffers and the workspaces kept all run: ``prediction.framework_memory``.
- PyTorch's caching allocator reserves more than the tensors allocate, and what frameworks
  report as peak memory is its peak *reserved* (``reserved``); the CUDA context and NCCL's
  buffers sit outside it (``runtime``). Both are cited in ``runtime/memory.yaml``.

``activations_at_peak`` and ``stage_peak_bytes`` combine the terms, for one stage here and on
arrays for many plans in the search's screen.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np

from paraplan.catalog import load_runtime_memory
from paraplan.inventory import JobInventory, StageInventory
from paraplan.inventory.fp8 import amax_history_bytes, recipe_costs
from paraplan.inventory.job import adam_state_bytes, fp8_weight_params, split_params
from paraplan.inventory.ops import OpKind
from paraplan.inventory.recompute import recompute_cost
from paraplan.prediction.framework_memory import (
    boundary_bytes,
    deepspeed_pipeline_buffers,
    logit_elements,
    logits_output_bytes,
    loss_logits_bytes,
    ring_attention_bytes,
    runs_torch_pipelining,
    torch_pipeline_buffers,
    workspace_bytes,
)
from paraplan.prediction.memory_parts import MEMORY_PARTS
from paraplan.prediction.offload import count_offload, offloaded_layers
from paraplan.schedule.closed_form import stage_in_flight
from paraplan.specs import FP8Recipe, Framework, ParallelPlan, Recompute


@dataclass(frozen=True, slots=True)
class StageMemory:
    """One GPU of one pipeline stage at its peak, in bytes.

    ``allocated`` is what PyTorch's tensors take, ``reserved`` what the caching allocator holds
    for them (what ``torch.cuda.max_memory_reserved`` and the frameworks' logs report),
    ``total`` what the GPU must have: ``reserved`` plus the CUDA context and NCCL's buffers."""

    stage: int
    weights: float
    gradients: float
    optimizer_states: float
    activations: float
    buffers: float  # communication buffers: reduce buckets, unsharded gradients being reduced or accumulated
    in_flight_microbatches: float
    host: float = 0.0  # bytes this GPU keeps in host memory (offload), not counted in ``total``
    logits: float = 0.0  # the loss's extra copies of the logits, beyond the activations' own peak
    gathered_params: float = 0.0  # ZeRO-3's gathered (unsharded) weights of the units in flight
    runtime: float = 0.0  # CUDA context and NCCL buffers, outside the caching allocator
    fragmentation_share: float = 0.0  # of the memory reserved for the transient tensors, what is left in holes
    workspaces: float = 0.0  # cuBLAS / Transformer Engine workspaces and cached dummy weight gradients
    moment: str = ""  # the moment of the step the peak is at (``MOMENTS``), whose tensors the parts are
    gradients_freed: bool = False  # the gradients are freed between steps (transient, not persistent)

    @property
    def persistent(self) -> float:
        """Tensors allocated once and kept: weights, gradient buffers (unless the trainer frees
        them between steps), optimizer states and the framework's workspaces."""
        kept = 0.0 if self.gradients_freed else self.gradients
        return self.weights + kept + self.optimizer_states + self.workspaces

    @property
    def transient(self) -> float:
        """Tensors allocated and freed within the iteration (what fragments the allocator)."""
        return transient_bytes(self.activations, self.logits, self.gathered_params, self._step_buffers)

    @property
    def _step_buffers(self) -> float:
        """The communication buffers with the gradients the trainer frees between steps."""
        return self.buffers + (self.gradients if self.gradients_freed else 0.0)

    @property
    def allocated(self) -> float:
        return self.persistent + self.transient

    @property
    def reserved(self) -> float:
        return self.total - self.runtime

    @property
    def fragmentation(self) -> float:
        """What the caching allocator reserves beyond the tensors."""
        return self.reserved - self.allocated

    @property
    def allowance(self) -> float:
        """What the prediction adds to the tensors: fragmentation, CUDA context, NCCL buffers."""
        return self.fragmentation + self.runtime

    @property
    def total(self) -> float:
        return stage_peak_bytes(self.persistent, self.activations, self.logits, self.gathered_params,
                                self._step_buffers, self.runtime, self.fragmentation_share)


def transient_bytes(activations, logits, gathered, buffers):
    """``StageMemory.transient`` from its parts; numbers or numpy arrays (the search's screen)."""
    return activations + logits + gathered + buffers


def hold_end_tensors(held, working, ends_saved, gpipe_without_full_recompute):
    """(held, working) bytes per micro-batch once GPipe's order is accounted for: every
    micro-batch's forward finishes before any backward, so (unless full recompute drops them)
    the LM head's and the loss's saved tensors ``ends_saved`` are held for all of them, not
    just the one being processed. Numbers or numpy arrays (the search's screen)."""
    every = gpipe_without_full_recompute
    return np.where(every, held + ends_saved, held), np.where(every, working - ends_saved, working)


def activations_at_peak(held, working, ends_saved, gpipe_without_full_recompute, in_flight, offloaded_layers=0,
                        layers=1):
    """(activations, offloaded): a stage's activations at its peak and, of the bytes its
    ``in_flight`` micro-batches hold, what activation offload keeps on the host (the share of
    its ``layers`` that ``offloaded_layers`` is). ``held`` bytes per micro-batch in flight and
    ``working`` for the one being processed, the ends' ``ends_saved`` held for every micro-batch
    under GPipe's order (``hold_end_tensors``). ``estimate_stage_memory`` calls it for one stage
    and the search's screen for a stage class of many plans (numpy arrays; no offloaded layers)."""
    every = gpipe_without_full_recompute
    if isinstance(every, np.ndarray) or every:
        held, working = hold_end_tensors(held, working, ends_saved, every)
    held_all = held * in_flight
    offloaded = held_all * offloaded_layers / layers if offloaded_layers else 0.0
    return held_all + working - offloaded, offloaded


def stage_peak_bytes(persistent, activations, logits, gathered, buffers, runtime, fragmentation: float):
    """A stage's peak memory from its parts (``StageMemory.total``; the search's screen calls it on
    arrays): the persistent tensors, the transient ones (``transient_bytes``) with what the
    allocator reserves around them, and the runtime's (``peak_bytes``)."""
    return peak_bytes(persistent, transient_bytes(activations, logits, gathered, buffers), runtime, fragmentation)


#: The moments of a step ``step_peak_bytes`` compares, in its order: the loss at the end of the
#: (last micro-batch's) forward pass, the first layers of the backward pass (every activation
#: still saved, the backward's buffers allocated), and the end of the backward pass before the
#: optimizer step (every gradient, and the first layer's backward working bytes), and the optimizer
#: step itself (the activations and the backward's buffers freed, every gradient, and the
#: temporaries the step allocates: torch foreach's, ``inventory.optimizer.step_temporary_bytes``;
#: without them it never exceeds the end of the backward).
MOMENTS = ("loss", "backward start", "backward end", "optimizer step")


def step_peak_bytes(persistent, gradients_freed, grads_at_forward, activations, logits, layer_working, gathered,
                    buffers, backward_buffers, runtime, fragmentation: float, step_temporaries=0.0):
    """The peak of a step's memory timeline: the largest of ``stage_peak_bytes`` at each of the
    ``MOMENTS``, with the tensors alive at that moment (numbers or numpy arrays: the search's
    screen; a tuple of the four totals). ``persistent`` holds the tensors kept between steps;
    ``gradients_freed`` the gradient bytes the trainer frees between steps
    (``ParallelPlan.frees_gradients``), which exist at the loss only where ``grads_at_forward``
    (more than one micro-batch a step: the earlier ones' gradients) and always at the end of the
    backward; ``activations`` and ``logits`` as ``activations_at_peak`` and ``microbatch_bytes``
    give them (the layers' working bytes are the backward's, the loss's extra copies the
    forward's beyond them; ``layer_working`` is what the last backward pass, the first layer's,
    holds beside nearly every gradient: the tensors that layer kept for it and its working bytes); ``buffers`` held all step, ``backward_buffers`` only in the backward
    (FSDP's unsharded gradient and reduce-scatter input). The gradients of the units done early
    in the backward are left out of its first moment (a unit's shard, against the activations it
    frees); between the first layers and the end both change linearly with the layers done, so
    the larger of the two ends bounds the backward. At the optimizer step ``step_temporaries``
    (allocated by every step alike, counted with the tensors kept) join the states and every
    gradient; the ``buffers`` held all step stay."""
    early = np.where(grads_at_forward, gradients_freed, 0.0) if isinstance(grads_at_forward, np.ndarray) else (
        gradients_freed if grads_at_forward else 0.0)
    loss = stage_peak_bytes(persistent, activations, logits, gathered, buffers + early, runtime, fragmentation)
    backward = stage_peak_bytes(persistent, activations, 0.0, gathered, buffers + backward_buffers + early, runtime,
                                fragmentation)
    end = stage_peak_bytes(persistent, layer_working, 0.0, gathered, buffers + backward_buffers + gradients_freed,
                           runtime, fragmentation)
    step = stage_peak_bytes(persistent + step_temporaries, 0.0, 0.0, 0.0, buffers + gradients_freed, runtime,
                            fragmentation)
    return loss, backward, end, step


def peak_bytes(persistent, transient, runtime, fragmentation: float):
    """A GPU's peak memory from its persistent and transient tensors: the allocator reserves
    ``transient / (1 - fragmentation)`` for the transient ones (``fragmentation`` being the
    share of reserved memory left in holes), and ``runtime`` sits outside it. Works on numbers
    and numpy arrays alike (the search's screen)."""
    return persistent + transient / (1.0 - fragmentation) + runtime


def usable_hbm_bytes(hbm_bytes, headroom: float):
    """What a plan may use of ``hbm_bytes`` when it leaves ``headroom`` of it free."""
    return hbm_bytes * (1.0 - headroom)


def runtime_bytes(plan: ParallelPlan) -> float:
    """The CUDA context plus NCCL's buffers: one communicator per parallel dimension with more
    than one rank, and the all-to-all's connections under expert parallelism."""
    rt = load_runtime_memory()
    communicators = sum(n > 1 for n in (plan.tp, plan.cp, plan.pp, plan.dp))
    return (rt.cuda_context_bytes + communicators * rt.nccl_communicator_bytes
            + (rt.nccl_all_to_all_bytes if plan.ep > 1 else 0.0))


def fragmentation_share() -> float:
    return load_runtime_memory().allocator_fragmentation


def in_flight_microbatches(inv: JobInventory, stage: int) -> float:
    """Micro-batches whose activations a stage holds at its peak (in units of its whole
    layer stack; interleaving holds more, smaller chunks): ``schedule.closed_form.stage_in_flight``,
    the count the plan screen uses too."""
    plan = inv.job.parallel
    return float(stage_in_flight(plan.schedule, stage, plan.pp, plan.num_microbatches, plan.vpp))


def activations_per_microbatch(inv: JobInventory, st: StageInventory) -> tuple[float, float]:
    """(bytes held per micro-batch in flight, extra working bytes for the one being processed):
    the layers keep what the recompute policy keeps (``inventory.recompute``); the ends keep
    what they save while their micro-batch is processed."""
    held, working, _ = microbatch_bytes(inv, st)
    return held, working


def microbatch_bytes(inv: JobInventory, st: StageInventory) -> tuple[float, float, float]:
    """``activations_per_microbatch`` and the loss's extra copies of the logits beyond the
    layers' working bytes (``loss_logits_bytes``): the loss runs before any layer's backward,
    so the two peaks do not add up. A layer's working bytes include what ring attention holds
    in its backward pass (``ring_attention_bytes``)."""
    held = layer_working = 0.0
    for block in st.blocks:
        rc = recompute_cost(inv.job.parallel, block.ops, inv.shape, block.num_layers)
        held += rc.held_bytes
        ring = ring_attention_bytes(inv.job.parallel, inv.shape) if any(
            op.kind is OpKind.ATTENTION for op in block.ops) else 0.0
        layer_working = max(layer_working, rc.working_bytes + ring)
    logits = max(0.0, loss_logits_bytes(inv.job, st) - layer_working)
    return held, layer_working + end_saved_bytes(st), logits


def first_layer_held_bytes(inv: JobInventory, st: StageInventory) -> float:
    """What the stage's first layer keeps for its own backward pass per micro-batch (its saved
    tensors, or its input where the recompute policy re-runs it: ``recompute_cost`` of one
    layer of the stage's first block). The last backward of a step, the first layer's, runs
    with these tensors alive beside the layer's working bytes."""
    if not st.blocks:
        return 0.0
    block = st.blocks[0]
    return recompute_cost(inv.job.parallel, block.ops, inv.shape, 1).held_bytes


def end_saved_bytes(st: StageInventory) -> float:
    """What the stage's end operators (embedding, LM head, loss) save for the backward pass."""
    return sum(op.saved_bytes for op in st.end_ops)


def last_backward_bytes(first_layer_held, working, ends_saved):
    """What the step's last backward pass, the stage's first layer's, holds: the tensors that
    layer kept for it (``first_layer_held_bytes``: one layer of the stage's first block) and
    the layers' working bytes (``microbatch_bytes``'s, less the ends' saved tensors
    ``ends_saved``, which the ends' backward freed before). Numbers or numpy arrays (the
    search's screen): ``step_peak_bytes``'s ``layer_working``."""
    return first_layer_held + working - ends_saved


def grads_at_forward(microbatches):
    """Whether freed gradients exist at the loss (``step_peak_bytes``'s ``grads_at_forward``):
    with more than one micro-batch a step, the earlier ones' gradients. Numbers or numpy arrays."""
    return microbatches > 1




def _units(st: StageInventory) -> tuple[float, float]:
    """(the largest unit ZeRO-3 gathers at once on this stage, all of the stage's weights), in
    parameters of this rank's tensor-parallel shard: one layer, the embedding, the final norm
    and LM head (torchtitan's ``fully_shard`` units)."""
    layer = max((sum(split_params(b.ops)) for b in st.blocks), default=0.0)
    embedding = sum(op.params for op in st.end_ops if op.kind is OpKind.EMBEDDING)
    head = sum(op.params for op in st.end_ops) - embedding
    return max(layer, embedding, head), st.params + st.expert_params


def deepspeed_reduce_buckets(plan: ParallelPlan, pb: float, gb: float, bucket_elements: float) -> float:
    """Bytes of the gradient reduce buckets DeepSpeed's ZeRO optimizers allocate, each of the
    full ``reduce_bucket_size`` elements whatever the model's size (``torch.empty``), with
    ``contiguous_gradients`` (true by default, ``zero/config.py``). Read in DeepSpeed 0.19.8:

    - ZeRO-1 and ZeRO-2 (``zero/stage_1_and_2.py``, ``DeepSpeedZeroOptimizer``): the gradient
      hooks (registered whenever ``contiguous_gradients`` is set, stage 1 included) call
      ``setup_buckets`` at a backward's first gradient, which allocates one bucket, and a
      second with ``overlap_comm`` (off by default below ZeRO-3, turned off with a pipeline:
      ``ParallelPlan.deepspeed_overlap_comm``); ``_release_ipg_buffers`` frees them after the
      reduction. With a pipeline ``reduce_gradients(pipeline_parallel=True)`` allocates one
      at the reduction instead. Their dtype is ``_gradient_reduction_buffer_dtype``: the
      gradient-accumulation dtype for ZeRO-1 with a separate one (``gb``), else the model's
      (``pb``). Earlier releases allocated the same buffers in
      ``DeepSpeedZeroOptimizer.backward`` (``self.ipg_buffer``, ``dtype=self.dtype``).
    - ZeRO-3 (``zero/stage3.py``, ``DeepSpeedZeroOptimizer_Stage3.__init__``): one bucket per
      communication dtype, allocated once.
    - ZeRO-0 runs no ZeRO optimizer (``engine._configure_optimizer``): none of these buckets."""
    if plan.zero_stage == 0:
        return 0.0
    if plan.zero_stage == 3:
        return pb * bucket_elements
    buckets = 2.0 if plan.deepspeed_overlap_comm else 1.0
    return buckets * (gb if plan.zero_stage == 1 else pb) * bucket_elements




def framework_buffers(inv: JobInventory, st: StageInventory) -> tuple[float, float, float]:
    """(gathered weights, communication buffers, backward-only buffers) one GPU of ``st`` holds
    beyond its shards (see the module docstring): the buffers held all step, and those only a
    backward pass holds (FSDP's unsharded gradient and reduce-scatter input of one unit, without
    pipeline parallelism), which ``step_peak_bytes`` places in the backward's moments only."""
    job = inv.job
    plan = job.parallel
    pb, gb = inv.param_bytes, inv.grad_bytes
    unit, stage = _units(st)
    sharded = plan.zero_shards > 1 or plan.edp > 1
    if plan.framework is Framework.DEEPSPEED:
        rt = load_runtime_memory()
        gathered = 0.0
        if plan.zero_stage >= 3 and sharded:
            live = max(unit, min(rt.deepspeed_stage3_max_live_parameters, unit + rt.deepspeed_stage3_prefetch_bucket_size))
            gathered = pb * min(stage, live)
        return gathered, deepspeed_reduce_buckets(plan, pb, gb, rt.deepspeed_reduce_bucket_size) if sharded else 0.0, 0.0
    if plan.framework is Framework.FSDP and plan.pp > 1 and sharded:
        # torchtitan with pipeline parallelism: unsharded weights (ZeRO-3) and gradients
        # accumulated in the reduce dtype (ZeRO-2/3) across the micro-batches, and the
        # reduce-scatter input of one unit at the last one
        gathered = pb * stage if plan.zero_stage >= 3 else 0.0
        accumulated = gb * stage + gb * unit if plan.zero_stage >= 2 else 0.0
        return gathered, accumulated, 0.0
    # ZeRO-3: the unit in use and the next, prefetched; ZeRO-2/3: the unit's unsharded
    # gradient and its reduce-scatter input, in the backward pass only (Megatron's distributed
    # optimizer, ZeRO-1, reduces its contiguous gradient buffer in place)
    gathered = 2.0 * pb * unit if plan.zero_stage >= 3 and sharded else 0.0
    return gathered, 0.0, (pb + gb) * unit if plan.zero_stage >= 2 and sharded else 0.0


def estimate_stage_memory(inv: JobInventory, st: StageInventory) -> StageMemory:
    """One GPU of ``st`` at the moment of its step's peak (``at_peak_moment``)."""
    return at_peak_moment(*step_memory(inv, st))


def step_memory(inv: JobInventory, st: StageInventory) -> tuple[StageMemory, float, bool, float, float]:
    """(every tensor of the step on one GPU of ``st``, its gradients whole; the backward-only
    buffers; whether freed gradients exist at the loss; what the first layer's backward, the step's last, holds;
    what the optimizer step allocates, ``StageInventory.step_temporaries``):
    ``at_peak_moment``'s arguments, which the search's screen reads too."""
    plan = inv.job.parallel
    dp, zero, edp = plan.zero_shards, plan.zero_stage, plan.edp
    params, experts = st.params, st.expert_params
    held, working, logits = microbatch_bytes(inv, st)
    flight = in_flight_microbatches(inv, st.index)
    every = plan.schedule.forwards_all_first and plan.recompute is not Recompute.FULL  # GPipe holds the ends' tensors
    activations, offloaded = activations_at_peak(held, working, end_saved_bytes(st) if every else 0.0, every, flight,
                                                 *offloaded_layers(plan, st))
    # FP8 layers keep an FP8 copy of their weights and its transpose (one byte each): of the
    # rank's shard under ZeRO-3 (FSDP's float8 all-gathers FP8 shards), plus the layer being
    # gathered and used
    # (``inventory.fp8``: the recipe's copy bytes per parameter, and delayed scaling's amax
    # histories, which every rank keeps whole)
    fp8_copies = 0.0
    recipe = plan.fp8_recipe
    for block in st.blocks:
        if recipe is None or recipe is FP8Recipe.DELAYED:
            per_layer = 2.0 * fp8_weight_params(block.ops)  # today's arithmetic, to the last bit
        else:
            per_layer = recipe_costs(recipe).copy_bytes * fp8_weight_params(block.ops)
        fp8_copies += per_layer * (block.num_layers / dp + 1 if zero >= 3 else block.num_layers)
        fp8_copies += block.num_layers * amax_history_bytes(sum(op.fp8 for op in block.ops), recipe)

    def sharded(bytes_per_param: float, from_stage: int) -> float:
        """The stage's weights at ``bytes_per_param``, sharded over the data-parallel ranks
        (the experts' over the expert data-parallel ranks) from ZeRO stage ``from_stage``."""
        if zero < from_stage:
            return (params + experts) * bytes_per_param
        return (params / dp + experts / edp) * bytes_per_param

    weights, gradients = sharded(inv.param_bytes, 3), sharded(inv.grad_bytes, 2)
    optimizer = sharded(adam_state_bytes(inv.job.precision), 1)
    if plan.framework is Framework.FSDP and zero >= 3 and inv.param_bytes < 4.0 and (dp > 1 or edp > 1):
        # FSDP2's sharded parameter is the fp32 master itself (MixedPrecisionPolicy casts it to
        # param_dtype only for the all-gather; torchtitan builds the model in fp32): a 4-byte
        # shard and Adam's two moments, not a 16-bit shard beside a 12-byte optimizer state (with
        # one rank nothing is sharded: the run is ZeRO 0's, ``search.space.runs_as_zero``)
        weights, optimizer = sharded(4.0, 3), sharded(adam_state_bytes(inv.job.precision) - 4.0, 1)
    off = count_offload(inv, st, weights, gradients, optimizer, offloaded)  # what offload moves off the GPU
    gathered, buffers, backward_buffers = framework_buffers(inv, st)
    per_microbatch, once = deepspeed_pipeline_buffers(plan, inv.shape, logit_elements(st.end_ops),
                                                      first=st.index == 0, last=st.index == plan.pp - 1,
                                                      microbatches=plan.num_microbatches)
    buffers += per_microbatch * flight + once
    if runs_torch_pipelining(plan):
        x = inv.shape
        chunks = float(plan.schedule.chunks(plan.vpp))  # interleaving's vpp, ZB-V's two
        kept, received = torch_pipeline_buffers(boundary_bytes(x), logits_output_bytes(st, x.e),
                                                float(plan.num_microbatches), flight, 1.0 if st.index == 0 else 0.0,
                                                chunks, plan.keeps_pipeline_outputs)
        activations, buffers = activations + kept, buffers + received
    mem = StageMemory(
        stage=st.index,
        weights=weights - off.weights + fp8_copies,
        gradients=gradients - off.gradients,
        optimizer_states=optimizer - off.optimizer_states,
        activations=float(activations),
        buffers=buffers,
        in_flight_microbatches=flight,
        host=off.on_host(inv.job),
        logits=logits,
        gathered_params=gathered,
        runtime=runtime_bytes(plan),
        fragmentation_share=fragmentation_share(),
        workspaces=workspace_bytes(inv, st),
        gradients_freed=plan.frees_gradients,
    )
    # the first layer's backward, the step's last: its own kept tensors and its working bytes
    layer_working = last_backward_bytes(first_layer_held_bytes(inv, st), working, end_saved_bytes(st))
    return mem, backward_buffers, grads_at_forward(plan.num_microbatches), layer_working, st.step_temporaries


def freed_gradients(mem: StageMemory) -> float:
    """The gradient bytes the trainer frees between steps (``ParallelPlan.frees_gradients``)."""
    return mem.gradients if mem.gradients_freed else 0.0


def moment_totals(mem: StageMemory, backward_buffers: float, grads_at_forward: bool,
                  layer_working: float, step_temporaries: float = 0.0) -> tuple[float, float, float, float]:
    """The GPU's total at each of the ``MOMENTS`` (``step_peak_bytes``) from ``step_memory``'s
    values: what compares two jobs at the same moment of their steps."""
    return step_peak_bytes(mem.persistent, freed_gradients(mem), grads_at_forward, mem.activations, mem.logits,
                           layer_working, mem.gathered_params, mem.buffers, backward_buffers, mem.runtime,
                           mem.fragmentation_share, step_temporaries)


def at_peak_moment(mem: StageMemory, backward_buffers: float, grads_at_forward: bool,
                   layer_working: float, step_temporaries: float = 0.0) -> StageMemory:
    """``mem`` (every tensor of the step, the gradients whole) cut to the moment of its step's
    peak (``step_peak_bytes``): its parts are then the tensors alive at that moment, and
    ``moment`` names it; at the optimizer step its temporaries are counted with the optimizer
    states."""
    freed = freed_gradients(mem)
    totals = moment_totals(mem, backward_buffers, grads_at_forward, layer_working, step_temporaries)
    at = max(range(len(MOMENTS)), key=lambda i: (totals[i], -i))  # the first of equal peaks
    early = freed if grads_at_forward else 0.0
    kept = mem.gradients - freed
    parts = (
        {"logits": mem.logits, "gradients": kept + early},
        {"logits": 0.0, "gradients": kept + early, "buffers": mem.buffers + backward_buffers},
        {"logits": 0.0, "activations": layer_working, "buffers": mem.buffers + backward_buffers},
        {"logits": 0.0, "activations": 0.0, "gathered_params": 0.0,
         "optimizer_states": mem.optimizer_states + step_temporaries},
    )[at]
    return replace(mem, moment=MOMENTS[at], **parts)


def estimate_memory(inv: JobInventory) -> tuple[StageMemory, ...]:
    """Memory of one GPU of every pipeline stage."""
    return tuple(estimate_stage_memory(inv, st) for st in inv.stages)


@dataclass(frozen=True)
class PlanMemory:
    """The memory of a prediction: every pipeline stage's (``stages``; the object is also the
    sequence of them) against its GPU's HBM, with the named parts of the worst stage (the one
    with the least margin) as attributes. ``pred.memory.total``, ``pred.memory.margin``,
    ``pred.memory[1].activations``."""

    stages: tuple[StageMemory, ...]
    hbm_bytes: tuple[float, ...]  # each stage's GPU memory (the smallest, for mixed GPUs)
    headroom: float  # the share of it the plan leaves free (``Job.memory_headroom``)

    def __post_init__(self) -> None:
        if len(self.stages) != len(self.hbm_bytes):
            raise ValueError("PlanMemory: one HBM size per stage")

    def __len__(self) -> int:
        return len(self.stages)

    def __iter__(self):
        return iter(self.stages)

    def __getitem__(self, i):
        return self.stages[i]

    def usable(self, stage: int) -> float:
        return usable_hbm_bytes(self.hbm_bytes[stage], self.headroom)

    def margin_of(self, stage: int) -> float:
        """What stage ``stage`` leaves of its usable memory (negative: it does not fit)."""
        return self.usable(stage) - self.stages[stage].total

    @functools.cached_property
    def worst(self) -> StageMemory:
        """The stage with the least margin (every named part below reads it: found once)."""
        return min(self.stages, key=lambda m: self.margin_of(m.stage))

    @property
    def fits(self) -> bool:
        return all(self.margin_of(m.stage) >= 0 for m in self.stages)

    # the worst stage's parts, by name
    @property
    def stage(self) -> int:
        return self.worst.stage

    @property
    def weights(self) -> float:
        return self.worst.weights

    @property
    def gradients(self) -> float:
        return self.worst.gradients

    @property
    def optimizer(self) -> float:
        return self.worst.optimizer_states

    @property
    def workspaces(self) -> float:
        return self.worst.workspaces

    @property
    def activations(self) -> float:
        return self.worst.activations

    @property
    def logits(self) -> float:
        return self.worst.logits

    @property
    def gathered_params(self) -> float:
        return self.worst.gathered_params

    @property
    def buffers(self) -> float:
        return self.worst.buffers

    @property
    def fragmentation(self) -> float:
        return self.worst.fragmentation

    @property
    def runtime(self) -> float:
        return self.worst.runtime

    @property
    def allowance(self) -> float:
        return self.worst.allowance

    @property
    def allocated(self) -> float:
        return self.worst.allocated

    @property
    def reserved(self) -> float:
        return self.worst.reserved

    @property
    def total(self) -> float:
        return self.worst.total

    @property
    def hbm(self) -> float:
        return self.hbm_bytes[self.worst.stage]

    @property
    def headroom_bytes(self) -> float:
        return self.hbm - self.usable(self.worst.stage)

    @property
    def margin(self) -> float:
        """GPU memory the worst stage leaves free after the headroom (negative: short by it)."""
        return self.margin_of(self.worst.stage)

    def to_dict(self) -> dict:
        """The JSON form (``Prediction.to_dict()["memory"]``): the worst stage's parts and every
        stage's total."""
        w = self.worst
        return {
            "worst_stage": w.stage,
            "peak_moment": w.moment,
            **{f"{p.field}_bytes": getattr(w, p.field) for p in MEMORY_PARTS},
            "allocated_bytes": w.allocated,
            "reserved_bytes": w.reserved,
            "total_bytes": w.total,
            "hbm_bytes": self.hbm,
            "memory_headroom": self.headroom,
            "margin_bytes": self.margin,
            "fits": self.fits,
            "per_stage_total_bytes": [m.total for m in self.stages],
        }
