"""The notes a prediction carries about its plan, gathered in one place for the homogeneous
(``facade.predict``) and heterogeneous (``hetero.predict_hetero``) paths, grouped by kind:
``uncalibrated`` (what the model takes without a measurement: kernel curves, links, power, the
experts, the attention kernel, the host's launches, the queued-kernel gap, collectives beyond
their measured sizes), ``ignored`` (a setting the plan states that nothing priced runs: an
attention kernel on unfused attention, CUDA graphs on a dense model, a userbuffers file without
the overlap) and ``placement`` (a parallel group straddling a scale-up domain).
The memory-dependent offload notes are added where the memory is known
(``facade.assemble_prediction``)."""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.costmodel import (
    attention_kernel_gaps,
    attention_kernel_ignored,
    calibration_gaps,
    expert_gaps,
    link_gaps,
    power_gaps,
    queued_gap_notes,
)
from paraplan.inventory import JobInventory, Op
from paraplan.inventory.placement import straddle_notes
from paraplan.prediction.host_sync import cuda_graph_notes, host_sync_notes
from paraplan.prediction.stages import CommCosts
from paraplan.prediction.userbuffers import unused_cfg_notes
from paraplan.specs import Job


@dataclass(frozen=True)
class PlanNotes:
    """A prediction's notes by kind (one note each, in the order first said)."""

    uncalibrated: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    placement: tuple[str, ...] = ()

    def __add__(self, other: PlanNotes) -> PlanNotes:
        """Both sets of notes, a note said by both kept once (a heterogeneous job's groups)."""
        return PlanNotes(
            uncalibrated=tuple(dict.fromkeys(self.uncalibrated + other.uncalibrated)),
            ignored=tuple(dict.fromkeys(self.ignored + other.ignored)),
            placement=tuple(dict.fromkeys(self.placement + other.placement)),
        )


def plan_notes(job: Job, comm: CommCosts, inv: JobInventory) -> PlanNotes:
    """Every note ``job`` (on one GPU type: a heterogeneous job's view of one group) says about
    its plan, with ``comm`` its collectives' costs and ``inv`` its inventory."""
    c = job.cluster
    gaps = calibration_gaps(c.gpu, job.precision, all_ops(inv)) + link_gaps(c)
    gaps += power_gaps(c, job.precision)
    gaps += expert_gaps(job)
    gaps += attention_kernel_gaps(job)
    gaps += host_sync_notes(job) + comm.extrapolated_notes(inv)  # the extrapolation: a calibration range
    gaps += queued_gap_notes(job)
    ignored = attention_kernel_ignored(job) + cuda_graph_notes(job) + unused_cfg_notes(job)
    straddles = straddle_notes(job.parallel, c.domain_size, c.num_gpus, job.model.is_moe)
    return PlanNotes(uncalibrated=tuple(dict.fromkeys(gaps)), ignored=ignored, placement=straddles)


def all_ops(inv: JobInventory) -> list[Op]:
    """Every distinct operator the job runs (each stage's layer, ends and optimizer)."""
    ops = {id(op): op for st in inv.stages for op in (*(o for b in st.blocks for o in b.ops), *st.end_ops, st.optimizer)}
    return list(ops.values())
