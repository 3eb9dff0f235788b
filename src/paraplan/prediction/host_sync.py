"""What a host sync point in a layer's forward adds to it: after the host waits for the GPU,
the GPU cannot run ahead of the host, so the kernels after the sync start no earlier than the
host launches them.

A mixture-of-experts layer's token dispatcher syncs once per forward (``ParallelPlan.
moe_host_sync``: Megatron-Core's alltoall dispatcher copies the routing's counts to the host for
the all-to-all's and grouped GEMM's split sizes, DeepEP's dispatch returns its received counts to
the CPU). From the sync to the next layer's sync the host launches every kernel of one layer
(the rest of this one, then the next one's attention, router and permutation) at
``launch_s`` CPU seconds each (``catalog/runtime/host.yaml``, measured in profiler traces), and
the GPU runs each kernel once it is launched and the previous one is done. The cycle takes
max(GPU time, host launch time) and more where the two interleave (``launch_bound_s``); a layer
whose kernels outlast the host's launches loses nothing, and halving the GPU time of a
host-bound layer does not halve it. What each operator launches is the inventory's
(``Op.forward_host_launches``: Megatron-Core's counts in ``inventory.moe_kernels``), where the
parts a partial CUDA graph captures (``ParallelPlan.cuda_graph_scope``) are one launch, the
graph's replay (``inventory.moe.graphed``). The backward pass has no sync (its split sizes are kept from
the forward), so it is left as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

from paraplan.catalog import load_host_launch
from paraplan.inventory import Op

#: The MoE layer's operator the dispatcher's sync comes right after (the host waits for the
#: counts before the dispatch all-to-all; the permutation was launched before it).
SYNC_AFTER = "moe_permute"


def launch_bound_s(items: Sequence[tuple[float, int]], launch_s: float) -> float:
    """Seconds from a sync to the next one for ``items`` (GPU seconds, kernels the host launches
    for it), in order: the host launches item i's kernels after item i - 1's, ``launch_s`` each;
    the GPU starts item i when both its launch and item i - 1 are done. The first item may have
    0 kernels (launched before the sync, already queued on the GPU)."""
    host = gpu = 0.0
    for seconds, kernels in items:
        host += kernels * launch_s
        gpu = max(gpu, host) + seconds
    return max(gpu, host)


def sync_items(ops: Sequence[Op], fwd: Sequence[float]) -> list[tuple[float, int]] | None:
    """The forward of one MoE layer as ``launch_bound_s`` items, from the dispatcher's sync to
    the next layer's: the permutation (launched before the sync, queued), the operators after
    it, then the next layer's operators up to its own permutation, whose launch comes last.
    Only kernels: the collectives' kernels, which would keep the GPU busy for some of the
    launches, are left out (so the wait is at most this). None when the layer has no
    permutation (no dispatcher)."""
    names = [op.name for op in ops]
    if SYNC_AFTER not in names:
        return None
    i = names.index(SYNC_AFTER)
    items: list[tuple[float, int]] = [(fwd[i], 0)]
    # an operator with no forward time launches nothing in the forward (a view, a backward-only op)
    items += [(t, op.forward_host_launches if t > 0.0 else 0) for op, t in zip(ops[i + 1:], fwd[i + 1:], strict=True)]
    items += [(t, op.forward_host_launches if t > 0.0 else 0) for op, t in zip(ops[:i], fwd[:i], strict=True)]
    items.append((0.0, ops[i].forward_host_launches))  # the next permutation's launch, before its sync
    return items


def host_wait_s(ops: Sequence[Op], fwd: Sequence[float], launch_s: float) -> float:
    """What the host's launches add to one MoE layer's forward after its dispatcher's sync:
    ``launch_bound_s`` of its items less their GPU seconds (0 when the GPU time covers them)."""
    items = sync_items(ops, fwd)
    if items is None:
        return 0.0
    return max(0.0, launch_bound_s(items, launch_s) - sum(t for t, _ in items))


def host_sync_notes(job) -> tuple[str, ...]:
    """What a MoE prediction whose dispatcher syncs the host takes without a measurement of
    this cluster's host: the per-kernel launch cost measured on another host."""
    if not job.model.is_moe or not job.parallel.moe_host_sync:
        return ()
    spec = load_host_launch()
    return (f"host launch cost {spec.launch_s * 1e6:.1f} us per kernel after each MoE dispatcher sync, "
            f"measured on {spec.host}: this cluster's host has no measurement (catalog runtime/host.yaml; "
            "parallel.moe_host_sync false for a sync-free dispatcher); the wait is an upper bound (the "
            "all-to-alls' own time is not counted against the launches)",)


def cuda_graph_notes(job) -> tuple[str, ...]:
    """Partial CUDA graphs (``parallel.cuda_graph_scope``) stated for a dense model, said in the
    prediction: a graph saves host launches, and only a MoE layer's dispatcher sync makes the GPU
    wait for them (``host_wait_s``), so the scope changes nothing priced."""
    scope = job.parallel.cuda_graph_scope
    if not scope or job.model.is_moe:
        return ()
    return (f"parallel.cuda_graph_scope {' '.join(scope)}: a dense model's kernel launches run ahead of "
            "the GPU (no dispatcher sync waits for them), so a graph saves no priced time",)
