"""One stage's seconds per micro-batch, written once for one plan and for many.

``stage_timing`` (one stage of one plan, numbers) and the search's screen (a stage class of
many plans, numpy arrays with one entry per plan) both gather a stage's cost terms, its layers'
and its ends' (``PassWork``), and call ``stage_work`` and ``stage_passes``: the layers summed
with the ends, the data-parallel traffic of every micro-batch (ZeRO-2/3) overlapped with the
passes, offload's exposed host copies, the passes as the pipeline schedule takes them and the
once-per-iteration gradient sync they leave exposed. A plan feature that changes a stage's time
is written here (or in the functions called here), not in either caller.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from paraplan.prediction.offload import OffloadCosts, exposed_offload_s
from paraplan.schedule.overlap import exposed_sync_s, with_sharded_traffic


# Not frozen: ``stage_timing`` builds several per stage, and a frozen dataclass takes 5 x longer to build.
@dataclass(slots=True)
class PassWork:
    """Seconds per micro-batch of one layer, of a stage's ends (embedding, LM head, loss) or of a
    whole stage: numbers, or numpy arrays with one entry per plan."""

    forward: object  # the operators' forward
    backward: object  # the operators' backward, input and weight gradients
    wgrad: object  # of ``backward``, the weight gradients' (a zero-bubble schedule's W pass)
    comm_fwd: object  # what the TP, CP and expert collectives add to the forward pass
    comm_bwd: object  # and to the backward pass
    recompute: object = 0.0  # forward operators and collectives run again in the backward pass
    # of ``comm_fwd`` and ``comm_bwd``, what a paired step hides (Megatron-Core's EP all-to-all
    # overlap: one micro-batch's all-to-alls beside another's computation; ``stage_passes``
    # takes it off for the share of the passes that run paired)
    paired_fwd: object = 0.0
    paired_bwd: object = 0.0


def stage_work(ends: PassWork, blocks: Iterable[tuple[object, PassWork]]) -> PassWork:
    """A stage's ``PassWork``: its ends' plus, for each block of ``k`` equal layers, ``k`` times
    one layer's (a mixture of experts may mix dense and MoE blocks)."""
    f, b, w, cf, cb, r = ends.forward, ends.backward, ends.wgrad, ends.comm_fwd, ends.comm_bwd, ends.recompute
    pf, pb = ends.paired_fwd, ends.paired_bwd
    for k, layer in blocks:
        f = f + k * layer.forward
        b = b + k * layer.backward
        w = w + k * layer.wgrad
        cf = cf + k * layer.comm_fwd
        cb = cb + k * layer.comm_bwd
        r = r + k * layer.recompute
        pf = pf + k * layer.paired_fwd
        pb = pb + k * layer.paired_bwd
    return PassWork(f, b, w, cf, cb, r, pf, pb)


@dataclass(slots=True)
class StagePasses:
    """One stage's passes per micro-batch, built from its ``PassWork`` by ``stage_passes``."""

    work: PassWork
    sharded_fwd: object  # the operators' forward with the data-parallel traffic of every micro-batch
    sharded_bwd: object
    offload_fwd: object  # the host copies offload leaves exposed
    offload_bwd: object
    fwd_pass: object  # the passes as the pipeline schedule takes them
    bwd_pass: object
    exposed_sync: object  # once per iteration: the gradient reduction and gather not hidden

    @property
    def zero_fwd(self):
        """What the data-parallel traffic of every micro-batch (ZeRO-3's gathers) adds to the forward."""
        return _positive(self.sharded_fwd - self.work.forward)

    @property
    def zero_bwd(self):
        """And to the backward (ZeRO-2/3's gradient reduce-scatters)."""
        return _positive(self.sharded_bwd - self.work.backward)


def _positive(x):
    return np.maximum(0.0, x) if isinstance(x, np.ndarray) else max(0.0, x)


def stage_passes(work: PassWork, layers, dp_fwd, dp_bwd, reduce_s, gather_s, slowdown, overlap: bool,
                 offload: OffloadCosts | None = None, paired_share=0.0) -> StagePasses:
    """The passes of a stage of ``layers`` layers doing ``work`` per micro-batch, with ``dp_fwd`` and
    ``dp_bwd`` seconds of data-parallel traffic every micro-batch (ZeRO-3's weight gathers, ZeRO-2/3's
    gradient reduce-scatters; overlapped unit by unit with ``overlap``: ``with_sharded_traffic``),
    ``reduce_s`` and ``gather_s`` once an iteration (``exposed_sync_s``) and ``offload``'s host copies;
    ``paired_share`` of the passes run paired (``schedule.closed_form.paired_share``), each hiding
    ``work.paired_fwd`` and ``work.paired_bwd`` of its collectives (the mean over the passes).
    Numbers for one plan or numpy arrays for many (``overlap`` and ``offload`` the same for all)."""
    forward, backward = work.forward, work.backward
    comm_fwd = work.comm_fwd - paired_share * work.paired_fwd
    comm_bwd = work.comm_bwd - paired_share * work.paired_bwd
    if isinstance(dp_fwd, np.ndarray) or isinstance(dp_bwd, np.ndarray):
        sharded = np.maximum(dp_fwd, dp_bwd) > 0  # a stage without such traffic keeps its passes as they are
        if sharded.any():
            f, b = with_sharded_traffic(forward, backward, comm_fwd, comm_bwd, dp_fwd, dp_bwd, layers,
                                        slowdown, overlap, work.recompute)
            forward, backward = (f, b) if sharded.all() else (np.where(sharded, f, forward), np.where(sharded, b, backward))
    elif dp_fwd > 0 or dp_bwd > 0:
        forward, backward = map(float, with_sharded_traffic(forward, backward, comm_fwd, comm_bwd, dp_fwd,
                                                            dp_bwd, layers, slowdown, overlap, work.recompute))
    sharded_fwd, sharded_bwd = forward, backward
    offload_fwd = offload_bwd = 0.0
    if offload is not None:
        offload_fwd, offload_bwd = exposed_offload_s(offload, forward, backward, layers)
        forward, backward = forward + offload_fwd, backward + offload_bwd
    fwd_pass, bwd_pass = forward + comm_fwd, backward + work.recompute + comm_bwd
    exposed = exposed_sync_s(fwd_pass, bwd_pass, reduce_s, gather_s, slowdown, overlap)
    return StagePasses(work, sharded_fwd, sharded_bwd, offload_fwd, offload_bwd, fwd_pass, bwd_pass, exposed)
