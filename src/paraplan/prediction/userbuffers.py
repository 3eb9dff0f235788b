"""Transformer Engine's userbuffers tensor-parallel overlap as a configuration file runs it
(``parallel.tp_comm_overlap`` with ``parallel.tp_comm_overlap_cfg``: a ``catalog/userbuffers``
file, the ``ub_cfgs`` NeMo and Megatron-LM hand TE's ``initialize_ub``).

Which GEMM overlaps which collective (TE ``module/base.py`` ``initialize_ub`` and its layers'
``ub_split_ag``/``ub_split_rs``/``ub_bulk_dgrad``/``ub_bulk_wgrad`` paths; names as the file's):

- forward: the sequence-parallel all-gather of the norm's output feeds QKV (``qkv_fprop``) and
  the MLP's first linear (``fc1_fprop``); the attention output (``proj_fprop``) and the MLP's
  second linear (``fc2_fprop``) feed a reduce-scatter;
- backward: the all-gather of the output gradient feeds the input gradient of the attention
  output and the MLP's second linear (``proj_dgrad``, ``fc2_dgrad``); the norm's output, kept as
  the rank's shard, is all-gathered again beside QKV's and fc1's input gradient
  (``qkv_dgrad``, ``fc1_dgrad``: the inventory's ``inventory.sp_comm.SAVED_REGATHER``), and
  those input gradients are reduce-scattered beside QKV's and fc1's weight gradient
  (``qkv_wgrad``, ``fc1_wgrad``).

How each method runs (TE ``pytorch/csrc/comm_gemm_overlap.h`` of 2023, release_v0.8's era,
``UbufCommOverlap`` and ``UbufP2PCommOverlap``):

- ``ring_exchange`` (``split_overlap_ag``): the GEMM in tp chunks, one per rank's shard, each
  re-reading the weight; tp - 1 peer-to-peer copies of one shard each (``use_ce = 1``: the copy
  engines; the GEMM keeps every SM, ``_math_sms = multiProcessorCount``), each beside one chunk,
  the next chunk waiting for it; the first chunk is the rank's own shard. ``aggregate``: after an
  exposed first exchange of one shard with the neighbour, tp/2 GEMMs of two shards beside copies
  of two;
- ``pipeline`` (``split_overlap_rs``): the GEMM in ``num_splits`` chunks of its output columns
  (each reading the whole input), on ``sm_count - num_sm`` SMs when ``set_sm_margin``; chunk i's
  reduce-scatter runs on ``num_sm`` SMs beside chunk i + 1, the last chunk's after every GEMM
  (exposed; TE gives it ``UB_MAX_SM`` SMs);
- ``bulk`` (``bulk_overlap``): the whole collective on its own stream beside one GEMM, its kernel
  on ``num_sm`` SMs; without ``set_sm_margin`` the GEMM is launched on every SM and runs on the
  others while the collective holds its own.

The cost of fewer SMs follows from the GEMM model: a GEMM on ``sms - n`` of ``sms`` SMs runs at
``(sms - n) / sms`` of its rate. Collectives and copies are priced by the network model (a chunk
as 1/n of its collective); the copy engines' and communication kernels' HBM traffic beside the
GEMMs is not priced (no cited measurement), nor the three compute streams' chunks overlapping
one another. In an FP8 job the all-gathers move the FP8 copies (the inventory sizes them so:
``inventory.sp_comm.gather_bytes``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from paraplan.catalog import load_userbuffers
from paraplan.costmodel import CostModel
from paraplan.inventory import Collective, CollectiveKind, Op, OpKind
from paraplan.inventory.sp_comm import SAVED_REGATHER
from paraplan.prediction.async_tp import decomposed, operand_bytes
from paraplan.specs import ConfigError, Phase, UserbuffersGemm

if TYPE_CHECKING:
    from paraplan.prediction.stages import CommCosts

_AG, _RS = CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER
#: userbuffers' GEMM -> (the layer's GEMM operator, its pass, the collective beside it, whether
#: that collective is the backward re-gather of the norm's saved output, ``SAVED_REGATHER``)
UB_GEMMS: dict[str, tuple[str, Phase, CollectiveKind, bool]] = {
    "qkv_fprop": ("linear1", Phase.FWD, _AG, False),
    "fc1_fprop": ("linear3", Phase.FWD, _AG, False),
    "proj_fprop": ("linear2", Phase.FWD, _RS, False),
    "fc2_fprop": ("linear4", Phase.FWD, _RS, False),
    "proj_dgrad": ("linear2", Phase.BWD_INPUT, _AG, False),
    "fc2_dgrad": ("linear4", Phase.BWD_INPUT, _AG, False),
    "qkv_dgrad": ("linear1", Phase.BWD_INPUT, _AG, True),
    "fc1_dgrad": ("linear3", Phase.BWD_INPUT, _AG, True),
    "qkv_wgrad": ("linear1", Phase.BWD_WEIGHT, _RS, False),
    "fc1_wgrad": ("linear3", Phase.BWD_WEIGHT, _RS, False),
}
#: the methods the code read here runs for each collective (release_v0.8: ring exchange gathers,
#: the pipelined GEMM reduce-scatters; bulk either, beside a backward GEMM)
_RUNS = {("ring_exchange", _AG), ("pipeline", _RS), ("bulk", _AG), ("bulk", _RS)}
_BACKWARD = (Phase.BWD_INPUT, Phase.BWD_WEIGHT)


def unused_cfg_notes(job) -> tuple[str, ...]:
    """A userbuffers configuration the user stated that nothing runs (``tp_comm_overlap`` off:
    Transformer Engine builds its userbuffers only with it), said in the prediction; one a
    framework preset filled in (beside sequence parallelism, whether or not the overlap is on)
    stays quiet, as the preset's own default."""
    plan = job.parallel
    if not plan.tp_comm_overlap_cfg or plan.tp_comm_overlap:
        return ()
    preset = getattr(job, "preset", None)
    if preset is not None and "tp_comm_overlap_cfg" in preset.taken:
        return ()
    return (f"parallel.tp_comm_overlap_cfg {plan.tp_comm_overlap_cfg}: Transformer Engine's userbuffers "
            "run only with parallel.tp_comm_overlap true",)


def runs_userbuffers(comm: CommCosts) -> bool:
    """Whether the plan's TP overlap is priced from a userbuffers configuration."""
    plan = comm.plan
    return bool(plan.tp_comm_overlap and plan.tp_comm_overlap_cfg) and plan.tp > 1 and plan.sequence_parallel


Seconds = tuple[float, ...]


def userbuffers_layer(ops: tuple[Op, ...], fwd: Seconds, bwd: Seconds, weight: Seconds,
                      tp_colls: tuple[Collective, ...], cm: CostModel,
                      comm: CommCosts) -> tuple[Seconds, Seconds, Seconds, float, float]:
    """One layer under userbuffers: its operators' forward, backward and weight-gradient seconds
    (``weight``: the weight-gradient part of ``bwd``) with each overlapped GEMM as the method
    runs it (chunked, on fewer SMs), and the exposed seconds of its TP communication forward
    and backward. A collective of the inventory no configured GEMM takes (a layer without one
    of the four linears) stays exposed whole."""
    cfg = load_userbuffers(str(comm.plan.tp_comm_overlap_cfg))
    f, b, w = list(fwd), list(bwd), list(weight)
    index = {op.name: i for i, op in enumerate(ops) if op.kind is OpKind.GEMM}
    calls = _calls(tp_colls)
    exposed = {False: 0.0, True: 0.0}
    for name, (op_name, phase, kind, regather) in UB_GEMMS.items():
        backward = phase in _BACKWARD
        queue = calls.get((kind, backward, regather), [])
        if op_name not in index or not queue:
            continue
        call = queue.pop(0)
        gemm = cfg.gemm(name)
        if (gemm.method, kind) not in _RUNS:
            raise ConfigError(f"parallel.tp_comm_overlap_cfg: {cfg.name}'s {name} runs {gemm.method}, which "
                              f"Transformer Engine {cfg.te_version} does not run beside a {kind.value}")
        i = index[op_name]
        seconds, extra = _priced(ops[i], phase, gemm, comm.seconds(call), cm, comm)
        if phase is Phase.FWD:
            f[i] = seconds
        elif phase is Phase.BWD_INPUT:
            b[i] = seconds + w[i]
        else:
            b[i] += seconds - w[i]
            w[i] = seconds
        exposed[backward] += extra
    for (_, backward, _), left in calls.items():  # collectives no configured GEMM took
        exposed[backward] += sum(comm.seconds(c) for c in left)
    return tuple(f), tuple(b), tuple(w), exposed[False], exposed[True]


def _calls(tp_colls: tuple[Collective, ...]) -> dict[tuple[CollectiveKind, bool, bool], list[Collective]]:
    """The layer's TP collectives as single calls, by (kind, backward, the saved shard's re-gather)."""
    out: dict[tuple[CollectiveKind, bool, bool], list[Collective]] = {}
    for c in tp_colls:
        key = (c.kind, c.phase in _BACKWARD, c.name == SAVED_REGATHER)
        out.setdefault(key, []).extend([dataclasses.replace(c, count=1)] * c.count)
    return out


def _priced(op: Op, phase: Phase, gemm: UserbuffersGemm, coll_s: float, cm: CostModel,
            comm: CommCosts) -> tuple[float, float]:
    """(the GEMM's seconds in ``phase`` as ``gemm.method`` runs it, what its collective of
    ``coll_s`` seconds adds beside it)."""
    tp = comm.plan.tp
    if gemm.method == "ring_exchange":
        steps = tp // 2 if gemm.aggregate else tp
        chunked = cm.estimate_op_s(decomposed(op, steps), phase)
        return chunked, ring_exposed(chunked, coll_s, tp, gemm.aggregate)
    share = _sm_share(gemm, comm)
    if gemm.method == "pipeline":
        if gemm.num_splits < 1:
            raise ConfigError(f"parallel.tp_comm_overlap_cfg: a pipelined GEMM needs num_splits >= 1, not {gemm.num_splits}")
        chunked = cm.estimate_op_s(split_columns(op, gemm.num_splits), phase) / share
        return chunked, pipeline_exposed(chunked, coll_s, gemm.num_splits, share, gemm.set_sm_margin)
    whole = cm.estimate_op_s(op, phase)
    seconds = whole / share if gemm.set_sm_margin else whole
    return seconds, beside(seconds, coll_s, 1.0 - share, gemm.set_sm_margin) - seconds


def _sm_share(gemm: UserbuffersGemm, comm: CommCosts) -> float:
    """The share of the GPU's SMs a GEMM keeps beside ``gemm.num_sm`` communication SMs."""
    sms = comm.cm.cluster.gpu.sms
    if gemm.num_sm == 0:
        return 1.0
    if sms is None:
        raise ConfigError(f"parallel.tp_comm_overlap_cfg: userbuffers' communication kernels take SMs from the "
                          f"GEMMs, and GPU {comm.cm.cluster.gpu.name} has no SM count (sms) in the catalog")
    if gemm.num_sm >= sms:
        raise ConfigError(f"parallel.tp_comm_overlap_cfg: num_sm {gemm.num_sm} leaves no SM of {sms} to the GEMM")
    return (sms - gemm.num_sm) / sms


def ring_exposed(gemm_s: float, coll_s: float, tp: int, aggregate: bool) -> float:
    """What an all-gather of ``coll_s`` seconds adds to its GEMM of ``gemm_s`` (already split)
    run as a ring exchange: each copy of one shard (1/(tp - 1) of the all-gather) beside one
    GEMM chunk, the next chunk waiting for it; ``aggregate``: the first one-shard exchange
    exposed, then tp/2 - 1 copies of two shards beside GEMMs of two."""
    shard = coll_s / (tp - 1)
    if aggregate:
        steps = tp // 2
        return shard + (steps - 1) * max(0.0, 2.0 * shard - gemm_s / steps)
    return (tp - 1) * max(0.0, shard - gemm_s / tp)


def pipeline_exposed(gemm_s: float, coll_s: float, splits: int, sm_share: float, sm_margin: bool) -> float:
    """What a reduce-scatter of ``coll_s`` seconds adds to its GEMM of ``gemm_s`` (already split,
    at its SMs) run pipelined in ``splits`` chunks: chunk i's reduce-scatter beside chunk i + 1,
    the last one after every chunk."""
    chunk, part = gemm_s / splits, coll_s / splits
    total = chunk + (splits - 1) * beside(chunk, part, 1.0 - sm_share, sm_margin) + part
    return total - gemm_s


def beside(gemm_s: float, coll_s: float, comm_share: float, sm_margin: bool) -> float:
    """Seconds of a GEMM and a collective launched together on two streams, the collective's
    kernel holding ``comm_share`` of the SMs. With ``sm_margin`` the GEMM was launched on the
    others (``gemm_s`` already at them): the longer of the two. Without, the GEMM runs on the
    others only while the collective lasts: it loses ``comm_share`` of the time they share, so
    the pair takes ``gemm_s + max(coll_s - gemm_s, comm_share * coll_s)``."""
    if sm_margin:
        return max(gemm_s, coll_s)
    return gemm_s + max(coll_s - gemm_s, comm_share * coll_s)


def split_columns(op: Op, splits: int) -> Op:
    """``op`` as the pipelined reduce-scatter issues it: ``splits`` GEMMs of 1/splits of its
    output columns, each reading the whole input again (``split_overlap_rs`` splits the weight's
    rows and keeps B whole)."""
    dims = dict(op.dims)
    again = (splits - 1) * operand_bytes(op) * dims["m"] * dims["k"]
    return dataclasses.replace(op, launches=op.launches * splits, bytes=op.bytes + again)
