"""Trace a Hugging Face model's own code: the aten operators of one layer of each kind.

The model is built from its config on PyTorch's meta device (no weights, no memory), its
decoder layers are cut to one representative of each distinct kind (same module tree, same
parameter shapes, same attention type), and a causal-LM step runs forward and backward at the
job's micro-batch and sequence length under a ``TorchDispatchMode``. Each aten operator is
recorded with the module that ran it (``torch.utils.module_tracker``), its phase, input and
output shapes, dtype, FLOPs (``torch.utils.flop_counter``'s formulas: matmuls and
convolutions; one per output element for pointwise operators) and the bytes it reads and
writes (views move none). What autograd saves for the backward pass comes from
``torch.autograd.graph.saved_tensors_hooks``, each tensor once, parameters excluded.

The attention core is recorded as one operator (``attention``) through a function registered
in ``transformers``' ``AttentionInterface``: it carries the causal flag, the sliding window,
the attention sinks and the soft cap the model passes, as a fused kernel would run them, and
its FLOPs follow the inventory's convention (the full square, 4 b h s s_kv d).

``torch`` and ``transformers`` are the ``hf`` extra; nothing here imports them at module
import. Remote code runs only with ``trust_remote_code=True``.

The pieces: ``hfrecords`` (what is recorded), ``hfbuild`` (the model on the meta device, its
layer kinds, its parameters), ``hfrecorder`` (the dispatch recorder), ``hfhooks`` (the attention
core and the routed experts as recorded kernels) and ``hfcache`` (the disk cache).
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from paraplan.inventory.hfbuild import (
    _WHERE,
    ParameterCount,
    _build,
    _decoder_layers,
    _embedding_and_head,
    _kind_label,
    _need,
    _signature,
    build_config,
    count_parameters,
    quiet_transformers,
    read_config,
)
from paraplan.inventory.hfcache import TRACE_VERSION, _key, cache_dir, load, store
from paraplan.inventory.hfhooks import (
    _BOX,
    _group_every_expert,
    _register_attention,
    _register_experts,
    unwrap_functions,
    wrap_functions,
)
from paraplan.inventory.hfrecorder import _Recorder
from paraplan.inventory.hfrecords import SavedTensor, TracedLayer, TracedModel, TracedOp
from paraplan.specs import ConfigError

__all__ = [
    "TRACE_VERSION",
    "ParameterCount",
    "SavedTensor",
    "TracedLayer",
    "TracedModel",
    "TracedOp",
    "build_config",
    "cache_dir",
    "count_parameters",
    "read_config",
    "trace_layer_ops",
    "trace_model",
]


def trace_model(
    config: dict[str, Any], micro_batch: int, seq_length: int, *, dtype: str = "bfloat16",
    trust_remote_code: bool = False,
) -> TracedModel:
    """Trace ``config`` (a config.json mapping) at ``micro_batch`` x ``seq_length`` tokens."""
    with quiet_transformers():
        return _trace_model(config, micro_batch, seq_length, dtype=dtype, trust_remote_code=trust_remote_code)


def _trace_model(
    config: dict[str, Any], micro_batch: int, seq_length: int, *, dtype: str, trust_remote_code: bool,
) -> TracedModel:
    torch = _need("torch")
    hf_config = build_config(config, trust_remote_code=trust_remote_code)
    _check_fits(hf_config, micro_batch, seq_length)
    attention = _register_attention()
    num_layers = int(getattr(hf_config, "num_hidden_layers", 0) or getattr(hf_config, "n_layer", 0) or 0)
    torch_dtype = getattr(torch, dtype)
    hf_config._attn_implementation = attention
    experts = _register_experts() or "batched_mm"
    if hasattr(hf_config, "_experts_implementation"):
        hf_config._experts_implementation = experts
    _, model = _build(config, trust_remote_code, hf_config, dtype=torch_dtype, attn_implementation=attention,
                      experts_implementation=experts)
    total = sum(p.numel() for p in model.parameters())
    embedding_params, head_params = _embedding_and_head(model)
    list_name, layers = _decoder_layers(model, num_layers)
    num_layers = len(layers)
    types = list(getattr(hf_config, "layer_types", None) or [None] * num_layers)
    kinds: dict[str, list[int]] = {}
    for i, layer in enumerate(layers):
        kinds.setdefault(_signature(layer, types[i] if i < len(types) else None), []).append(i)
    reps = [indices[0] for indices in kinds.values()]
    kept = torch.nn.ModuleList([layers[i] for i in reps])
    parent = model.get_submodule(list_name.rpartition(".")[0]) if "." in list_name else model
    setattr(parent, list_name.rpartition(".")[2], kept)
    hf_config.num_hidden_layers = len(reps)
    if getattr(hf_config, "layer_types", None):
        try:
            hf_config.layer_types = [types[i] for i in reps]
        except AttributeError:  # derived from other fields (Mamba-2): the kept layers keep theirs
            pass
    rec = _Recorder(model, {id(layer): slot for slot, layer in enumerate(kept)})
    rec.module_types = {(None, name): type(module).__name__ for name, module in model.named_modules()}
    rec.module_types.update({
        (slot, name): type(module).__name__ for slot, layer in enumerate(kept) for name, module in layer.named_modules()
    })
    _group_every_expert(hf_config, kept)
    tokens = torch.zeros((micro_batch, seq_length), dtype=torch.long, device="meta")
    _BOX[0] = rec
    undo = wrap_functions(rec, kept)
    try:
        with rec:
            out = model(input_ids=tokens, labels=tokens, use_cache=False)
            out.loss.backward()
    except (RuntimeError, NotImplementedError, ValueError, TypeError, IndexError, AttributeError,
            AssertionError, KeyError, OverflowError) as err:
        if os.environ.get("PARAPLAN_TRACE_DEBUG"):
            raise
        first = str(err).strip().splitlines()[0][:120] if str(err).strip() else type(err).__name__
        if isinstance(err, OverflowError) or "overflow" in first.lower():
            raise ConfigError(_too_big(micro_batch, seq_length, first)) from None
        raise ConfigError(
            f"{_WHERE}: model_type {config.get('model_type')!r}: its code does not run on the meta device "
            f"({first}); describe the model by its fields instead (inventory: hand)"
        ) from None
    finally:
        _BOX[0] = None
        unwrap_functions(undo)
    traced: list[TracedLayer] = []
    for slot, (_sig, indices) in enumerate(kinds.items()):
        layer = kept[slot]
        ops = tuple(op for s, op in rec.ops if s == slot)
        saved = tuple(t for s, t in rec.saved if s == slot)
        breakdown = tuple(
            (name, sum(p.numel() for p in child.parameters(recurse=False)))
            for name, child in layer.named_modules() if any(True for _ in child.parameters(recurse=False))
        )
        traced.append(TracedLayer(
            kind=_kind_label(layer, types[indices[0]] if indices[0] < len(types) else None, indices[0]),
            indices=tuple(indices),
            layer_type=type(layer).__name__,
            params=sum(p.numel() for p in layer.parameters()),
            param_breakdown=breakdown,
            ops=ops,
            saved=saved,
            calls=tuple(c for s, c in rec.calls if s == slot),
        ))
    ends, stages = _end_stages(rec.ops)
    where = {op.module: stage for op, stage in zip(ends, stages, strict=True) if op.phase == "fwd"}
    paths = {id(m): n for n, m in model.named_modules()}
    return TracedModel(
        model_type=str(config.get("model_type")), micro_batch=micro_batch, seq_length=seq_length, dtype=dtype,
        total_params=int(total), embedding_params=int(embedding_params), head_params=int(head_params),
        num_layers=num_layers, layers=tuple(traced), ends=ends, end_stage=stages,
        end_saved=tuple((where.get(t.module, "last"), t) for s, t in rec.saved if s is None),
        end_params=_end_params(model, list_name),
        embedding_path=paths.get(id(model.get_input_embeddings()), ""),
        head_path=paths.get(id(model.get_output_embeddings()), "") if model.get_output_embeddings() is not None else "",
        tp_plan=_model_plan(model, hf_config),
        pp_plan=_pipeline_plan(model, hf_config),
    )


_LIMIT = 2**63  # bytes (and elements) a torch tensor's size is held in: a signed 64-bit integer


def _too_big(micro_batch: int, seq_length: int, why: str) -> str:
    return (f"model.seq_length: micro-batch {micro_batch:,} x {seq_length:,} tokens makes tensors larger than torch "
            f"can describe even on the meta device ({why}); use a shorter seq_length or micro_batch_size")


def _check_fits(hf_config, micro_batch: int, seq_length: int) -> None:
    """One line, before tracing, when the job's tokens times the model's widest per-token
    tensor (the logits: the vocabulary, in float32) pass 2^63 bytes."""
    text = getattr(hf_config, "get_text_config", lambda: hf_config)()
    widths = [getattr(text, k, 0) for k in ("vocab_size", "hidden_size", "intermediate_size", "d_model", "n_embd")]
    widest = max(int(w) for w in widths if isinstance(w, int)) if any(isinstance(w, int) for w in widths) else 1
    if int(micro_batch) * int(seq_length) * widest * 4 >= _LIMIT:
        raise ConfigError(_too_big(micro_batch, seq_length, f"the float32 logits alone exceed 2^63 bytes: "
                                   f"{micro_batch:,} x {seq_length:,} x {widest:,} x 4"))


def _end_stages(ops) -> tuple[tuple[TracedOp, ...], tuple[str, ...]]:
    """The operators outside the layers, each with its end: "first" when it ran before the
    layers' forward or after their backward (the embedding), "last" otherwise (norm, head, loss)."""
    fwd = [i for i, (s, op) in enumerate(ops) if s is not None and op.phase == "fwd"]
    bwd = [i for i, (s, op) in enumerate(ops) if s is not None and op.phase == "bwd"]
    first_fwd, last_bwd = (fwd[0] if fwd else len(ops)), (bwd[-1] if bwd else -1)
    ends, stages = [], []
    for i, (s, op) in enumerate(ops):
        if s is None:
            ends.append(op)
            before = i < first_fwd if op.phase == "fwd" else i > last_bwd
            stages.append("first" if before else "last")
    return tuple(ends), tuple(stages)


def _end_params(model, list_name: str) -> tuple[tuple[str, int], ...]:
    """Each module outside the decoder layers with parameters of its own (a tied weight once,
    where it is first met: the input embedding)."""
    seen: set[int] = set()
    out = []
    for name, module in model.named_modules():
        if name == list_name or name.startswith(list_name + "."):
            continue
        n = 0
        for p in module.parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                n += p.numel()
        if n:
            out.append((name, int(n)))
    return tuple(out)


def _model_plan(model, hf_config) -> tuple[tuple[str, str], ...]:
    """The tensor-parallel styles the model publishes for modules outside its layers: the
    config's ``base_model_tp_plan`` (under the base model's prefix) and the causal LM's own
    ``_tp_plan`` (``lm_head: colwise_gather_output``)."""
    plan: dict[str, str] = {}
    prefix = getattr(model, "base_model_prefix", "") or ""
    for key, style in (getattr(hf_config, "base_model_tp_plan", None) or {}).items():
        if ".*." not in key:
            plan[f"{prefix}.{key}" if prefix and hasattr(model, prefix) else key] = str(style)
    for key, style in (getattr(type(model), "_tp_plan", None) or {}).items():
        if ".*." not in key:
            plan[key] = str(style)
    return tuple(sorted(plan.items()))


def _pipeline_plan(model, hf_config) -> tuple[str, ...]:
    """The model's pipeline plan (``base_model_pp_plan``: embedding, layers, norm; the causal
    LM's ``_pp_plan``: the head), as module paths in order; () when it publishes none."""
    base = getattr(hf_config, "base_model_pp_plan", None) or {}
    if not base:
        return ()
    prefix = getattr(model, "base_model_prefix", "") or ""
    keys = [f"{prefix}.{k}" if prefix and hasattr(model, prefix) else k for k in base]
    return tuple(keys) + tuple(getattr(type(model), "_pp_plan", None) or {})


@functools.lru_cache(maxsize=32)
def _cached(blob: str, micro_batch: int, seq_length: int, dtype: str, trust_remote_code: bool) -> TracedModel:
    config = json.loads(blob)
    path = cache_dir() / f"{_key(config, micro_batch, seq_length, dtype)}.json"
    trace = load(path)
    if trace is None:
        trace = trace_model(config, micro_batch, seq_length, dtype=dtype, trust_remote_code=trust_remote_code)
        store(path, trace)
    return trace


def trace_layer_ops(
    config: dict[str, Any], micro_batch: int, seq_length: int, *, dtype: str = "bfloat16",
    trust_remote_code: bool = False,
) -> TracedModel:
    """The trace of ``config`` at (micro-batch, sequence), from memory, the disk cache
    (``cache_dir()``, keyed by the config, the shapes and the torch/transformers versions), or
    traced now (a second or two for an 8B model)."""
    blob = json.dumps(config, sort_keys=True)
    return _cached(blob, int(micro_batch), int(seq_length), dtype, bool(trust_remote_code))
