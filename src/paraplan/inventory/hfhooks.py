"""The kernels a trace records as training frameworks run them (``inventory.hftrace``): the
attention core as one fused operator (registered in ``transformers``' ``AttentionInterface``:
causal flag, sliding window, sinks and soft cap as the model passes them; FLOPs over the full
square, 4 b h s s_kv d) and routed experts as one grouped GEMM (registered in its
``ExpertsInterface``, or swapped in for experts that run every token through every expert)."""

from __future__ import annotations

import functools

from paraplan.inventory.hfbuild import _need
from paraplan.inventory.hfrecorder import _attention_flops, _bytes


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
    output, the activation's output and the down projection's output (for the gradient of the
    router's probabilities, which weight it in the combine)."""
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
                # the down projection's rows, which the combine weights by the router's
                # probabilities: their gradient needs them (Megatron's moe_unpermute keeps them)
                rows_out = hidden.new_empty((s, h))
                for t in (rows_in, fc1, act_out, rows_out):
                    rec._pack(t)
                # read: the rows (up), the gate's input, the down GEMM's input, the rows to
                # combine, each expert's weights once; written: the up output, the gate's
                # output, the down output and the combined tokens
                tokens = s / info["top_k"]
                rec._record("grouped_mm", (hidden, weights, *params), (out,), gemm + act,
                            2.0 * s * h * item + wbytes + act * item * (1 + info["gate"]),
                            (s + tokens) * h * item + act * item * (1 + info["gate"]),
                            (("experts", e), ("top_k", info["top_k"]), ("rows", s), ("inter", inter),
                             ("gate", info["gate"])))
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


# functions of a model's code whose operators form one kernel in training frameworks (Megatron's
# and Transformer Engine's fused RoPE): traced as a region of their own
REGION_FUNCTIONS = ("apply_rotary_pos_emb", "apply_rotary_emb")


def wrap_functions(recorder, layers) -> list[tuple[object, str, object]]:
    """Replace the recognised functions (``REGION_FUNCTIONS``, by name prefix) of the modules
    that define ``layers``' classes with recording regions; returns what to put back."""
    import inspect
    import sys

    undo = []
    homes = {type(m).__module__ for m in layers.modules()}
    for home in sorted(homes):
        module = sys.modules.get(home)
        if module is None:
            continue
        for name, fn in list(vars(module).items()):
            if inspect.isfunction(fn) and name.startswith(REGION_FUNCTIONS):
                undo.append((module, name, fn))
                setattr(module, name, recorder.function(name, fn))
    return undo


def unwrap_functions(undo) -> None:
    for module, name, fn in undo:
        setattr(module, name, fn)
