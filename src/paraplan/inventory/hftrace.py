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
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paraplan.specs import ConfigError

_WHERE = "model.hf_config"
TRACE_VERSION = 2  # bump when the recorded fields change: old cache entries are ignored


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
class TracedLayer:
    """One layer kind: the layers it stands for, its exact parameters, operators and saves."""

    kind: str
    indices: tuple[int, ...]
    layer_type: str  # the decoder layer's class name
    params: int
    param_breakdown: tuple[tuple[str, int], ...]  # per module holding parameters of its own
    ops: tuple[TracedOp, ...]
    saved: tuple[SavedTensor, ...]

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

    @property
    def layer_params(self) -> int:
        return sum(layer.params * layer.count for layer in self.layers)


def _need(module: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"{_WHERE}: {module} is not installed: tracing a model's code needs the 'hf' extra "
            "(pip install 'paraplan[hf]')"
        ) from None


def read_config(path: Path) -> dict[str, Any]:
    """A config.json (or a model directory holding one) as a mapping."""
    from paraplan.catalog.hf import _read

    return _read(Path(path))


def build_config(config: dict[str, Any], *, trust_remote_code: bool = False) -> Any:
    """The ``transformers`` config object of ``config`` (a config.json's mapping)."""
    transformers = _need("transformers")
    model_type = config.get("model_type")
    if config.get("auto_map") and not trust_remote_code:
        raise ConfigError(
            f"{_WHERE}: auto_map: this config needs the model's own remote code; paraplan runs it only "
            "when told to (--trust-remote-code)"
        )
    if not model_type:
        raise ConfigError(f"{_WHERE}: model_type: missing; a config.json names its model_type")
    fields = {k: v for k, v in config.items() if k != "model_type"}
    try:
        cls = transformers.AutoConfig.for_model
        return cls(str(model_type), **fields)
    except (ValueError, KeyError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(
            f"{_WHERE}: model_type {model_type!r}: transformers {transformers.__version__} cannot build it "
            f"({first[:120]}); upgrade transformers or describe the model by its fields"
        ) from None


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _shapes(values) -> tuple[tuple[int, ...], ...]:
    import torch

    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(tuple(int(d) for d in v.shape))
        elif isinstance(v, (list, tuple)):
            out.extend(_shapes(v))
    return tuple(out)


def _tensors(values):
    import torch

    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from _tensors(v)


def _bytes(values) -> float:
    return float(sum(t.numel() * t.element_size() for t in _tensors(values)))


def _attention_flops(q, k, v) -> float:
    """Q K^T and P V over the full square: 2 b h s s_kv (d_qk + d_v)."""
    b, h, s, d_qk = q.shape
    s_kv, d_v = k.shape[-2], v.shape[-1]
    return 2.0 * b * h * s * s_kv * (d_qk + d_v)


class _Recorder:
    """Records aten operators (a TorchDispatchMode) and saved tensors (saved_tensors_hooks).

    Forward, an operator belongs to the innermost module running (a stack kept by global module
    hooks). Backward, it belongs to the module whose forward made the autograd node running
    (``torch._C._current_autograd_node``): each module's forward post-hook labels the nodes it
    made, innermost first, walking back from its outputs to its inputs."""

    def __init__(self, model, layers: dict[int, int]):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils.flop_counter import flop_registry

        self.paths = {id(m): n for n, m in model.named_modules()}
        self.types = {id(m): type(m).__name__ for m in model.modules()}
        self.layers = layers  # id of each kept layer module -> its slot
        self.layer_path = {slot: self.paths[i] for i, slot in layers.items()}
        self.stack: list[Any] = []
        self.ops: list[tuple[int | None, TracedOp]] = []
        self.saved: list[tuple[int | None, SavedTensor]] = []
        self._keep: list[Any] = []  # saved tensors stay alive, so their storages are never reused
        self._seen_saved: set[int] = set()
        self._params = {p.untyped_storage()._cdata for p in model.parameters()}
        self._in_attention = False
        self._boundaries: dict[int, list] = {}
        self.module_types: dict[tuple[int | None, str], str] = {}
        recorder = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                if recorder._in_attention:
                    return out
                schema = func._schema
                is_view = bool(schema.returns) and all(r.alias_info is not None for r in schema.returns)
                packet = func._overloadpacket
                outs = out if isinstance(out, (tuple, list)) else (out,)
                flops = 0.0
                if packet in flop_registry:
                    flops = float(flop_registry[packet](*args, **kwargs, out_val=out))
                elif torch.Tag.pointwise in func.tags:
                    flops = float(sum(t.numel() for t in _tensors(outs)))
                name = str(func).removeprefix("aten.").removesuffix(".default")
                inputs = (*args, *kwargs.values())
                recorder._record(name, inputs, outs, flops, 0.0 if is_view else _bytes(inputs),
                                 0.0 if is_view else _bytes(outs))
                return out

        self.mode = Mode()
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda x: x)

    def __enter__(self):
        import torch

        mod = torch.nn.modules.module
        self._handles = [
            mod.register_module_forward_pre_hook(self._pre),
            mod.register_module_forward_hook(self._post),
        ]
        self.mode.__enter__()
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)
        self.mode.__exit__(*exc)
        for handle in self._handles:
            handle.remove()

    def _pre(self, module, args):
        self.stack.append(module)
        self._boundaries[id(module)] = [t.grad_fn for t in _tensors(args) if t.grad_fn is not None]

    def _post(self, module, args, output):
        if self.stack and self.stack[-1] is module:
            self.stack.pop()
        # the node objects stay referenced during the walk, so their ids are not reused
        boundary = self._boundaries.pop(id(module), [])
        stop = {id(n) for n in boundary}
        held: list[Any] = []
        label = self._label(module)
        todo = [t.grad_fn for t in _tensors(output if isinstance(output, (tuple, list)) else (output,))
                if t.grad_fn is not None]
        if isinstance(output, dict):  # a ModelOutput
            todo += [t.grad_fn for t in _tensors(list(output.values())) if t.grad_fn is not None]
        seen: set[int] = set()
        while todo:
            node = todo.pop()
            if node is None or id(node) in seen or id(node) in stop:
                continue
            seen.add(id(node))
            held.append(node)
            if "paraplan" not in node.metadata:
                node.metadata["paraplan"] = label
            todo.extend(n for n, _ in node.next_functions if n is not None)

    def _label(self, module) -> tuple[int | None, str]:
        """(layer slot, path inside the layer) of ``module``; (None, its path) outside the layers."""
        path = self.paths.get(id(module), "")
        for slot, layer in self.layer_path.items():
            if path == layer:
                return slot, ""
            if path.startswith(layer + "."):
                return slot, path[len(layer) + 1:]
        return None, path

    def where(self) -> tuple[int | None, str]:
        """(layer slot, path inside the layer) of the module running now."""
        import torch

        node = torch._C._current_autograd_node()
        if node is not None:
            return node.metadata.get("paraplan", (None, ""))
        if not self.stack:
            return None, ""
        return self._label(self.stack[-1])

    def _record(self, name, inputs, outs, flops, read, written, extra=()):
        import torch

        slot, path = self.where()
        node = torch._C._current_autograd_node()
        dtypes = [t.dtype for t in _tensors(inputs) if t.is_floating_point()] or [
            t.dtype for t in _tensors(outs)
        ] or [torch.float32]
        op = TracedOp(
            module=path,
            module_type=self.module_types.get((slot, path), ""),
            aten=name,
            phase="bwd" if node is not None else "fwd",
            shapes=_shapes(inputs),
            out_shapes=_shapes(outs),
            dtype=str(dtypes[0]).removeprefix("torch."),
            flops=flops,
            bytes_read=read,
            bytes_written=written,
            extra=tuple(extra),
        )
        self.ops.append((slot, op))

    def _pack(self, tensor):
        storage = tensor.untyped_storage()._cdata
        if storage not in self._params and storage not in self._seen_saved:
            self._seen_saved.add(storage)
            self._keep.append(tensor)
            slot, path = self.where()
            self.saved.append((slot, SavedTensor(
                module=path, shape=tuple(int(d) for d in tensor.shape),
                dtype=str(tensor.dtype).removeprefix("torch."),
                bytes=float(tensor.untyped_storage().nbytes()),
            )))
        return tensor


def _attention_function(recorder_box: list):
    """The attention core as one recorded operator, forward and backward."""
    import torch

    class Core(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, info):
            ctx.info = info
            ctx.save_for_backward(q, k, v)
            rec = recorder_box[0]
            out = q.new_empty((*q.shape[:-1], v.shape[-1]))
            if rec is not None:
                rec._in_attention = True
                ctx.lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
                rec._pack(ctx.lse)  # the logsumexp a flash kernel keeps
                rec._record("attention", (q, k, v), (out,), _attention_flops(q, k, v),
                            _bytes((q, k, v)), _bytes((out,)), info)
                rec._in_attention = False
            return out

        @staticmethod
        def backward(ctx, grad):
            q, k, v = ctx.saved_tensors
            rec = recorder_box[0]
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            if rec is not None:
                rec._in_attention = True
                # dQ, dK, dV recompute the scores: 5 matmuls against the forward's 2
                rec._record("attention", (q, k, v, grad), (dq, dk, dv), 2.5 * _attention_flops(q, k, v),
                            _bytes((q, k, v, grad, grad)), _bytes((dq, dk, dv)), ctx.info)
                rec._in_attention = False
            return dq, dk, dv, None

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        heads, groups = query.shape[1], key.shape[1]  # grouped-query: each K/V head read once
        info = (
            ("causal", bool(getattr(module, "is_causal", True))),
            ("sliding_window", kwargs.get("sliding_window") or None),
            ("sinks", kwargs.get("s_aux") is not None),
            ("softcap", kwargs.get("softcap")),
            ("heads", int(heads)),
            ("groups", int(groups)),
        )
        out = Core.apply(query, key, value, info)
        return out.transpose(1, 2).contiguous(), None

    return attention


def _experts_function(recorder_box: list):
    """The routed experts of a MoE block as one grouped GEMM, forward and backward.

    ``transformers``' eager ``batched_mm`` gathers each routed token's expert weights
    (``gate_up_proj[expert_ids]``), which reads S = tokens x top-k copies of the weights; a
    grouped GEMM (Megatron's TEGroupedMLP, ``grouped_mm``) reads each expert's weights once.
    Recorded here as a training kernel runs it: forward the up (gate+up) and down GEMMs over
    the S routed rows plus the gate's elementwise work; backward the data gradient (``grouped_mm``)
    and the weight gradient (``grouped_mm`` marked ``weight_grad``, its output the experts' weights,
    flattened),
    each the forward's GEMM FLOPs. Saved for backward: the permuted input, the up projection's
    output and the activation's output."""
    import torch

    class Grouped(torch.autograd.Function):
        @staticmethod
        def forward(ctx, hidden, weights, info, *params):
            rec = recorder_box[0]
            ctx.info = info
            if rec is not None:
                rec._in_attention = True  # the allocations below are no operators of the model
            # a grouped kernel keeps the permuted rows (packed below), not the block's input
            ctx.like = (hidden.new_empty(hidden.shape), weights.new_empty(weights.shape))
            out = hidden.new_empty(hidden.shape)
            if rec is not None:
                s, h = info["rows"], hidden.shape[-1]
                e, up, down, inter = info["experts"], info["up"], info["down"], info["inter"]
                item = hidden.element_size()
                gemm = 2.0 * s * (up + down) / e  # each row meets one expert's weights
                wbytes = float(sum(p.numel() * p.element_size() for p in params))
                act = float(s * inter)
                rows_in = hidden.new_empty((s, h))
                fc1 = hidden.new_empty((s, inter * info["gate"]))
                act_out = hidden.new_empty((s, inter))
                for t in (rows_in, fc1, act_out):
                    rec._pack(t)
                # read: the rows (up), the gate's input, the down GEMM's input, the rows to
                # combine, each expert's weights once; written: the up output, the gate's
                # output, the down output and the combined tokens
                tokens = s / info["top_k"]
                rec._record("grouped_mm", (hidden, weights, *params), (out,), gemm + act,
                            2.0 * s * h * item + wbytes + act * item * (1 + info["gate"]),
                            (s + tokens) * h * item + act * item * (1 + info["gate"]),
                            (("experts", e), ("top_k", info["top_k"]), ("rows", s)))
                rec._in_attention = False
            return out

        @staticmethod
        def backward(ctx, grad):
            hidden, weights = ctx.like
            info = ctx.info
            rec = recorder_box[0]
            if rec is not None:
                rec._in_attention = True
            grads = [torch.empty_like(p) for p in info["params"]]
            d_hidden, d_weights = torch.empty_like(hidden), torch.empty_like(weights)
            if rec is not None:
                s, h = info["rows"], hidden.shape[-1]
                e, up, down, inter = info["experts"], info["up"], info["down"], info["inter"]
                item = hidden.element_size()
                gemm = 2.0 * s * (up + down) / e
                wbytes = float(sum(p.numel() * p.element_size() for p in info["params"]))
                act = float(s * inter)
                w = sum(p.numel() for p in info["params"])
                rec._record("grouped_mm", (grad, *info["params"]), (hidden,), gemm + 2.0 * act,
                            2.0 * s * h * item + wbytes + 3.0 * act * item * (1 + info["gate"]),
                            2.0 * s * h * item + act * item * (1 + info["gate"]),
                            (("experts", e), ("rows", s)))
                rec._record("grouped_mm", (grad, hidden), (hidden.new_empty((w,)),), gemm,
                            2.0 * s * h * item + act * item * (1 + info["gate"]), wbytes,
                            (("experts", e), ("rows", s), ("weight_grad", True)))
                rec._in_attention = False
            return (d_hidden, d_weights, None, *grads)

    def grouped(module, hidden, weights, tokens: int, top_k: int):
        gate = bool(getattr(module, "has_gate", True)) and hasattr(module, "gate_up_proj")
        up_w = module.gate_up_proj if gate else module.up_proj
        params = [p for p in module.parameters(recurse=True) if p.requires_grad]
        e = int(getattr(module, "num_experts", up_w.shape[0]))
        up = up_w.numel()
        down = module.down_proj.numel()
        out_dim = up // e // hidden.shape[-1]  # per expert: 2 x intermediate with a gate
        inter = out_dim // 2 if gate else out_dim
        info = {"rows": tokens * top_k, "experts": e, "up": up, "down": down,
                "inter": inter, "gate": 2 if gate else 1, "top_k": top_k, "params": params}
        return Grouped.apply(hidden, weights, info, *params)

    def experts(module, hidden_states, top_k_index, top_k_weights):
        top_k = int(top_k_index.shape[-1])
        return grouped(module, hidden_states, top_k_weights, int(hidden_states.shape[0]), top_k)

    def every_expert(module, top_k: int):
        """A forward for experts written to run every token through every expert (Llama 4's
        reference code: the input is the tokens repeated per expert, scaled by the router's
        scores, zero where not routed): recorded as the grouped GEMM of the top-k rows."""

        def forward(hidden_states):
            e = int(getattr(module, "num_experts", module.down_proj.shape[0]))
            weights = hidden_states.new_empty((1,))
            return grouped(module, hidden_states, weights, int(hidden_states.shape[0]) // e, top_k)

        return forward

    experts.every_expert = every_expert
    return experts


_BOX: list = [None]


def _group_every_expert(hf_config, layers) -> None:
    """Experts whose own code runs every token through every expert (a 3-D ``gate_up_proj``, no
    ``ExpertsInterface``, ``forward(hidden_states)`` over experts x tokens rows) run as the
    recorded grouped GEMM of the rows the router sends them."""
    import inspect

    text = getattr(hf_config, "get_text_config", lambda: hf_config)()
    top_k = int(getattr(text, "num_experts_per_tok", 0) or 0)
    if _register_experts() is None or top_k <= 0:
        return
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    every_expert = ALL_EXPERTS_FUNCTIONS["paraplan_trace"].every_expert
    for module in layers.modules():
        stacked = getattr(module, "gate_up_proj", None)
        if stacked is None or getattr(stacked, "ndim", 0) != 3 or hasattr(module, "has_gate"):
            continue
        if list(inspect.signature(type(module).forward).parameters) == ["self", "hidden_states"]:
            module.forward = every_expert(module, top_k)


@functools.cache
def _register_experts() -> str | None:
    """The recorded grouped GEMM under ``transformers``' ``ExpertsInterface`` (None without one)."""
    _need("transformers")
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError:  # an older transformers: experts run as they are written
        return None
    name = "paraplan_trace"
    ExpertsInterface.register(name, _experts_function(_BOX))
    return name


@functools.cache
def _register_attention() -> str:
    transformers = _need("transformers")
    name = "paraplan_trace"
    # no mask function is registered under this name, so the models build no mask (the
    # recorded core reads causality and the window itself) and never look at position values
    transformers.AttentionInterface.register(name, _attention_function(_BOX))
    return name


def _decoder_layers(model, num_layers: int):
    """(dotted name, ModuleList) of the decoder layers: the longest ModuleList of the model."""
    import torch

    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    exact = [(n, m) for n, m in lists if len(m) == num_layers]
    pool = exact or lists
    if not pool:
        raise ConfigError(f"{_WHERE}: the model built from the config has no list of layers to trace")
    return max(pool, key=lambda nm: len(nm[1]))


def _signature(layer, layer_type: str | None) -> str:
    parts = [type(layer).__name__, str(layer_type or "")]
    for name, module in layer.named_modules():
        own = [(n, tuple(p.shape)) for n, p in module.named_parameters(recurse=False)]
        parts.append(f"{name}:{type(module).__name__}:{own}")
        for attr in ("sliding_window", "attention_type", "layer_type", "is_sliding", "use_sliding_window"):
            if hasattr(module, attr) and isinstance(getattr(module, attr), (int, str, bool, type(None))):
                parts.append(f"{attr}={getattr(module, attr)}")
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:12]


def _kind_label(layer, layer_type: str | None, index: int) -> str:
    names = {type(m).__name__.lower() for m in layer.modules()}
    moe = any("moe" in n or "experts" in n or "sparse" in n for n in names)
    parts = [str(layer_type)] if layer_type else []
    parts.append("moe" if moe else "dense")
    return "-".join(parts) + f"@{index}"


def _embedding_and_head(model) -> tuple[int, int]:
    """The input embedding's parameters, and the output head's when it is not tied to it."""
    embeddings = model.get_input_embeddings()
    embedding = sum(p.numel() for p in embeddings.parameters()) if embeddings is not None else 0
    head = model.get_output_embeddings()
    tied = head is not None and embeddings is not None and head.weight is embeddings.weight
    return int(embedding), 0 if head is None or tied else int(sum(p.numel() for p in head.parameters()))


def trace_model(
    config: dict[str, Any], micro_batch: int, seq_length: int, *, dtype: str = "bfloat16",
    trust_remote_code: bool = False,
) -> TracedModel:
    """Trace ``config`` (a config.json mapping) at ``micro_batch`` x ``seq_length`` tokens."""
    torch = _need("torch")
    hf_config = build_config(config, trust_remote_code=trust_remote_code)
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
    rec.module_types = {
        (slot, name): type(module).__name__ for slot, layer in enumerate(kept) for name, module in layer.named_modules()
    }
    _group_every_expert(hf_config, kept)
    tokens = torch.zeros((micro_batch, seq_length), dtype=torch.long, device="meta")
    _BOX[0] = rec
    try:
        with rec:
            out = model(input_ids=tokens, labels=tokens, use_cache=False)
            out.loss.backward()
    except (RuntimeError, NotImplementedError, ValueError, TypeError, IndexError, AttributeError,
            AssertionError, KeyError) as err:
        if os.environ.get("PARAPLAN_TRACE_DEBUG"):
            raise
        first = str(err).strip().splitlines()[0][:120] if str(err).strip() else type(err).__name__
        raise ConfigError(
            f"{_WHERE}: model_type {config.get('model_type')!r}: its code does not run on the meta device "
            f"({first}); describe the model by its fields instead (inventory: hand)"
        ) from None
    finally:
        _BOX[0] = None
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
        ))
    return TracedModel(
        model_type=str(config.get("model_type")), micro_batch=micro_batch, seq_length=seq_length, dtype=dtype,
        total_params=int(total), embedding_params=int(embedding_params), head_params=int(head_params),
        num_layers=num_layers, layers=tuple(traced), ends=tuple(op for s, op in rec.ops if s is None),
    )


@dataclass(frozen=True, slots=True)
class ParameterCount:
    """A config's parameters from its module tree (tied weights once)."""

    total: int
    embedding: int  # the input embedding(s)
    head: int  # the output projection when it is not tied to the embedding (0 when tied)
    routed: int  # the routed experts' weights (0 for a dense model)
    routed_active: int  # the part of ``routed`` one token runs through (top-k of each block)

    @property
    def active(self) -> int:
        """Parameters one token uses: everything but the routed experts it is not sent to."""
        return self.total - self.routed + self.routed_active


def _build(config: dict[str, Any], trust_remote_code: bool = False, hf_config=None, **kwargs):
    """(config object, the causal LM built from it on the meta device); one line when it cannot be."""
    torch = _need("torch")
    transformers = _need("transformers")
    if hf_config is None:
        hf_config = build_config(config, trust_remote_code=trust_remote_code)
    kwargs.setdefault("dtype", torch.bfloat16)
    try:
        with torch.device("meta"):
            return hf_config, transformers.AutoModelForCausalLM.from_config(
                hf_config, trust_remote_code=trust_remote_code, **kwargs)
    except (ValueError, AssertionError, AttributeError, TypeError, KeyError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:120]
        raise ConfigError(
            f"{_WHERE}: model_type {config.get('model_type')!r}: transformers cannot build a causal LM of it "
            f"({first}); describe the model by its fields instead"
        ) from None


def count_parameters(config: dict[str, Any], *, trust_remote_code: bool = False) -> ParameterCount:
    """Every parameter of ``config``'s model built on the meta device, and the active share.

    Routed experts are the modules ``transformers`` stores as one tensor per projection with
    the experts first (``gate_up_proj``/``up_proj``/``down_proj``, 3-D), or a ``ModuleList``
    named ``experts``; a token runs ``num_experts_per_tok`` of them. Shared experts, routers,
    attention, norms, embeddings and the head are always active."""
    hf_config, model = _build(config, trust_remote_code)
    text = getattr(hf_config, "get_text_config", lambda: hf_config)()
    top_k = int(getattr(text, "num_experts_per_tok", 0) or getattr(text, "experts_per_token", 0) or 0)
    total = sum(p.numel() for p in model.parameters())
    embedding, head_params = _embedding_and_head(model)
    routed = active = 0
    seen: set[int] = set()
    for name, module in model.named_modules():
        if id(module) in seen:
            continue
        stacked = [p for n, p in module.named_parameters(recurse=False)
                   if p.dim() == 3 and n.split("_")[0] in ("gate", "up", "down", "w1", "w2", "w3")]
        listed = name.rsplit(".", 1)[-1] == "experts" and len(module) > 1 if hasattr(module, "__len__") else False
        if stacked or listed:
            own = list(module.parameters())
            experts = int(getattr(module, "num_experts", 0) or (len(module) if listed else stacked[0].shape[0]))
            n = sum(p.numel() for p in own)
            routed += n
            active += n * min(top_k, experts) // experts if experts else n
            seen.update(id(m) for m in module.modules())
    return ParameterCount(total=int(total), embedding=int(embedding), head=int(head_params),
                          routed=int(routed), routed_active=int(active))


# ---------------------------------------------------------------- the cache


def cache_dir() -> Path:
    """Where traces are kept: $PARAPLAN_CACHE_DIR, else $XDG_CACHE_HOME/paraplan, else ~/.cache."""
    base = os.environ.get("PARAPLAN_CACHE_DIR")
    if base:
        return Path(base) / "hftrace"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "paraplan" / "hftrace"


def _key(config: dict[str, Any], micro_batch: int, seq_length: int, dtype: str) -> str:
    import importlib.metadata as md

    versions = []
    for dist in ("torch", "transformers"):
        try:
            versions.append(md.version(dist))
        except md.PackageNotFoundError:
            versions.append("-")
    blob = json.dumps([TRACE_VERSION, versions, config, micro_batch, seq_length, dtype], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _to_json(trace: TracedModel) -> dict[str, Any]:
    return dataclasses.asdict(trace)


def _from_json(data: dict[str, Any]) -> TracedModel:
    def op(d):
        return TracedOp(**{**d, "shapes": tuple(map(tuple, d["shapes"])), "out_shapes": tuple(map(tuple, d["out_shapes"])),
                           "extra": tuple(tuple(x) for x in d["extra"])})

    layers = tuple(
        TracedLayer(
            kind=ld["kind"], indices=tuple(ld["indices"]), layer_type=ld["layer_type"], params=ld["params"],
            param_breakdown=tuple(tuple(x) for x in ld["param_breakdown"]),
            ops=tuple(op(o) for o in ld["ops"]),
            saved=tuple(SavedTensor(**{**s, "shape": tuple(s["shape"])}) for s in ld["saved"]),
        )
        for ld in data["layers"]
    )
    fields = {k: v for k, v in data.items() if k not in ("layers", "ends")}
    return TracedModel(**fields, layers=layers, ends=tuple(op(o) for o in data["ends"]))


@functools.lru_cache(maxsize=32)
def _cached(blob: str, micro_batch: int, seq_length: int, dtype: str, trust_remote_code: bool) -> TracedModel:
    config = json.loads(blob)
    key = _key(config, micro_batch, seq_length, dtype)
    path = cache_dir() / f"{key}.json"
    try:
        return _from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    trace = trace_model(config, micro_batch, seq_length, dtype=dtype, trust_remote_code=trust_remote_code)
    try:
        from paraplan.files.atomic import temp_path

        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_path(path)
        tmp.write_text(json.dumps(_to_json(trace)))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache directory: the trace is still returned, only not kept
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
