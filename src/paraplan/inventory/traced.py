"""A traced layer (``inventory.hftrace``) as paraplan operators, and its comparison with the
hand-written inventory (``inventory.layer``).

Each module of the layer that ran operators becomes one ``Op``: a ``Linear`` its GEMM (the
forward matmul's m, k, n; backward the data- and weight-gradient matmuls), the recorded
attention core the fused ``flash_atten`` (causal: half the square executed; a sliding window
of w: the band's share), a norm module a ``NORM``, an embedding an ``EMBEDDING``, and every
other module's operators (activations, rotary embedding, residual adds, copies) one
``ELEMENTWISE`` op with the bytes eager PyTorch moves. Saved bytes are what autograd kept in
that module's forward. Operators the cost model has no curve for (convolutions of causal conv,
scans of state-space models) keep their role prefixed ``uncalibrated:`` and are costed as
memory-bound elementwise kernels (the roofline: bytes over HBM bandwidth, Williams et al.
2009), which says so rather than guessing a compute rate.

Nothing here imports torch.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass

from paraplan.inventory.hftrace import TracedLayer, TracedOp
from paraplan.inventory.kernel_mixes import traced_module_mix
from paraplan.inventory.ops import Collective, Op, OpKind
from paraplan.inventory.scan_kinds import scan_ops
from paraplan.inventory.shapes import LocalShape
from paraplan.specs import ModelSpec

_MATMULS = {"mm", "addmm", "bmm", "baddbmm", "_grouped_mm", "grouped_mm"}
_UNCALIBRATED = {"convolution", "convolution_backward", "_conv_depthwise2d", "cumsum", "logcumsumexp"}


def _gemm_dims(ops: list[TracedOp]) -> tuple[tuple[str, int], ...]:
    for op in ops:
        if op.phase == "fwd" and op.aten in _MATMULS and len(op.shapes) >= 2:
            a, b = op.shapes[-2], op.shapes[-1]
            if op.aten == "addmm" and len(op.shapes) >= 3:
                a, b = op.shapes[1], op.shapes[2]
            return (("m", int(a[-2])), ("k", int(a[-1])), ("n", int(b[-1])))
    return ()


def _window_fraction(s: int, s_kv: int, window: int | None, causal: bool) -> float:
    """The share of the full s x s_kv square a causal kernel executes: half without a window
    (the inventory's convention), the band of ``window`` keys behind each query with one."""
    if not causal:
        return 1.0
    if not window or window >= s_kv:
        return 0.5
    w = int(window)
    band = w * s - w * (w - 1) / 2.0
    return band / (s * s_kv)


def _chunk_fraction(s: int, s_kv: int, chunk: int) -> float:
    """The share of the s x s_kv square a causal kernel executes when each query sees only the
    keys of its own chunk of ``chunk`` tokens (Llama 4's chunked attention): a causal triangle per
    chunk, half of each chunk's square in the inventory's convention; half the square when one
    chunk holds the whole sequence."""
    if chunk >= s_kv:
        return 0.5
    full, rest = divmod(s, chunk)
    return (full * chunk * chunk + rest * rest) / (2.0 * s * s_kv)


def layer_ops_from_trace(layer: TracedLayer, *, attention_chunk: int | None = None) -> tuple[Op, ...]:
    """The operators of one traced layer kind, in the order their modules first ran.
    ``attention_chunk``: the chunk of a chunked-attention layer (the config's
    ``attention_chunk_size`` for the layers it names ``chunked_attention``)."""
    groups: dict[str, list[TracedOp]] = defaultdict(list)
    attention: list[TracedOp] = []
    for op in layer.ops:
        if op.aten == "attention":
            attention.append(op)
        else:
            groups[op.module].append(op)
    params = dict(layer.param_breakdown)
    saved: dict[str, float] = defaultdict(float)
    for t in layer.saved:
        saved[t.module] += t.bytes
    out: list[Op] = []
    attention_module = attention[0].module if attention else None
    _hand_down_params(params, groups)
    for module, ops in groups.items():
        kernels = scan_ops(module, ops[0].module_type, ops, float(params.get(module, 0)), _item(layer))
        if kernels is not None:  # a state-space or linear-attention module: its fused kernels
            out.extend(kernels)
            continue
        fwd = [o for o in ops if o.phase == "fwd"]
        bwd = [o for o in ops if o.phase == "bwd"]
        mtype = ops[0].module_type
        atens = sorted({o.aten for o in ops if o.bytes or o.flops})
        kept = saved.get(module, 0.0)
        if module == attention_module:
            kept -= sum(_attention_saved(layer, attention_module))
        common = dict(
            flops=sum(o.flops for o in fwd), bytes=sum(o.bytes for o in fwd),
            bwd_flops=sum(o.flops for o in bwd), bwd_bytes=sum(o.bytes for o in bwd),
            params=float(params.get(module, 0)), saved_bytes=max(kept, 0.0),
        )
        matmuls = any(o.aten in _MATMULS for o in fwd)
        # experts: one grouped GEMM (the tracer's registered experts function records it); a
        # router: its scoring GEMM; GPT-2's Conv1D: a Linear with its weight transposed (addmm)
        linear = any(word in mtype.lower() for word in ("linear", "conv1d", "expert", "router"))
        if matmuls and linear and params.get(module, 0) > 0:
            weight_grads = [o for o in bwd if o.aten in _MATMULS]
            # the weight gradient is the backward matmul whose output has the weight's size
            w = params.get(module, 0)
            wgrad = [o for o in weight_grads if o.out_shapes and _numel(o.out_shapes[0]) == w]
            wgrad = wgrad[-1:] if wgrad else weight_grads[-1:]
            out.append(Op(name=module or "layer", kind=OpKind.GEMM, role=f"traced {mtype} ({', '.join(atens)})",
                          bwd_weight_flops=sum(o.flops for o in wgrad), bwd_weight_bytes=sum(o.bytes for o in wgrad),
                          dims=_gemm_dims(fwd), **common))
            continue
        if module == attention_module or not (common["flops"] or common["bytes"] or common["bwd_bytes"]):
            if module != attention_module and not common["params"]:
                continue
        kind = OpKind.ELEMENTWISE
        role = f"traced {mtype or 'layer'} ({', '.join(atens)})"
        if "norm" in mtype.lower():
            kind = OpKind.NORM
        elif "embedding" in mtype.lower() and "rotary" not in mtype.lower():
            kind = OpKind.EMBEDDING
        # its streaming kernels' kinds (``kernel_mixes.TRACED_MODULES``)
        mix = traced_module_mix(mtype) if kind is not OpKind.EMBEDDING else None
        if matmuls or any(o.aten.split(".")[0] in _UNCALIBRATED for o in ops):
            # a scan, a causal convolution or chunked linear attention written in torch (Mamba,
            # gated DeltaNet): no curve of its own yet, costed as a memory-bound kernel
            role, mix = "uncalibrated: " + role, None
        out.append(Op(name=module or "layer", kind=kind, role=role, memory_kernels=mix, **common))
    if attention:
        out.append(_attention_op(layer, attention, attention_chunk))
    return tuple(out)


def _hand_down_params(params: dict[str, int], groups: dict[str, list[TracedOp]]) -> None:
    """Parameters of modules that ran no operator of their own (a ``Conv1d`` whose weights the
    mixer's code convolves with functionally) go to the closest enclosing module that did."""
    for name in [n for n in params if n not in groups and n]:
        parent = name
        while parent:
            parent = parent.rpartition(".")[0]
            if parent in groups:
                params[parent] = params.get(parent, 0) + params.pop(name)
                break


def _item(layer: TracedLayer) -> int:
    """Bytes per activation element of the trace (its first forward operator's dtype)."""
    first = next((o.dtype for o in layer.ops if o.phase == "fwd" and o.dtype), "bfloat16")
    return _ITEM.get(first, 2)


_ITEM = {"bfloat16": 2, "float16": 2, "float32": 4}


def _attention_saved(layer: TracedLayer, module: str) -> list[float]:
    """What the recorded core keeps: q, k, v and the float32 logsumexp (the last four saves of
    the attention module, made by the core itself)."""
    mine = [t.bytes for t in layer.saved if t.module == module]
    return mine[-4:]


def _attention_op(layer: TracedLayer, ops: list[TracedOp], chunk: int | None = None) -> Op:
    fwd = [o for o in ops if o.phase == "fwd"]
    bwd = [o for o in ops if o.phase == "bwd"]
    first = fwd[0]
    info = dict(first.extra)
    q, k = first.shapes[0], first.shapes[1]
    b, heads, s, d = q
    s_kv = k[-2]
    fraction = _window_fraction(s, s_kv, info.get("sliding_window"), bool(info.get("causal", True)))
    variant = ["flash"]
    if info.get("sliding_window"):
        variant.append(f"sliding window {info['sliding_window']}")
    if chunk and not info.get("sliding_window") and bool(info.get("causal", True)):
        fraction = _chunk_fraction(s, s_kv, int(chunk))
        variant.append(f"chunked {chunk}")
    if info.get("sinks"):
        variant.append("sinks")
    if info.get("softcap"):
        variant.append(f"soft cap {info['softcap']}")
    kept = sum(_attention_saved(layer, first.module))
    lse = 4.0 * b * heads * s
    return Op(
        name="flash_atten",
        kind=OpKind.ATTENTION,
        role=f"traced attention core ({', '.join(variant)}{', causal' if info.get('causal', True) else ''})",
        flops=sum(o.flops for o in fwd),
        bytes=sum(o.bytes for o in fwd),
        bwd_flops=sum(o.flops for o in bwd),
        bwd_bytes=sum(o.bytes for o in bwd),
        saved_bytes=kept,
        selective_recompute=True,
        selective_kept_bytes=max(kept - lse, 0.0),
        exec_fraction=fraction,
        dims=(("b", b), ("h", heads), ("l", s), ("l_kv", s_kv), ("d", d)),
    )


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


@dataclass(frozen=True, slots=True)
class Agreement:
    """One quantity of one layer, traced against hand-written."""

    quantity: str
    traced: float
    hand: float

    @property
    def relative(self) -> float:
        """(traced - hand) / hand; 0 when both are 0."""
        if self.hand == 0:
            return 0.0 if self.traced == 0 else float("inf")
        return (self.traced - self.hand) / self.hand


def _sum(ops, attr: str, kinds=None) -> float:
    return float(sum(getattr(o, attr) for o in ops if kinds is None or o.kind in kinds))


def compare_layer(traced: tuple[Op, ...], hand: tuple[Op, ...]) -> tuple[Agreement, ...]:
    """Parameters, FLOPs (forward, backward; GEMMs, attention), HBM bytes and saved
    activations of one layer, traced beside hand-written."""
    gemm, attn = {OpKind.GEMM, OpKind.BMM}, {OpKind.ATTENTION}
    rows = [
        ("parameters", "params", None),
        ("forward FLOPs", "flops", None),
        ("backward FLOPs", "bwd_flops", None),
        ("GEMM FLOPs (fwd)", "flops", gemm),
        ("attention FLOPs (fwd)", "flops", attn),
        ("forward bytes", "bytes", None),
        ("backward bytes", "bwd_bytes", None),
        ("saved activations", "saved_bytes", None),
    ]
    return tuple(Agreement(name, _sum(traced, attr, kinds), _sum(hand, attr, kinds)) for name, attr, kinds in rows)


_DTYPES = {2: "bfloat16", 4: "float32"}


def costed_layer_ops(layer: TracedLayer, kernels: str, *, attention_chunk: int | None = None,
                     ) -> tuple[tuple[Op, ...], tuple[str, ...]]:
    """One traced layer kind's operators as ``kernels`` (``fused`` | ``eager``) cost them, and
    for each the path of the module it stands for inside the layer. ``attention_chunk``: a
    chunked-attention layer's chunk (``layer_ops_from_trace``)."""
    if kernels == "fused":
        from paraplan.inventory.fused import fused_layer_ops

        return fused_layer_ops(layer, attention_chunk=attention_chunk)
    ops = layer_ops_from_trace(layer, attention_chunk=attention_chunk)
    attention = next((o.module for o in layer.ops if o.aten == "attention"), "")
    modules = tuple(attention if op.kind is OpKind.ATTENTION else ("" if op.name == "layer" else op.name)
                    for op in ops)
    return ops, modules


def is_moe_label(kind: str) -> bool:
    """Whether a traced layer kind's label (``TracedLayer.kind``: "full_attention-moe@3") names
    a mixture-of-experts layer."""
    return kind.rpartition("@")[0].endswith("moe")


@functools.lru_cache(maxsize=64)
def traced_layers(model: ModelSpec, x: LocalShape) -> dict[str, tuple[tuple[Op, ...], tuple[Collective, ...]]]:
    """The operators of each layer kind of ``model`` (``inventory: traced``) on one rank at
    shape ``x``, keyed by the traced kind (``TracedLayer.kind``: "full_attention-dense@0",
    "sliding_attention-dense@0", "moe@3", ...), traced from its ``hf_config`` at the micro-batch
    and the rank's sequence (``x.s``: seq / cp), split over ``x.tp`` ranks by the model's
    ``base_model_tp_plan`` (``inventory.tp_plan``) with the tensor-parallel collectives that
    plan implies, a mixture of experts' routed experts over ``ep`` (``traced_moe``), and the
    job's FP8 recipe (``traced_job.in_job``)."""
    from paraplan.inventory.tp_plan import config_of, layer_plan
    from paraplan.inventory.traced_job import in_job
    from paraplan.inventory.traced_moe import layer_on_rank

    config = config_of(str(model.hf_config))
    trace = _trace(model, x)
    plan = layer_plan(config) if x.tp > 1 else None
    act = str(config.get("hidden_act") or config.get("hidden_activation") or "silu")
    out = {}
    for layer in trace.layers:
        chunk = config.get("attention_chunk_size") if layer.kind.startswith("chunked_attention") else None
        ops, coll = layer_on_rank(model, x, layer, plan, act, chunk)
        out[layer.kind] = (in_job(ops, x), coll)
    return out


def _trace(model: ModelSpec, x: LocalShape):
    from paraplan.inventory.hftrace import trace_layer_ops
    from paraplan.inventory.tp_plan import config_of

    config = config_of(str(model.hf_config))
    return trace_layer_ops(config, x.b, x.s, dtype=_DTYPES.get(x.e, "bfloat16"))  # x.s: seq / cp


def traced_layer_indices(model: ModelSpec, x: LocalShape) -> dict[str, tuple[int, ...]]:
    """Which of the model's layers each traced kind stands for (layer indices from 0)."""
    return {layer.kind: layer.indices for layer in _trace(model, x).layers}

