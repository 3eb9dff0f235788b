"""What a trace of a Hugging Face model records (``inventory.hftrace``): each aten operator of
one layer kind with its module, phase, shapes, FLOPs and bytes; the tensors autograd saves; the
layer kinds and the model's exact parameters. Plain data: nothing here imports torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class TracedOp:
    """One aten operator (or the recorded attention core) of one layer, one micro-batch."""

    module: str  # path inside the layer ("self_attn.q_proj"); "" for the layer itself
    module_type: str  # the module's class name ("Linear", "LlamaRMSNorm")
    aten: str  # "mm", "mul.Tensor", ..., or "attention"
    phase: str  # "fwd" | "bwd"
    shapes: tuple[tuple[int, ...], ...]
    out_shapes: tuple[tuple[int, ...], ...]
    dtype: str
    flops: float
    bytes_read: float
    bytes_written: float
    # attention: causal, sliding window, sinks, soft cap (as the model passed them)
    extra: tuple[tuple[str, Any], ...] = ()

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.bytes_written


@dataclass(frozen=True, slots=True)
class SavedTensor:
    """A tensor autograd keeps for the backward pass (each once; parameters are not counted)."""

    module: str
    shape: tuple[int, ...]
    dtype: str
    bytes: float


@dataclass(frozen=True, slots=True)
class ModuleCall:
    """One forward call of a module (or of a recognised function, ``self_attn.apply_rotary_pos_emb``)
    of one layer: the tensors it was given and returned, each as (a number naming its storage
    within the trace, shape, bytes). Two calls given the same storage read the same tensor (q, k
    and v projections of one input); the boundary is what a fused kernel of the call moves."""

    module: str
    module_type: str
    inputs: tuple[tuple[int, tuple[int, ...], float], ...]
    outputs: tuple[tuple[int, tuple[int, ...], float], ...]


@dataclass(frozen=True, slots=True)
class TracedLayer:
    """One layer kind: the layers it stands for, its exact parameters, operators and saves."""

    kind: str
    indices: tuple[int, ...]
    layer_type: str  # the decoder layer's class name
    params: int
    param_breakdown: tuple[tuple[str, int], ...]  # per module holding parameters of its own
    ops: tuple[TracedOp, ...]
    saved: tuple[SavedTensor, ...]
    calls: tuple[ModuleCall, ...] = ()  # each module call's boundary, in the order they ended

    @property
    def count(self) -> int:
        return len(self.indices)

    def flops(self, phase: str | None = None) -> float:
        return sum(op.flops for op in self.ops if phase is None or op.phase == phase)

    @property
    def saved_bytes(self) -> float:
        return sum(t.bytes for t in self.saved)


@dataclass(frozen=True, slots=True)
class TracedModel:
    """The trace of a config at (micro-batch, sequence): its layer kinds and exact parameters."""

    model_type: str
    micro_batch: int
    seq_length: int
    dtype: str
    total_params: int  # every parameter of the module tree, tied weights once
    embedding_params: int  # the input embedding(s)
    head_params: int  # the output projection when it is not tied to the embedding
    num_layers: int
    layers: tuple[TracedLayer, ...]
    ends: tuple[TracedOp, ...] = field(default=())  # embedding, final norm, head, loss
    # which end each of ``ends`` belongs to: "first" (ran before the layers forward, after them
    # backward: the embedding) or "last" (the final norm, the head, the soft cap, the loss)
    end_stage: tuple[str, ...] = field(default=())
    end_saved: tuple[tuple[str, SavedTensor], ...] = field(default=())  # (end, tensor) autograd keeps
    end_params: tuple[tuple[str, int], ...] = field(default=())  # (module path, own parameters), tied once
    embedding_path: str = ""  # the input embedding's module path ("model.embed_tokens")
    head_path: str = ""  # the output projection's ("lm_head"); "" when the model has none
    tp_plan: tuple[tuple[str, str], ...] = field(default=())  # the model's plan outside the layers
    pp_plan: tuple[str, ...] = field(default=())  # base_model_pp_plan's keys and the model's own, in order

    @property
    def layer_params(self) -> int:
        return sum(layer.params * layer.count for layer in self.layers)
