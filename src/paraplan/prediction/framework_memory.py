"""What the frameworks hold on a GPU beyond the layers' saved tensors and the sharded
weights, gradients and optimizer states (``prediction.memory`` adds them to a stage's peak; the
search's screen calls the same functions on its tables):

- DeepSpeed's pipeline engine keeps each in-flight micro-batch's stage output, its send and
  receive buffers and, on the last stage, a micro-batch's logits through its backward and,
  with two or more micro-batches a step, the previous one's (``deepspeed_pipeline_buffers``).
- The loss holds the logits in several precisions at once (``loss_logits_bytes``); under
  torchtitan's tensor parallelism PyTorch's ``loss_parallel`` holds more of them, and the LM
  head saves its all-gathered input (``inventory.layer.dtensor_gathered_inputs``).
- PyTorch's pipeline stage (``torch.distributed.pipelining``, torchtitan's pipelines) keeps,
  where the plan says so (``pipeline_keeps_outputs``, the torch of 2024-25), every micro-batch's
  output until the next step, one receive buffer per micro-batch for the activations and one
  for their gradients, and the gradients of the received activations
  (``torch_pipeline_buffers``).
- PyTorch's ring attention (torchtitan's context parallelism) all-gathers the K and V of the
  whole sequence and accumulates the gradients in fp32 in each attention backward pass
  (``ring_attention_bytes``, part of a layer's working bytes).
- Workspaces allocated once and kept (``workspace_bytes``): PyTorch's cuBLAS workspace, and
  under Megatron Transformer Engine's and the dummy weight gradients it caches.
"""

from __future__ import annotations

import numpy as np

from paraplan.catalog import load_runtime_memory
from paraplan.inventory import JobInventory, StageInventory
from paraplan.inventory.job import param_bytes
from paraplan.inventory.ops import OpKind
from paraplan.inventory.shapes import LocalShape
from paraplan.specs import Framework, Job, ParallelPlan


def ring_attention_bytes(plan: ParallelPlan, x: LocalShape) -> float:
    """What PyTorch's ring attention (``torch.distributed.tensor.experimental.context_parallel``,
    torchtitan's context parallelism) holds in one attention layer's backward pass beyond the
    attention's own tensors, on each of the ``cp`` ranks (``_templated_ring_attention_backward``
    in torch 2.6.0, ``_attention.py``; torchtitan's ``Attention.forward`` in
    ``models/llama/model.py`` calls ``repeat_kv`` before ``F.scaled_dot_product_attention``, so
    K and V have the local query heads):

    - the K and V of the whole sequence: the default ``_RotateMethod.ALL_GATHER`` rotater
      all-gathers the concatenated local K and V once (``ft_c.all_gather_tensor``) and hands out
      one rank's chunk per ring step: ``cp`` x (K + V) in the activations' precision. With
      torchtitan's ``context_parallel_rotate_method = "alltoall"`` (``cp_comm_type``) the
      ``_AllToAllRotater`` shifts them one rank per step: the concatenation sent and the one
      received, 2 x (K + V) whatever ``cp``;
    - the fp32 accumulators of the local dQ, dK and dV (``convert_to_f32`` is True: ``accum_dtype
      = torch.float32``, ``torch.zeros_like``): 3 x 4 bytes per element;
    - the fp32 dK and dV being rotated (``_RotateMethod.ALL_TO_ALL``, ``permute_tensor``): the
      concatenation sent (``torch.cat([grad_key.flatten(), grad_value.flatten()])``) and the one
      received, 2 x 2 x 4 bytes per element.

    One element is one of ``b x heads x s x d`` of the rank's local query (``s`` the rank's
    share of the sequence). The forward pass's ring (the merger's fp32 output and the same
    all-gathered K and V) holds less. Megatron runs context parallelism through Transformer
    Engine's own attention and is not covered here; neither is cp = 1 (no ring)."""
    if plan.cp <= 1 or plan.framework is not Framework.FSDP:
        return 0.0
    elements = x.b * x.heads * x.s * x.d
    kv_copies = plan.cp if plan.cp_comm == "allgather" else 2
    return elements * (2.0 * kv_copies * x.e + 3.0 * 4.0 + 2.0 * 2.0 * 4.0)


def torch_pipeline_buffers(boundary, logits_out, microbatches, in_flight, first, chunks=1.0, keeps_outputs=True):
    """(activations, buffers): the bytes PyTorch's pipeline stage keeps on one GPU beyond its
    layers' saved tensors (``torch.distributed.pipelining``, the pipelining of torchtitan; read
    in torch 2.6.0 ``stage.py`` and ``schedules.py``), for ``microbatches`` micro-batches with
    ``in_flight`` of them held at the stage's peak (``in_flight_microbatches``), ``boundary``
    bytes for a tensor sent between stages (the layer input: [b, s/tp with sequence
    parallelism, h]) and ``logits_out`` for the logits of one micro-batch on the stage that
    computes the loss (0 elsewhere); ``first`` is 1 on the first stage, ``chunks`` the model
    chunks a GPU runs (``Schedule.chunks``: interleaving's vpp, ZB-V's two), each a stage
    object with its own outputs and receive buffers. Numbers or numpy arrays (the search's screen).

    - ``forward_one_chunk`` appends every micro-batch's output to ``output_chunks``, which only
      the next ``step()``'s ``clear_runtime_states`` empties (the last stage merges them into
      the returned output): all ``microbatches`` outputs at the peak, the logits on the last
      stage (activations). PyTorch issue #128910 (H-Huang, open): "We use extra memory in our
      schedules because we accumulate all the activations across a Schedule step"; still so
      in torch 2.13 (PR #194119, 2026: "A pipeline stage keeps every forward output alive
      until the end of the step"). Where ``keeps_outputs`` is False (``ParallelPlan.
      keeps_pipeline_outputs``, today's torchtitan: its trainer calls ``pp_schedule.step(...,
      return_outputs=False)`` and torch's schedules ``forward_one_chunk(...,
      save_forward_output=return_outputs)``) no output is kept for the step: only the
      ``fwd_cache`` entries of the micro-batches in flight, popped by their backward pass,
      hold a stage's output (``in_flight`` boundaries on every chunk but the last stage's;
      the logits of the one in flight are the loss's, ``loss_logits_bytes``).
    - ``_prepare_forward_infra`` and ``_prepare_backward_infra`` allocate one receive buffer per
      micro-batch (``_make_tensor_from_meta`` for each chunk id), kept across steps: the
      activations' on every stage but the first and the gradients' on every stage but the last
      (buffers). The activation buffers of the micro-batches in flight are the first layer's
      inputs the layers already keep, so ``microbatches - in_flight`` of them are counted.
    - ``stage_backward`` runs ``torch.autograd.backward`` and reads each input's ``.grad``:
      the gradient of a received activation stays on its buffer until the next step's
      ``clear_runtime_states`` (``a.buffer.grad = None``): at the peak, the micro-batches
      already back through the stage, ``microbatches - in_flight`` (activations). PyTorch PR
      #164329 (October 2025; torch 2.13 has it) frees each one once it is sent: counted as
      the torch of the published runs (2.6) held them, a pessimistic bound for newer releases.

    Not counted: the last stage's ``_merge_outputs`` concatenates the kept logits once the
    backward passes are done (another ``microbatches`` logits, after FSDP has resharded the
    stage), a later and usually lower peak."""
    last = np.where(np.asarray(logits_out) > 0, 1.0, 0.0)
    beyond = np.maximum(microbatches - in_flight, 0.0) * (chunks - first) * boundary
    outputs = np.where(keeps_outputs, microbatches * ((chunks - last) * boundary + logits_out),
                       np.minimum(in_flight, microbatches) * (chunks - last) * boundary)
    grad_receive = microbatches * (chunks - last) * boundary
    activations, buffers = outputs + beyond, grad_receive + beyond
    if np.ndim(activations) == 0:
        return float(activations), float(buffers)
    return activations, buffers


def boundary_bytes(x: LocalShape) -> float:
    """One micro-batch's activation on this rank where stages meet, a layer's input and output
    ([b, s, h], s/tp with sequence parallelism), in the activations' precision: what a pipeline
    sends, receives and keeps between stages."""
    return x.e * x.b * x.s_norm * x.h


def logits_output_bytes(st: StageInventory, e: float) -> float:
    """The logits of one micro-batch in the activations' precision (``e`` bytes), on the stage
    that computes the loss (0 elsewhere): the model's output, before the loss casts it."""
    return e * logit_elements(st.end_ops)


def pipelines_on_torch(framework: Framework) -> bool:
    """Whether ``framework``'s pipelines run on ``torch.distributed.pipelining`` (torchtitan's)."""
    return framework is Framework.FSDP


def runs_torch_pipelining(plan: ParallelPlan) -> bool:
    """Whether the plan's pipeline runs on ``torch.distributed.pipelining`` (torchtitan)."""
    return pipelines_on_torch(plan.framework) and plan.pp > 1


# Bytes per logit element the loss holds at its peak, beyond the fp32 softmax it saves for the
# backward pass (``cross_entropy``'s ``saved_bytes`` in the inventory), with e-byte logits:
# - Megatron-LM's vocab-parallel cross entropy (megatron/core/tensor_parallel/cross_entropy.py,
#   also Megatron-DeepSpeed's): ``vocab_parallel_logits.float()`` copies the e-byte logits to
#   fp32, then subtracts the max, exponentiates and normalises that copy in place and saves it;
#   the backward pass turns the saved softmax into the gradient in place. At the peak: the
#   e-byte logits (alive in the model's forward) or the e-byte gradient cast back, beside the
#   fp32 copy: e extra bytes (none in fp32, where ``.float()`` returns the logits themselves).
# - torchtitan's ``cross_entropy_loss``: ``F.cross_entropy(pred.float(), labels)``, i.e.
#   log_softmax (saves its fp32 output) and nll_loss; the trainer deletes ``pred`` before
#   ``loss.backward()``. Forward: e-byte logits + fp32 copy + fp32 log-softmax, at most 12
#   bytes for any e <= 4; backward of log_softmax: its saved output, the incoming fp32
#   gradient and the fp32 input gradient, 12 bytes: the peak, 8 beyond the saved 4.
# - torchtitan with tensor parallelism computes it under PyTorch's ``loss_parallel()``
#   (train.py's train context; torchtitan's default whenever tp > 1, its LM head's
#   ``ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)`` in
#   parallelisms/parallelize_llama.py ``apply_tp``), on the local vocabulary shard. Its backward
#   (torch/distributed/tensor/parallel/loss.py ``_nll_loss_and_log_softmax_backward``: the same
#   in its 2024 form and at pytorch 02eef6b) fuses nll_loss's and log_softmax's:
#   ``grad_input = torch.zeros_like(x)`` beside the saved fp32 log-softmax ``x``, then
#   ``(grad_input + torch.exp(x)) * grad_output``:
#   while the sum is formed, x, grad_input, exp(x) and the sum are alive, 16 bytes, 12 beyond
#   the saved 4 (its forward, ``_log_softmax``, peaks lower: the fp32 input, ``x - x_max``,
#   ``exp`` of it, then the result, 12 bytes with the e-byte logits freed, 14 without).
#   Compiled (``compile_loss``: torchtitan's torch.compile of the loss), Inductor saves the
#   e-byte logits and a logsumexp per token, and its backward kernel writes the e-byte
#   gradient directly: at most 2e bytes, 2e - 4 beyond the 4 the inventory saves (the Inductor
#   code of this loss on the CPU, PyTorch 2.13: the only full-size buffer is the bf16
#   gradient; the forward returns the bf16 input among its saved tensors).
TORCHTITAN_LOSS_EXTRA_BYTES = 8.0
LOSS_PARALLEL_EXTRA_BYTES = 12.0
# - Megatron-Core's fused cross entropy (``cross_entropy_loss_fusion``, impl 'native';
#   megatron/core/fusions/fused_cross_entropy.py, read in megatron-core 0.15.0): the same steps
#   as the unfused one, each a ``torch.compile``'d function (``megatron.core.jit.jit_fuser``),
#   and the gradient cast to bf16 (``grad_input.to(torch.bfloat16)``). Inductor materialises
#   the in-place updates of the fp32 logits in a temporary of their full size: measured with
#   these functions on an H100 (PyTorch 2.11, 1024 x 128256 logits) the forward pass peaks at
#   10.0 bytes per logit element (bf16 logits, fp32 copy, fp32 temporary) and the backward
#   pass at 10.0 (saved softmax, fp32 temporary, bf16 gradient): 6 beyond the saved 4, in
#   either precision. The CPU's Inductor code shows the backward's temporary too (a float32
#   buffer of the logits' shape beside the bf16 output).
MEGATRON_FUSED_LOSS_EXTRA_BYTES = 6.0


def logit_elements(end_ops) -> float:
    """The logits one micro-batch of a stage computes (this rank's vocabulary shard): the
    loss operator's elements among ``end_ops``, 0 on a stage without the loss."""
    loss = next((op for op in end_ops if op.kind is OpKind.LOSS), None)
    if loss is None:
        return 0.0
    elements = 1.0
    for _, n in loss.dims:
        elements *= n
    return elements


def loss_logits_bytes(job: Job, st: StageInventory) -> float:
    """Bytes the loss holds at its peak beyond the softmax the inventory saves, on the stage
    that computes it (0 elsewhere)."""
    elements = logit_elements(st.end_ops)
    if not elements:
        return 0.0
    e = param_bytes(job.precision)
    if job.parallel.framework is Framework.FSDP:
        if job.parallel.compile_loss:
            extra = max(0.0, 2.0 * e - 4.0)
        elif job.parallel.tp > 1:
            extra = LOSS_PARALLEL_EXTRA_BYTES
        else:
            extra = TORCHTITAN_LOSS_EXTRA_BYTES
    elif job.parallel.framework is Framework.MEGATRON and job.parallel.cross_entropy_loss_fusion:
        extra = MEGATRON_FUSED_LOSS_EXTRA_BYTES
    else:
        extra = e if e < 4.0 else 0.0
    # torchtitan's ChunkedLossWrapper: one chunk's logits at a time (``inventory.ends.chunked_loss``)
    return extra * elements / (job.parallel.loss_chunks or 1)


def _by_architecture(sizes: dict[str, float], architecture: str | None) -> float:
    return sizes.get(architecture or "", sizes["default"])


def dummy_wgrad_bytes(inv: JobInventory, st: StageInventory) -> float:
    """The dummy weight gradients Megatron keeps on one GPU of ``st``: with gradient
    accumulation fusion the weight-gradient GEMMs add into ``main_grad`` and return a
    placeholder gradient of the weight's shape, which Transformer Engine caches, one per
    distinct shape and dtype, for the whole run (``get_dummy_wgrad``, ``_dummy_wgrads`` in
    transformer_engine/pytorch/module/base.py, used by its Linear, LayerNormLinear,
    LayerNormMLP and GroupedLinear when Megatron's DDP set ``grad_added_to_main_grad``);
    Megatron-Core's own linear layers (the LM head, ``LinearWithGradAccumulationAndAsync
    Communication``, megatron/core/tensor_parallel/layers.py) take theirs from it too since
    megatron-core 0.14 (0.12 and 0.13 allocated a fresh one per call). In the weights' 16 bits."""
    shapes = set()
    for op in (*(op for block in st.blocks for op in block.ops), *st.end_ops):
        if op.kind is OpKind.GEMM and op.params > 0:
            dims = dict(op.dims)
            shapes.add((dims["k"], dims["n"]) if "k" in dims and "n" in dims else (op.params, 1))
    return inv.param_bytes * sum(k * n for k, n in shapes)


def workspace_bytes(inv: JobInventory, st: StageInventory) -> float:
    """Workspaces one GPU of ``st`` allocates once and keeps (catalog ``runtime/memory.yaml``):
    PyTorch's cuBLAS workspace; under Megatron (Transformer Engine layers) also Transformer
    Engine's and, with gradient accumulation fusion, the cached dummy weight gradients
    (``dummy_wgrad_bytes``)."""
    rt = load_runtime_memory()
    plan = inv.job.parallel
    architecture = inv.job.cluster.gpu.architecture
    total = _by_architecture(rt.cublas_workspace_bytes, architecture)
    if plan.framework is Framework.MEGATRON:
        total += _by_architecture(rt.te_cublas_workspace_bytes, architecture)
        if plan.fuses_gradient_accumulation:
            total += dummy_wgrad_bytes(inv, st)
    return total


def deepspeed_pipeline_buffers(plan: ParallelPlan, x: LocalShape, logits: float, *, first: bool,
                               last: bool, microbatches: int) -> tuple[float, float]:
    """(bytes per micro-batch in flight, bytes once) that DeepSpeed's ``PipelineEngine`` keeps
    for its sends and receives on a stage of a pipeline (``first``/``last``: the stage's ends;
    none with one stage), beside the layers' checkpointed inputs. ``x`` gives the activation
    crossing stages (``boundary_bytes``); ``logits`` the elements of one
    micro-batch's logits (the last stage's output). Read in DeepSpeed
    ``runtime/pipe/engine.py`` (commit 0050fdad) and ``runtime/pipe/schedule.py``:

    - every stage but the last keeps each in-flight micro-batch's output in
      ``pipe_buffers['outputs']`` until that micro-batch's backward pass (the last layer's
      output, which no checkpoint holds); with tp > 1 the engine partitions it over the
      tensor-parallel ranks (``pipe_partitioned``, on by default: ``PartitionedTensor``, the
      full tensor's ``.data`` set to ``torch.zeros(1)``), 1/tp of it. It receives gradients
      into ``grad_layer``, allocated once (the partition with tp > 1), and with tp > 1
      ``_exec_backward_pass`` rebuilds the full output and the full gradient
      (``part_output.full()``, ``part_grad.full()``) for ``torch.autograd.backward``: both
      live while the stage's layers are recomputed;
    - every stage but the first receives into ``pipe_recv_buf``, allocated once (the
      partition with tp > 1), and keeps the received copy in ``pipe_buffers['inputs']`` until
      the micro-batch's gradient is sent; ``_exec_forward_pass`` runs the layers on a clone of
      it (with tp > 1 on the full tensor rebuilt from the partition, which replaces the copy):
      with tp = 1 a second copy of each in-flight micro-batch's input;
    - the last stage's ``_exec_backward_pass`` returns before it clears
      ``pipe_buffers['outputs']`` (read again in DeepSpeed 0.14.4's engine.py): a micro-batch's
      logits (in the model's dtype) stay referenced by its buffer through its loss's backward
      pass, beside the gradient the loss casts back to that dtype (``loss_logits_bytes`` counts
      one of the two), and until the micro-batch two later replaces them (``_exec_forward_pass``
      assigns ``pipe_buffers['outputs'][buffer_id]`` after the stage's forward, before the
      loss). ``TrainSchedule.num_pipe_buffers`` gives the last stage two buffers
      (``max(2, min(stages - stage_id, micro_batches))``) and micro-batch i the buffer i % 2: with
      ``microbatches`` >= 2 the previous micro-batch's logits stay in the other buffer through
      this one's loss and backward; with one micro-batch the step always takes buffer 0, whose
      logits of the previous step are released before the loss runs (``_reserve_pipe_buffers``
      only adds slots; nothing empties them between steps), so no earlier logits are held then.

    With sequence parallelism each tensor-parallel rank's stage output is its own sequence
    shard, [b, s/tp, h], which ``PartitionedTensor`` cannot split further: Megatron-DeepSpeed
    runs it with ``pipe_partitioned`` and ``grad_partitioned`` false (its example scripts set
    ``PARTITIONED_MODE=false`` with ``--sequence-parallel``), so the buffers are whole shards,
    as with tp = 1, and nothing is rebuilt."""
    if plan.framework is not Framework.DEEPSPEED or (first and last):
        return 0.0, 0.0
    boundary = boundary_bytes(x)  # this rank's stage output (its sequence shard with sp)
    partitioned = plan.tp > 1 and not plan.sequence_parallel  # pipe_partitioned
    part = boundary / plan.tp if partitioned else boundary
    per_microbatch = once = 0.0
    if not last:
        per_microbatch += part  # pipe_buffers['outputs']
        once += part  # grad_layer
        if partitioned:
            once += 2.0 * boundary  # the full output and gradient of the backward pass
    if not first:
        once += part  # pipe_recv_buf
        if not partitioned:
            per_microbatch += boundary  # the received copy beside the forward's clone
    if last:
        once += x.e * logits  # this micro-batch's logits, in its buffer through its backward
        if microbatches > 1:
            once += x.e * logits  # the previous micro-batch's logits, in the other buffer
    return per_microbatch, once
