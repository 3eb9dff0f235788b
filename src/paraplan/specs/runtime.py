"""What a training process holds on a GPU besides its tensors (``catalog/runtime/memory.yaml``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict

from paraplan.specs._types import Bytes, _bounded, _number

_Elements = Annotated[float, _bounded(_number, 0.0, 1e13, "a number of elements from 0 to 1e13")]
_Share = Annotated[float, _bounded(_number, 0.0, 0.9, "a fraction from 0 to 0.9")]


class RuntimeMemorySpec(BaseModel):
    """The CUDA context, NCCL's buffers, the caching allocator's fragmentation and the
    framework buffers whose size is a setting (with the setting's default)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    cuda_context_bytes: Bytes
    nccl_communicator_bytes: Bytes
    nccl_all_to_all_bytes: Bytes
    allocator_fragmentation: _Share
    deepspeed_reduce_bucket_size: _Elements
    deepspeed_stage3_prefetch_bucket_size: _Elements
    deepspeed_stage3_max_live_parameters: _Elements
    # workspaces allocated once through the caching allocator and kept (allocated memory), by
    # the GPU's architecture as the catalog names it (``default``: every other one): PyTorch's
    # cuBLAS workspace, and Transformer Engine's (Megatron's layers)
    cublas_workspace_bytes: dict[str, Bytes]
    te_cublas_workspace_bytes: dict[str, Bytes]
    sources: dict[str, str] = {}


class HostLaunchSpec(BaseModel):
    """The host's CPU seconds per launched kernel (``catalog/runtime/host.yaml``), measured in a
    profiler trace on ``host``; ``spread_us``: the same measurement on other hosts."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    launch_s: Annotated[float, _bounded(_number, 1e-7, 1e-3, "seconds from 1e-7 to 1e-3")]
    host: str
    spread_us: dict[str, float] = {}
