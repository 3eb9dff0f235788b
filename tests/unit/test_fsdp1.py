"""FSDP1 (torch.distributed.fsdp.FullyShardedDataParallel, flat parameters) as torch 2.1-2.2 runs
it: the kernels around each unit's all-gather and reduce-scatter (``inventory.fsdp1``), read from
torch/distributed/fsdp/_flat_param.py, _runtime_utils.py and algorithms/_comm_hooks/default_hooks.py."""

import pytest

from paraplan.catalog import resolve_job
from paraplan.costmodel import AnalyticalCostModel
from paraplan.inventory import count_job
from paraplan.inventory.fsdp1 import predivide_factor
from paraplan.prediction import predict
from paraplan.prediction.stages import CommCosts, per_microbatch_dp_s
from paraplan.specs import Phase


def job(version=1, nodes=2, shard=None, reduce_fp32=False, precision="bf16", zero=3):
    parallel = {"framework": "fsdp", "zero_stage": zero, "global_batch_size": 8 * nodes * 2,
                "fsdp_version": version, "grad_reduce_in_fp32": reduce_fp32}
    if shard is not None:
        parallel["data_parallel_shard_degree"] = shard
    return resolve_job({"model": "llama-2-7b", "cluster": {"name": "dgx-a100", "num_nodes": nodes},
                        "parallel": parallel, "precision": precision})


def side(j):
    st = count_job(j).stages[0]
    return {op.name: op for op in st.side_kernels}, st


def test_the_predivide_factor_doubles_while_the_ranks_left_exceed_it_as_torchs_does():
    assert [predivide_factor(n) for n in (1, 2, 8, 16, 96, 128)] == [1, 2, 4, 4, 16, 16]


def test_fsdp1_casts_each_units_shard_before_every_all_gather_forward_and_again_backward():
    kernels, st = side(job())
    shard = st.params / 16
    cast = kernels["fsdp1_shard_cast"]
    assert cast.bytes == pytest.approx(shard * (4 + 2))  # read the fp32 shard, write bf16
    assert cast.bwd_bytes == pytest.approx(cast.bytes)  # FULL_SHARD reshards after forward
    assert cast.launches == st.num_layers  # one per FSDP unit


def test_fsdp1_concatenates_each_units_gradients_into_its_flat_gradient_on_the_computation_stream():
    layer = count_job(job()).stages[0].layer_ops
    flat = {op.name: op for op in layer}["fsdp1_grad_flatten"]
    params = sum(op.params for op in layer)
    assert flat.bwd_bytes == pytest.approx(2 * 2 * params) and flat.bytes == 0
    assert not flat.recomputable


def test_bf16_reduction_divides_before_and_after_and_casts_the_reduced_shard_to_fp32():
    kernels, st = side(job())  # 16 ranks: predivide 4 over the unit, postdivide 4 over the shard
    p, shard = st.params, st.params / 16
    assert kernels["fsdp1_reduce_kernels"].bwd_bytes == pytest.approx(p * 4 + shard * 4 + shard * (2 + 4))
    assert kernels["fsdp1_reduce_kernels"].launches == 3 * st.num_layers


def test_fp32_reduction_casts_the_unsharded_gradient_up_first_and_never_casts_the_shard():
    kernels, st = side(job(reduce_fp32=True))
    p, shard = st.params, st.params / 16
    assert kernels["fsdp1_reduce_kernels"].bwd_bytes == pytest.approx(p * (2 + 4) + p * 8 + shard * 8)


def test_hybrid_shard_adds_the_replicas_all_reduce_divides_on_the_shard():
    flat, _ = side(job(nodes=4))
    hybrid, st = side(job(nodes=4, shard=8))  # 8 ranks a shard group, 4 replicas
    shard = st.params / 8
    # 8: predivide 4 (unit), postdivide 2 (shard); 4 replicas: predivide 2, postdivide 2 (shard)
    expected = st.params * 4 + shard * 4 + 2 * shard * 4 + shard * 6
    assert hybrid["fsdp1_reduce_kernels"].bwd_bytes == pytest.approx(expected)
    assert hybrid["fsdp1_shard_cast"].bytes > flat["fsdp1_shard_cast"].bytes  # shards of 8, not 32


def test_fsdp2_fp32_training_and_zero1_run_none_of_fsdp1s_kernels():
    assert not side(job(version=2))[0]
    assert not side(job(zero=1))[0]
    assert "fsdp1_shard_cast" not in side(job(precision="fp32"))[0]


def test_the_side_kernels_are_priced_in_the_collectives_chain_not_in_the_computation():
    j = job()
    inv = count_job(j)
    st = inv.stages[0]
    cm = AnalyticalCostModel(j.cluster, j.precision)
    comm = CommCosts(inv, cm)
    f, b = per_microbatch_dp_s(st, cm, comm)
    kernels = sum(cm.estimate_op_s(op, Phase.FWD) for op in st.side_kernels)
    assert kernels > 0
    assert f == pytest.approx(comm.total(st.per_microbatch_dp, (Phase.FWD,)) + kernels)
    assert b > comm.total(st.per_microbatch_dp, (Phase.BWD_INPUT, Phase.BWD_WEIGHT))


def test_fsdp1s_kernels_make_a_prediction_slower_never_faster():
    import paraplan.inventory.job as inventory_job

    with_kernels = predict(job()).iteration_s
    real = inventory_job.fsdp1_side_kernels, inventory_job.fsdp1_grad_flatten
    inventory_job.fsdp1_side_kernels = lambda *a, **k: ()
    inventory_job.fsdp1_grad_flatten = lambda *a, **k: ()
    try:
        without = predict(job()).iteration_s
    finally:
        inventory_job.fsdp1_side_kernels, inventory_job.fsdp1_grad_flatten = real
    assert 1.0 < with_kernels / without < 1.2
