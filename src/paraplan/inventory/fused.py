"""A traced layer costed as training frameworks run it (``kernels: fused``, the default).

A Hugging Face model's eager code runs a norm as about a dozen kernels (a float32 copy, the
mean of squares, the scale), the rotary embedding as slices, a negation, a concatenation and
multiplies, and q, k, v (gate, up) as separate GEMMs. Megatron-Core, Transformer Engine and
torchtitan run each of these as one kernel. Here the traced aten operators are grouped by the
module (or recognised function, ``hfhooks.REGION_FUNCTIONS``) that issued them, and each group
becomes ONE operator named as the hand-written inventory (``inventory.layer``) names it, so it
is timed on the same measured operator curve:

- a norm module (RMSNorm/LayerNorm of any model): ``RMSlayernorm`` / ``layernorm``; a norm of
  the attention heads (QK-norm): one ``qk_norm`` for q and k;
- the rotary embedding's application: ``RoPE_fused`` (one kernel per tensor; the ``RoPE`` curves
  time GPT-NeoX's unfused multi-kernel form: ``layer.FUSED_ROPE``);
- the activation and the gate multiply (``act(gate) * up``): ``swiglu`` (SiLU) / ``geglu``, an
  ungated activation ``gelu``;
- each residual add of the layer: ``res_add``; each dropout module: ``dropout``;
- GEMMs reading the same input (q/k/v, gate/up) one horizontally fused GEMM (Megatron's fused
  QKV and fc1), with the split of the fused QKV output (its gradient: a concatenation).

Each fused operator's bytes are the fused kernel's ideal bytes, the convention its measured
curve was fitted with (``layer.elementwise``): forward its inputs, outputs and parameters,
backward its inputs, twice its outputs (the incoming gradient and the input's gradient, of the
output's size) and twice its parameters; it keeps its inputs for the backward (a norm its
input, the gated activation its two inputs, the rotary embedding and residual adds nothing, a
dropout its one-byte mask). GEMMs move their ideal bytes (``layer.gemm``). FLOPs are the
traced ones. The attention core, routed experts and anything not recognised keep the traced
costing (``inventory.traced``); layout copies of the attention module (its transposes and
``contiguous``, which a fused attention kernel's layout makes unnecessary; MLA's concatenations
of the rotary and non-rotary parts, which Megatron's fused MLA RoPE writes whole) are left out.
The attention core keeps q, k and v at their own sizes, a router its 16-bit input and its
probabilities, and a tensor two GEMMs read is kept once (what Megatron-Core keeps).

Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from paraplan.inventory.hfrecords import ModuleCall, TracedLayer, TracedOp
from paraplan.inventory.layer import FUSED_ROPE, _bias, gemm
from paraplan.inventory.ops import Op, OpKind

_ACTIVATIONS = ("act", "gelu", "silu", "swish", "relu", "tanh", "sigmoid")
# copies and allocations only: a fused attention kernel reads and writes its own layout
_LAYOUT = frozenset({"clone", "copy_", "_to_copy", "contiguous", "_unsafe_view", "view", "transpose", "cat",
                     "new_empty", "empty_like", "empty", "new_empty_strided", "empty_strided"})
_SCAN_KINDS = frozenset({OpKind.SSM_SCAN, OpKind.SELECTIVE_SCAN, OpKind.CAUSAL_CONV1D, OpKind.LINEAR_ATTENTION})
# and in the attention block: MLA's concatenation of each head's rotary and non-rotary parts and
# the gradient of the key's rotary part broadcast over the heads (a sum), which Megatron-Core's
# fused MLA RoPE kernels (``fused_apply_mla_rope_for_q`` / ``_for_kv``) write as q and k whole
_REARRANGE = _LAYOUT | {"zeros_like", "sum", "expand"}
_ITEM = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _parent(path: str) -> str:
    return path.rpartition(".")[0]


def _fused(name: str, kind: OpKind, role: str, ops: list[TracedOp], read: float, written: float, *,
           params: float = 0.0, e: int = 2, saved: float = 0.0, dims=()) -> Op:
    """One fused kernel over ``ops`` (the traced FLOPs) reading ``read`` and writing
    ``written`` bytes forward; backward it reads its inputs and the output's gradient and
    writes the inputs' gradient (the output's size): ``read + 2 written``, parameters twice."""
    return Op(
        name=name, kind=kind, role=f"traced, fused: {role}",
        flops=sum(o.flops for o in ops if o.phase == "fwd"),
        bytes=read + written + e * params,
        bwd_flops=sum(o.flops for o in ops if o.phase == "bwd"),
        bwd_bytes=read + 2.0 * written + 2.0 * e * params,
        params=params, saved_bytes=saved, dims=dims,
    )


def _ideal_gemm(op: Op, e: int, *, name: str | None = None, module: str = "") -> Op:
    """``op`` (a traced Linear) with the ideal GEMM's bytes at its m, k, n (``layer.gemm``)."""
    dims = dict(op.dims)
    m, k, n = dims["m"], dims["k"], dims["n"]
    ideal = gemm(name or op.name, op.role, m, k, n, e, bias=False, saved=op.saved_bytes)
    return dataclasses.replace(
        op, name=name or op.name, role=f"traced, fused: {module or op.name} GEMM",
        bytes=ideal.bytes, bwd_bytes=ideal.bwd_bytes, bwd_weight_bytes=ideal.bwd_weight_bytes,
    )


def _merge_gemms(members: list[Op], e: int) -> Op:
    """GEMMs that read one input as one GEMM of the summed output width."""
    first = members[0]
    dims = dict(first.dims)
    n = sum(dict(o.dims)["n"] for o in members)
    parent = _parent(first.name)
    short = "+".join(o.name.rpartition(".")[2] for o in members)
    name = f"{parent}.{short}" if parent else short
    merged = dataclasses.replace(
        first, name=name,
        flops=sum(o.flops for o in members), bwd_flops=sum(o.bwd_flops for o in members),
        bwd_weight_flops=sum(o.bwd_weight_flops for o in members), params=sum(o.params for o in members),
        saved_bytes=sum(o.saved_bytes for o in members), dims=(("m", dims["m"]), ("k", dims["k"]), ("n", n)),
    )
    return _ideal_gemm(merged, e, module=f"{short} (horizontally fused)")


def fused_layer_ops(layer: TracedLayer, *, attention_chunk: int | None = None) -> tuple[tuple[Op, ...], tuple[str, ...]]:
    """The operators of one traced layer kind as fused kernels run them, and for each the path
    of the module it stands for inside the layer (what ``tp_plan.shard_layer`` splits by).
    State-space and linear-attention modules are already their fused kernels' work
    (``scan_kinds``) and are kept as ``layer_ops_from_trace`` gives them."""
    from paraplan.inventory.traced import layer_ops_from_trace

    eager = layer_ops_from_trace(layer, attention_chunk=attention_chunk)
    attention_module = next((o.module for o in layer.ops if o.aten == "attention"), None)
    by_module: dict[str, list[TracedOp]] = defaultdict(list)
    for op in layer.ops:
        if op.aten != "attention":
            by_module[op.module].append(op)
    calls: dict[str, ModuleCall] = {}
    for call in layer.calls:
        calls.setdefault(call.module, call)
    dtypes = [o.dtype for o in layer.ops if o.aten in ("mm", "addmm", "attention")] or ["bfloat16"]
    e = _ITEM.get(dtypes[0], 2)
    head_dim = next((dict(o.dims).get("d") for o in eager if o.kind is OpKind.ATTENTION), None)

    out: list[tuple[int, Op, str]] = []  # (order, op, module)
    order = {module: i for i, module in enumerate(by_module)}
    done: set[str] = set()

    # GEMMs: those reading one input (same storage, same parent) fused horizontally
    gemms = [o for o in eager if o.kind is OpKind.GEMM and "expert" not in o.role.lower()
             and "router" not in o.role.lower() and {"m", "k", "n"} <= dict(o.dims).keys()]
    groups: dict[tuple, list[Op]] = defaultdict(list)
    for op in gemms:
        call = calls.get(op.name)
        source = call.inputs[0][0] if call is not None and call.inputs else id(op)
        groups[(source, _parent(op.name))].append(op)
    activation_inputs: set[int] = set()
    qkv_width = _qkv_width(layer)
    for members in groups.values():
        module = members[0].name
        merged = _ideal_gemm(members[0], e) if len(members) == 1 else _merge_gemms(members, e)
        out.append((order.get(module, 0), merged, module))
        m, k, n = (dict(merged.dims)[d] for d in ("m", "k", "n"))
        qkv = _parent(module) == attention_module and n == qkv_width
        if merged.params > k * n and not qkv:
            # Megatron returns the bias of its row-parallel and fc1 GEMMs unapplied (bias-dropout-
            # add, bias-GELU) and reduces its gradient in a kernel of its own; the QKV GEMM's
            # bias is its epilogue's (``layer._bias``)
            out.append((order.get(module, 0), _bias(f"{module} bias", m * n, n, e, own_kernel=False), module))
        if qkv:
            split = Op(name="qkv_split", kind=OpKind.ELEMENTWISE,
                       role="traced, fused: split of the fused QKV output (gradient: cat)",
                       flops=0.0, bytes=0.0, bwd_flops=0.0, bwd_bytes=2.0 * e * m * n, dims=(("elements", m * n),))
            out.append((order.get(module, 0), split, _parent(module)))
        done.update(o.name for o in members)
        for o in members:
            call = calls.get(o.name)
            if call is not None:
                activation_inputs.update(k for k, _, _ in call.outputs)
    for op in eager:  # routers and experts: as traced, a router keeping what Megatron's keeps
        if op.kind is OpKind.GEMM and op.name not in done:
            if "router" in op.role.lower():
                op = _fused_router(op, calls.get(op.name), e)
            out.append((order.get(op.name, 0), op, op.name))
            done.add(op.name)
    out = _saved_once(out, calls, {o.module for o in layer.ops if o.aten == "grouped_mm"})

    for op in eager:  # SSM scans, causal convolutions, linear attention: their kernels' work
        if op.kind in _SCAN_KINDS:
            module = op.name.rsplit(".", 1)[0]
            out.append((order.get(module, 0), op, module))
            done.add(module)

    qk_norms: list[tuple[list[TracedOp], ModuleCall, str]] = []
    for module, ops in by_module.items():
        if module in done:
            continue
        call = calls.get(module)
        mtype = (call.module_type if call else ops[0].module_type).lower()
        at = order[module]
        if call is not None and "norm" in mtype and call.inputs and call.outputs:
            read = call.inputs[0][2]
            written = sum(b for _, _, b in call.outputs)
            params = float(dict(layer.param_breakdown).get(module, 0))
            width = call.inputs[0][1][-1] if call.inputs[0][1] else 0
            if attention_module and module.startswith(attention_module + ".") and width == head_dim:
                qk_norms.append((ops, call, module))
                done.add(module)
                continue
            rms = "rms" in mtype or params == width
            name = "RMSlayernorm" if rms else "layernorm"
            if attention_module and module.startswith(attention_module + "."):
                # a latent's norm inside the attention block (MLA's q_a_layernorm and
                # kv_a_layernorm), named as the hand-written MLA names them
                name = "kv_norm" if module.rpartition(".")[2].startswith("kv") else "q_norm"
            dims = (("tokens", _numel(call.inputs[0][1][:-1])), ("dim", width))
            out.append((at, _fused(name, OpKind.NORM, f"{module} ({call.module_type})", ops, read, written,
                                   params=params, e=e, saved=read, dims=dims), module))
        elif call is not None and call.module_type.startswith(("apply_rotary",)):
            shapes = {s for _, s, _ in call.outputs}
            read = sum(b for _, s, b in call.inputs if s in shapes)  # q and k; not the cos/sin tables
            written = sum(b for _, _, b in call.outputs)
            out.append((at, _fused(FUSED_ROPE, OpKind.ELEMENTWISE, f"rotary embedding ({module})", ops, read,
                                   written, e=e), module))
        elif call is not None and any(w in mtype for w in _ACTIVATIONS) and call.outputs:
            out.append((at, _activation(module, call, ops, by_module, e), module))
            done.add(_parent(module))
        elif call is not None and "dropout" in mtype:
            if any(o.bytes for o in ops):
                elements = sum(_numel(s) for _, s, _ in call.outputs)
                written = sum(b for _, _, b in call.outputs)
                out.append((at, _fused("dropout", OpKind.ELEMENTWISE, f"dropout ({module})", ops, written,
                                       written, e=e, saved=float(elements)), module))
        else:
            continue
        done.add(module)
    if qk_norms:
        ops = [o for group, _, _ in qk_norms for o in group]
        read = sum(call.inputs[0][2] for _, call, _ in qk_norms)
        written = sum(sum(b for _, _, b in call.outputs) for _, call, _ in qk_norms)
        params = float(sum(dict(layer.param_breakdown).get(m, 0) for _, _, m in qk_norms))
        module = qk_norms[0][2]
        out.append((order[module], _fused("qk_norm", OpKind.NORM, "RMSNorm of query and key heads", ops, read,
                                          written, params=params, e=e, saved=read), module))

    # what is left: residual adds (forward adds of the layer's own code), and the rest as traced
    for module, ops in by_module.items():
        if module in done:
            continue
        if module == "":
            adds = [o for o in ops if o.phase == "fwd" and o.aten.startswith("add") and len(o.shapes) >= 2
                    and o.shapes[0] == o.shapes[1]]
            for o in adds:
                written = o.bytes_written
                out.append((order[module], _fused("res_add", OpKind.ELEMENTWISE, "residual add", [o], 2 * written,
                                                  written, e=e), module))
            rest = [o for o in ops if o not in adds and o.phase == "fwd" and o.flops]
            if not rest:
                continue
        if module == attention_module and all(o.aten.split(".")[0] in _REARRANGE for o in ops if o.bytes):
            continue  # layout copies a fused attention kernel does not make
        kept = next((o for o in eager if o.name == (module or "layer") and o.kind is not OpKind.GEMM), None)
        if kept is not None and module != "":
            out.append((order[module], kept, module))
    core = _fused_core(next((o for o in eager if o.kind is OpKind.ATTENTION), None), layer)
    out.sort(key=lambda t: t[0])
    ops_out = [op for _, op, _ in out]
    modules = [m for _, _, m in out]
    if core is not None:
        ops_out.append(core)
        modules.append(attention_module or "")
    return tuple(ops_out), tuple(modules)


def _qkv_width(layer: TracedLayer) -> int | None:
    """The output width of a projection that makes q, k and v at once: (heads + 2 groups) x d."""
    for op in layer.ops:
        if op.aten == "attention" and op.phase == "fwd":
            info = dict(op.extra)
            d = op.shapes[0][-1]
            return (int(info.get("heads", 0)) + 2 * int(info.get("groups", 0))) * int(d)
    return None


def _activation(module: str, call: ModuleCall, ops: list[TracedOp], by_module, e: int) -> Op:
    """The activation and, when its parent multiplies its output by another tensor of its
    shape (``act(gate) * up``), that multiply: one gated-activation kernel."""
    out_shape = call.outputs[0][1]
    parent_ops = by_module.get(_parent(module), [])
    gate = [o for o in parent_ops if o.aten.startswith("mul") and o.out_shapes and o.out_shapes[0] == out_shape]
    elements = _numel(out_shape)
    written = call.outputs[0][2]
    mtype = call.module_type.lower()
    dims = (("elements", elements),)
    if gate:
        # the gated kernel's own backward: the parent's backward multiplies are part of it
        both = ops + [o for o in parent_ops if o.aten.startswith("mul")]
        name = "swiglu" if ("silu" in mtype or "swish" in mtype) else "geglu"
        return _fused(name, OpKind.ELEMENTWISE, f"gated activation ({call.module_type} x up)", both,
                      2.0 * written, written, e=e, saved=2.0 * written, dims=dims)
    name = "gelu" if "gelu" in mtype else mtype
    return _fused(name, OpKind.ELEMENTWISE, f"activation ({call.module_type})", ops, call.inputs[0][2],
                  written, e=e, saved=call.inputs[0][2], dims=dims)


def _fused_core(core: Op | None, layer: TracedLayer) -> Op | None:
    """The attention core keeping what a fused kernel keeps: q, k and v at their own sizes, and
    the float32 logsumexp. HF's code hands the kernel views (DeepSeek-V3's value is a slice of
    kv_b_proj's output, GPT-2's q, k, v slices of c_attn's), and autograd keeping a view keeps
    its whole storage, which the trace records; Megatron-Core makes them contiguous first
    (``MLASelfAttention``: ``value = value.contiguous()``) and the fused QKV split's are
    contiguous, so the storage behind them is freed."""
    if core is None:
        return None
    first = next(o for o in layer.ops if o.aten == "attention" and o.phase == "fwd")
    item = _ITEM.get(first.dtype, 2)
    qkv = float(sum(_numel(shape) for shape in first.shapes[:3]) * item)
    b, heads, s = first.shapes[0][:3]
    lse = 4.0 * b * heads * s
    kept = min(core.saved_bytes, qkv + lse)
    return dataclasses.replace(core, saved_bytes=kept, selective_kept_bytes=max(kept - lse, 0.0))


def _fused_router(op: Op, call: ModuleCall | None, e: int) -> Op:
    """A router keeping its input as the layer holds it (16 bits) and its probabilities: HF's
    DeepSeek-V3 router runs its GEMM in float32 on a float32 copy of the input and the weight,
    which autograd keeps (29 + 7 MiB at 1,024 tokens); Megatron-Core's router GEMM in float32
    (``moe_router_dtype``, ``RouterGatingLinearFunction``) keeps the input and weight as they
    are and casts inside, as the hand-written ``router`` and ``router_topk`` count."""
    if call is None or not call.inputs:
        return op
    experts = dict(op.dims).get("n", 0)
    tokens = _numel(call.inputs[0][1][:-1])
    return dataclasses.replace(op, saved_bytes=call.inputs[0][2] + e * tokens * experts)


def _saved_once(out: list[tuple[int, Op, str]], calls: dict[str, ModuleCall],
                grouped: set[str]) -> list[tuple[int, Op, str]]:
    """GEMMs of different modules reading one tensor (DeepSeek-V3's router and shared experts
    both read the pre-MLP norm's output) keep it once: autograd saves the same storage. Routed
    experts (``grouped``) keep their permuted copy of it, another tensor."""
    seen: set[int] = set()
    kept: list[tuple[int, Op, str]] = []
    for at, op, module in sorted(out, key=lambda t: t[0]):
        call = calls.get(module)
        if op.kind is OpKind.GEMM and call is not None and call.inputs and module not in grouped:
            source, _, size = call.inputs[0]
            if source in seen:
                op = dataclasses.replace(op, saved_bytes=max(op.saved_bytes - size, 0.0))
            seen.add(source)
        kept.append((at, op, module))
    return kept
