"""The breakdown tells the truth (issue 24): time the critical path spends waiting for a
collective is that collective's component, never compute; every renderer prints one list of
components."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st

from paraplan.catalog import resolve_job
from paraplan.prediction import Breakdown, predict
from paraplan.prediction.components import COMPONENTS, ComponentKind, components_of
from paraplan.specs import ConfigError, Job

#: The components a faster or slower network leaves unchanged.
UNMOVED = [c.field for c in COMPONENTS if c.kind in (ComponentKind.COMPUTE, ComponentKind.OPTIMIZER)]
COMMUNICATION = [c.field for c in COMPONENTS if c.kind is ComponentKind.COMMUNICATION]


def _slowed_link(link, factor: float):
    """``link`` with every bandwidth it has (nominal and measured curves) times ``factor``."""
    curves = {
        name: curve.model_copy(update={"bus_bytes_per_s": {n: b * factor for n, b in curve.bus_bytes_per_s.items()}})
        for name, curve in link.collectives.items()
    }
    return link.model_copy(update={"bandwidth_bytes_per_s": link.bandwidth_bytes_per_s * factor, "collectives": curves})


def _slowed(job: Job, inter: float = 1.0, intra: float = 1.0) -> Job:
    """``job`` on the same cluster with its network (only) slowed."""
    cluster = job.cluster
    update = {}
    if cluster.inter_node is not None and inter != 1.0:
        update["inter_node"] = _slowed_link(cluster.inter_node, inter)
    if cluster.intra_node is not None and intra != 1.0:
        update["intra_node"] = _slowed_link(cluster.intra_node, intra)
    return job.model_copy(update={"cluster": cluster.model_copy(update=update)})


def _issue_job(framework: str, network: str = "400 Gb/s") -> Job:
    """Issue 24's case: Llama-3-8B on four p5 nodes, FSDP-style ZeRO-3, full recompute."""
    return resolve_job({
        "model": "llama-3-8b",
        "cluster": {"name": "aws-p5.48xlarge", "num_nodes": 4,
                    "inter_node": {"bandwidth": network, "latency": "20 us", "efficiency": 0.8}},
        "parallel": {"tp": 1, "micro_batch_size": 2, "global_batch_size": 512, "zero_stage": 3,
                     "recompute": "full", "framework": framework},
    })


def test_every_renderer_reads_one_list_of_components():
    assert [f.name for f in dataclasses.fields(Breakdown)] == [c.field for c in COMPONENTS]
    assert len({c.label for c in COMPONENTS}) == len(COMPONENTS)
    from paraplan.report import stagebars

    assert stagebars.COMPONENTS is COMPONENTS


@pytest.mark.parametrize("framework", ["fsdp", "deepspeed", "megatron"])
def test_a_zero3_plan_on_a_10_gbps_network_reports_its_wait_as_dp_communication(framework):
    fast, slow = predict(_issue_job(framework)), predict(_issue_job(framework, "10 Gb/s"))
    assert slow.iteration_s > 3 * fast.iteration_s
    for field in UNMOVED:  # the kernels take as long on either network
        assert getattr(slow.breakdown, field) == pytest.approx(getattr(fast.breakdown, field), rel=1e-12)
    grown = slow.breakdown.dp_communication_s - fast.breakdown.dp_communication_s
    assert grown == pytest.approx(slow.iteration_s - fast.iteration_s, rel=1e-9)
    assert slow.breakdown.dp_communication_s > 0.5 * slow.iteration_s  # the bottleneck, named
    assert slow.breakdown.total_s == pytest.approx(slow.iteration_s, rel=1e-9)


def test_the_table_and_the_json_name_the_network_wait():
    from rich.console import Console

    from paraplan.report.tables import render_prediction

    pred = predict(_issue_job("fsdp", "10 Gb/s"))
    console = Console(width=80, record=True)
    console.print(render_prediction(pred))
    text = console.export_text()
    (row,) = [line for line in text.splitlines() if "DP / ZeRO communication" in line]
    assert f"{pred.breakdown.dp_communication_s:.4f}" in row
    data = json.loads(json.dumps(pred.to_dict()))
    assert data["breakdown"]["dp_communication_s"] == pytest.approx(pred.breakdown.dp_communication_s)


def _moe(**parallel) -> Job:
    return resolve_job({"model": "mixtral-8x7b", "cluster": {"name": "dgx-h100", "num_nodes": 2},
                        "parallel": {"tp": 2, "pp": 1, "ep": 8, "micro_batch_size": 1, "global_batch_size": 64,
                                     "sequence_parallel": True, "zero_stage": 1, **parallel}})


def test_a_mixture_of_experts_names_its_all_to_all_ep_communication():
    pred = predict(_moe())
    assert pred.breakdown.ep_communication_s > 0
    assert pred.breakdown.tp_communication_s > 0  # the attention's TP traffic stays TP
    assert [c.label for c in components_of(pred.job)].count("EP communication") == 1
    # slowing the links moves the all-to-all's growth into EP and TP, never into compute
    slow = predict(_slowed(pred.job, inter=0.1, intra=0.1))
    assert slow.breakdown.ep_communication_s > pred.breakdown.ep_communication_s
    for field in UNMOVED:
        assert getattr(slow.breakdown, field) == pytest.approx(getattr(pred.breakdown, field), rel=1e-12)


def test_experts_on_every_rank_exchange_no_tokens():
    pred = predict(_moe(ep=1, tp=1, sequence_parallel=False))
    assert pred.breakdown.ep_communication_s == 0.0
    assert "EP communication" not in [c.label for c in components_of(pred.job)]


def test_the_table_lists_the_components_of_the_plan_and_any_that_is_not_zero():
    dense = resolve_job({"model": "llama-3-8b", "cluster": {"name": "dgx-h100", "num_nodes": 2},
                         "parallel": {"tp": 2, "pp": 2, "micro_batch_size": 1, "global_batch_size": 64}})
    labels = [c.label for c in components_of(dense)]
    assert "TP communication" in labels and "pipeline bubble (idle)" in labels
    assert "EP communication" not in labels and "CP communication" not in labels


# --- the property -------------------------------------------------------------------------

MODELS = ["gpt3-1.3b", "llama-2-7b", "llama-3-8b", "mixtral-8x7b", "qwen3-30b-a3b"]
CLUSTERS = ["dgx-h100", "aws-p5.48xlarge", "perlmutter", "dgx-a100"]


@st.composite
def jobs(draw) -> Job:
    """Dense and MoE models, ZeRO 0-3, Megatron / DeepSpeed / FSDP, pipelines (1F1B, interleaved
    with blocking or asynchronous sends, GPipe, the zero-bubble schedules, DeepSpeed's lock-step
    TrainSchedule or not), TP, CP, EP."""
    model = draw(st.sampled_from(MODELS))
    cluster = draw(st.sampled_from(CLUSTERS))
    gpus_per_node = 4 if cluster == "perlmutter" else 8
    nodes = draw(st.sampled_from([1, 2, 4]))
    tp, pp, cp = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 1, 2]))
    if (gpus_per_node * nodes) % (tp * pp * cp):
        reject()
    dp = gpus_per_node * nodes // (tp * pp * cp)
    framework = draw(st.sampled_from(["megatron", "deepspeed", "fsdp"]))
    mbs = draw(st.sampled_from([1, 2]))
    parallel = {
        "tp": tp, "pp": pp, "cp": cp, "framework": framework, "zero_stage": draw(st.sampled_from([0, 1, 2, 3])),
        "micro_batch_size": mbs, "global_batch_size": mbs * dp * draw(st.sampled_from([1, 4, 8])),
        "recompute": draw(st.sampled_from(["none", "selective", "full"])),
        "sequence_parallel": tp > 1 and draw(st.booleans()),
    }
    if model in ("mixtral-8x7b", "qwen3-30b-a3b"):
        parallel["ep"] = draw(st.sampled_from([e for e in (1, 2, 4, 8) if (dp * cp) % e == 0]))
        parallel["moe_shared_expert_overlap"] = draw(st.booleans())
    if framework == "megatron" and parallel["sequence_parallel"]:
        parallel["tp_comm_overlap"] = draw(st.booleans())
    if pp > 1 and framework == "megatron" and draw(st.booleans()):
        parallel.update(schedule="interleaved", vpp=2, overlap_p2p_comm=draw(st.booleans()))
    if pp > 1 and framework == "fsdp":
        parallel["schedule"] = draw(st.sampled_from(["1f1b", "gpipe", "zb-h1", "zb-v"]))
    if pp > 1 and framework == "deepspeed":
        parallel["deepspeed_train_schedule"] = draw(st.booleans())
    try:
        return resolve_job({"model": {"name": model, "seq_length": draw(st.sampled_from([2048, 4096]))},
                            "cluster": {"name": cluster, "num_nodes": nodes}, "parallel": parallel})
    except ConfigError:
        reject()


def _stage_of(pred) -> int:
    """The stage the breakdown was cut from (the one whose kernels it holds)."""
    m = pred.job.parallel.num_microbatches
    return min(range(len(pred.stages)), key=lambda i: abs(m * pred.stages[i].backward_mb_s
                                                            - pred.breakdown.backward_compute_s))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(job=jobs(), inter=st.sampled_from([1.0, 0.5, 0.1, 0.02]), intra=st.sampled_from([1.0, 0.5, 0.1]))
def test_slowing_the_network_only_moves_time_into_communication(job, inter, intra):
    fast = predict(job)
    try:
        slow = predict(_slowed(job, inter, intra))
    except ConfigError:
        reject()
    assert slow.iteration_s >= fast.iteration_s * (1 - 1e-12)
    for a, b in zip(fast.stages, slow.stages, strict=True):  # every stage's kernels and step
        for field in ("forward_mb_s", "backward_mb_s", "recompute_mb_s", "optimizer_s", "wgrad_mb_s"):
            assert getattr(b, field) == pytest.approx(getattr(a, field), rel=1e-12), field
    same_stage = _stage_of(fast) == _stage_of(slow)
    event(f"critical stage {'kept' if same_stage else 'moved'}")
    if same_stage:
        for field in UNMOVED:
            assert getattr(slow.breakdown, field) == pytest.approx(getattr(fast.breakdown, field), rel=1e-12), field
        # what the iteration grew by went to communication only: waiting for the pipeline's
        # sends is p2p, and the bubble is the schedule's own idle time with free sends
        moved = sum(getattr(slow.breakdown, f) - getattr(fast.breakdown, f) for f in COMMUNICATION)
        assert moved == pytest.approx(slow.iteration_s - fast.iteration_s, rel=1e-6, abs=1e-9)
        assert slow.breakdown.pipeline_bubble_s == pytest.approx(
            fast.breakdown.pipeline_bubble_s, rel=1e-6, abs=1e-9 * slow.iteration_s)
    for pred in (fast, slow):
        assert pred.breakdown.total_s == pytest.approx(pred.iteration_s, rel=1e-9)


def test_the_csv_and_the_html_report_use_the_same_components():
    pytest.importorskip("matplotlib")
    from paraplan.report.formats import render_csv
    from paraplan.report.html import render_html

    pred = predict(_issue_job("fsdp", "10 Gb/s"), keep_timeline=True)
    header = render_csv([pred.to_dict()]).splitlines()[0].split(",")
    assert [h for h in header if h.startswith("breakdown.")] == [f"breakdown.{c.field}" for c in COMPONENTS]
    page = render_html(pred)
    assert f"<td class=l>DP / ZeRO communication</td><td>{pred.breakdown.dp_communication_s:.4f}</td>" in page


def test_a_breakdown_that_does_not_add_up_is_an_internal_error():
    from paraplan.inventory import count_job
    from paraplan.prediction.sanity import check_possible
    from paraplan.specs import InternalError

    job = _issue_job("fsdp")
    pred, inv = predict(job), count_job(job)
    peak = job.cluster.gpu.flops_for(job.precision) * job.cluster.num_gpus
    check_possible(pred, inv, peak)  # the real one adds up
    # the ZeRO gathers' seconds counted as compute as well: more than the iteration
    doubled = dataclasses.replace(pred.breakdown, forward_compute_s=pred.breakdown.forward_compute_s
                                  + pred.breakdown.dp_communication_s)
    with pytest.raises(InternalError, match="breakdown adding up to"):
        check_possible(dataclasses.replace(pred, breakdown=doubled), inv, peak)
    stage = dataclasses.replace(pred.stages[0], zero_fwd_mb_s=0.0)  # a part of a pass lost
    with pytest.raises(InternalError, match="stage 0's forward parts"):
        check_possible(dataclasses.replace(pred, stages=(stage,)), inv, peak)


def test_a_trace_comparison_reads_each_dimension_s_communication_from_its_own_component():
    from paraplan.costmodel import AnalyticalCostModel
    from paraplan.validate.stageparts import predicted_stage_parts

    pred = predict(_moe(recompute="full"))
    (parts,) = predicted_stage_parts(pred, AnalyticalCostModel(pred.job.cluster, pred.job.precision))
    assert parts["ep comm"] == pytest.approx(pred.breakdown.ep_communication_s, rel=1e-12)
    assert parts["tp comm"] == pytest.approx(pred.breakdown.tp_communication_s, rel=1e-12)
    # recomputed TP traffic is TP's, not a residue counted as DP
    assert parts["dp comm"] == pytest.approx(pred.breakdown.dp_communication_s, rel=1e-12)


# --- the runs the breakdown is cut from ----------------------------------------------------

@pytest.mark.parametrize(("schedule", "vpp", "m"), [("1f1b", 1, 12), ("interleaved", 2, 9), ("gpipe", 1, 6),
                                                    ("zb-h1", 1, 9), ("zb-v", 1, 7), ("1f1b", 1, 2100)])
def test_the_runs_without_sends_time_as_the_simulation_does(schedule, vpp, m):
    # one walk of the task graph times both runs; each must be the simulation's own with free
    # sends, bit for bit (past 2,048 micro-batches, extrapolated as the simulation is)
    from paraplan.schedule import free_sends_finish, simulate_pipeline
    from paraplan.specs import Schedule

    sched = Schedule(schedule)
    fwd, bwd, wgrad = [1.0, 1.3, 0.9], [2.1, 2.6, 1.7], [0.8, 1.1, 0.6]
    compute = ([0.7, 1.0, 0.6], [1.5, 2.0, 1.2])
    got = free_sends_finish((fwd, bwd), compute, m, sched, vpp, wgrad)
    for (f, b), finish in zip(((fwd, bwd), compute), got, strict=True):
        assert finish == simulate_pipeline(f, b, 0.0, m, sched, vpp, wgrad_s=wgrad).finish
    assert got[0] != got[1]


def test_deepspeeds_runs_without_transfers_time_as_its_simulation_does():
    from paraplan.schedule import deepspeed_free_sends_finish, simulate_deepspeed_pipeline

    fwd, bwd, compute = [1.0, 1.3, 0.9, 1.1], [2.1, 2.6, 1.7, 2.2], ([0.7, 1.0, 0.6, 0.8], [1.5, 2.0, 1.2, 1.6])
    got = deepspeed_free_sends_finish((fwd, bwd), compute, 10)
    for (f, b), finish in zip(((fwd, bwd), compute), got, strict=True):
        assert finish == simulate_deepspeed_pipeline(f, b, 0.0, 10).finish


def test_a_pipeline_on_a_slow_network_shows_its_sends_as_p2p_and_keeps_its_bubble():
    # the audit's case: Llama-3-8B tp 8 pp 4 over four nodes, 400 Gb/s against 1 Gb/s; the
    # bubble used to grow with the sends (+5 s at 1 Gb/s), it is the schedule's own idle time
    def at(network):
        return predict(resolve_job({
            "model": "llama-3-8b",
            "cluster": {"name": "aws-p5.48xlarge", "num_nodes": 4,
                        "inter_node": {"bandwidth": network, "latency": "20 us", "efficiency": 0.8}},
            "parallel": {"tp": 8, "pp": 4, "micro_batch_size": 1, "global_batch_size": 256}}))

    fast, slow = at("400 Gb/s"), at("1 Gb/s")
    assert slow.iteration_s > 10 * fast.iteration_s
    assert slow.breakdown.pipeline_bubble_s == pytest.approx(fast.breakdown.pipeline_bubble_s, rel=1e-9)
    grown = slow.breakdown.pipeline_p2p_s - fast.breakdown.pipeline_p2p_s
    assert grown == pytest.approx(slow.iteration_s - fast.iteration_s, rel=1e-9)
    assert slow.breakdown.pipeline_p2p_s > 0.9 * slow.iteration_s  # the bottleneck, named


def test_waiting_for_another_stages_collectives_is_communication_not_bubble():
    # GPT-NeoX-20B at tp 8 on Perlmutter's 4-GPU nodes: every stage's TP all-reduces cross the
    # network, and the critical stage waits for its neighbours' too (7 of its 8 s of bubble
    # were that wait): communication, the bubble its kernels' schedule's own idle time
    from pathlib import Path

    from paraplan.catalog import load_job

    pred = predict(load_job(Path(__file__).parents[2] / "examples/gpt-neox-20b-perlmutter-pp4-tp8-dp4.yaml"))
    m, t = pred.job.parallel.num_microbatches, pred.stages[_stage_of(pred)]
    own = m * (t.tp_fwd_mb_s + t.tp_bwd_mb_s)
    assert pred.breakdown.tp_communication_s > 1.1 * own
    assert pred.breakdown.pipeline_bubble_s < 0.1 * pred.breakdown.tp_communication_s
    assert pred.breakdown.total_s == pytest.approx(pred.iteration_s, rel=1e-9)
