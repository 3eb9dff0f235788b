"""Map one GPUModeling single-operator sample onto the inventory operator paraplan counts.

The GPUModeling25 data set (``data/gpumodeling``, README there) times one operator of a
Megatron / GPT-NeoX transformer layer at a time, with the shapes one tensor-parallel rank
sees. A row gives the grid point as floats: ``mp`` (tensor-parallel degree), ``b``
(micro-batch), ``h`` (total attention heads), ``l`` (sequence length), ``dim`` (hidden size)
and, optionally, ``Vp`` (vocabulary rows per rank); each file carries only the columns its
operator needs.

:func:`op_for_sample` turns such a row into the :class:`~paraplan.inventory.ops.Op` that the
inventory produces for that operator. It builds a synthetic :class:`ModelSpec` whose shapes
reproduce the sampled tensors, shards it with :func:`shard_shape` (``tp = mp``, no context or
sequence parallelism, fp16) and picks the operator by name from :func:`count_layer_ops`,
:func:`count_embedding_ops` or :func:`count_head_ops`. No FLOP or byte formula is written
here: whatever the inventory counts is what a calibration (or a learned backend) sees, so
fitted parameters mean exactly what the cost model uses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from paraplan.inventory.ends import count_embedding_ops, count_head_ops
from paraplan.inventory.layer import count_layer_ops
from paraplan.inventory.ops import Op
from paraplan.inventory.shapes import LocalShape, shard_shape
from paraplan.specs import ModelSpec, Precision

__all__ = ["GPT2_VOCAB", "SAMPLE_TAGS", "op_for_sample"]

#: The GPT-2 vocabulary the GPUModeling samples pad (``Vp = ceil(50257 / (128 mp)) * 128``).
GPT2_VOCAB = 50257
_VOCAB_MULTIPLE = 128
#: Head dimension assumed for rows that carry no ``dim`` (softmax rows): the softmax reads and
#: writes [b, h/mp, l, l] scores, whose size does not depend on it.
_DEFAULT_HEAD_DIM = 128
#: Hidden size assumed for rows that carry no ``dim`` (cross-entropy rows): the loss reads
#: [b, l, Vp] logits, whose size does not depend on it.
_DEFAULT_HIDDEN = 1024


def _int(row: Mapping[str, Any], key: str, default: int | None = None) -> int:
    """An integral column of ``row`` (the CSVs store them as floats, e.g. ``2048.0``)."""
    if key not in row:
        if default is None:
            raise ValueError(f"sample row has no {key!r} column (it has: {', '.join(map(str, row))})")
        return default
    value = float(row[key])
    if not value.is_integer() or value < 1:
        raise ValueError(f"sample column {key!r} = {row[key]!r} is not a positive integer")
    return int(value)


def _model(
    row: Mapping[str, Any],
    *,
    hidden: int,
    heads: int,
    kv_channels: int,
    **fields: Any,
) -> ModelSpec:
    """A one-layer synthetic model with the row's sequence length and vocabulary.

    The vocabulary is the row's ``Vp`` times ``mp`` when the row has a ``Vp`` column, else
    GPT-2's 50257 padded to a multiple of 128*mp, as Megatron / GPT-NeoX (and the sampler)
    pad it; either way the rank holds ``Vp`` rows.
    """
    mp = _int(row, "mp", 1)
    vocab: dict[str, Any] = {"vocab_size": GPT2_VOCAB, "make_vocab_size_divisible_by": _VOCAB_MULTIPLE}
    if "Vp" in row:
        vocab["padded_vocab_size"] = _int(row, "Vp") * mp
    return ModelSpec(
        name="gpumodeling-sample",
        num_layers=1,
        hidden_size=hidden,
        num_attention_heads=heads,
        kv_channels=kv_channels,
        seq_length=_int(row, "l"),
        **vocab,
        **fields,
    )


def _shape(model: ModelSpec, row: Mapping[str, Any], *, tp: int | None = None) -> LocalShape:
    """The per-rank shape: ``tp = mp`` (or the given ``tp``), no CP/SP, micro-batch ``b``, in
    the row's ``precision`` (fp16, GPUModeling's, when it names none)."""
    tp = _int(row, "mp", 1) if tp is None else tp
    return shard_shape(model, tp, 1, False, _int(row, "b"), row.get(PRECISION_KEY, Precision.FP16))


def _pick(ops: tuple[Op, ...], name: str) -> Op:
    """The first operator called ``name`` (a layer has two ``res_add``; they are identical)."""
    for op in ops:
        if op.name == name:
            return op
    raise LookupError(f"the inventory has no operator {name!r} (it has: {', '.join(o.name for o in ops)})")


def _split_heads(dim: int, mp: int) -> tuple[int, int]:
    """(heads, head dim) for rows that give no head count: ``mp`` heads of ``dim/mp``.

    Only the product heads*d enters the projections (QKV output width 3*dim/mp, output
    projection input dim/mp), so any split with ``mp | heads`` gives the same operator.
    """
    if dim % mp:
        raise ValueError(f"dim={dim} is not divisible by mp={mp}")
    return mp, dim // mp


def _attention_heads(row: Mapping[str, Any]) -> tuple[int, int, int]:
    """(hidden, heads, head dim) from a row with ``h`` (and ``dim`` when the row has it)."""
    h = _int(row, "h")
    if "dim" not in row:
        return h * _DEFAULT_HEAD_DIM, h, _DEFAULT_HEAD_DIM
    dim = _int(row, "dim")
    if dim % h:
        raise ValueError(f"dim={dim} is not divisible by h={h}")
    return dim, h, dim // h


def _linear(name: str, *, bias: bool) -> Callable[[Mapping[str, Any]], Op]:
    def build(row: Mapping[str, Any]) -> Op:
        dim, mp = _int(row, "dim"), _int(row, "mp", 1)
        heads, d = _split_heads(dim, mp)
        model = _model(row, hidden=dim, heads=heads, kv_channels=d, add_bias_linear=bias, activation="gelu")
        return _pick(count_layer_ops(model, _shape(model, row)), name)

    build.__doc__ = (
        f"``{name}``: the layer GEMM of that name with ``tp = mp`` and a GELU MLP of width 4*dim "
        f"({'with' if bias else 'without'} bias, as the sampler ran it; the bias changes only "
        "the parameter count)."
    )
    return build


def _linear_final(row: Mapping[str, Any]) -> Op:
    """``linear_final``: the LM-head GEMM ``[l*b, dim] x [dim, Vp]`` of :func:`count_head_ops`."""
    dim, mp = _int(row, "dim"), _int(row, "mp", 1)
    heads, d = _split_heads(dim, mp)
    model = _model(row, hidden=dim, heads=heads, kv_channels=d)
    return _pick(count_head_ops(model, _shape(model, row)), "linear_final")


def _unfused(name: str) -> Callable[[Mapping[str, Any]], Op]:
    def build(row: Mapping[str, Any]) -> Op:
        hidden, heads, d = _attention_heads(row)
        model = _model(row, hidden=hidden, heads=heads, kv_channels=d, attention="unfused")
        return _pick(count_layer_ops(model, _shape(model, row)), name)

    build.__doc__ = (
        f"``{name}``: the operator of that name in an unfused-attention layer (no attention "
        "dropout), heads ``h/mp`` of ``dim/h`` on the rank."
    )
    return build


def _scaled_softmax(row: Mapping[str, Any]) -> Op:
    """``ScaledUpperTriangMaskedSoftmax``: Megatron's fused causal-mask softmax is exactly the
    inventory's ``softmax`` ("scaled causal-mask softmax", [b, h/mp, l, l])."""
    return _unfused("softmax")(row)


def _flash(row: Mapping[str, Any]) -> Op:
    """``flash_atten``: the inventory's flash-attention op, with ``exec_fraction = 1``.

    The inventory counts causal flash attention as executing half the full-square FLOPs;
    GPUModeling called ``flash_attn_func(q, k, v)`` with its default ``causal=False``, so the
    sampled kernel executed all of them.
    """
    hidden, heads, d = _attention_heads(row)
    model = _model(row, hidden=hidden, heads=heads, kv_channels=d, attention="flash")
    op = _pick(count_layer_ops(model, _shape(model, row)), "flash_atten")
    return dataclasses.replace(op, exec_fraction=1.0)


def _flash_causal(row: Mapping[str, Any]) -> Op:
    """``flash_atten_causal``: causal flash attention as a GPT layer runs it (paraplan's own
    sampler times it so), the inventory's op as it is (``exec_fraction`` 0.5). Whether a kernel
    really skips the masked half is the device's: the CPU's scaled_dot_product_attention does
    not (the same time either way), FlashAttention on a GPU does."""
    hidden, heads, d = _attention_heads(row)
    model = _model(row, hidden=hidden, heads=heads, kv_channels=d, attention="flash")
    return _pick(count_layer_ops(model, _shape(model, row)), "flash_atten")


def _norm(name: str, normalization: str) -> Callable[[Mapping[str, Any]], Op]:
    def build(row: Mapping[str, Any]) -> Op:
        dim = _int(row, "dim")
        model = _model(row, hidden=dim, heads=1, kv_channels=dim, normalization=normalization)
        return _pick(count_layer_ops(model, _shape(model, row, tp=1)), name)

    build.__doc__ = (
        f"``{name}``: the input norm over ``[l, b, dim]``. Norms are not split by tensor "
        "parallelism (and the rows have no ``mp``), so the shape uses ``tp = 1``."
    )
    return build


def _rope(row: Mapping[str, Any]) -> Op:
    """``RoPE``: GPT-NeoX rotary embedding of q and k over the full head dim
    (``rotary_percent = 1``), ``[l, b, h/mp, dim/h]`` each: its unfused ``apply_rotary_pos_emb``
    (slices, a negation, a concatenation, multiplies and adds: ``rope_fusion`` off)."""
    hidden, heads, d = _attention_heads(row)
    model = _model(
        row, hidden=hidden, heads=heads, kv_channels=d, position_embedding="rotary", rotary_percent=1.0
    ).model_copy(update={"rope_fusion": False})
    return _pick(count_layer_ops(model, _shape(model, row)), "RoPE")


def _gelu(row: Mapping[str, Any]) -> Op:
    """``gelu``: the MLP activation over ``[l, b, 4*dim/mp]`` (GELU MLP of width 4*dim)."""
    dim, mp = _int(row, "dim"), _int(row, "mp", 1)
    heads, d = _split_heads(dim, mp)
    model = _model(row, hidden=dim, heads=heads, kv_channels=d, activation="gelu")
    return _pick(count_layer_ops(model, _shape(model, row)), "gelu")


def _res_add(row: Mapping[str, Any]) -> Op:
    """``res_add``: a residual add of two ``[l, b, dim]`` tensors (not split by TP; ``tp = 1``).

    The sampler's backward time is a copy of the forward one; callers should use only the
    forward phase.
    """
    dim = _int(row, "dim")
    model = _model(row, hidden=dim, heads=1, kv_channels=dim)
    return _pick(count_layer_ops(model, _shape(model, row, tp=1)), "res_add")


def _embedding(row: Mapping[str, Any]) -> Op:
    """``embedding``: the vocab-parallel word-embedding lookup, table ``[Vp, dim]``, ids
    ``[b, l]`` (rotary model, so no learned-position add)."""
    dim, mp = _int(row, "dim"), _int(row, "mp", 1)
    heads, d = _split_heads(dim, mp)
    model = _model(row, hidden=dim, heads=heads, kv_channels=d, position_embedding="rotary")
    return _pick(count_embedding_ops(model, _shape(model, row)), "embedding")


def _cross_entropy(row: Mapping[str, Any]) -> Op:
    """``parallel_cross_entropy_128``: the inventory's ``cross_entropy`` (vocab-parallel, fp32)
    over ``[b, l, Vp]`` logits. The rows have no ``dim``; the loss does not depend on it."""
    mp = _int(row, "mp", 1)
    dim = _DEFAULT_HIDDEN * mp
    model = _model(row, hidden=dim, heads=mp, kv_channels=_DEFAULT_HIDDEN)
    return _pick(count_head_ops(model, _shape(model, row)), "cross_entropy")


_BUILDERS: dict[str, Callable[[Mapping[str, Any]], Op]] = {
    "linear1": _linear("linear1", bias=True),
    "linear2": _linear("linear2", bias=False),
    "linear3": _linear("linear3", bias=False),
    "linear4": _linear("linear4", bias=False),
    "linear_final": _linear_final,
    "baddbmm": _unfused("baddbmm"),
    "bmm": _unfused("bmm"),
    "softmax": _unfused("softmax"),
    "ScaledUpperTriangMaskedSoftmax": _scaled_softmax,
    "flash_atten": _flash,
    "flash_atten_causal": _flash_causal,
    "layernorm": _norm("layernorm", "layernorm"),
    "RMSlayernorm": _norm("RMSlayernorm", "rmsnorm"),
    "RoPE": _rope,
    "gelu": _gelu,
    "res_add": _res_add,
    "embedding": _embedding,
    "parallel_cross_entropy_128": _cross_entropy,
}

#: Every GPUModeling operator tag :func:`op_for_sample` understands.
SAMPLE_TAGS: tuple[str, ...] = tuple(_BUILDERS)


#: The key under which ``op_for_sample`` passes the sample's precision to the builders.
PRECISION_KEY = "precision"


#: A samples-store record's shape columns (``paraplan.samples.schema``), each with the name
#: :func:`op_for_sample` reads it under.
SHAPE_COLUMNS: dict[str, str] = {"mp": "mp", "b": "b", "h": "h", "l": "l", "dim": "dim", "vp": "Vp"}


def sample_shape(record: Mapping[str, Any], missing: Callable[[Any], bool]) -> dict[str, int]:
    """:func:`op_for_sample`'s row for one samples-store record: its shape columns that are
    set (``missing`` tells an unset one: the store's nulls), as integers."""
    return {key: int(record[column]) for column, key in SHAPE_COLUMNS.items() if not missing(record[column])}


def op_for_sample(tag: str, row: Mapping[str, float], precision: Precision = Precision.FP16) -> Op:
    """The inventory operator timed by one GPUModeling operator row.

    ``tag`` is the file's operator tag (``linear1`` ... ``parallel_cross_entropy_128``, see
    :data:`SAMPLE_TAGS`); ``row`` maps column names (``mp``, ``b``, ``h``, ``l``, ``dim``,
    ``Vp``) to values; extra columns such as the timings are ignored. Compare the measured
    forward time with phase FWD and the measured backward time with BWD_INPUT + BWD_WEIGHT.
    ``precision`` is the one the row was timed in: it sets the bytes per element of the
    operator's traffic (GPUModeling timed fp16; paraplan's own sampler records fp32 too).
    Raises ``ValueError`` for an unknown tag or a row whose shape cannot be built.
    """
    try:
        build = _BUILDERS[tag]
    except KeyError:
        raise ValueError(
            f"unknown GPUModeling operator tag {tag!r} (known: {', '.join(SAMPLE_TAGS)})"
        ) from None
    return build({**row, PRECISION_KEY: Precision(precision)})
