"""What a prediction is: the iteration, its breakdown, the stages' timings, memory, MFU, cost.

``Prediction.to_dict()`` is the JSON form the README documents.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from paraplan.prediction.components import COMPONENTS, Component
from paraplan.prediction.memory import PlanMemory, StageMemory
from paraplan.schedule import PipelineResult
from paraplan.specs import HeteroJob, Job


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Where one iteration's seconds go, on its critical path; the parts add up to it. The
    fields are ``components.COMPONENTS`` in that order (labels and kinds there): compute holds
    its kernels' own seconds, and what a collective adds to them is its own component."""

    forward_compute_s: float
    backward_compute_s: float
    recompute_s: float
    tp_communication_s: float
    cp_communication_s: float
    ep_communication_s: float
    dp_communication_s: float
    pipeline_p2p_s: float
    offload_s: float
    host_wait_s: float
    optimizer_step_s: float
    pipeline_bubble_s: float

    @property
    def total_s(self) -> float:
        """The parts' sum, in field order (``asdict`` would deep-copy each float first)."""
        return sum(getattr(self, name) for name in _BREAKDOWN_FIELDS)

    def parts(self) -> tuple[tuple[Component, float], ...]:
        """(component, seconds) in ``COMPONENTS`` order."""
        return tuple((c, getattr(self, c.field)) for c in COMPONENTS)


_BREAKDOWN_FIELDS = tuple(f.name for f in fields(Breakdown))


@dataclass(frozen=True, slots=True)
class StageTiming:
    """One micro-batch on one stage (``*_mb_s``) and the once-per-iteration parts.

    A pass is its kernels' own seconds (``forward_mb_s``, ``backward_mb_s``, ``recompute_mb_s``)
    plus what each kind of communication adds to it on the stage's path (``tp_``, ``cp_``,
    ``ep_``, ``zero_`` and ``offload_`` ``fwd``/``bwd``): the exposed part of a collective and
    the slowdown of the kernels it overlaps; the forward also what it waits for the host's
    kernel launches (``host_wait_mb_s``). ``fwd_pass_mb_s`` and ``bwd_pass_mb_s`` are the
    passes' totals as the pipeline schedule takes them (the parts add up to them)."""

    stage: int
    num_layers: int
    forward_mb_s: float
    backward_mb_s: float
    recompute_mb_s: float
    tp_fwd_mb_s: float  # TP collectives (the ends' included)
    tp_bwd_mb_s: float  # and the recomputed forward's, in the backward pass
    cp_fwd_mb_s: float
    cp_bwd_mb_s: float
    ep_fwd_mb_s: float  # a mixture of experts' dispatch and combine (EP all-to-all, expert TP)
    ep_bwd_mb_s: float
    zero_fwd_mb_s: float  # what ZeRO-3 / FSDP parameter gathers add to a pass
    zero_bwd_mb_s: float  # (and backward, the gradient reduce-scatters)
    offload_fwd_mb_s: float  # host copies offload leaves exposed
    offload_bwd_mb_s: float
    fwd_pass_mb_s: float
    bwd_pass_mb_s: float
    p2p_s: float  # one activation (forward) or gradient (backward) send to a neighbour
    grad_reduce_s: float
    param_gather_s: float
    exposed_dp_s: float  # once per iteration, after the last micro-batch
    optimizer_s: float
    p2p_mask_s: float = 0.0  # what a forward send carries besides the activation
    # the weight-gradient operators' share of the backward pass (the W pass of a zero-bubble
    # schedule; everything else of the backward, collectives and recompute included, is B)
    wgrad_mb_s: float = 0.0
    # what the forward pass waits for the host's kernel launches after a MoE dispatcher's sync
    # (``prediction.host_sync``): in ``fwd_pass_mb_s``, not in ``forward_mb_s``
    host_wait_mb_s: float = 0.0

    @property
    def p2p_fwd_s(self) -> float:
        return self.p2p_s + self.p2p_mask_s

    @property
    def offload_mb_s(self) -> float:
        return self.offload_fwd_mb_s + self.offload_bwd_mb_s

    @property
    def busy_mb_s(self) -> float:
        """Seconds the stage is busy with one micro-batch: both passes, everything they wait for."""
        return self.fwd_pass_mb_s + self.bwd_pass_mb_s

    def per_microbatch(self) -> dict[str, float]:
        """One micro-batch's seconds by breakdown component (``Breakdown`` field names)."""
        return {
            "forward_compute_s": self.forward_mb_s,
            "backward_compute_s": self.backward_mb_s,
            "recompute_s": self.recompute_mb_s,
            "tp_communication_s": self.tp_fwd_mb_s + self.tp_bwd_mb_s,
            "cp_communication_s": self.cp_fwd_mb_s + self.cp_bwd_mb_s,
            "ep_communication_s": self.ep_fwd_mb_s + self.ep_bwd_mb_s,
            "dp_communication_s": self.zero_fwd_mb_s + self.zero_bwd_mb_s,
            "offload_s": self.offload_mb_s,
            "host_wait_s": self.host_wait_mb_s,
        }


@dataclass(frozen=True, slots=True)
class OpEstimate:
    """One operator of one layer, with its work and its estimated seconds (``--explain``)."""

    name: str
    role: str
    kind: str
    flops: float
    bytes: float
    params: float
    fwd_s: float
    bwd_s: float
    recompute_s: float
    source: str
    dims: tuple[tuple[str, int], ...] = ()  # the inventory's shape names, e.g. (("m", 4096), ("k", ...), ("n", ...))


@dataclass(frozen=True, slots=True)
class CollectiveEstimate:
    name: str
    kind: str
    dim: str
    bytes: float
    phase: str
    count: int
    group_size: int
    group_nodes: int
    seconds: float
    source: str = "alpha-beta"
    # how often it runs: each "layer" (tp, cp, ep), each "micro-batch" of the stage (ZeRO-2/3
    # over the stage's weights) or once an "iteration" (gradient reduction)
    per: str = "layer"


# what ``--explain`` shows: one layer's operators and collectives, the stage's data-parallel collectives
Explained = tuple[tuple[OpEstimate, ...], tuple[CollectiveEstimate, ...], tuple[CollectiveEstimate, ...]]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the stages of a plan on a heterogeneous cluster run."""

    cluster: str
    node_order: tuple[str, ...]  # the GPU of every node, in rank order
    stage_gpus: tuple[str, ...]  # the GPU type(s) of every stage, "A100-SXM4-40GB+A10" when mixed
    stage_hbm_bytes: tuple[float, ...]  # the smallest HBM among each stage's GPUs
    gpus: tuple[tuple[str, int], ...]  # (GPU, how many) per node group
    price_per_hour_usd: float | None
    job: HeteroJob | None = field(default=None, repr=False, compare=False)  # the job predicted


class Deferred:
    """A figure computed when first read: ``compute()``, once. A ``Prediction`` given one for
    its breakdown (and so its bubble fraction) computes it on the first read of the field (the plan
    search reads neither, and a pipeline's breakdown costs a second run of its schedule).
    It pickles as what it holds: the function (a module-level one with its arguments), or the
    value once computed."""

    __slots__ = ("_compute", "_value")

    def __init__(self, compute: Callable[[], Any]) -> None:
        self._compute: Callable[[], Any] | None = compute
        self._value: Any = None

    def __getstate__(self) -> tuple:
        return self._compute, self._value

    def __setstate__(self, state: tuple) -> None:
        self._compute, self._value = state

    def value(self) -> Any:
        if self._compute is not None:
            self._value = self._compute()
            self._compute = None  # and what it held (the stages, the job) with it
        return self._value


class _OnRead:
    """A field of a frozen dataclass that may be given as a ``Deferred``: its first read
    computes it and keeps the value in its place. Read as any other field (``asdict``,
    ``replace``, ``==`` and ``repr`` read it too); there is no default."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            raise AttributeError(self._name)  # the dataclass then sees no default
        value = obj.__dict__[self._name]
        if isinstance(value, Deferred):
            value = value.value()
            obj.__dict__[self._name] = value
        return value

    def __set__(self, obj: Any, value: Any) -> None:  # the dataclass's __init__ only (frozen)
        obj.__dict__[self._name] = value


@dataclass(frozen=True)
class Prediction:
    """Everything paraplan predicts for one job. ``to_dict()`` gives the JSON form."""

    job: Job
    backend: str
    iteration_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    hfu: float
    # a pipeline's: given as a ``Deferred``, computed on the first read (``prediction.facade``)
    breakdown: Breakdown = _OnRead()  # type: ignore[assignment]
    stages: tuple[StageTiming, ...]
    memory: PlanMemory  # given as the stages' StageMemory, it is wrapped with their GPUs' HBM
    params_total: float
    model_flops_per_iteration: float
    pipeline: PipelineResult | None = field(default=None, repr=False)
    placement: Placement | None = None
    # kernels timed with generic guesses, not curves measured on the GPU (one note each)
    uncalibrated: tuple[str, ...] = ()
    # settings the plan states that nothing priced runs (an attention kernel on unfused attention,
    # CUDA graphs on a dense model, a userbuffers file without the overlap): one note each
    ignored_settings: tuple[str, ...] = ()
    # where the plan's parallel groups sit on the cluster (a group straddling a scale-up domain),
    # facts of the placement rather than gaps in the calibration (one note each)
    placement_notes: tuple[str, ...] = ()
    params_active: float = 0.0  # a mixture of experts': those one token is computed with
    _explain: Callable[[], Explained] | None = field(
        default=None, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not isinstance(self.memory, PlanMemory):
            stages = tuple(self.memory)
            if self.placement is not None:
                hbm = self.placement.stage_hbm_bytes
            else:
                hbm = (self.job.cluster.gpu.hbm_bytes,) * len(stages)
            object.__setattr__(self, "memory", PlanMemory(stages, tuple(hbm), self.job.memory_headroom))

    @functools.cached_property
    def _explained(self) -> Explained:
        return self._explain() if self._explain is not None else ((), (), ())

    @property
    def layer_ops(self) -> tuple[OpEstimate, ...]:
        """The operators of one layer of the critical stage, with their seconds."""
        return self._explained[0]

    @property
    def layer_collectives(self) -> tuple[CollectiveEstimate, ...]:
        """The collectives of one layer of the critical stage, with their seconds."""
        return self._explained[1]

    @property
    def stage_collectives(self) -> tuple[CollectiveEstimate, ...]:
        """The critical stage's data-parallel collectives, with their seconds: ZeRO-2/3's
        gathers and reduce-scatters of every micro-batch (over the stage's weights: FSDP and
        DeepSpeed issue them layer by layer) and the gradient reduction once an iteration."""
        return self._explained[2]

    @property
    def worst_memory(self) -> StageMemory:
        """The stage with the least memory to spare."""
        return self.memory.worst

    @property
    def fits(self) -> bool:
        """Every stage fits its GPU's memory less the job's headroom."""
        return self.memory.fits

    @property
    def hbm_bytes(self) -> tuple[float, ...]:
        """Each stage's GPU memory (the smallest, for a stage on mixed GPUs)."""
        return self.memory.hbm_bytes

    @property
    def gpu_name(self) -> str:
        if self.placement is not None:
            return " + ".join(f"{n} x {gpu}" for gpu, n in self.placement.gpus)
        return self.job.cluster.gpu.name

    @property
    def cost_per_hour_usd(self) -> float | None:
        if self.placement is not None:
            return self.placement.price_per_hour_usd
        price = self.job.cluster.price_per_gpu_hour
        return None if price is None else price * self.job.cluster.num_gpus

    @property
    def usd_per_million_tokens(self) -> float | None:
        hourly = self.cost_per_hour_usd
        return None if hourly is None else hourly / 3600.0 / self.tokens_per_s * 1e6

    @property
    def bubble_fraction(self) -> float:
        """The pipeline bubble's share of the iteration (from the breakdown: reading it reads
        a pipeline's deferred breakdown)."""
        return self.breakdown.pipeline_bubble_s / self.iteration_s

    @property
    def time_to_train_s(self) -> float | None:
        tokens = self.job.train_tokens
        return None if tokens is None else tokens / self.tokens_per_s

    @property
    def cost_to_train_usd(self) -> float | None:
        hourly, seconds = self.cost_per_hour_usd, self.time_to_train_s
        return None if hourly is None or seconds is None else hourly * seconds / 3600.0

    def plan_dict(self) -> dict:
        """The resolved parallel plan, as JSON keys (also the columns of search results)."""
        plan = self.job.parallel
        return {
            "tp": plan.tp,
            "pp": plan.pp,
            "dp": plan.dp,
            "cp": plan.cp,
            "vpp": plan.vpp,
            "sequence_parallel": plan.sequence_parallel,
            "zero_stage": plan.zero_stage,
            "micro_batch_size": plan.micro_batch_size,
            "global_batch_size": plan.global_batch_size,
            "num_microbatches": plan.num_microbatches,
            "recompute": plan.recompute.value,
            "schedule": plan.schedule.value,
            "framework": plan.framework.value,
            **({"cp_comm_type": plan.cp_comm} if plan.cp > 1 else {}),
            "layers_per_stage": [s.num_layers for s in self.stages],
            **({"attention_kernel": plan.attention_kernel.value} if plan.attention_kernel is not None else {}),
            **({"node_order": list(self.placement.node_order)} if self.placement is not None else {}),
            **({"offload_optimizer": plan.offload_optimizer, "offload_param": plan.offload_param,
                "cpu_offloading_num_layers": plan.cpu_offloading_num_layers if plan.cpu_offloading else 0}
               if plan.offloads else {}),
        }

    def to_dict(self) -> dict:
        """A JSON-ready mapping; keys follow DESIGN.md's vocabulary (documented in the README)."""
        job = self.job
        return {
            "job": job.name,
            "backend": self.backend,
            "model": job.model.name,
            "seq_length": job.model.seq_length,
            "gpu": self.gpu_name,
            "cluster": self.placement.cluster if self.placement is not None else job.cluster.name,
            "num_gpus": job.cluster.num_gpus,
            "parallel": self.plan_dict(),
            "precision": job.precision.value,
            "iteration_s": self.iteration_s,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "bubble_fraction": self.bubble_fraction,
            "params_total": self.params_total,
            "params_active": self.params_active,
            "model_flops_per_iteration": self.model_flops_per_iteration,
            "breakdown": asdict(self.breakdown),
            "memory": self.memory.to_dict(),
            "cost": {
                "price_per_gpu_hour_usd": None if self.placement else job.cluster.price_per_gpu_hour,
                "cost_per_hour_usd": self.cost_per_hour_usd,
                "usd_per_million_tokens": self.usd_per_million_tokens,
                "train_tokens": job.train_tokens,
                "time_to_train_s": self.time_to_train_s,
                "cost_to_train_usd": self.cost_to_train_usd,
            },
            "stages": [asdict(s) for s in self.stages],
            "uncalibrated": list(self.uncalibrated),
            "ignored_settings": list(self.ignored_settings),
            "placement_notes": list(self.placement_notes),
            **({"placement": _placement_dict(self.placement)} if self.placement is not None else {}),
            **({"framework_preset": job.preset.to_dict()} if job.preset is not None else {}),
            **({"inventory": {"source": "traced", "kernels": job.model.kernels,
                              "pipeline": traced_pipeline(job)}}
               if job.model.inventory == "traced" else {}),
        }


def traced_pipeline(job) -> str:
    """How a traced model's embedding, layers, norm and head sit on the pipeline stages."""
    from paraplan.inventory import local_shape
    from paraplan.inventory.traced_ends import pipeline_placement

    return pipeline_placement(job.model, local_shape(job.model, job.parallel, job.precision))


def _placement_dict(placement: Placement) -> dict:
    return {f: getattr(placement, f) for f in ("cluster", "node_order", "stage_gpus", "stage_hbm_bytes", "gpus",
                                               "price_per_hour_usd")}


