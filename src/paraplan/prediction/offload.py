"""Offload: what moves to the host (ZeRO-Offload, ZeRO-Infinity, Megatron-Core activation
offload), what it costs per micro-batch and per iteration, and what the prediction must say
about the host data it had to assume.

Bytes come from the inventory (the stage's parameters, ``param_bytes``, ``grad_bytes``,
``adam_state_bytes``, the recompute policy's held activations); rates from the catalog: the
GPU's host link (``ClusterSpec.host_link``: PCIe or NVLink-C2C, per direction) and the node's
``HostSpec`` (CPU-Adam throughput, NVMe bandwidth, host memory).

Timing follows DeepSpeed's defaults (Ren et al., ZeRO-Offload, ATC'21, arXiv 2101.06840, §4.1
and Fig. 5): gradients are copied device->host as they are reduced, overlapping the backward
pass; the CPU Adam step and the copy of the updated 16-bit parameters back to the GPU are on
the critical path (the one-step delayed parameter update, which hides them, is off by default
and not modelled). ZeRO-Infinity (Rajbhandari et al., SC'21, arXiv 2104.07857) prefetches
offloaded parameters layer by layer ahead of their use and overlaps NVMe I/O of the optimizer
state with the CPU step. Activation offload (Transformer Engine's ``get_cpu_offload_context``,
used by Megatron-Core's ``cpu_offloading``) copies a layer's saved tensors out asynchronously
while the next layer computes, and reloads them one layer ahead in the backward pass: each
copy costs only what it exceeds the computation it overlaps, ``max(0, copy - compute)`` per
layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.inventory import JobInventory, StageInventory
from paraplan.inventory.job import adam_state_bytes, params_updated
from paraplan.specs import ClusterSpec, ConfigError, Framework, Job, LinkSpec, ParallelPlan

# When a node has no CPU-Adam measurement: DeepSpeed's CPU-Adam on a DGX-2 node's two Xeon
# Platinum 8168 CPUs (48 cores), as recalled from the ZeRO-Offload paper (arXiv 2101.06840,
# its CPU-Adam latency table): a 10-billion-parameter step in 2.57 s, i.e. 3.9e9 parameters/s
# per node. The figure was not re-read against the paper; every prediction that uses it says so.
FALLBACK_CPU_ADAM_PARAMS_PER_S = 10e9 / 2.57
FALLBACK_CPU_ADAM_SOURCE = ("DeepSpeed CPU-Adam on a DGX-2 node as recalled from the ZeRO-Offload paper "
                            "(arXiv 2101.06840), not re-checked")
# When a GPU has no host-link data: PCIe Gen4 x16, 64 GB/s bidirectional = 32 GB/s per direction
# (PCI-SIG PCIe 4.0 base specification: 16 GT/s per lane, 128b/130b encoding).
FALLBACK_HOST_LINK = LinkSpec(bandwidth_bytes_per_s=32e9, latency_s=10e-6, efficiency=0.8)
# fp32 gradient partition DeepSpeed keeps on the host beside the optimizer (the CPU-Adam input)
HOST_GRAD_BYTES = 4.0


def host_link(cluster: ClusterSpec) -> LinkSpec:
    return cluster.host_link if cluster.host_link is not None else FALLBACK_HOST_LINK


def host_bytes_per_s(cluster: ClusterSpec) -> float:
    """What one GPU moves to or from its host per second (one direction)."""
    return host_link(cluster).p2p_bytes_per_s


def cpu_adam_params_per_s(cluster: ClusterSpec) -> float:
    rate = cluster.host.cpu_adam_params_per_s
    return rate if rate is not None else FALLBACK_CPU_ADAM_PARAMS_PER_S


def nvme_bytes_per_s(cluster: ClusterSpec) -> float:
    """The node's NVMe bandwidth; an error naming the field when the catalog has none (no
    generic NVMe figure is worth guessing: drives and their number vary by 10x)."""
    bw = cluster.host.nvme_bandwidth_bytes_per_s
    if bw is None:
        raise ConfigError(
            f"cluster.host.nvme_bandwidth: cluster {cluster.name!r} has no NVMe bandwidth; "
            "offload to nvme needs one (give host: {nvme_bandwidth: ...} in the cluster)"
        )
    return bw


@dataclass(frozen=True, slots=True)
class OffloadBytes:
    """Bytes of one GPU of one stage that live off the device."""

    optimizer_states: float  # to the host (cpu) or NVMe
    host_gradients: float  # DeepSpeed's fp32 gradient partition on the host
    gradients: float  # the device's gradient partition, where offload keeps it on the host
    weights: float  # the ZeRO-3 parameter shard, to the host or NVMe
    activations: float  # the offloaded layers' saved activations, all micro-batches in flight

    def on_host(self, job: Job) -> float:
        """Of these, what sits in host memory (NVMe holds the rest)."""
        p = job.parallel
        return (
            (self.optimizer_states if p.offload_optimizer == "cpu" else 0.0)
            + self.host_gradients
            + (self.weights if p.offload_param == "cpu" else 0.0)
            + self.activations
        )


def _shard(inv: JobInventory, st: StageInventory) -> float:
    """Parameters of ``st`` one GPU updates (the inventory's optimizer step's)."""
    return params_updated(inv.job, st.params, st.expert_params)


def offloaded_layers(plan: ParallelPlan, st: StageInventory) -> tuple[int, int]:
    """(k, n): of stage ``st``'s n layers, the k whose saved activations activation offload
    (Megatron-Core's ``cpu_offloading``) keeps on the host; (0, 1) without it."""
    if not plan.cpu_offloading:
        return 0, 1
    n = st.num_layers
    return min(plan.cpu_offloading_num_layers or 0, n), n


def count_offload(inv: JobInventory, st: StageInventory, weights: float, gradients: float,
                  optimizer_states: float, activations: float) -> OffloadBytes:
    """What leaves one GPU of stage ``st``: its optimizer states (``optimizer_states`` bytes on
    the device without offload), its gradient partition (``gradients``) where offload keeps it
    on the host, its parameter shard (``weights``), and ``activations`` (the offloaded layers'
    share of what the micro-batches in flight hold: ``memory.activations_at_peak``).

    Gradients: DeepSpeed's ZeRO-2/3 offload copies each reduced bucket to its fp32 host
    partition (the GPU keeps only the communication buckets, inside the runtime allowance) and
    FSDP2's CPUOffloadPolicy moves gradients to the CPU; ZeRO-1 (DeepSpeed, Megatron's
    --optimizer-cpu-offload) keeps the gradient buffer on the GPU and copies it in the step."""
    p = inv.job.parallel
    opt = p.offload_optimizer != "none"
    shard = _shard(inv, st)
    grads_on_host = opt and (p.framework is Framework.FSDP or (p.framework is Framework.DEEPSPEED and p.zero_stage >= 2))
    return OffloadBytes(
        optimizer_states=optimizer_states if opt else 0.0,
        host_gradients=shard * HOST_GRAD_BYTES if opt else 0.0,
        gradients=gradients if grads_on_host else 0.0,
        weights=weights if p.offload_param != "none" else 0.0,
        activations=activations,
    )


def gradient_copy_s(inv: JobInventory, st: StageInventory) -> float:
    """Seconds to copy one GPU's gradient partition to the host (ZeRO-Offload), 0 without
    optimizer offload."""
    if inv.job.parallel.offload_optimizer == "none":
        return 0.0
    return _shard(inv, st) * inv.grad_bytes / host_bytes_per_s(inv.job.cluster)


def exposed_gradient_copy_s(copy_s, backward_s, zero_stage, num_microbatches):
    """What the gradient copy adds to each micro-batch's backward pass: its excess over the
    backward it overlaps, every micro-batch under ZeRO-2/3 (which reduce, and copy out, every
    micro-batch's gradients), once per iteration under ZeRO-1 (at the accumulation boundary;
    spread over the micro-batches here). Works on numbers and numpy arrays alike
    (``exposed_offload_s``)."""
    exposed = (copy_s - backward_s) * (copy_s > backward_s)
    return np.where(zero_stage >= 2, exposed, exposed / num_microbatches)


def optimizer_step_s(inv: JobInventory, st: StageInventory) -> float | None:
    """The optimizer step with offload: the node's CPUs run CPU-Adam over all its GPUs'
    partitions (NVMe state traffic overlapped with it), then the updated 16-bit parameters go
    back to the GPU unless they live on the host. None without optimizer offload."""
    job = inv.job
    p, c = job.parallel, job.cluster
    if p.offload_optimizer == "none":
        return None
    shard = _shard(inv, st)
    cpu = shard * c.gpus_per_node / cpu_adam_params_per_s(c)
    if p.offload_optimizer == "nvme":  # read and write the states
        cpu = max(cpu, 2.0 * shard * adam_state_bytes(job.precision) * c.gpus_per_node / nvme_bytes_per_s(c))
    back = 0.0 if p.offload_param != "none" else shard * inv.param_bytes / host_bytes_per_s(c)
    return cpu + back


@dataclass(frozen=True, slots=True)
class OffloadCosts:
    """The host copies of one stage in seconds, before the computation hides any of them; numbers
    for one plan, or numpy arrays with one entry per plan (the search's screen). What they add to
    its passes is ``exposed_offload_s``."""

    gradient_copy_s: object  # the gradient partition to the host (ZeRO-Offload), 0 without
    zero_stage: object
    num_microbatches: object
    param_fetch_s: object = None  # one pass's fetch of the ZeRO-3 parameter shard; None: not offloaded
    offloaded_layers: object = None  # layers whose activations go to the host; None: none do
    layer_copy_s: object = 0.0  # one layer's saved activations, out or back


def offload_costs(inv: JobInventory, st: StageInventory, layer_saved_bytes: float) -> OffloadCosts:
    """The host copies of stage ``st``; ``layer_saved_bytes``: what one layer saves for the backward
    pass per micro-batch (what activation offload copies out and back)."""
    p, c = inv.job.parallel, inv.job.cluster
    link = host_bytes_per_s(c)
    fetch = offloaded = None
    if p.offload_param != "none":
        # ZeRO-3 fetches every layer's shard to the GPU before its all-gather, in the forward
        # and again in the backward pass, prefetched while the previous layer computes
        rate = link if p.offload_param == "cpu" else min(link, nvme_bytes_per_s(c) / c.gpus_per_node)
        fetch = _shard(inv, st) * inv.param_bytes / rate
    if p.cpu_offloading:
        offloaded = offloaded_layers(p, st)[0]
    return OffloadCosts(gradient_copy_s(inv, st), p.zero_stage, p.num_microbatches, fetch, offloaded,
                        layer_saved_bytes / link)


def exposed_offload_s(costs: OffloadCosts, forward_s, backward_s, layers):
    """(forward, backward) seconds the host copies add to one micro-batch of a stage of ``layers``
    layers whose passes take ``forward_s`` and ``backward_s``: a parameter fetch its excess over the
    pass it is prefetched beside, the gradient copy ``exposed_gradient_copy_s``, activation offload
    per offloaded layer its copy's excess over one layer's pass. Numbers or numpy arrays."""
    fwd = bwd = 0.0
    if costs.param_fetch_s is not None:
        fwd = fwd + np.maximum(0.0, costs.param_fetch_s - forward_s)
        bwd = bwd + np.maximum(0.0, costs.param_fetch_s - backward_s)
    bwd = bwd + exposed_gradient_copy_s(costs.gradient_copy_s, backward_s, costs.zero_stage, costs.num_microbatches)
    if costs.offloaded_layers is not None:
        k, per_layer = costs.offloaded_layers, costs.layer_copy_s
        fwd = fwd + k * np.maximum(0.0, per_layer - forward_s / layers)
        bwd = bwd + k * np.maximum(0.0, per_layer - backward_s / layers)
    return fwd, bwd


def offload_notes(job: Job, host_bytes_per_gpu: float) -> tuple[str, ...]:
    """What a prediction with offload must say: host data it assumed, host memory it needs."""
    p, c = job.parallel, job.cluster
    if not p.offloads:
        return ()
    notes = []
    if c.host_link is None:
        notes.append(f"{c.name}: no host-link data for {c.gpu.name}; offload copies assume PCIe Gen4 x16 "
                     "(32 GB/s per direction at a generic 80 %)")
    elif c.host_link.source is None and "host_link_efficiency" not in c.sources:
        notes.append(f"{c.name}: host-link copies at a generic {c.host_link.efficiency:.0%} of its "
                     f"{c.host_link.bandwidth_bytes_per_s / 1e9:.0f} GB/s (no measurement)")
    if p.offload_optimizer != "none" and c.host.cpu_adam_params_per_s is None:
        notes.append(f"{c.name}: no CPU-Adam throughput for this node; the optimizer step assumes "
                     f"{FALLBACK_CPU_ADAM_PARAMS_PER_S:.3g} parameters/s per node, {FALLBACK_CPU_ADAM_SOURCE}")
    need = host_bytes_per_gpu * c.gpus_per_node
    have = c.host.memory_bytes
    if have is None:
        notes.append(f"{c.name}: host memory per node unknown; offload needs {need / 1e9:.1f} GB per node (not checked)")
    elif need > have:
        notes.append(f"{c.name}: offload needs {need / 1e9:.1f} GB of host memory per node but a node has "
                     f"{have / 1e9:.1f} GB: the plan does not fit on the host")
    return tuple(notes)
