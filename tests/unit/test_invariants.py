"""Issue 15's invariants, as properties of valid jobs: catalog models on catalog clusters with
random plans (tp, pp, cp, micro-batches, global batch, recompute, ZeRO, schedule, Megatron /
DeepSpeed / FSDP, sequence parallelism and its overlap, BF16 / FP8, sequence length).

test_predict.py checks several of these on one job; here hypothesis draws the job. Each test
keeps its examples few (the suite stays fast; all six held for 1,500 examples each when they
were written); a failing example is printed as the job mapping.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from paraplan.catalog import resolve_job
from paraplan.inventory import count_job
from paraplan.inventory.job import fp8_weight_params
from paraplan.prediction import predict
from paraplan.specs import ConfigError, Precision

MODELS = ["gpt2", "gpt3-125m", "gpt3-1.3b", "llama-2-7b", "mistral-7b", "llama-3-8b", "gpt-neox-20b", "llama-2-70b",
          "gpt3-175b", "llemma-7b"]
CLUSTERS = ["dgx-a100", "dgx-h100", "aws-p4de.24xlarge", "aws-p5.48xlarge", "aws-g5.12xlarge", "perlmutter",
            "perlmutter-gpumodeling", "vista-gpumodeling", "gcp-a3-highgpu-8g", "azure-nd-h100-v5"]
FP8 = {"dgx-h100", "aws-p5.48xlarge", "gcp-a3-highgpu-8g", "azure-nd-h100-v5"}
RECOMPUTE = ["none", "selective", "full"]
SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.filter_too_much,
                                                                          HealthCheck.too_slow])


@st.composite
def job_mappings(draw) -> dict:
    """A job mapping; some draws are invalid (tp not dividing the heads, ...) and rejected."""
    cluster = draw(st.sampled_from(CLUSTERS))
    gpus_per_node = {"aws-g5.12xlarge": 4, "perlmutter": 4, "perlmutter-gpumodeling": 4,
                     "vista-gpumodeling": 1}.get(cluster, 8)
    num_nodes = draw(st.sampled_from([1, 2, 4]))
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if t <= gpus_per_node]))
    pp = draw(st.sampled_from([1, 2, 4]))
    cp = draw(st.sampled_from([1, 1, 2]))
    if (gpus_per_node * num_nodes) % (tp * pp * cp):
        reject()
    dp = gpus_per_node * num_nodes // (tp * pp * cp)
    framework = draw(st.sampled_from(["megatron", "deepspeed"] + (["fsdp"] if pp == 1 else [])))
    schedule = draw(st.sampled_from(["1f1b", "gpipe"] + (["interleaved"] if pp > 1 and framework == "megatron"
                                                         else [])))
    mbs = draw(st.sampled_from([1, 2, 4]))
    parallel = {
        "tp": tp, "pp": pp, "micro_batch_size": mbs,
        "global_batch_size": mbs * dp * draw(st.sampled_from([1, 2, 4, 8])) * (pp if schedule == "interleaved" else 1),
        "recompute": draw(st.sampled_from(RECOMPUTE)), "zero_stage": draw(st.sampled_from([0, 1, 2, 3])),
        "schedule": schedule, "framework": framework,
        "sequence_parallel": tp > 1 and draw(st.booleans()), "cp": cp,
    }
    if schedule == "interleaved":
        parallel["vpp"] = 2
    if framework == "megatron" and parallel["sequence_parallel"]:
        parallel["tp_comm_overlap"] = draw(st.booleans())
    model = {"name": draw(st.sampled_from(MODELS)), "seq_length": draw(st.sampled_from([1024, 2048, 4096, 32768]))}
    precision = draw(st.sampled_from(["bf16", "fp8"] if cluster in FP8 else ["bf16"]))
    return {"model": model, "cluster": {"name": cluster, "num_nodes": num_nodes}, "parallel": parallel,
            "precision": precision}


def _resolve(raw: dict):
    try:
        return resolve_job(raw)
    except ConfigError:
        reject()


def _with(raw: dict, **parallel) -> dict:
    return {**raw, "parallel": {**raw["parallel"], **parallel}}


def _model_state(pred) -> list[float]:
    """Weights, gradients and optimizer states per GPU of every stage, less the working copy
    ZeRO-3 in FP8 gathers: one layer's FP8 weights and transpose beside the shard (README,
    search: "ZeRO-3, except in FP8, where it holds one gathered layer's FP8 copy beside the
    shard"). That copy is the layer being used, not state the stage keeps; with dp x cp = 1
    there is nothing to shard and it would be the whole difference from ZeRO 0."""
    job = pred.job
    if job.parallel.zero_stage < 3 or job.precision is not Precision.FP8:
        gathered = [0.0] * len(pred.memory)
    else:
        gathered = [2.0 * fp8_weight_params(st.layer_ops) for st in count_job(job).stages]
    return [m.weights - g + m.gradients + m.optimizer_states for m, g in zip(pred.memory, gathered, strict=True)]


@SETTINGS
@given(raw=job_mappings(), extra=st.sampled_from([1, 2]))
def test_more_layers_never_make_an_iteration_faster(raw, extra):
    job = _resolve(raw)
    plan = job.parallel
    more = {**raw, "model": {**raw["model"], "num_layers": job.model.num_layers + extra * plan.pp * plan.vpp}}
    assert predict(_resolve(more)).iteration_s >= predict(job).iteration_s * (1 - 1e-12)


@SETTINGS
@given(raw=job_mappings())
def test_more_recompute_is_never_faster_and_never_keeps_more_activations(raw):
    preds = [predict(_resolve(_with(raw, recompute=policy))) for policy in RECOMPUTE]
    for less, more in itertools.pairwise(preds):
        assert more.iteration_s >= less.iteration_s * (1 - 1e-12)
        for a, b in zip(less.memory, more.memory, strict=True):
            assert b.activations <= a.activations * (1 + 1e-12)


@SETTINGS
@given(raw=job_mappings())
def test_a_higher_zero_stage_never_holds_more_model_state(raw):
    """Weights, gradients and optimizer states per GPU on every stage (gather buffers are not
    model state). Stages a framework refuses for the plan are left out."""
    states = []
    for zero in range(4):
        try:
            states.append(_model_state(predict(resolve_job(_with(raw, zero_stage=zero)))))
        except ConfigError:
            continue
    if len(states) < 2:
        reject()
    for lower, higher in itertools.pairwise(states):
        assert all(h <= lo * (1 + 1e-12) for lo, h in zip(lower, higher, strict=True))


def _faster(cluster, factor: float):
    """``cluster`` with every peak and bandwidth (HBM, links, measured collective curves)
    ``factor`` times higher; latencies, efficiencies and overheads unchanged."""

    def link(spec):
        if spec is None:
            return None
        curves = {k: c.model_copy(update={"bus_bytes_per_s": {n: b * factor for n, b in c.bus_bytes_per_s.items()}})
                  for k, c in spec.collectives.items()}
        return spec.model_copy(update={"bandwidth_bytes_per_s": spec.bandwidth_bytes_per_s * factor,
                                       "collectives": curves})

    gpu = cluster.gpu.model_copy(update={
        "peak_flops": {p: v * factor for p, v in cluster.gpu.peak_flops.items()},
        "hbm_bandwidth_bytes_per_s": cluster.gpu.hbm_bandwidth_bytes_per_s * factor,
        "intra_node": link(cluster.gpu.intra_node),
    })
    return cluster.model_copy(update={"gpu": gpu, "intra_node": link(cluster.intra_node),
                                      "inter_node": link(cluster.inter_node)})


@SETTINGS
@given(raw=job_mappings(), factor=st.floats(1.0, 8.0))
def test_faster_hardware_is_never_slower(raw, factor):
    job = _resolve(raw)
    fast = job.model_copy(update={"cluster": _faster(job.cluster, factor)})
    assert predict(fast).iteration_s <= predict(job).iteration_s * (1 + 1e-12)


@SETTINGS
@given(raw=job_mappings())
def test_fits_exactly_when_every_stage_s_total_is_within_the_gpu_memory_less_the_headroom(raw):
    pred = predict(_resolve(raw))
    usable = pred.job.cluster.gpu.hbm_bytes * (1 - pred.job.memory_headroom)
    assert pred.fits == (pred.worst_memory.total <= usable) == pred.to_dict()["memory"]["fits"]
    assert pred.memory.margin == pytest.approx(usable - pred.worst_memory.total)
    assert pred.to_dict()["memory"]["total_bytes"] == max(m.total for m in pred.memory)


@SETTINGS
@given(raw=job_mappings())
def test_the_breakdown_sums_to_the_iteration_and_utilisation_is_ordered(raw):
    pred = predict(_resolve(raw))
    assert pred.breakdown.total_s == pytest.approx(pred.iteration_s, rel=1e-9)
    assert 0 <= pred.mfu <= pred.hfu <= 1
    assert 0 <= pred.bubble_fraction < 1
