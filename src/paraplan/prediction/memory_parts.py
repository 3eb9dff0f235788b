"""The parts a GPU's peak memory is cut into: one list, read by every renderer.

Each part is a field of ``StageMemory`` (the JSON key ``memory.<field>_bytes``), one label
(what tables, pictures, the HTML report and ``compare`` print) and one line of description.
The order is the order every renderer lists them (a stacked bar, bottom to top).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MemoryPart:
    field: str  # the StageMemory field; its JSON key is ``memory.<field>_bytes``
    label: str  # what every table, picture and report prints
    description: str  # one line for the documentation and the HTML report
    always: bool = False  # listed even when zero (a table leaves out the other parts that are zero)

    @property
    def key(self) -> str:
        """The key of ``Prediction.to_dict()`` (and a CSV column) holding the worst stage's part."""
        return f"memory.{self.field}_bytes"


_P = MemoryPart

#: The memory parts in the order every renderer lists them; they add up to the GPU's total.
MEMORY_PARTS: tuple[MemoryPart, ...] = (
    _P("weights", "weights", "the parameters this GPU keeps (its ZeRO-3 shard, or all of its stage's)", True),
    _P("gradients", "gradients", "the gradient buffers this GPU keeps between iterations"),
    _P("optimizer_states", "optimizer states", ("Adam's moments and master weights this GPU keeps; at the optimizer step also torch foreach "
       "AdamW's temporaries")),
    _P("workspaces", "workspaces (cuBLAS, TE)",
       "cuBLAS and Transformer Engine workspaces and cached dummy weight gradients, kept all run"),
    _P("activations", "activations", "saved activations of the micro-batches in flight", True),
    _P("logits", "loss logits (extra copies)",
       "the copies of the logits the loss holds beyond the activations' own peak"),
    _P("gathered_params", "gathered weights (ZeRO-3)",
       "ZeRO-3 / FSDP's gathered (unsharded) weights of the layers in flight"),
    _P("buffers", "communication buffers",
       "reduce buckets and unsharded gradients being reduced or accumulated"),
    _P("fragmentation", "allocator fragmentation",
       "what PyTorch's caching allocator reserves beyond the tensors"),
    _P("runtime", "CUDA context + NCCL", "the CUDA context and NCCL's buffers, outside the allocator"),
)

BY_FIELD = {p.field: p for p in MEMORY_PARTS}


def memory_parts_of(stages) -> tuple[MemoryPart, ...]:
    """The parts a table lists for ``stages`` (StageMemory): those always listed and any other
    that is not zero on some stage."""
    stages = tuple(stages)
    return tuple(p for p in MEMORY_PARTS if p.always or any(getattr(m, p.field) > 0 for m in stages))
