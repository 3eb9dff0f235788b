"""Sequence-parallel TP communication as the frameworks run it: Megatron-LM's and Transformer
Engine's column-parallel linears gather their saved input shard again in the backward pass,
beside the input-gradient GEMM, and reduce-scatter the input gradient beside the weight-gradient
GEMM; torchtitan's DTensor linears keep the gathered input; FP8 jobs gather FP8 copies."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from paraplan.catalog import resolve_job
from paraplan.inventory import CollectiveKind, count_job
from paraplan.inventory.layer import gemm
from paraplan.inventory.ops import Collective, ParallelDim
from paraplan.inventory.sp_comm import SAVED_REGATHER, saved_shard_regathers
from paraplan.prediction.backends import make_cost_model
from paraplan.prediction.sp_backward import async_linears_backward
from paraplan.prediction.stages import BACKWARD, CommCosts, LayerCost
from paraplan.specs import Phase


def job(precision: str = "bf16", cluster: str = "dgx-h100", **parallel):
    plan = {"tp": 8, "sequence_parallel": True, "micro_batch_size": 1, "global_batch_size": 64, **parallel}
    return resolve_job({"model": {"name": "llama-3-70b", "seq_length": 4096},
                        "cluster": {"name": cluster, "num_nodes": 1}, "parallel": plan, "precision": precision})


def _block(j):
    return count_job(j).stages[0].blocks[0]


def _named(block, name, phase):
    return [c for c in block.collectives if c.name == name and c.phase is phase]


def test_megatrons_column_parallel_linears_gather_their_saved_shard_again_in_the_backward_pass():
    block = _block(job())
    (forward,) = _named(block, "tp_allgather", Phase.FWD)
    (again,) = _named(block, SAVED_REGATHER, Phase.BWD_INPUT)
    # QKV's and the MLP's first linear's input, the size of the forward gathers
    assert (again.count, again.bytes, again.kind) == (2, forward.bytes, CollectiveKind.ALL_GATHER)


def test_torchtitans_dtensor_linears_keep_the_gathered_input_and_gather_nothing_again():
    megatron, titan = _block(job()), _block(job(framework="torchtitan", recompute="none"))
    assert not _named(titan, SAVED_REGATHER, Phase.BWD_INPUT)
    # what the time leaves out the memory holds: the gathered input, tp times the shard
    (m_qkv,) = [op for op in megatron.ops if op.name == "linear1"]
    (t_qkv,) = [op for op in titan.ops if op.name == "linear1"]
    assert t_qkv.saved_bytes == pytest.approx(8 * m_qkv.saved_bytes)


def test_torchtitans_per_op_checkpointing_gathers_again_what_it_does_not_save():
    # its save list keeps mm, attention and reduce_scatter_tensor outputs, not the all-gather's
    from paraplan.inventory.recompute import recompute_cost

    j = job(framework="torchtitan", recompute="op")
    inv = count_job(j)
    cm = make_cost_model(j, "analytical")
    block = inv.stages[0].blocks[0]
    layer = LayerCost.of(block, cm, CommCosts(inv, cm))
    rc = recompute_cost(j.parallel, block.ops, inv.shape, 1)
    gathers = CommCosts(inv, cm).total(tuple(_named(block, "tp_allgather", Phase.FWD)), (Phase.FWD,))
    assert rc.gather_weight == 1.0 and gathers > 0 and layer.tp_gather_fwd == pytest.approx(gathers)
    assert layer.recompute_s(rc) == pytest.approx(layer.recompute_kernels_s(rc) + gathers)
    off = recompute_cost(job(sequence_parallel=False, framework="torchtitan", recompute="op").parallel,
                         block.ops, inv.shape, 1)
    assert off.gather_weight == 0.0


def test_without_sequence_parallelism_nothing_is_gathered_again():
    assert not _named(_block(job(sequence_parallel=False)), SAVED_REGATHER, Phase.BWD_INPUT)


@pytest.mark.parametrize(("mla", "halves", "count"), [(False, 2, 2), (False, 1, 1), (True, 2, 1), (True, 1, 0)])
def test_a_layer_gathers_again_only_the_inputs_its_column_parallel_linears_gather(mla, halves, count):
    # MLA gathers its latents outside the linears, which keep them gathered: only the MLP's
    # first linear re-gathers; a MoE layer's attention alone (halves 1) re-gathers QKV's input
    plan = job().parallel
    colls = saved_shard_regathers(SimpleNamespace(multi_latent_attention=mla), plan, None, halves, 10.0)
    assert sum(c.count for c in colls) == count


class _Comm:
    """Each collective call takes its bytes in seconds; the GPU's overlap slowdown is 0.2."""

    slowdown = 0.2

    @staticmethod
    def seconds(c: Collective) -> float:
        return c.bytes * c.count

    @staticmethod
    def call_s(c: Collective) -> float:
        return c.bytes


def _linears():
    ops = (gemm("linear1", "QKV", 8, 8, 8, 2, bias=False, saved=0.0),
           gemm("linear3", "MLP up", 8, 8, 8, 2, bias=False, saved=0.0))
    return ops, (5.0, 5.0), (2.0, 2.0)  # each backward 5 s, its weight gradient 2 s


def _backward(name, kind, seconds, count=2):
    return Collective(name, kind, ParallelDim.TP, seconds, Phase.BWD_INPUT, count)


def test_a_regather_shorter_than_its_input_gradient_gemm_costs_only_the_gemms_slowdown():
    ops, bwd, weight = _linears()
    colls = (_backward(SAVED_REGATHER, CollectiveKind.ALL_GATHER, 1.0),
             _backward("tp_reducescatter", CollectiveKind.REDUCE_SCATTER, 1.0))
    exposed, others = async_linears_backward(ops, bwd, weight, colls, _Comm())
    assert others == 0.0
    # four 1 s calls, each beside a longer GEMM: the GEMM slows by 0.2 / 1.2 of the shared second
    assert exposed == pytest.approx(4 * 0.2 / 1.2)


def test_a_collective_longer_than_its_gemm_waits_out_the_difference():
    ops, bwd, weight = _linears()
    colls = (_backward(SAVED_REGATHER, CollectiveKind.ALL_GATHER, 7.0),
             _backward("tp_reducescatter", CollectiveKind.REDUCE_SCATTER, 7.0))
    exposed, _ = async_linears_backward(ops, bwd, weight, colls, _Comm())
    # re-gathers beside the 3 s input-gradient GEMMs, reduce-scatters beside the 2 s weight ones
    assert exposed == pytest.approx(2 * (7.0 - 3.0) + 2 * (7.0 - 2.0))


def test_the_output_gradients_gather_waits_on_the_compute_stream_each_call_whole():
    ops, bwd, weight = _linears()
    grad = _backward("tp_allgather", CollectiveKind.ALL_GATHER, 1.5)
    exposed, others = async_linears_backward(ops, bwd, weight, (grad,), _Comm())
    assert exposed == 0.0 and others == 2 * 1.5


def test_megatrons_backward_exposes_less_than_its_collectives_sum_and_at_least_the_gradients_gather():
    j = job()
    inv = count_job(j)
    cm = make_cost_model(j, "analytical")
    comm = CommCosts(inv, cm)
    block = inv.stages[0].blocks[0]
    tp = tuple(c for c in block.collectives if c.dim is ParallelDim.TP)
    layer = LayerCost.of(block, cm, comm)
    gathers = comm.total(tuple(_named(block, "tp_allgather", Phase.BWD_INPUT)), BACKWARD)
    assert gathers <= layer.tp_bwd < comm.total(tp, BACKWARD)


def test_fp8_megatron_gathers_one_byte_an_element_and_reduce_scatters_two():
    block = _block(job("fp8"))
    rs = {c.bytes for c in block.collectives if c.kind is CollectiveKind.REDUCE_SCATTER}
    ag = {c.bytes for c in block.collectives if c.kind is CollectiveKind.ALL_GATHER}
    assert len(rs) == 1 and ag == {rs.pop() / 2}


def test_block_scaled_fp8_keeps_its_gathers_at_the_activation_precision():
    block = _block(job("fp8", "dgx-b200", fp8_recipe="mxfp8"))
    rs = {c.bytes for c in block.collectives if c.kind is CollectiveKind.REDUCE_SCATTER}
    ag = {c.bytes for c in block.collectives if c.kind is CollectiveKind.ALL_GATHER}
    assert ag == rs


def test_torchaos_tensorwise_float8_tp_gathers_its_forward_input_in_float8():
    block = _block(job("fp8", framework="torchtitan", fp8_recipe="current"))
    (fwd,) = _named(block, "tp_allgather", Phase.FWD)
    (bwd,) = _named(block, "tp_allgather", Phase.BWD_INPUT)
    assert fwd.bytes == bwd.bytes / 2
