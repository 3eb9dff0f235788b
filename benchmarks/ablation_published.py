"""What each effect of issue 13 moves on each development set: switch one off at a time.

Run: python benchmarks/ablation_published.py [path/to/shared/data]
Prints a markdown table (README, "Validation"): per set (runs_dev.json, runs_dev_modern.json,
the Perlmutter runs, benchmarks/data/runs_moe_dev.json's predictable runs as "MoE") the signed
median and the median |error| as shipped and with each effect switched off, in both directions, so that a reader sees why the numbers moved. The effects come
from operator- and link-level measurements and the frameworks' code; the runs are only
compared with, nothing is fitted or chosen by them.

Each row's label names the effect as shipped and, in parentheses, what the row puts in its place:
an effect that ships on is switched off, one that ships off (the queued-kernel gap, async TP) is
switched on. Some effects no development run exercises, so their rows move nothing: no run
states a cluster ``power_cap_w`` or ``async_tp`` (and none runs FSDP with tp > 1, where async TP
could be switched on); context parallelism appears in one MoE run only (Qwen3-235B cp 8, p2p) and
an FP8 recipe other than delayed scaling in one MoE run only (GB200, MXFP8), so those rows move the
MoE column alone, without moving its median. The TP-overlap rows' Flux floor moves nothing either:
the only runs with TP overlap (MLPerf) state their own userbuffers configuration. Under the table
the script prints every row that moves no run, and each row that moves runs but no median with
those runs' errors (as shipped -> switched).
"""

from __future__ import annotations

import contextlib
import copy
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paraplan.costmodel.roofline as roofline
import paraplan.inventory.job as inventory_job
import paraplan.inventory.shapes as shapes
import paraplan.prediction.stages as stages
import paraplan.schedule.overlap as overlap
from paraplan.catalog import load_catalog_entry, load_gpu, resolve_job
from paraplan.prediction import predict
from paraplan.schedule import overlapped_s
from paraplan.specs import ConfigError, FP8Recipe
from paraplan.validate import load_runs
from paraplan.validate.gpumodeling import job_mapping_from_run
from paraplan.validate.published import measured_iteration_s
from paraplan.validate.records import job_from_record

DATA = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared" / "data"
NEW_CURVES = ("H100-SXM5-80GB", "H200-SXM-141GB", "B200")

Mapping = dict[str, Any]


def _inline_gpu(mapping: Mapping, edit: Callable[[dict], None]) -> Mapping:
    """The job with its catalog GPU written out inline and changed by ``edit``."""
    out = copy.deepcopy(mapping)
    cluster = out["cluster"]
    name = cluster.get("gpu") or load_catalog_entry("clusters", cluster["name"])["gpu"]
    raw = copy.deepcopy(load_catalog_entry("gpus", load_gpu(name).name))
    raw.pop("aliases", None)
    edit(raw)
    cluster["gpu"] = raw
    return out


def _generic_curves(mapping: Mapping) -> Mapping:
    gpu = mapping["cluster"].get("gpu") or load_catalog_entry("clusters", mapping["cluster"]["name"])["gpu"]
    if load_gpu(gpu).name not in NEW_CURVES:
        return mapping
    return _inline_gpu(mapping, lambda raw: raw.pop("efficiency", None))


def _no_contention(mapping: Mapping) -> Mapping:
    return _inline_gpu(mapping, lambda raw: raw.setdefault("efficiency", {}).update(overlap_slowdown=0.0))


def _burst_clocks(mapping: Mapping) -> Mapping:
    """Before issue 27: GEMMs at the burst rate the curves were calibrated on, not the clock a
    board holds at its power limit (``efficiency.sustained`` removed)."""
    return _inline_gpu(mapping, lambda raw: raw.setdefault("efficiency", {}).pop("sustained", None))


def _ideal_tp_overlap(mapping: Mapping) -> Mapping:
    """Before issue 27: --tp-comm-overlap hid all but one of tp chunks, the GEMMs slowed by
    ``overlap_slowdown`` (the GPU's measured ``efficiency.tp_overlap`` removed)."""
    if not resolve_job(mapping).parallel.tp_comm_overlap:
        return mapping
    return _inline_gpu(mapping, lambda raw: raw.setdefault("efficiency", {}).pop("tp_overlap", None))


def _attention_burst(mapping: Mapping) -> Mapping:
    """Before issue 27: fused attention at the burst rate of its curve, not held at the power
    limit (``efficiency.sustained.attention_fraction`` removed)."""
    def edit(raw: dict) -> None:
        sustained = raw.get("efficiency", {}).get("sustained")
        if sustained is not None:
            sustained.pop("attention_fraction", None)
    return _inline_gpu(mapping, edit)


def _attention_flops_curve(mapping: Mapping) -> Mapping:
    """Before issue 27: every attention kernel on its FLOP curve, never by its tiles (each
    ``attention_kernels.*.tiles`` removed)."""
    def edit(raw: dict) -> None:
        for curve in raw.get("efficiency", {}).get("attention_kernels", {}).values():
            curve.pop("tiles", None)
    return _inline_gpu(mapping, edit)


# H100's FP8 GEMM curve before issue 27: the BF16 curve x 1.91 / 2 (FBGEMM at 500 W, TE on the H200 NVL)
FP8_RATIO_191 = {"max_fraction": 0.7656, "half_work": 9.34e9}


def _grouped_gemm_four_streams(mapping: Mapping) -> Mapping:
    """Before issue 27's MoE pass: Transformer Engine's grouped GEMM as its 4 streams' GEMMs
    filling the GPU together (the GPU's measured ``efficiency.grouped_gemm`` removed)."""
    gpu = mapping["cluster"].get("gpu") or load_catalog_entry("clusters", mapping["cluster"]["name"])["gpu"]
    if "grouped_gemm" not in load_catalog_entry("gpus", load_gpu(gpu).name).get("efficiency", {}):
        return mapping
    return _inline_gpu(mapping, lambda raw: raw["efficiency"].pop("grouped_gemm", None))


def _fp8_ratio_191(mapping: Mapping) -> Mapping:
    """Before issue 27: Hopper's FP8 GEMM curve from same-shape ratios taken at 500-600 W (1.91)
    instead of the FP8/BF16 MAMF ratio measured at the board's own 700 W (H100 SXM 1.765)."""
    gpu = mapping["cluster"].get("gpu") or load_catalog_entry("clusters", mapping["cluster"]["name"])["gpu"]
    if load_gpu(gpu).name not in ("H100-SXM5-80GB", "H200-SXM-141GB", "H100-PCIE-80GB", "H800"):
        return mapping
    return _inline_gpu(mapping, lambda raw: raw["efficiency"]["precisions"]["fp8"]["gemm"].update(FP8_RATIO_191))


def _parallel(**values: Any) -> Callable[[Mapping], Mapping]:
    """Each named plan field switched to the value given, where the job has it on: stated in the
    record or taken from its framework preset (stated explicitly, so the preset cannot lay its
    default back under it)."""
    def change(mapping: Mapping) -> Mapping:
        out = copy.deepcopy(mapping)
        preset = resolve_job(mapping).preset
        taken = set(preset.taken) if preset is not None else set()
        for key, value in values.items():
            if key in out["parallel"] or key in taken:
                out["parallel"][key] = value
        return out
    return change


def _parallel_stated(**values: Any) -> Callable[[Mapping], Mapping]:
    """Each named plan field stated as the value given on every job (a field no preset sets)."""
    def change(mapping: Mapping) -> Mapping:
        out = copy.deepcopy(mapping)
        out["parallel"].update(values)
        return out
    return change


def _no_layer_or_op_recompute(mapping: Mapping) -> Mapping:
    """torchtitan's and fms-fsdp's layer / op recompute switched off (the framework kept)."""
    out = copy.deepcopy(mapping)
    if out["parallel"].get("recompute") in ("layer", "op"):
        out["parallel"]["recompute"] = "none"
        out["parallel"].pop("recompute_every", None)
    return out


def _generic_links(mapping: Mapping) -> Mapping:
    """Before issue 13: every cluster's NCCL efficiency was the generic 0.8."""
    out = copy.deepcopy(mapping)
    cluster = out["cluster"]
    if cluster.get("name") not in ("dgx-a100", "dgx-h100"):
        return out
    raw = load_catalog_entry("clusters", cluster["name"])
    for link in ("intra_node", "inter_node"):
        values = {**raw[link], **cluster.get(link, {})}
        values.pop("p2p_efficiency", None)
        cluster[link] = {**values, "efficiency": 0.8}
    return out


def _fused(field: str, arch: str, value: str) -> Callable[[Mapping], Mapping]:
    """The job with ``field`` stated true (a fused kernel) where the model has the kernel: a
    stated field wins over the record's and the framework preset's eager one."""

    def change(mapping: Mapping) -> Mapping:
        out = copy.deepcopy(mapping)
        if out["model"].get(arch) == value:
            out["model"][field] = True
        return out

    return change


_fused_swiglu = _fused("swiglu_fusion", "activation", "swiglu")
_fused_rmsnorm = _fused("rmsnorm_fusion", "normalization", "rmsnorm")


def _fused_projections(mapping: Mapping) -> Mapping:
    """The job with q, k, v as one GEMM and a gated MLP's gate and up as one (Megatron-Core's
    linear_qkv and linear_fc1), stated over the preset's separate ones (torchtitan, fms-fsdp)."""
    out = copy.deepcopy(mapping)
    if isinstance(out["model"], dict):
        out["model"]["qkv_fusion"] = True
        if out["model"].get("activation") == "swiglu":
            out["model"]["gate_up_fusion"] = True
    return out


def _fused_rope_no_repeat(mapping: Mapping) -> Mapping:
    """The job with RoPE as one kernel and grouped K/V read in place (Megatron-Core's fused RoPE,
    SDPA's enable_gqa), stated over the preset's eager forms (torchtitan 2024, fms-fsdp)."""
    out = copy.deepcopy(mapping)
    if isinstance(out["model"], dict) and out["model"].get("position_embedding", "rotary") == "rotary":
        out["model"]["rope_impl"] = "kernel"
        out["model"]["gqa_expand"] = "none"
    return out


def _no_kernel_floor(mapping: Mapping) -> Mapping:
    """The GPU's measured kernel floor (``kernel_overhead_s``) set to 0, its curves kept."""
    return _inline_gpu(mapping, lambda raw: raw.setdefault("efficiency", {}).update(kernel_overhead_s=0.0))


def _no_fsdp2_copies(mapping: Mapping) -> Mapping:
    out = copy.deepcopy(mapping)
    job = resolve_job(mapping)
    if job.parallel.framework.value == "fsdp" and job.parallel.fsdp_version != 1:
        out["parallel"]["fsdp_version"] = 1
    return out


@contextlib.contextmanager
def _no_fsdp1_kernels() -> Iterator[None]:
    """FSDP1's kernels around its collectives priced as nothing (the shard casts before each
    all-gather, the flat gradient's concatenation, the casts and divides around each
    reduce-scatter: ``inventory.fsdp1``), FSDP1 kept."""
    real = inventory_job.fsdp1_side_kernels, inventory_job.fsdp1_grad_flatten
    inventory_job.fsdp1_side_kernels = lambda *args, **kwargs: ()
    inventory_job.fsdp1_grad_flatten = lambda *args, **kwargs: ()
    try:
        yield
    finally:
        inventory_job.fsdp1_side_kernels, inventory_job.fsdp1_grad_flatten = real


def _reference_network(mapping: Mapping) -> Mapping:
    out = copy.deepcopy(mapping)
    out["cluster"].pop("inter_node", None)
    return out


@contextlib.contextmanager
def _fp8_everywhere() -> Iterator[None]:
    """Before issue 13: an FP8 job ran every kernel at the FP8 peak, with no casts."""
    precision, shard = roofline.compute_precision_of_job, shapes.shard_shape

    def all_fp8(job_precision):
        return job_precision

    def no_fp8_linears(*args, **kwargs):
        import dataclasses

        return dataclasses.replace(shard(*args, **kwargs), fp8_linears=False)

    roofline.compute_precision_of_job, shapes.shard_shape = all_fp8, no_fp8_linears
    try:
        yield
    finally:
        roofline.compute_precision_of_job, shapes.shard_shape = precision, shard


@contextlib.contextmanager
def _no_exposed_units() -> Iterator[None]:
    sharded = overlap.sharded_pass_s  # the stages call it through schedule.overlap.with_sharded_traffic
    overlap.sharded_pass_s = lambda compute, comm, units, slowdown, beside=0.0: overlapped_s(compute, comm, slowdown, beside)
    try:
        yield
    finally:
        overlap.sharded_pass_s = sharded


@contextlib.contextmanager
def _stages_function(name: str, replacement: Callable[..., Any]) -> Iterator[None]:
    """``prediction.stages``' function ``name`` replaced while the predictions run."""
    real = getattr(stages, name)
    setattr(stages, name, replacement)
    try:
        yield
    finally:
        setattr(stages, name, real)


def _cp_comm_hidden() -> contextlib.AbstractContextManager:
    """Before issue 27: context parallelism's K/V exchange wholly hidden behind the attention (no
    ring step's send, all-gather, reduce-scatter or all-to-all exposed: ``stages.context_comm``)."""
    return _stages_function("context_comm", lambda *args, **kwargs: (0.0, 0.0))


def _ideal_async_tp() -> contextlib.AbstractContextManager:
    """PyTorch's async TP as its name promises: every TP collective of a layer hidden and its
    GEMMs whole, instead of as torch runs it (``prediction.async_tp``: 1/tp-row GEMMs, symmetric-
    memory copies and barriers, the backward reduce-scatter left to NCCL)."""
    return _stages_function("async_tp_layer", lambda ops, fwd, bwd, weight, tp, cm, comm: (fwd, bwd, 0.0, 0.0))


def _async_tp_on(mapping: Mapping) -> Mapping:
    """async TP stated on where torch would fuse anything (framework fsdp, tp > 1, sequence
    parallelism, no Transformer Engine overlap); torchtitan 0.3 ships it off."""
    plan = resolve_job(mapping).parallel
    if plan.framework.value != "fsdp" or plan.tp < 2 or not plan.sequence_parallel or plan.tp_comm_overlap:
        return mapping
    out = copy.deepcopy(mapping)
    out["parallel"]["async_tp"] = True
    return out


def _no_power_cap(mapping: Mapping) -> Mapping:
    """The cluster's stated ``power_cap_w`` removed: the GPUs at their board's TDP."""
    if not isinstance(mapping.get("cluster"), dict) or "power_cap_w" not in mapping["cluster"]:
        return mapping
    out = copy.deepcopy(mapping)
    out["cluster"].pop("power_cap_w")
    return out


def _delayed_scaling(mapping: Mapping) -> Mapping:
    """An FP8 job's current / rowwise / MXFP8 recipe (stated or its preset's) replaced by
    Transformer Engine's delayed scaling: that recipe's casts, amaxes and scales instead
    (``inventory.fp8``); NVFP4, a different GEMM format, kept."""
    recipe = resolve_job(mapping).parallel.fp8_recipe
    if recipe in (None, FP8Recipe.DELAYED, FP8Recipe.NVFP4):
        return mapping
    out = copy.deepcopy(mapping)
    out["parallel"]["fp8_recipe"] = FP8Recipe.DELAYED.value
    return out


def _megatron_dropout(mapping: Mapping) -> Mapping:
    """MLPerf v3.0's runs with Megatron-LM's GPT dropout of 0.1 (their config states 0.0)."""
    if (mapping.get("parallel") or {}).get("framework") != "nemo-mlperf-3.0":
        return mapping
    out = copy.deepcopy(mapping)
    out["model"].update(attention_dropout=0.1, hidden_dropout=0.1)
    return out


def _mlperf_fa2(mapping: Mapping) -> Mapping:
    """MLPerf v3.0's runs with FlashAttention-2's curve (their flash-attn 1.0.5 instead)."""
    if (mapping.get("parallel") or {}).get("framework") != "nemo-mlperf-3.0":
        return mapping
    out = copy.deepcopy(mapping)
    out["parallel"]["attention_kernel"] = "fa2"
    return out


def _same(mapping: Mapping) -> Mapping:
    return mapping


# name -> (change to the job mapping, context the predictions run in)
SWITCHES: dict[str, tuple[Callable[[Mapping], Mapping], Callable[[], contextlib.AbstractContextManager]]] = {
    "nothing (as shipped)": (_same, contextlib.nullcontext),
    "H100/H200/B200 measured curves (generic 80 % / 60 % / 80 % instead)": (_generic_curves, contextlib.nullcontext),
    "FP8 as it runs (every kernel at the FP8 peak, no casts)": (_same, _fp8_everywhere),
    "measured NCCL efficiencies of DGX A100 / H100 (generic 0.8 instead)": (_generic_links, contextlib.nullcontext),
    "contention under overlap (overlap_slowdown 0)": (_no_contention, contextlib.nullcontext),
    "FP8/BF16 GEMM ratio of H100 MAMFs at 700 W (1.765; 1.91 from 500-600 W boards instead)": (
        _fp8_ratio_191, contextlib.nullcontext),
    "sustained-clock GEMMs at the power limit (burst-calibrated rate instead)": (_burst_clocks,
                                                                                 contextlib.nullcontext),
    "FSDP/ZeRO-3 first gather and last reduce-scatter exposed": (_same, _no_exposed_units),
    "torchtitan / fms-fsdp layer and op recompute (none instead)": (_no_layer_or_op_recompute, contextlib.nullcontext),
    "TP communication overlap (MLPerf)": (_parallel(tp_comm_overlap=False), contextlib.nullcontext),
    "TP overlap floor measured on Flux kernels (one chunk exposed + contention alone instead)": (_ideal_tp_overlap,
                                                                                           contextlib.nullcontext),
    "asynchronous pipeline sends (MLPerf)": (_parallel(overlap_p2p_comm=False), contextlib.nullcontext),
    "eager SwiGLU (torchtitan, fms-fsdp; fused instead)": (_fused_swiglu, contextlib.nullcontext),
    "eager RMSNorm as the frameworks ran it (torchtitan 2024, fms-fsdp; fused instead)": (_fused_rmsnorm,
                                                                                         contextlib.nullcontext),
    "separate q/k/v and gate/up GEMMs (torchtitan 2024, fms-fsdp; one fused GEMM each instead)": (
        _fused_projections, contextlib.nullcontext),
    "FSDP2's copy-out / copy-in kernels (torchtitan; FSDP1's views instead)": (_no_fsdp2_copies,
                                                                               contextlib.nullcontext),
    "FSDP1's shard casts, flat-gradient concatenation and reduce divides (fms-fsdp; none instead)": (
        _same, _no_fsdp1_kernels),
    "torch's foreach AdamW (fms-fsdp, torchtitan 0.1; fused instead)": (_parallel(optimizer_impl="fused"),
                                                                        contextlib.nullcontext),
    "clip_grad_norm_ scaling every gradient each step (fms-fsdp, torchtitan; norm alone instead)": (
        _parallel(grad_clip_scale=False), contextlib.nullcontext),
    "hybrid sharding (fms-fsdp 7B/13B)": (_parallel(data_parallel_shard_degree=None), contextlib.nullcontext),
    "bf16 gradient reduction (fms-fsdp, MLPerf v3.0's grad_sync_dtype)": (_parallel(grad_reduce_in_fp32=True),
                                                                           contextlib.nullcontext),
    "DP gradient reduction after the pipeline drains (Megatron-LM 2021-22 local DDP; overlapped instead)": (
        _parallel(overlap_grad_reduce=True), contextlib.nullcontext),
    "Transformer Engine's FP8 amax all-reduce (MLPerf; none instead)": (_parallel(fp8_amax_reduce="none"),
                                                                         contextlib.nullcontext),
    "MLPerf's own TE userbuffers configuration (the Flux floor instead)": (_parallel(tp_comm_overlap_cfg=None),
                                                                           contextlib.nullcontext),
    "MLPerf v3.0's dropout 0.0 (its model config; Megatron-LM's 0.1 instead)": (_megatron_dropout,
                                                                              contextlib.nullcontext),
    "MLPerf v3.0's FlashAttention 1.0.5 (FA2's H100 curve instead)": (_mlperf_fa2, contextlib.nullcontext),
    "TE 0.x per-module FP8 bookkeeping kernels (MLPerf; none instead)": (_parallel(te_fp8_bookkeeping="none"),
                                                                         contextlib.nullcontext),
    "eager RoPE and repeated K/V (torchtitan 2024, fms-fsdp; one RoPE kernel, no copy instead)": (
        _fused_rope_no_repeat, contextlib.nullcontext),
    "kernel floor from real traces (H100 1.29 us, A100 3.00 us; 0 instead)": (_no_kernel_floor,
                                                                             contextlib.nullcontext),
    "no idle gap between queued kernels (off by default; on instead: H100 1.41 us, A100 1.15 us per kernel)": (
        _parallel_stated(queued_kernel_gap=True), contextlib.nullcontext),
    "the network a record states (reference node's instead)": (_reference_network, contextlib.nullcontext),
    "TE grouped GEMM at its measured concurrency (H100 1.60; 4 streams filling the GPU instead)": (
        _grouped_gemm_four_streams, contextlib.nullcontext),
    "attention kernel of the framework preset (the GPU's one attention curve instead)": (
        _parallel(attention_kernel=None), contextlib.nullcontext),
    "attention held at the power limit (H100; burst rate instead)": (_attention_burst, contextlib.nullcontext),
    "cuDNN attention priced by its tiles (H100; its FLOP curve instead)": (_attention_flops_curve,
                                                                          contextlib.nullcontext),
    "context-parallel communication as the frameworks run it (ring p2p sends, all-gathers, a2a exposed;"
    " all hidden instead)": (_same, _cp_comm_hidden),
    "async TP as torch runs it (1/tp-row GEMMs, copies, barriers, unfused backward reduce-scatter;"
    " every TP collective hidden instead)": (_same, _ideal_async_tp),
    "no async TP (torchtitan 0.3's default; on instead where FSDP runs tp > 1 with sequence parallelism)": (
        _async_tp_on, contextlib.nullcontext),
    "a cluster's stated power cap (power_cap_w; the board's TDP instead)": (_no_power_cap, contextlib.nullcontext),
    "FP8 recipe's casts, amaxes and scales as stated (current / rowwise / MXFP8; delayed scaling instead)": (
        _delayed_scaling, contextlib.nullcontext),
}


def _group(run: dict) -> str:
    """The column a run counts in: its source, split by GPU where a source has two."""
    source = str(run["id"]).split("-")[0]
    if source == "ibm":
        return f"ibm {'H100' if 'h100' in run['id'] else 'A100'}"
    if run.get("model", {}).get("num_moe_experts"):
        return "MoE"
    return {"mlperf": "MLPerf H100 FP8", "torchtitan": "torchtitan A100"}.get(source, source)


def _errors(runs, to_mapping, measured, change, context) -> dict[str, dict[str, float]]:
    """Per column, each run's signed error by its id."""
    groups: dict[str, dict[str, float]] = {}
    with context():
        for run in runs:
            job = resolve_job(change(to_mapping(run)))
            groups.setdefault(_group(run), {})[str(run["id"])] = predict(job).iteration_s / measured(run) - 1.0
    return groups


def _moved_runs(groups: dict[str, dict[str, float]], shipped: dict[str, dict[str, float]]) -> list[str]:
    """'id: shipped -> switched %' for each run whose error the row changes."""
    return [f"{run} {100 * shipped[column][run]:+.1f} -> {100 * error:+.1f} %"
            for column, errors in groups.items() for run, error in errors.items() if error != shipped[column][run]]


def _predictable(runs: list[dict]) -> list[dict]:
    """The runs whose record makes a job (``validate runs`` skips the others, naming why)."""
    out = []
    for run in runs:
        with contextlib.suppress(ConfigError):
            resolve_job(job_from_record(run).mapping)
            out.append(run)
    return out


def main() -> None:
    published = lambda r: job_from_record(r).mapping  # noqa: E731
    sets = [
        (load_runs(DATA / "published" / "runs_dev.json"), published, measured_iteration_s),
        (load_runs(DATA / "published" / "runs_dev_modern.json"), published, measured_iteration_s),
        ([dict(r, id=f"Perlmutter-{r['id']}") for r in load_runs(DATA / "gpumodeling" / "runs_perlmutter.json")],
         job_mapping_from_run, lambda r: r["measured"]["iteration_time_s"]["min"]),
        (_predictable(load_runs(Path(__file__).resolve().parent / "data" / "runs_moe_dev.json")), published,
         measured_iteration_s),
    ]
    rows = []
    for name, (change, context) in SWITCHES.items():
        groups: dict[str, dict[str, float]] = {}
        for runs, to_mapping, measured in sets:
            groups.update(_errors(runs, to_mapping, measured, change, context))
        rows.append((name, groups))
    columns = list(rows[0][1])
    print("Signed median error per source, % (negative: predicted faster than measured); last column: median |error|"
          " of all dense runs (the MoE column's runs are not in it)")
    print()
    print("| switched off | " + " | ".join(columns) + " | all dense |")
    print("|---|" + "---|" * (len(columns) + 1))
    lines = []
    for name, groups in rows:
        every = [abs(e) for column, errors in groups.items() if column != "MoE" for e in errors.values()]
        cells = [f"{100 * statistics.median(groups[c].values()):+.1f}" for c in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {100 * statistics.median(every):.1f} |")
    print("\n".join(lines))
    shipped, shipped_cells = rows[0][1], lines[0].split(" | ")[1:]
    unmoved = [name for name, groups in rows[1:] if not _moved_runs(groups, shipped)]
    hidden = [(name, _moved_runs(groups, shipped)) for (name, groups), line in zip(rows[1:], lines[1:], strict=True)
              if name not in unmoved and line.split(" | ")[1:] == shipped_cells]
    if unmoved:
        print()
        print("Rows that move no run (no development run exercises the effect, so this table cannot show it): "
              + "; ".join(unmoved))
    for name, moved in hidden:
        print()
        print(f"Row '{name}' moves no median, only: " + "; ".join(moved))


if __name__ == "__main__":
    main()
