"""Communication that runs beside computation: how long the pair takes.

NCCL's kernels occupy SMs and HBM bandwidth, so computation slows down while they run:
Lee et al. 2025 ("Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed
Deep Learning", arXiv 2507.03114) measure an average 18.9 % compute slowdown under overlap on
A100, H100, MI250 and MI210 (40 % at most). The GPU's ``efficiency.overlap_slowdown`` holds it.

Both functions take floats or numpy arrays (the plan screen evaluates them for every plan).
"""

from __future__ import annotations

import numpy as np


def overlapped_s(compute_s, comm_s, slowdown, beside_s=0.0):
    """Seconds for ``compute_s`` of computation with ``comm_s`` of communication beside it.

    While both run, computation advances at 1 / (1 + slowdown) of its speed; communication
    keeps its own. If communication ends first (comm < compute (1 + slowdown)), the computation
    it overlapped took (1 + slowdown) times longer: compute + comm * slowdown / (1 + slowdown).
    Otherwise all computation is slowed and communication is the critical path: comm.

    ``beside_s`` is more computation the communication also runs beside, counted elsewhere and
    not in the result (a backward pass's recompute, ``with_sharded_traffic``): the communication
    hides behind ``compute_s + beside_s`` and the result is that pair's time less ``beside_s``;
    with none it is the pair's time (a test checks both agree where ``beside_s`` is 0).
    """
    shared = np.minimum(comm_s, (compute_s + beside_s) * (1.0 + slowdown))
    return np.maximum(comm_s - beside_s, compute_s + shared * slowdown / (1.0 + slowdown))


def exposed_beside(compute_s: float, comm_s: float, exposed_share: float, slowdown: float) -> float:
    """What ``comm_s`` adds to ``compute_s`` when all but ``exposed_share`` of it overlaps
    the computation (which slows while it runs: ``schedule.overlapped_s``)."""
    if comm_s <= 0.0:
        return 0.0
    hidden = comm_s * (1.0 - exposed_share)
    return float(overlapped_s(compute_s, hidden, slowdown)) - compute_s + comm_s * exposed_share


def sharded_pass_s(compute_s, comm_s, units, slowdown, beside_s=0.0):
    """One forward or backward pass under ZeRO-3 / FSDP: each of ``units`` wrapped blocks
    gathers its weights (and, backward, reduce-scatters its gradients) while its neighbour
    computes, prefetching one unit ahead. The first unit's gather has nothing to hide behind
    (forward), and the last unit's reduce-scatter nothing after it (backward): 1/units of the
    traffic is exposed, the rest overlaps the pass's computation (and ``beside_s``, counted
    elsewhere: ``overlapped_s``)."""
    exposed = comm_s / np.maximum(units, 1)
    return exposed + overlapped_s(compute_s, comm_s - exposed, slowdown, beside_s)


def with_sharded_traffic(forward_s, backward_s, tp_fwd_s, tp_bwd_s, dp_fwd_s, dp_bwd_s, layers, slowdown,
                         overlap: bool, recompute_s=0.0):
    """A stage's forward and backward seconds per micro-batch (kernels, without their
    tensor-parallel collectives ``tp_*``) once its per-micro-batch data-parallel traffic
    ``dp_*`` (ZeRO-3's weight gathers, ZeRO-2/3's gradient reduce-scatters) is added:
    with ``overlap`` (Megatron-LM's overlap_grad_reduce and the like) each of ``layers``
    units prefetches beside its neighbour's pass, tensor-parallel collectives included
    (``sharded_pass_s``), else the traffic adds up. A checkpointed unit recomputes its forward
    inside its own backward (``recompute_s``, the stage's, counted apart): the backward's
    gathers and reduce-scatters run beside it too. Megatron-FSDP reduce-scatters a unit's
    gradients on its own stream once the unit's backward ends and prefetches the next unit's
    weights as the unit's backward begins (megatron/core/distributed/fsdp/src/megatron_fsdp/
    megatron_fsdp.py ``_register_backward_hooks``, ``no_sync``: "for grads shard mode there will
    actually always be gradient sync"), the recompute of ``--recompute-granularity full`` inside
    that backward (``CheckpointFunction.backward``); torch's FSDP the same (``_pre_backward_hook``
    unshards, the checkpoint wrapper recomputes, ``_post_backward_hook`` reduce-scatters).
    ``prediction.stage_arithmetic.stage_passes`` calls it, for ``stage_timing`` and for the plan
    screen."""
    if not overlap:
        return forward_s + dp_fwd_s, backward_s + dp_bwd_s
    units = np.maximum(layers, 1)
    return (sharded_pass_s(forward_s + tp_fwd_s, dp_fwd_s, units, slowdown) - tp_fwd_s,
            sharded_pass_s(backward_s + tp_bwd_s, dp_bwd_s, units, slowdown, recompute_s) - tp_bwd_s)


def exposed_sync_s(fwd_pass_s, bwd_pass_s, reduce_s, gather_s, slowdown, overlap: bool):
    """Seconds the once-per-iteration gradient reduction ``reduce_s`` and parameter
    all-gather ``gather_s`` add: with ``overlap`` the buckets reduce beside the last
    micro-batch's backward pass and the gather beside the next iteration's first forward
    (both slowing it down), else both are exposed. ``prediction.stage_arithmetic.stage_passes``
    calls it, for ``stage_timing`` and for the plan screen."""
    if not overlap:
        return reduce_s + gather_s
    return (overlapped_s(bwd_pass_s, reduce_s, slowdown) - bwd_pass_s
            + overlapped_s(fwd_pass_s, gather_s, slowdown) - fwd_pass_s)
