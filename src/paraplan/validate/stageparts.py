"""paraplan's prediction of each pipeline stage, in the parts a profiler trace shows.

A trace cuts each rank's iteration into compute by kernel class, exposed communication per
parallel dimension, and idle time (``traces.decode``). This module cuts the prediction the same
way, per stage: the operators' seconds by class (a layer's operators times its layers, the
stage's ends, recompute, the optimizer step), the TP, CP and EP traffic, the exposed DP/ZeRO traffic (the
part outside the passes and the part a sharded pass leaves exposed), the stage's pipeline sends,
and the rest of the iteration as idle (the bubble and waiting for the other stages).
"""

from __future__ import annotations

from paraplan.costmodel import CostModel
from paraplan.inventory import OpKind, count_job
from paraplan.inventory.recompute import recompute_cost
from paraplan.prediction import Prediction
from paraplan.prediction.facade import stage_sends_s
from paraplan.prediction.stages import BACKWARD
from paraplan.specs import Phase

#: The trace's compute class of each operator kind (``traces.rules.COMPUTE_CLASSES``).
CLASS_OF_KIND = {
    OpKind.GEMM: "gemm",
    OpKind.BMM: "attention",
    OpKind.ATTENTION: "attention",
    OpKind.SOFTMAX: "attention",
    OpKind.NORM: "norm",
    OpKind.ELEMENTWISE: "elementwise",
    OpKind.EMBEDDING: "embedding",  # the trace has its own embedding class (kernel_classes.yaml)
    OpKind.LOSS: "elementwise",
    OpKind.OPTIMIZER: "optimizer",
}


def predicted_stage_parts(pred: Prediction, cm: CostModel) -> list[dict[str, float]]:
    """Per stage, seconds of one iteration: each compute class, ``compute`` (their sum),
    ``tp comm``, ``cp comm``, ``ep comm``, ``dp comm`` and ``pp comm`` (exposed), ``idle`` and ``iteration``.
    ``cm`` is the cost model ``pred`` was made with."""
    job = pred.job
    plan = job.parallel
    inv = count_job(job)
    m = plan.num_microbatches
    p2p = max(t.p2p_s for t in pred.stages)
    mask = max(t.p2p_mask_s for t in pred.stages)
    out = []
    for st, timing in zip(inv.stages, pred.stages, strict=True):
        parts: dict[str, float] = {}
        for block in st.blocks:
            again = recompute_cost(plan, block.ops, inv.shape, block.num_layers).op_weights
            for op, weight in zip(block.ops, again, strict=True):
                fwd = cm.estimate_op_s(op, Phase.FWD)
                bwd = sum(cm.estimate_op_s(op, ph) for ph in BACKWARD)
                _add(parts, CLASS_OF_KIND[op.kind], m * block.num_layers * (fwd * (1.0 + weight) + bwd))
        for op in st.end_ops:
            seconds = sum(cm.estimate_op_s(op, ph) for ph in (Phase.FWD, *BACKWARD))
            _add(parts, CLASS_OF_KIND[op.kind], m * seconds)
        _add(parts, "optimizer", timing.optimizer_s)
        comm = {
            "tp comm": m * (timing.tp_fwd_mb_s + timing.tp_bwd_mb_s),
            "cp comm": m * (timing.cp_fwd_mb_s + timing.cp_bwd_mb_s),
            "ep comm": m * (timing.ep_fwd_mb_s + timing.ep_bwd_mb_s),
            "pp comm": stage_sends_s(job, timing.stage, p2p, mask),
            # a sharded pass (ZeRO-3, FSDP) leaves part of its gathers and reduce-scatters
            # exposed; offload's host copies are counted here too, as they were
            "dp comm": timing.exposed_dp_s + m * (timing.zero_fwd_mb_s + timing.zero_bwd_mb_s + timing.offload_mb_s),
        }
        compute = sum(parts.values())
        parts.update(compute=compute, **comm)
        parts["idle"] = max(0.0, pred.iteration_s - compute - sum(comm.values()))
        parts["iteration"] = pred.iteration_s
        out.append(parts)
    return out


def _add(parts: dict[str, float], name: str, seconds: float) -> None:
    parts[name] = parts.get(name, 0.0) + seconds
