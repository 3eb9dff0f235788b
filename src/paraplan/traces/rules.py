"""How trace events become components: the classification tables, as data.

An event's name (and category) is matched against `COMM_RULES`, then `COMPUTE_RULES`, in order;
the first match names its class. A GPU kernel (not communication) is classified by its own name
from the table in `kernel_classes.yaml` (`paraplan.traces.kernels`), a memory copy or set is
"memory". Events no rule names (module annotations, autograd wrappers,
`aten::empty`, ...) take their enclosing event's class. A rule that `claims` its subtree gives its
class to everything nested inside it (the optimizer step's many small element-wise ops are the
optimizer; the matmuls inside an unfused attention are attention).

What real traces hold (seen in torch 2.13 CPU traces with gloo, and in NCCL GPU traces):
* gloo: `c10d::allreduce_`, `c10d::_allgather_base_`, `c10d::send`, ... on the calling thread
  (enqueueing: short for async work), and `gloo:all_reduce`, `gloo:all_gather`, `gloo:send`, ...
  user annotations spanning the transfer itself (waiting for the peer included), on a
  `pt_gloo_runloop` thread for async work or on the calling thread for blocking send/recv.
  With `record_shapes=True` they carry `Input Dims` and `Input type` (the bytes); they carry no
  process-group name. torch 2.13 records no `record_param_comms` event for gloo.
* NCCL: kernels `ncclDevKernel_AllReduce_Sum_bf16_RING_LL(...)` whose args hold
  `Collective name`, `In msg nelems`, `Out msg nelems`, `Group size`, `dtype`,
  `Process Group Name`, `Process Group Description` and `Process Group Ranks`. The host around
  the launch holds `c10d::alltoall_base_` > `record_param_comms` (the same arguments, PyTorch
  2.x) > `nccl:all_to_all` (a user annotation with the input's `Input Dims`): the kernel takes its
  kind from there (an all_to_all runs as `ncclKernel_SendRecv_...`; `paraplan.traces.comm_link`).
* DeepEP (github.com/deepseek-ai/DeepEP): `void deep_ep::intranode::dispatch<...>(...)`,
  `deep_ep::internode_ll::combine<...>`, ... kernels move MoE tokens: expert-parallel all_to_all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from paraplan.traces.kernels import classify_kernel

#: Compute classes, in the order tables show them.
COMPUTE_CLASSES = ("gemm", "attention", "norm", "elementwise", "fp8_cast", "optimizer", "other",
                   "embedding", "memory", "conv")
#: Profiler categories of GPU kernels (Kineto's, and the 2021 schema's), classified by the
#: kernel's own name (`paraplan.traces.kernels`); memory copies and sets are "memory".
KERNEL_CATEGORIES = frozenset({"kernel", "Kernel"})
#: Host-side CUDA/HIP API calls that launch GPU work; a kernel carries its launch's
#: ``args.correlation`` (Kineto's categories; ``cuda_driver`` covers cuLaunchKernel).
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver", "runtime"})
MEMORY_CATEGORIES = frozenset({"gpu_memcpy", "gpu_memset", "Memcpy", "Memset"})
#: Collective kinds, normalised (lower case, no punctuation) -> the name paraplan shows.
COLLECTIVE_KINDS = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "allgatherintotensor": "all_gather",
    "allgathercoalesced": "all_gather",
    "reducescatter": "reduce_scatter",
    "reducescattertensor": "reduce_scatter",
    "alltoall": "all_to_all",
    "alltoallv": "all_to_all",
    "alltoallsingle": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
    "send": "send",
    "recv": "recv",
    "sendrecv": "send_recv",
}
P2P_KINDS = frozenset({"send", "recv", "send_recv"})
#: Kinds that, when the process group names no dimension, are expert parallelism's (MoE token
#: dispatch and combine are all-to-alls; Megatron-LM's and torchtitan's EP use all_to_all_single).
EP_KINDS = frozenset({"all_to_all"})


@dataclass(frozen=True)
class Rule:
    pattern: str  # a regular expression searched in the event name
    klass: str
    claims: bool = False  # everything nested inside takes this class
    categories: tuple[str, ...] = ()  # empty: any category
    op: str = ""  # communication: the operation, when the name does not tell it


COMPUTE_RULES: tuple[Rule, ...] = (
    Rule(r"^Optimizer\.(step|zero_grad)#", "optimizer", claims=True),
    Rule(r"multi_tensor_apply|_fused_adam|adam_|_foreach_|FusedAdam|lamb_", "optimizer", claims=True),
    Rule(r"(?i)scaled_dot_product|flash_?attn|flash_fwd|flash_bwd|fmha|efficient_attention|"
         r"attention", "attention", claims=True),
    Rule(r"(?i)layer_?norm|rms_?norm|group_norm|batch_norm", "norm", claims=True),
    Rule(r"(?i)fp8|float8|e4m3|e5m2|cast_transpose|amax", "fp8_cast", claims=True),
    Rule(r"^aten::(mm|addmm|bmm|baddbmm|addbmm|matmul|_scaled_mm|addmv|mv|dot)$", "gemm"),
    Rule(r"(?i)gemm|cutlass|cublas|xmma|wgmma|nvjet|_mma_|matmul", "gemm"),
    Rule(r"^aten::(embedding|embedding_dense_backward|embedding_backward)_?$", "embedding"),
    Rule(r"^aten::(add|sub|mul|div|neg|pow|sqrt|rsqrt|exp|log|tanh|sigmoid|gelu|silu|relu|softmax|"
         r"_softmax|log_softmax|_log_softmax|dropout|native_dropout|where|masked_fill|clamp|copy|"
         r"fill|zero|lerp|addcmul|addcdiv|sum|mean|cat|stack|"
         r"threshold_backward|gelu_backward|silu_backward|_log_softmax_backward_data|"
         r"nll_loss_forward|nll_loss_backward|index_select|_to_copy)_?$", "elementwise"),
)

#: Communication events: the operation name is the text the group `op` catches.
#: A "transfer" spans the transfer itself; an "annotation" is the host's record of a transfer that
#: runs on the GPU (`nccl:all_reduce` on the CPU thread): a transfer only on a trace without GPU
#: kernels, where it is all there is; a "host" event enqueues one (its arguments may name the kind,
#: the process group and the bytes of the kernel it launches, see `paraplan.traces.comm_link`).
COMM_RULES: tuple[Rule, ...] = (
    Rule(r"^(?:gloo|mpi|ucc):(?P<op>\w+)", "transfer", claims=True),
    Rule(r"^(?:nccl|xccl|rccl):(?P<op>\w+)", "annotation", claims=True),
    Rule(r"^nccl(?:Dev)?Kernel_(?P<op>[A-Za-z]+)", "transfer", claims=True, categories=("kernel", "Kernel")),
    # DeepEP's (github.com/deepseek-ai/DeepEP, csrc/kernels/{intranode,internode,internode_ll}.cu)
    # MoE dispatch/combine kernels and their notify steps, e.g.
    # `void deep_ep::intranode::dispatch<8, 768, 8192>(...)`; NVSHMEM's all-to-all collective kernels
    # (`nvshmemx_alltoallmem_on_stream`): expert parallelism's all-to-all
    Rule(r"^(?:void )?deep_ep::(?:intranode|internode|internode_ll)::(?:\w*dispatch|\w*combine|cached_notify)\b",
         "transfer", claims=True, categories=("kernel", "Kernel"), op="all_to_all"),
    Rule(r"(?i)^(?:void )?(?:nvshmemi?x?_?\w*)?alltoall\w*(?:kernel|_on_stream)|^(?:void )?nvshmem\w*alltoall",
         "transfer", claims=True, categories=("kernel", "Kernel"), op="all_to_all"),
    Rule(r"^record_param_comms$", "host", claims=True),
    Rule(r"^c10d::(?P<op>\w+?)_?$", "host", claims=True),
    Rule(r"^(?:nccl|gloo):", "host", claims=True),
    # FSDP2's regions that wait for their collective: their own time is waiting, their
    # children (copy-in, copy-out) keep their class
    Rule(r"^FSDP::all_gather( \(|$)", "wait", op="all_gather"),
    Rule(r"^FSDP::post_backward_(reduce|rs_wait)", "wait", op="reduce_scatter"),
)

#: Iterations: ProfilerStep#N markers, else these framework train-step regions (in order).
STEP_MARKER = re.compile(r"^ProfilerStep#(\d+)$")
TRAIN_STEP_REGIONS = (
    re.compile(r"^(train_step|training_step|train_batch|TrainStep|Megatron train_step)$"),
    re.compile(r"^DeepSpeedEngine\.train_batch$"),
)

#: Which parallel dimension a process group serves, from its description or name (torchtitan's
#: mesh names, Megatron-LM's and DeepSpeed's group names). First match wins.
GROUP_DIMENSIONS: tuple[tuple[str, str], ...] = (
    (r"(?i)(^|[_:\s-])(pp|pipe|pipeline)([_:\s-]|$)", "pp"),
    (r"(?i)(^|[_:\s-])(ep|expert|moe)([_:\s-]|$)", "ep"),
    (r"(?i)(^|[_:\s-])(tp|tensor|mp|model)([_:\s-]|$)", "tp"),
    (r"(?i)(^|[_:\s-])(dp|data|fsdp|dp_shard|dp_replicate|zero)([_:\s-]|$)", "dp"),
    (r"(?i)(^|[_:\s-])(cp|context)([_:\s-]|$)", "cp"),
)
#: Bytes per element, by the spellings traces use (`Input type`, NCCL's `dtype`).
DTYPE_BYTES = {
    "float": 4, "Float": 4, "float32": 4, "double": 8, "Double": 8, "float64": 8,
    "c10::Half": 2, "Half": 2, "float16": 2, "c10::BFloat16": 2, "BFloat16": 2, "bfloat16": 2,
    "c10::Float8_e4m3fn": 1, "Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "Float8_e5m2": 1,
    "int": 4, "Int": 4, "int32": 4, "long int": 8, "Long": 8, "int64": 8, "short int": 2,
    "signed char": 1, "unsigned char": 1, "Byte": 1, "Char": 1, "bool": 1, "Bool": 1,
}
DIMENSIONS = ("tp", "cp", "ep", "pp", "dp", "unknown")


@dataclass(frozen=True)
class Verdict:
    """What one event name is: a compute class, a communication op, or neither (None)."""

    klass: str | None  # a COMPUTE_CLASSES entry, "comm", or None (takes the enclosing class)
    claims: bool = False
    collective: str | None = None  # the normalised kind, for communication
    transfer: bool = False  # the event spans the transfer itself (not its enqueueing)
    annotation: bool = False  # the host's record of a GPU transfer: a transfer only without kernels


_COMPILED_COMPUTE = tuple((re.compile(r.pattern), r) for r in COMPUTE_RULES)
_COMPILED_COMM = tuple((re.compile(r.pattern), r) for r in COMM_RULES)


def collective_kind(op: str) -> str:
    """'all_reduce', 'AllReduce', '_allgather_base' -> the name paraplan shows ('other' if none)."""
    norm = re.sub(r"[^a-z]", "", op.lower())
    norm = norm.removesuffix("base")
    return COLLECTIVE_KINDS.get(norm, "other")


@lru_cache(maxsize=65536)
def classify(name: str, category: str = "") -> Verdict:
    """The verdict for an event name; cached, since a trace repeats a few thousand names."""
    for regex, rule in _COMPILED_COMM:
        if rule.categories and category not in rule.categories:
            continue
        m = regex.search(name)
        if m:
            op = m.groupdict().get("op") or rule.op
            return Verdict("comm", rule.claims, collective_kind(op) if op else None,
                           rule.klass in ("transfer", "annotation"), rule.klass == "annotation")
    if category in KERNEL_CATEGORIES:
        return Verdict(classify_kernel(name))
    if category in MEMORY_CATEGORIES:
        return Verdict("memory")
    for regex, rule in _COMPILED_COMPUTE:
        if rule.categories and category not in rule.categories:
            continue
        if regex.search(name):
            return Verdict(rule.klass, rule.claims)
    return Verdict(None)


def group_dimension(description: str) -> str | None:
    """'tp', 'pp', 'dp', ... for a process group's description or name; None if it names none."""
    for pattern, dim in GROUP_DIMENSIONS:
        if re.search(pattern, description):
            return dim
    return None
