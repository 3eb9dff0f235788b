"""A GPU communication kernel is the host collective that launched it.

A kernel's name tells how NCCL moves the data, not what the program asked for: torch's
`all_to_all` runs as `ncclKernel_SendRecv_...`, which by its name is pipeline p2p. The host
knows: the runtime call that launched the kernel (the `cuda_runtime`/`cuda_driver` event with the
kernel's `args.correlation`) sits inside the collective's host events on its thread, e.g.

    c10d::alltoall_base_  >  record_param_comms  >  nccl:all_to_all  >  cudaLaunchKernel

`record_param_comms` carries, in PyTorch 2.x, `Collective name`, `In msg nelems`, `dtype`,
`Group size` and the process group (`Process Group Name`/`Description`). So the kind is the
innermost enclosing host collective's that names one, and the process group, its size and the
bytes are the innermost enclosing one's whose arguments carry them (the annotation
`nccl:all_to_all` records its input tensor's `Input Dims`); what the host does not say is the
kernel's own (its name and arguments). On a trace with GPU kernels the host's annotations
(`nccl:all_reduce`) are no transfers of their own: the kernel is the transfer. The enclosing events are found as for operators
(`paraplan.traces.ops.HostThread`, HolisticTraceAnalysis's call-stack linking).
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.traces.ops import HostThread


@dataclass(frozen=True, slots=True)
class HostComm:
    """What one host communication event says: its kind ("other" when it names none), and the
    arguments that name the process group, its size and the bytes (those it carries)."""

    kind: str
    args: dict  # the arguments that name the group and the bytes ({} when none do)


def host_collectives(launches, comms, wanted: set[int]) -> dict[int, list[HostComm]]:
    """Correlation id -> the host communication events around the runtime call that launched it
    (innermost first), for the ids in ``wanted``.

    ``launches``: (thread key, start, correlation id) of runtime calls; ``comms``: (thread key,
    start, end, HostComm) of host communication events."""
    threads: dict[object, HostThread] = {}
    seen: set[int] = set()
    for key, ts, corr in launches:
        if corr in wanted and corr not in seen:  # the first call of a repeated id wins
            seen.add(corr)
            threads.setdefault(key, HostThread()).launch(corr, ts)
    if not seen:
        return {}
    infos: list[HostComm] = []
    for key, ts, end, info in comms:
        thread = threads.get(key)
        if thread is not None:
            thread.op(ts, end - ts, len(infos))
            infos.append(info)
    stacks: dict[int, list[int]] = {}
    for thread in threads.values():
        thread.enclosing_ops(stacks, whole_stack=True)
    return {corr: [infos[i] for i in reversed(stack)] for corr, stack in stacks.items()}


def from_host(kind: str, args: dict, around: list[HostComm]) -> tuple[str, dict]:
    """The kind and the arguments (group, size, bytes) of a kernel whose own are ``kind`` and
    ``args``, with the host collectives ``around`` it (innermost first): the host's win, the
    innermost's first."""
    host_kind = next((c.kind for c in around if c.kind != "other"), None)
    merged = dict(args)
    for c in reversed(around):  # the innermost says last
        merged.update(c.args)
    return host_kind or kind, merged
