"""What a training process holds on a GPU besides its tensors (``catalog/runtime/memory.yaml``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, field_validator

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


#: The GEMMs Transformer Engine's userbuffers overlap with a tensor-parallel collective, by the
#: names its ``initialize_ub`` configuration uses, and the method it runs each with when a
#: configuration leaves it out (TE ``module/base.py`` ``initialize_ub``: ``methods``)
UB_DEFAULT_METHODS = {
    "qkv_fprop": "ring_exchange", "fc1_fprop": "ring_exchange", "proj_dgrad": "ring_exchange",
    "fc2_dgrad": "ring_exchange", "proj_fprop": "pipeline", "fc2_fprop": "pipeline",
    "qkv_dgrad": "bulk", "qkv_wgrad": "bulk", "fc1_dgrad": "bulk", "fc1_wgrad": "bulk",
}
UB_METHODS = ("ring_exchange", "pipeline", "bulk")


class UserbuffersGemm(BaseModel):
    """How userbuffers runs one GEMM beside its collective (one entry of a TE ``ub_cfgs`` file).
    Absent keys take ``initialize_ub``'s defaults: num_sm 16, cga_size 2, set_sm_margin 0,
    aggregate 0, num_splits 4 (a pipelined GEMM the file does not name; 0 otherwise)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str
    num_sm: Annotated[int, _bounded(_number, 0, 1024, "an SM count from 0 to 1024")] = 16
    cga_size: Annotated[int, _bounded(_number, 1, 16, "a cluster size from 1 to 16")] = 2
    num_splits: Annotated[int, _bounded(_number, 0, 64, "a split count from 0 to 64")] = 0
    set_sm_margin: bool = False
    aggregate: bool = False

    @field_validator("method")
    @classmethod
    def _known_method(cls, value: str) -> str:
        if value not in UB_METHODS:
            raise ValueError(f"one of {', '.join(UB_METHODS)}, not {value!r}")
        return value


class UserbuffersSpec(BaseModel):
    """A Transformer Engine userbuffers configuration (``catalog/userbuffers/*.yaml``: the
    ``ub_cfgs`` a framework hands ``initialize_ub``), each GEMM's method and SMs, with its source.
    A GEMM the file leaves out runs TE's default method (``UB_DEFAULT_METHODS``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    gemms: dict[str, UserbuffersGemm]
    source: str
    te_version: str

    @field_validator("gemms")
    @classmethod
    def _known_gemms(cls, value: dict[str, UserbuffersGemm]) -> dict[str, UserbuffersGemm]:
        unknown = sorted(set(value) - set(UB_DEFAULT_METHODS))
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: not a GEMM userbuffers overlaps ({', '.join(UB_DEFAULT_METHODS)})")
        return value

    def gemm(self, name: str) -> UserbuffersGemm:
        """The configuration of GEMM ``name`` (``UB_DEFAULT_METHODS``' keys), TE's default where absent."""
        if name in self.gemms:
            return self.gemms[name]
        method = UB_DEFAULT_METHODS[name]
        return UserbuffersGemm(method=method, num_splits=4 if method == "pipeline" else 0)
