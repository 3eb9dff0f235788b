"""FSDP2 under a pipeline (torchtitan, torch.distributed.pipelining): the stage's weights are
gathered in the step's first forward and kept (torchtitan's "default" reshard policy is
``not pp_enabled``), its gradients accumulated unsharded and reduce-scattered once after the
last micro-batch's backward (the pipeline stage's ``perform_reduce_grad``)."""

from __future__ import annotations

import pytest

from paraplan.catalog import resolve_job
from paraplan.inventory import count_job
from paraplan.prediction import predict
from paraplan.specs import Phase


def job(framework="fsdp", pp=2, gbs=64, **parallel):
    plan = {"framework": framework, "zero_stage": 3, "micro_batch_size": 2, "global_batch_size": gbs, "tp": 2,
            "pp": pp, **parallel}
    return resolve_job({"model": "llama-2-7b", "cluster": {"name": "dgx-a100", "num_nodes": 2}, "parallel": plan})


def _named(colls, name, phase=None):
    return [c for c in colls if c.name == name and (phase is None or c.phase is phase)]


def test_fsdp_with_a_pipeline_gathers_a_stage_s_weights_once_a_step_not_every_micro_batch():
    j = job()
    assert j.parallel.num_microbatches > 1
    st = count_job(j).stages[0]
    assert not _named(st.per_microbatch_dp, "dp_allgather")  # neither in the forward nor the backward
    (gather,) = _named(st.grad_sync, "dp_allgather")
    assert gather.phase is Phase.OPTIMIZER  # beside the step's first forward (``exposed_sync_s``)
    assert gather.bytes == pytest.approx(st.params * 2)  # the stage's bf16 weights, once


def test_fsdp_with_a_pipeline_reduce_scatters_its_gradients_once_a_step():
    st = count_job(job()).stages[0]
    assert not st.per_microbatch_dp
    (reduce,) = _named(st.grad_sync, "dp_reducescatter", Phase.BWD_WEIGHT)
    assert reduce.bytes == pytest.approx(st.params * 4)  # fp32 gradients, accumulated over the micro-batches


def test_fsdp_with_a_pipeline_spends_the_same_data_parallel_seconds_whatever_the_micro_batch_count():
    few, many = predict(job(gbs=32)), predict(job(gbs=128))
    assert many.stages[0].zero_fwd_mb_s == many.stages[0].zero_bwd_mb_s == 0.0
    assert many.stages[0].grad_reduce_s == pytest.approx(few.stages[0].grad_reduce_s)
    assert many.stages[0].param_gather_s == pytest.approx(few.stages[0].param_gather_s)


def test_fsdp_with_a_pipeline_copies_the_gathered_weights_out_once_a_step():
    j = job()
    m = j.parallel.num_microbatches
    once = next(op for op in count_job(j).stages[0].blocks[0].ops if op.name == "fsdp_copy")
    every = next(op for op in count_job(job(pp=1)).stages[0].blocks[0].ops if op.name == "fsdp_copy")
    assert once.bytes == pytest.approx(every.bytes / m)


def test_pp_1_fsdp_is_unchanged_every_micro_batch_gathers_twice_and_reduce_scatters():
    st = count_job(job(pp=1)).stages[0]
    assert not job(pp=1).parallel.syncs_shards_once_per_step
    assert len(_named(st.per_microbatch_dp, "dp_allgather")) == 2
    assert len(_named(st.per_microbatch_dp, "dp_reducescatter")) == 1
    assert not st.grad_sync


def test_fsdp1_under_a_pipeline_is_not_an_fsdp_module_and_still_syncs_every_micro_batch():
    assert not job(fsdp_version=1).parallel.syncs_shards_once_per_step
