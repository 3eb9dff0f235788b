"""A GPU's memory curves per kind of streaming kernel (``efficiency.memory_kernels``) from a
profiler trace's streaming kernels.

Every kernel of a streaming operator (copy, cast, fill, element-wise add/mul/...) that recorded
its shapes and element types (``traces.ops.operator_kernels``) moves known bytes: a fill writes
its output; a copy (a cast when the two element types differ) reads its source and writes its
destination; an element-wise op reads every input and writes one output (in place: the first
input). The median duration of each distinct (operator, shapes, types, kernel) is one sample of
an element-wise inventory operator of those bytes, tagged by its class (``kernel_class``), so
``calibrate.efficiency.fit_efficiency`` fits each kind's curve through ``estimate_op_s``
exactly as it fits operator samples. A kernel PyTorch ran as its generic strided
``elementwise_kernel`` (a non-contiguous input: a transpose or a slice) is classed apart: it
does not stream. Kernel durations only: no iteration time is read.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from paraplan.calibrate.efficiency import fit_efficiency
from paraplan.calibrate.kernel_floor import FILL_OPS, FLOOR_OPS
from paraplan.calibrate.operators import FWD, OpSamples, predict_ops
from paraplan.calibrate.params import ParamLayout
from paraplan.inventory import Op, OpKind
from paraplan.inventory.kernel_mixes import SINGLE
from paraplan.specs import EfficiencyCurve, GpuSpec, MemoryKernel, Precision
from paraplan.traces.ops import ELEMENT_BYTES, KernelCall, operator_kernels

COPY_OPS = frozenset({"aten::copy_"})
#: PyTorch's generic TensorIterator kernel, run when an operand is not contiguous.
STRIDED_KERNEL = "at::native::elementwise_kernel<"
#: PyTorch's contiguous kernel without vector loads (a cast it cannot vectorize, mixed types).
UNROLLED_KERNEL = "at::native::unrolled_elementwise_kernel<"
CLASSES = ("fill", "copy", "cast", "elementwise", "unrolled", "strided")
#: The kind of streaming kernel (``MemoryKernel``) each class is: what ``efficiency.memory_kernels``
#: keys its curves by, and what the inventory's operators name (``inventory.kernel_mixes``).
KIND = {"fill": MemoryKernel.VECTORIZED, "copy": MemoryKernel.VECTORIZED, "cast": MemoryKernel.VECTORIZED,
        "elementwise": MemoryKernel.VECTORIZED, "unrolled": MemoryKernel.UNROLLED, "strided": MemoryKernel.STRIDED}


def kernel_class(call: KernelCall) -> str:
    """``strided`` for PyTorch's generic strided kernel, ``unrolled`` for its contiguous kernel
    without vector loads; else (the vectorized streaming kernel) ``fill``, ``copy`` (same
    element types), ``cast`` (a copy between element types) or ``elementwise`` (arithmetic)."""
    if STRIDED_KERNEL in call.kernel:
        return "strided"
    if UNROLLED_KERNEL in call.kernel:
        return "unrolled"
    if call.op in FILL_OPS:
        return "fill"
    if call.op in COPY_OPS:
        return "cast" if len(set(call.dtypes[:2])) > 1 else "copy"
    return "elementwise"


def traffic_bytes(call: KernelCall) -> float | None:
    """HBM bytes one streaming kernel moves (see the module's docstring); None when an element
    type's size is unknown or the types were not recorded."""
    if not call.dims or len(call.dtypes) != len(call.dims):
        return None
    sizes = [ELEMENT_BYTES.get(t) for t in call.dtypes]
    if any(s is None for s in sizes):
        return None
    elems = [math.prod(d) for d in call.dims]
    if call.op in FILL_OPS:
        return float(sizes[0] * elems[0])
    if call.op in COPY_OPS:
        return float(sizes[0] * elems[0] + sizes[1] * elems[1])
    read = sum(s * n for s, n in zip(sizes, elems, strict=True))
    if call.op.endswith("_"):
        return float(read + sizes[0] * elems[0])
    return float(read + max(sizes) * max(elems))


def stream_samples(path: Path, ops: frozenset[str] = FLOOR_OPS) -> OpSamples:
    """One sample per distinct (operator, shapes, types, kernel) of the kernels that ran alone
    for their operator call: an element-wise ``Op`` of the kernel's bytes, timed at the median
    of its calls, tagged by ``kernel_class``."""
    groups: dict[tuple, tuple[KernelCall, list[float]]] = {}
    for call in operator_kernels(path, ops):
        if call.siblings == 1 and call.seconds > 0.0:
            groups.setdefault((call.op, call.dims, call.dtypes, call.kernel), (call, []))[1].append(call.seconds)
    samples = OpSamples()
    for key, (call, seconds) in groups.items():
        traffic = traffic_bytes(call)
        if traffic is None:
            continue
        cls = kernel_class(call)
        op = Op(name=call.op.removeprefix("aten::"), kind=OpKind.ELEMENTWISE, role="stream", flops=0.0,
                bytes=traffic, bwd_flops=0.0, bwd_bytes=0.0, memory_kernels=SINGLE[KIND[cls]])
        samples.add(cls, FWD, op, key, float(np.median(seconds)))
    return samples


#: The classes PyTorch runs as its vectorized streaming kernel: what the vectorized curve is fitted to.
STREAMING = ("fill", "copy", "cast", "elementwise")


def fit_memory_curve(samples: OpSamples, gpu: GpuSpec, loss: str = "soft_l1") -> EfficiencyCurve:
    """``gpu``'s kind-level memory curve fitted to ``samples`` (``calibrate.efficiency.fit_efficiency``:
    least squares on log(pred / measured) through ``estimate_op_s``, each class weighing the
    same, the GPU's kernel overhead and other curves kept). Its per-kind curves are set aside
    while fitting, so that every sample is timed on the curve fitted: fitted to one kind's
    samples, it is that kind's curve (``efficiency.memory_kernels``)."""
    gpu = without_kind_curves(gpu)
    spec, _ = fit_efficiency(samples, gpu, gpu.flops_for(Precision.BF16), gpu.efficiency, loss=loss, max_nfev=400,
                             layout=ParamLayout(), fix_overhead=True)
    return spec.memory


def without_kind_curves(gpu: GpuSpec) -> GpuSpec:
    """``gpu`` with every streaming kernel timed on its generic ``memory`` curve."""
    if not gpu.efficiency.memory_kernels:
        return gpu
    return gpu.model_copy(update={"efficiency": gpu.efficiency.model_copy(update={"memory_kernels": {}})})


def with_memory_curve(gpu: GpuSpec, curve: EfficiencyCurve) -> GpuSpec:
    return gpu.model_copy(update={"efficiency": gpu.efficiency.model_copy(update={"memory": curve})})


def curve_errors(samples: OpSamples, gpu: GpuSpec) -> np.ndarray:
    """predicted / measured - 1 of every sample on ``gpu``'s curves."""
    return predict_ops(samples, gpu, gpu.flops_for(Precision.BF16)) / np.asarray(samples.measured) - 1.0


def leave_one_out(samples: OpSamples, gpu: GpuSpec, loss: str = "soft_l1") -> np.ndarray:
    """Each sample's error on the curve fitted without it (every sample on that one curve)."""
    out, gpu = [], without_kind_curves(gpu)
    for i in range(len(samples)):
        alone = np.arange(len(samples)) == i
        fitted = with_memory_curve(gpu, fit_memory_curve(samples.subset(~alone), gpu, loss))
        out.append(float(curve_errors(samples.subset(alone), fitted)[0]))
    return np.array(out)


#: The kinds fitted apart into ``efficiency.memory_kernels``, by the classes of their kernels. The
#: generic ``memory`` curve is not fitted here: it serves operators whose kernels' kind is not
#: known, and a GPU's best kind would price them as the fastest PyTorch kernels.
KIND_CLASSES = {MemoryKernel.VECTORIZED: STREAMING, MemoryKernel.UNROLLED: ("unrolled",),
                MemoryKernel.STRIDED: ("strided",)}


def kind_samples(samples: OpSamples, kind: MemoryKernel) -> OpSamples:
    """The samples of ``kind``'s classes."""
    classes = KIND_CLASSES[kind]
    return samples.subset(np.isin(np.asarray(samples.tag), classes))
