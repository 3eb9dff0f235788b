"""The tensor dimensions one rank sees for one micro-batch, derived once per job."""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.specs import ModelSpec, ParallelPlan, Precision

# Bytes of one activation element. FP8 training keeps activations in 16-bit between GEMMs.
_ACTIVATION_BYTES = {Precision.FP32: 4, Precision.FP16: 2, Precision.BF16: 2, Precision.FP8: 2}


@dataclass(frozen=True, slots=True)
class LocalShape:
    """Per-rank sizes: ``b`` micro-batch, ``s`` query tokens (seq/cp), ``s_kv`` key tokens,
    ``s_norm`` tokens seen by norms/dropout/residual (s/tp with sequence parallelism),
    ``h`` hidden, ``heads``/``groups`` attention heads and KV groups on this rank, ``d``
    head dim, ``ffn`` MLP width on this rank, ``vocab`` LM-head rows on this rank, ``e``
    activation bytes per element, ``fp8_linears`` whether the layers' linear GEMMs run in FP8
    (FP8 training as Transformer Engine runs it: only the linear layers of the transformer
    layers; attention, the LM head, norms and the optimizer stay in 16/32 bits)."""

    b: int
    s: int
    s_kv: int
    s_norm: int
    h: int
    heads: int
    groups: int
    d: int
    ffn: int
    vocab: int
    tp: int
    e: int
    fp8_linears: bool = False

    @property
    def tokens(self) -> int:
        return self.b * self.s


def local_shape(model: ModelSpec, plan: ParallelPlan, precision: Precision) -> LocalShape:
    return shard_shape(
        model, plan.tp, plan.cp, plan.sequence_parallel, plan.micro_batch_size, precision
    )


def shard_shape(
    model: ModelSpec, tp: int, cp: int, sequence_parallel: bool, micro_batch: int, precision: Precision
) -> LocalShape:
    """The shape for explicit degrees (``tp = cp = 1`` gives the unsharded model)."""
    s = model.seq_length // cp
    return LocalShape(
        b=micro_batch,
        s=s,
        s_kv=model.seq_length,
        s_norm=s // tp if sequence_parallel else s,
        h=model.hidden_size,
        heads=model.num_attention_heads // tp,
        groups=max(1, model.num_query_groups // tp),
        d=model.kv_channels,
        ffn=model.ffn_hidden_size // tp,
        vocab=model.vocab_for(tp) // tp,
        tp=tp,
        e=_ACTIVATION_BYTES[precision],
        fp8_linears=precision is Precision.FP8,
    )
