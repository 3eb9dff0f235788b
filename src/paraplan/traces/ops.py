"""Single-operator timings out of a profiler trace: the GEMMs, attention and memory-bound
operators the run executed, with their shapes (the trace must be recorded with
``record_shapes=True``) and their time.

On a CPU trace an operator's time is its ``aten::`` event's duration. On a GPU trace it is the
summed duration of the kernels the operator launched, matched by Kineto's ``External id``
(the ``cpu_op`` event carries the shapes, the ``kernel`` events the device time).
Only leaf operators are kept (``aten::mm``, not the ``aten::linear`` that calls it), so no
time is counted twice.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from paraplan.traces.reader import iter_events

#: Leaf operators by the class of kernel they run: the efficiency curve their timings fit.
GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"})
ATTENTION_OPS = frozenset({
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention",
    "aten::_flash_attention_forward",
})
_ATTENTION_BACKWARD = frozenset(
    {f"{name}_backward" for name in ATTENTION_OPS} | {"aten::_flash_attention_backward"}
)
#: Streaming element-wise operators (inputs read once, one output written): the GPU's
#: ``memory`` curve. Allocation-heavy ones (fill_, zero_ of fresh buffers) are left out.
MEMORY_OPS = frozenset({
    "aten::add", "aten::add_", "aten::mul", "aten::mul_", "aten::sub", "aten::sub_", "aten::div",
    "aten::div_", "aten::copy_", "aten::addcmul_", "aten::addcdiv_",
})
#: Memory-bound operators that do more per byte than streaming (a norm's reductions, an
#: activation's transcendental): their own curves, keyed by the inventory operator they
#: implement (``EfficiencySpec.ops``: "name" forward, "name:bwd" backward).
OWN_CURVE_OPS = {
    "aten::native_layer_norm": "layernorm",
    "aten::native_layer_norm_backward": "layernorm:bwd",
    "aten::_fused_rms_norm": "RMSlayernorm",
    "aten::gelu": "gelu",
    "aten::gelu_backward": "gelu:bwd",
}
ELEMENT_BYTES = {"float": 4, "c10::Half": 2, "c10::BFloat16": 2, "double": 8,
                 "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1}


@dataclass(frozen=True, slots=True)
class OpTiming:
    """One operator call: its name, the class of curve it belongs to, the shapes and element
    type of its tensor inputs, and the seconds it took."""

    name: str
    klass: str  # "gemm", "attention", "memory" or "op:<inventory operator>" (OWN_CURVE_OPS)
    backward: bool
    dims: tuple[tuple[int, ...], ...]
    dtype: str
    seconds: float


def op_class(name: str) -> tuple[str, bool] | None:
    """(curve class, whether a backward kernel) of a leaf operator paraplan times, or None."""
    if name in GEMM_OPS:
        return "gemm", False
    if name in ATTENTION_OPS:
        return "attention", False
    if name in _ATTENTION_BACKWARD:
        return "attention", True
    if name in MEMORY_OPS:
        return "memory", False
    if name in OWN_CURVE_OPS:
        return f"op:{OWN_CURVE_OPS[name]}", name.endswith("_backward")
    return None


def operator_timings(path: Path) -> list[OpTiming]:
    """Every timed leaf operator of one rank's trace, in file order. Empty when the trace was
    recorded without shapes (``record_shapes=False``)."""
    calls: dict[object, tuple[str, str, bool, tuple, str, float]] = {}
    order: list[object] = []
    kernel_s: dict[object, float] = defaultdict(float)
    for n, ev in enumerate(iter_events(path)):
        if ev.get("ph") != "X" or "dur" not in ev:
            continue
        cat = ev.get("cat") or ""
        args = ev.get("args") or {}
        if cat == "kernel":
            ext = args.get("External id")
            if ext is not None:
                kernel_s[ext] += float(ev["dur"]) * 1e-6
            continue
        if cat != "cpu_op":
            continue
        verdict = op_class(ev.get("name") or "")
        if verdict is None:
            continue
        dims, dtype = _tensor_inputs(args)
        if not dims:
            continue
        key = args.get("External id", ("event", n))
        calls[key] = (ev["name"], verdict[0], verdict[1], dims, dtype, float(ev["dur"]) * 1e-6)
        order.append(key)
    on_gpu = bool(kernel_s)
    out = []
    for key in order:
        name, klass, backward, dims, dtype, host_s = calls[key]
        seconds = kernel_s.get(key, 0.0) if on_gpu else host_s
        if seconds > 0.0:
            out.append(OpTiming(name, klass, backward, dims, dtype, seconds))
    return out


def _tensor_inputs(args: dict) -> tuple[tuple[tuple[int, ...], ...], str]:
    """The shapes of the tensor inputs (scalars and empty lists dropped) and the first one's
    element type."""
    dims, types = args.get("Input Dims"), args.get("Input type") or []
    if not isinstance(dims, list):
        return (), ""
    shapes, dtype = [], ""
    for i, d in enumerate(dims):
        if isinstance(d, list) and d and all(isinstance(x, int | float) for x in d):
            shapes.append(tuple(int(x) for x in d))
            if not dtype and i < len(types):
                dtype = str(types[i])
    return tuple(shapes), dtype
