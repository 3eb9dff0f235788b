"""Single-operator timings out of a profiler trace: the GEMMs, attention and memory-bound
operators the run executed, with their shapes (the trace must be recorded with
``record_shapes=True``) and their time.

On a CPU trace an operator's time is its ``aten::`` event's duration. On a GPU trace it is the
summed duration of the kernels the operator launched (the ``cpu_op`` event carries the shapes,
the ``kernel`` events the device time), linked through the launching runtime call's
correlation id to the innermost operator around that call (``trace_operators``).
Only leaf operators are kept (``aten::mm``, not the ``aten::linear`` that calls it), so no
time is counted twice.
"""

from __future__ import annotations

from array import array
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from paraplan.traces.kernels import kernel_precision
from paraplan.traces.reader import iter_events
from paraplan.traces.rules import RUNTIME_CATEGORIES

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
    # the precision its kernels' names say their math ran in ("tf32": fp32 operands on TF32
    # tensor cores; ``traces.kernels.kernel_precision``), "" when none says
    precision: str = ""


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


@dataclass(frozen=True, slots=True)
class TraceOps:
    """The timed leaf operators of one rank's trace, and how many of its GPU kernels could be
    attributed to the CPU operator that launched them."""

    timings: tuple[OpTiming, ...]
    kernels: int  # GPU kernels (``cat == "kernel"``) in the trace
    linked: int  # of them attributed to a CPU operator
    shaped_ops: int  # CPU operators that recorded the shapes of tensor inputs
    leaf_ops: int  # of them leaf operators paraplan times (``op_class``)

    @property
    def linked_fraction(self) -> float | None:
        """Linked kernels / kernels; None on a trace without kernels (a CPU trace)."""
        return self.linked / self.kernels if self.kernels else None


def operator_timings(path: Path) -> list[OpTiming]:
    """Every timed leaf operator of one rank's trace, in file order. Empty when the trace was
    recorded without shapes (``record_shapes=False``)."""
    return list(trace_operators(path).timings)


def trace_operators(path: Path) -> TraceOps:
    """Every timed leaf operator of one rank's trace (``operator_timings``) with the kernel
    linking counts (``TraceOps``).

    A kernel belongs to the CPU operator that launched it, found as HolisticTraceAnalysis does
    (facebookresearch/HolisticTraceAnalysis, ``hta/common/trace_collection.py``
    ``get_cpu_gpu_correlation``, ``hta/common/trace.py`` in v0.5.0: the kernel's ``correlation``
    equals its launching runtime call's; ``hta/common/trace_call_stack.py`` ``CallStackGraph``,
    ``call_stack.py`` in v0.5.0: the runtime call's parent is the innermost CPU event on its
    thread whose interval contains it): the runtime call (e.g.
    ``cudaLaunchKernel``) with the kernel's ``args.correlation``, then the innermost
    ``cpu_op`` on the runtime call's thread (pid, tid) whose interval contains the call. When a
    kernel has no such runtime call, its ``External id`` is matched to a ``cpu_op``'s (older
    and CPU-recorded traces, where that id is the operator's).
    """
    kernels, owners, info, shaped = _link(path)
    kernel_s: dict[int, float] = defaultdict(float)
    precision: dict[int, str] = {}
    for (_, _, seconds, kernel), op in zip(kernels, owners, strict=True):
        if op is not None:
            kernel_s[op] += seconds
            if op in info and op not in precision:
                said = kernel_precision(kernel)
                if said is not None:
                    precision[op] = said
    out = []
    for i in sorted(info):
        name, klass, backward, dims, dtype, host_s, _ = info[i]
        seconds = kernel_s.get(i, 0.0) if kernels else host_s
        if seconds > 0.0:
            out.append(OpTiming(name, klass, backward, dims, dtype, seconds, precision.get(i, "")))
    linked = sum(op is not None for op in owners)
    return TraceOps(tuple(out), len(kernels), linked, shaped, len(info))


@dataclass(frozen=True, slots=True)
class KernelCall:
    """One GPU kernel launched by a timed operator with shapes: the operator, its inputs' shapes
    and element type, the kernel's own seconds, and how many kernels that operator launched."""

    op: str
    dims: tuple[tuple[int, ...], ...]
    dtype: str
    seconds: float
    kernel: str
    siblings: int  # kernels the same operator call launched (this one included)
    dtypes: tuple[str, ...] = ()  # element type of each tensor input, in ``dims`` order


def operator_kernels(path: Path, names: frozenset[str]) -> list[KernelCall]:
    """Every kernel of one rank's trace launched by an operator named in ``names`` that recorded
    its input shapes, one row per kernel (not summed per operator as ``trace_operators`` does),
    linked as ``trace_operators`` links them."""
    kernels, owners, info, _ = _link(path, classify=lambda n: ("memory", False) if n in names else None)
    launched: dict[int, int] = defaultdict(int)
    for op in owners:
        if op is not None:
            launched[op] += 1
    out = []
    for (_, _, seconds, kernel), op in zip(kernels, owners, strict=True):
        if op is not None and op in info:
            name, _, _, dims, dtype, _, types = info[op]
            out.append(KernelCall(name, dims, dtype, seconds, kernel, launched[op], types))
    return out


def _link(path: Path, *, by_launch: bool = True, classify=None):
    """The kernels (correlation, External id, seconds, name), the index of the cpu_op each belongs to
    (None when unlinked), the timed leaf operators by index, and the number of operators with
    shapes. ``by_launch=False`` links by External id alone (the linking before issue 25);
    ``classify`` (default ``op_class``) says which operators are timed and their curve class."""
    classify = classify or op_class
    threads: dict[tuple, _Thread] = {}
    info: dict[int, tuple[str, str, bool, tuple, str, float, tuple]] = {}  # op index -> timed leaf op
    by_ext: dict[object, int] = {}
    launched: set = set()  # correlation ids of runtime calls
    kernels: list[tuple[object, object, float, str]] = []  # (correlation, External id, seconds, name)
    n_ops = shaped = 0
    for ev in iter_events(path):
        if ev.get("ph") != "X" or "dur" not in ev:
            continue
        cat = ev.get("cat") or ""
        args = ev.get("args") or {}
        if cat == "kernel":
            kernels.append((args.get("correlation"), args.get("External id"), float(ev["dur"]) * 1e-6,
                            ev.get("name") or ""))
        elif cat in RUNTIME_CATEGORIES:
            corr = args.get("correlation")
            if corr is not None and by_launch:
                _thread(threads, ev).launch(corr, float(ev["ts"]))
                launched.add(corr)
        elif cat == "cpu_op":
            i, n_ops = n_ops, n_ops + 1
            _thread(threads, ev).op(float(ev["ts"]), float(ev["dur"]), i)
            ext = args.get("External id")
            if ext is not None:
                by_ext.setdefault(ext, i)
            dims, types = _tensor_inputs(args)
            if not dims:
                continue
            shaped += 1
            verdict = classify(ev.get("name") or "")
            if verdict is not None:
                dtype = next((t for t in types if t), "")
                info[i] = (ev["name"], verdict[0], verdict[1], dims, dtype, float(ev["dur"]) * 1e-6, types)
    parent: dict[object, int] = {}
    for thread in threads.values():
        thread.enclosing_ops(parent)
    owners: list[int | None] = []
    for corr, ext, _, _ in kernels:
        op = parent.get(corr) if corr is not None else None
        if op is None and corr not in launched and ext is not None:
            op = by_ext.get(ext)
        owners.append(op)
    return kernels, owners, info, shaped


def _thread(threads: dict, ev: dict) -> _Thread:
    key = (ev.get("pid"), ev.get("tid"))
    if key not in threads:
        threads[key] = _Thread()
    return threads[key]


class _Thread:
    """One host thread's cpu_ops (start, end, index) and runtime calls (start, correlation),
    kept in flat arrays (a GB trace holds millions of them)."""

    __slots__ = ("ends", "index", "launch_corr", "launch_ts", "starts")

    def __init__(self) -> None:
        self.starts, self.ends, self.index = array("d"), array("d"), array("q")
        self.launch_ts, self.launch_corr = array("d"), []

    def op(self, ts: float, dur: float, i: int) -> None:
        self.starts.append(ts)
        self.ends.append(ts + dur)
        self.index.append(i)

    def launch(self, corr, ts: float) -> None:
        self.launch_ts.append(ts)
        self.launch_corr.append(corr)

    def enclosing_ops(self, parent: dict, *, whole_stack: bool = False) -> None:
        """Record in ``parent`` correlation id -> the innermost cpu_op of this thread containing
        that runtime call (``whole_stack``: the indices of every op containing it, outermost
        first): one sweep over starts with a stack of the operators still open (at a
        tie the outer operator opens first, and an operator opens before a call at its start)."""
        if not self.launch_corr or not self.starts:
            return
        import numpy as np

        starts, ends = np.frombuffer(self.starts), np.frombuffer(self.ends)
        order = np.lexsort((-ends, starts))
        op_start, op_end = starts[order].tolist(), ends[order].tolist()
        op_index = np.frombuffer(self.index, dtype=np.int64)[order].tolist()
        stack: list[tuple[float, int]] = []  # (end, op index)
        o, n = 0, len(op_start)
        for c in np.argsort(np.frombuffer(self.launch_ts), kind="stable").tolist():
            ts = self.launch_ts[c]
            while o < n and op_start[o] <= ts:
                while stack and stack[-1][0] < op_start[o]:
                    stack.pop()
                stack.append((op_end[o], op_index[o]))
                o += 1
            while stack and stack[-1][0] < ts:
                stack.pop()
            if stack:
                parent[self.launch_corr[c]] = [i for _, i in stack] if whole_stack else stack[-1][1]


def _tensor_inputs(args: dict) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]:
    """The shapes of the tensor inputs (scalars and empty lists dropped) and each one's element
    type ("" where the trace gives none)."""
    dims, types = args.get("Input Dims"), args.get("Input type") or []
    if not isinstance(dims, list):
        return (), ()
    shapes, dtypes = [], []
    for i, d in enumerate(dims):
        if isinstance(d, list) and d and all(isinstance(x, int | float) for x in d):
            shapes.append(tuple(int(x) for x in d))
            dtypes.append(str(types[i]) if i < len(types) else "")
    return tuple(shapes), tuple(dtypes)


#: The host-thread sweep (operators around each runtime call), for `paraplan.traces.comm_link` too.
HostThread = _Thread
