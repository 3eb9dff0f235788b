"""The components an iteration's seconds are cut into: one list, read by every renderer.

Each component is a field of ``Breakdown`` (the JSON key and the CSV column
``breakdown.<field>``), one label (what tables, pictures and the HTML report print) and a
kind. Time the critical path spends waiting for a collective belongs to that collective's
component, never to compute: a compute component holds its kernels' own seconds, and what an
overlapped collective adds beyond them (the part it leaves exposed, and the slowdown of the
kernels it runs beside) goes to the collective's component. With a pipeline, the critical
stage also waits for the sends and for other stages' collectives: that too is communication
(``prediction.facade.stage_parts``), and the bubble is the idle time the schedule leaves with
every send and collective free, which no network speed changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from paraplan.specs import Job


class ComponentKind(str, Enum):
    COMPUTE = "compute"  # kernels of the passes (a faster network leaves them unchanged)
    COMMUNICATION = "communication"  # collectives and pipeline sends over the GPUs' links
    HOST = "host"  # waiting for the host: its copies to and from GPU memory (offload), its kernel launches
    OPTIMIZER = "optimizer"  # the optimizer step
    IDLE = "idle"  # waiting for other stages' kernels (pipeline bubble)


@dataclass(frozen=True, slots=True)
class Component:
    field: str  # the Breakdown field, JSON key and CSV column (``breakdown.<field>``)
    label: str  # what every table, picture and report prints
    kind: ComponentKind
    description: str  # one line for the documentation and the HTML report


_C, _K = Component, ComponentKind

#: The components in the order every renderer lists them (a stacked bar, bottom to top).
COMPONENTS: tuple[Component, ...] = (
    _C("forward_compute_s", "forward compute", _K.COMPUTE, "forward kernels"),
    _C("backward_compute_s", "backward compute", _K.COMPUTE, "backward kernels (input and weight gradients)"),
    _C("recompute_s", "recompute", _K.COMPUTE, "forward kernels re-run in the backward (activation recomputation)"),
    _C("tp_communication_s", "TP communication", _K.COMMUNICATION,
       "tensor-parallel all-reduces, all-gathers and reduce-scatters, recomputed ones included"),
    _C("cp_communication_s", "CP communication", _K.COMMUNICATION,
       "context-parallel K/V exchanges attention leaves exposed"),
    _C("ep_communication_s", "EP communication", _K.COMMUNICATION,
       "mixture-of-experts token dispatch and combine (expert-parallel all-to-all, expert-TP gathers)"),
    _C("dp_communication_s", "DP / ZeRO communication", _K.COMMUNICATION,
       "gradient reduction, ZeRO / FSDP parameter gathers and gradient reduce-scatters"),
    _C("pipeline_p2p_s", "pipeline p2p", _K.COMMUNICATION,
       "what waiting for the sends between pipeline stages costs (the finish less the finish with free sends)"),
    _C("offload_s", "offload copies", _K.HOST, "host-memory copies the passes wait for (offload)"),
    _C("host_wait_s", "host launch wait", _K.HOST,
       "GPU idle while the host launches kernels after a host sync (MoE token dispatch)"),
    _C("optimizer_step_s", "optimizer step", _K.OPTIMIZER, "the optimizer step"),
    _C("pipeline_bubble_s", "pipeline bubble (idle)", _K.IDLE,
       "the schedule's own idle time: waiting for other stages' kernels (sends and collectives free)"),
)

BY_FIELD = {c.field: c for c in COMPONENTS}


def components_of(job: Job) -> tuple[Component, ...]:
    """The components a plan can have (a table lists these, and any other that is not zero):
    TP with tp > 1, CP with cp > 1, EP on a mixture of experts split over ranks, DP with data
    parallelism or ZeRO, p2p and bubble with a pipeline, offload copies with offload, the host
    launch wait on a mixture of experts whose token dispatcher syncs the host."""
    plan, model = job.parallel, job.model
    applies = {
        "recompute_s": plan.recompute.value != "none",
        "tp_communication_s": plan.tp > 1,
        "cp_communication_s": plan.cp > 1,
        "ep_communication_s": model.is_moe and plan.ep * plan.etp > 1,
        "dp_communication_s": plan.dp * plan.cp > 1 or plan.zero_stage > 0,
        "pipeline_p2p_s": plan.pp > 1,
        "pipeline_bubble_s": plan.pp > 1,
        "offload_s": plan.offloads,
        "host_wait_s": model.is_moe and plan.moe_host_sync,
    }
    return tuple(c for c in COMPONENTS if applies.get(c.field, True))
