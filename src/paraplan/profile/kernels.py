"""The PyTorch code that runs one inventory operator, forward and backward.

:func:`build_kernel` takes the :class:`~paraplan.inventory.Op` the inventory counts for a grid
point and allocates its tensors from the op's own dimensions (``op.dims``): a GEMM's ``m, k,
n``, attention's ``b, h, l, l_kv, d``, a norm's ``b, l, dim`` ... so that what is timed is
exactly what the cost model counts. The forward is the operator as Megatron-LM / GPT-NeoX run
it with eager PyTorch; the backward is ``torch.autograd.grad`` of its output with respect to
every input that training differentiates (input and weights), on a graph kept between repeats.

torch is imported inside the functions (``pip install 'paraplan[profile]'``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from paraplan.inventory import Op

__all__ = ["KERNELS", "Kernel", "Unsupported", "build_kernel", "torch_dtype"]


class Unsupported(Exception):
    """A point this device or dtype cannot run; ``str()`` is the reason a journal records."""


@dataclass
class Kernel:
    """``forward()`` runs the operator; ``backward()`` its gradients (on a kept graph)."""

    forward: Callable[[], Any]
    backward: Callable[[], Any]


def torch_dtype(name: str) -> Any:
    import torch

    table = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    if name not in table:
        raise Unsupported(f"no {name} kernels in the operator sampler (fp32, fp16, bf16)")
    return table[name]


def _grad_kernel(run: Callable[[], Any], inputs: list[Any]) -> Kernel:
    """A kernel whose backward is the gradient of ``run()``'s output w.r.t. ``inputs``."""
    import torch

    output = run()
    grad = torch.randn_like(output)

    def backward() -> Any:
        return torch.autograd.grad(output, inputs, grad, retain_graph=True)

    return Kernel(run, backward)


def _new(shape: tuple[int, ...], spec: Mapping[str, Any], *, grad: bool = True) -> Any:
    import torch

    return torch.randn(*shape, **spec).requires_grad_(grad)


def _gemm(op: Op, spec: Mapping[str, Any], *, bias: bool) -> Kernel:
    import torch.nn.functional as F

    d = dict(op.dims)
    x, w = _new((d["m"], d["k"]), spec), _new((d["n"], d["k"]), spec)
    b = _new((d["n"],), spec) if bias else None
    return _grad_kernel(lambda: F.linear(x, w, b), [x, w] + ([b] if bias else []))


def _heads(op: Op) -> tuple[int, int, int, int, int]:
    d = dict(op.dims)
    return d["b"], d["h"], d["l"], d["l_kv"], d["d"]


def _baddbmm(op: Op, spec: Mapping[str, Any]) -> Kernel:
    import torch

    b, h, s, s_kv, d = _heads(op)
    q, k = _new((b * h, s, d), spec), _new((b * h, d, s_kv), spec)
    out = torch.empty(b * h, s, s_kv, **spec)
    scale = 1.0 / math.sqrt(d)
    return _grad_kernel(lambda: torch.baddbmm(out, q, k, beta=0.0, alpha=scale), [q, k])


def _bmm(op: Op, spec: Mapping[str, Any]) -> Kernel:
    import torch

    b, h, s, s_kv, d = _heads(op)
    p, v = _new((b * h, s, s_kv), spec), _new((b * h, s_kv, d), spec)
    return _grad_kernel(lambda: torch.bmm(p, v), [p, v])


def _softmax(op: Op, spec: Mapping[str, Any]) -> Kernel:
    import torch

    b, h, s, s_kv, _ = _heads(op)
    scores = _new((b, h, s, s_kv), spec)
    return _grad_kernel(lambda: torch.softmax(scores, dim=-1), [scores])


def _flash(op: Op, spec: Mapping[str, Any]) -> Kernel:
    import torch.nn.functional as F

    b, h, s, s_kv, d = _heads(op)
    q, k, v = _new((b, h, s, d), spec), _new((b, h, s_kv, d), spec), _new((b, h, s_kv, d), spec)
    # op_for_sample counts the non-causal kernel GPUModeling timed (exec_fraction 1)
    causal = op.exec_fraction < 1.0
    return _grad_kernel(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), [q, k, v])


def _norm(op: Op, spec: Mapping[str, Any]) -> Kernel:
    import torch.nn.functional as F

    d = dict(op.dims)
    x, w = _new((d["l"], d["b"], d["dim"]), spec), _new((d["dim"],), spec)
    if op.name == "RMSlayernorm":
        return _grad_kernel(lambda: F.rms_norm(x, (d["dim"],), w, 1e-5), [x, w])
    bias = _new((d["dim"],), spec)
    return _grad_kernel(lambda: F.layer_norm(x, (d["dim"],), w, bias, 1e-5), [x, w, bias])


def _rope(op: Op, spec: Mapping[str, Any]) -> Kernel:
    import torch

    d = dict(op.dims)
    q, k = _new((d["l"], d["b"], d["h"], d["d"]), spec), _new((d["l"], d["b"], d["g"], d["d"]), spec)
    rot = d["d_rot"]
    angles = torch.randn(d["l"], 1, 1, rot, **spec)
    cos, sin = angles.cos(), angles.sin()

    def rotate(x: Any) -> Any:
        x1, x2 = x[..., : rot // 2], x[..., rot // 2 : rot]
        rotated = torch.cat((-x2, x1), dim=-1) * sin + x[..., :rot] * cos
        return rotated if rot == x.shape[-1] else torch.cat((rotated, x[..., rot:]), dim=-1)

    return _grad_kernel(lambda: torch.cat((rotate(q), rotate(k)), dim=2), [q, k])


def _gelu(op: Op, spec: Mapping[str, Any]) -> Kernel:
    import torch.nn.functional as F

    d = dict(op.dims)
    x = _new((d["l"], d["b"], d["ffn"]), spec)
    return _grad_kernel(lambda: F.gelu(x), [x])


def _res_add(op: Op, spec: Mapping[str, Any], shape: Mapping[str, int]) -> Kernel:
    # the inventory's residual add has no dims: its tensors are the [l, b, dim] of the point
    a, b = _new((shape["l"], shape["b"], shape["dim"]), spec), _new((shape["l"], shape["b"], shape["dim"]), spec)
    return _grad_kernel(lambda: a + b, [a, b])


def _embedding(op: Op, spec: Mapping[str, Any]) -> Kernel:
    import torch
    import torch.nn.functional as F

    d = dict(op.dims)
    table = _new((d["vocab"], d["dim"]), spec)
    ids = torch.randint(0, d["vocab"], (d["tokens"],), device=spec["device"])
    return _grad_kernel(lambda: F.embedding(ids, table), [table])


def _cross_entropy(op: Op, spec: Mapping[str, Any]) -> Kernel:
    import torch
    import torch.nn.functional as F

    d = dict(op.dims)
    logits = _new((d["b"] * d["l"], d["vocab"]), spec)
    target = torch.randint(0, d["vocab"], (d["b"] * d["l"],), device=spec["device"])
    # the inventory's loss runs in fp32 whatever the activations' dtype
    return _grad_kernel(lambda: F.cross_entropy(logits.float(), target), [logits])


#: Schema operator name -> builder(op, tensor spec, point shape).
KERNELS: dict[str, Callable[[Op, Mapping[str, Any], Mapping[str, int]], Kernel]] = {
    "linear1": lambda op, spec, _: _gemm(op, spec, bias=True),
    **{n: (lambda op, spec, _: _gemm(op, spec, bias=False)) for n in ("linear2", "linear3", "linear4", "linear_final")},
    "baddbmm": lambda op, spec, _: _baddbmm(op, spec),
    "bmm": lambda op, spec, _: _bmm(op, spec),
    "softmax": lambda op, spec, _: _softmax(op, spec),
    "flash_atten": lambda op, spec, _: _flash(op, spec),
    "layernorm": lambda op, spec, _: _norm(op, spec),
    "RMSlayernorm": lambda op, spec, _: _norm(op, spec),
    "RoPE": lambda op, spec, _: _rope(op, spec),
    "gelu": lambda op, spec, _: _gelu(op, spec),
    "res_add": _res_add,
    "embedding": lambda op, spec, _: _embedding(op, spec),
    "cross_entropy": lambda op, spec, _: _cross_entropy(op, spec),
}


def build_kernel(name: str, op: Op, shape: Mapping[str, int], *, dtype: str, device: str) -> Kernel:
    """Tensors for ``op`` on ``device`` in ``dtype`` and the callables that run it; raises
    :class:`Unsupported` for an operator or dtype the sampler has no kernel for."""
    if name not in KERNELS:
        raise Unsupported(f"no kernel for operator {name!r} in the sampler")
    spec = {"dtype": torch_dtype(dtype), "device": device}
    return KERNELS[name](op, spec, shape)
