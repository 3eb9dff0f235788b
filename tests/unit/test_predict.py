"""Properties of whole predictions (analytical backend)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import paraplan
from paraplan.catalog import resolve_job
from paraplan.prediction import predict


def _job(**overrides):
    raw = {
        "model": {"name": "gpt-neox-20b", **overrides.pop("model", {})},
        "cluster": {"name": "dgx-a100", "num_nodes": 4},
        "parallel": {"tp": 4, "pp": 4, "micro_batch_size": 1, "global_batch_size": 64, **overrides.pop("parallel", {})},
        **overrides,
    }
    return resolve_job(raw)


def test_the_breakdown_adds_up_to_the_iteration_time():
    pred = predict(_job(parallel={"recompute": "full", "zero_stage": 1}))
    assert pred.breakdown.total_s == pytest.approx(pred.iteration_s, rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(layers=st.integers(4, 40))
def test_more_layers_never_take_less_time(layers):
    # pp = 4: Megatron-LM splits layers it divides; DeepSpeed splits any count (first stages longer)
    framework = {"framework": "megatron" if layers % 4 == 0 else "deepspeed"}
    fewer = predict(_job(model={"num_layers": layers}, parallel=framework))
    more = predict(_job(model={"num_layers": layers + 4}, parallel=framework))
    assert more.iteration_s >= fewer.iteration_s


@settings(max_examples=20, deadline=None)
@given(policy=st.sampled_from(["none", "selective", "full"]))
def test_recompute_trades_time_for_memory(policy):
    base = predict(_job())
    other = predict(_job(parallel={"recompute": policy}))
    assert other.iteration_s >= base.iteration_s - 1e-12
    assert other.worst_memory.activations <= base.worst_memory.activations + 1e-6


def test_zero_stages_shrink_memory_monotonically():
    totals = [predict(_job(parallel={"zero_stage": z})).worst_memory.total for z in range(4)]
    assert totals == sorted(totals, reverse=True)
    assert totals[0] > totals[3]


def test_mfu_is_model_flops_over_time_and_peak():
    pred = predict(_job())
    peak = pred.job.cluster.gpu.flops_for(pred.job.precision)
    assert pred.mfu == pytest.approx(pred.model_flops_per_iteration / pred.iteration_s / 32 / peak)
    # no activation recompute: hardware FLOPs exceed model FLOPs only by FlashAttention's
    # backward recomputation of the scores
    assert pred.mfu < pred.hfu < 1.05 * pred.mfu


def test_a_job_that_does_not_fit_says_so():
    pred = predict(_job(model={"seq_length": 16384}, parallel={"micro_batch_size": 8, "global_batch_size": 64}))
    assert not pred.fits
    assert pred.to_dict()["memory"]["fits"] is False


def test_priced_jobs_report_time_and_cost_to_train():
    job = resolve_job(
        {
            "model": "llama-2-7b",
            "cluster": {"name": "aws-p4de.24xlarge", "num_nodes": 2},
            "parallel": {"tp": 2, "micro_batch_size": 1, "global_batch_size": 64},
            "train_tokens": "1T",
        }
    )
    pred = predict(job)
    assert pred.time_to_train_s == pytest.approx(1e12 / pred.tokens_per_s)
    hourly = job.cluster.price_per_gpu_hour * 16
    assert pred.cost_to_train_usd == pytest.approx(hourly * pred.time_to_train_s / 3600)


def test_the_python_api_accepts_a_mapping_and_returns_json_ready_values():
    pred = paraplan.predict({"model": "gpt2", "cluster": "dgx-a100"})
    data = pred.to_dict()
    for key in ("iteration_s", "tokens_per_s", "tflops_per_gpu", "mfu", "memory", "breakdown"):
        assert key in data
    assert data["memory"]["fits"] is True


def test_bubble_fraction_is_the_breakdowns_bubble_over_the_iteration():
    """One definition of the pipeline bubble: the summary's share is the breakdown's seconds."""
    pred = predict(_job(parallel={"pp": 4, "tp": 2, "micro_batch_size": 1, "global_batch_size": 32}))
    assert pred.breakdown.pipeline_bubble_s > 0
    assert pred.bubble_fraction == pytest.approx(pred.breakdown.pipeline_bubble_s / pred.iteration_s)


def _too_fast(job):
    """A broken cost model: every operator and collective a thousand times faster than the
    roofline allows, as a bug in a backend would make it."""
    from paraplan.costmodel import AnalyticalCostModel

    class TooFast(AnalyticalCostModel):
        name = "too-fast"

        def estimate_op_s(self, op, phase):
            return super().estimate_op_s(op, phase) / 1000

        def estimate_collective_s(self, coll, layout):
            return super().estimate_collective_s(coll, layout) / 1000

    return TooFast(job.cluster, job.precision)


def test_a_step_faster_than_the_peak_allows_is_an_internal_error_not_a_prediction():
    from paraplan.specs import ConfigError, InternalError

    job = _job()
    with pytest.raises(InternalError) as err:
        predict(job, _too_fast(job))
    message = str(err.value)
    assert not isinstance(err.value, ConfigError)  # not the user's input: a bug
    assert message.startswith("internal error: ") and "\n" not in message
    assert "MFU" in message and "above 100 %" in message and "faster than" in message


def test_validation_rejects_hardware_that_could_only_beat_its_peak():
    """The roofline never beats a peak because every efficiency is at most 1 and every rate,
    bandwidth and overhead is positive; an input that says otherwise never reaches a prediction."""
    from paraplan.specs import ConfigError

    gpu = {"name": "fast", "peak_flops": {"bf16": "100 TFLOPS"}, "hbm_bytes": "80 GB", "hbm_bandwidth": "2 TB/s"}
    link = {"bandwidth": "100 GB/s"}
    for bad in (
        {**gpu, "efficiency": {"gemm": {"max_fraction": 1.5, "half_work": 0}}},
        {**gpu, "efficiency": {"kernel_overhead_s": -1e-6}},
        {**gpu, "efficiency": {"overlap_slowdown": -0.5}},
        {**gpu, "peak_flops": {"bf16": "0 TFLOPS"}},
        {**gpu, "hbm_bandwidth": "0 TB/s"},
        {**gpu, "intra_node": {**link, "efficiency": 1.2}},
    ):
        with pytest.raises(ConfigError):
            resolve_job({"model": "gpt2", "cluster": {"gpu": bad, "gpus_per_node": 2, "intra_node": link},
                         "parallel": {"tp": 2}})


def test_the_json_form_states_the_sequence_length_and_the_cluster():
    data = predict(_job(model={"seq_length": 1024})).to_dict()
    assert data["seq_length"] == 1024
    assert data["cluster"] == "dgx-a100"


def test_long_causal_sequences_keep_mfu_below_hfu_below_one():
    """A10G at 256K and 1M tokens, where attention is almost all the work: counting causal
    attention's whole square (Narayanan et al. 2021, torchtitan) would put HFU at 105-116 %
    with the kernels at ~57 % of the peak; counting the half the model needs and the kernels
    run keeps 0 <= MFU <= HFU <= 1."""
    for seq in (262144, 1048576):
        pred = predict(resolve_job({
            "model": {"name": "llama-3-8b", "seq_length": seq},
            "cluster": {"gpu": "A10G", "num_nodes": 8},
            "parallel": {"tp": 8, "pp": 1, "sequence_parallel": True, "recompute": "none",
                         "micro_batch_size": 1, "global_batch_size": 8},
        }))
        assert 0 < pred.mfu <= pred.hfu <= 1
