"""The cost model's memos are exact and stay with their GPU or cluster: a collective priced
once per shape gives the float the pricing function gives, every part of a call's shape it
depends on tells two calls apart, an equal but distinct cluster gets its own memo, and a
pickled cost model carries none of it."""

from __future__ import annotations

import pickle

from paraplan.catalog import load_cluster
from paraplan.costmodel import AnalyticalCostModel, estimate_collective_s
from paraplan.costmodel.collectives import CollectivePricer
from paraplan.costmodel.shared import one_per
from paraplan.inventory import Collective, CollectiveKind, GroupLayout, ParallelDim
from paraplan.inventory.ops import ExpertRouting
from paraplan.specs import Phase, Precision

_LAYOUTS = (GroupLayout(2, 1, 2), GroupLayout(8, 1, 8), GroupLayout(16, 2, 8), GroupLayout(16, 4, 4),
            GroupLayout(12, 3, 4), GroupLayout(12, 3, 5))  # the last two differ only in ranks per node
_SIZES = (4.0, 3.0e4, 2.0**20 - 1.0, 6.4e7)


def _calls() -> list[Collective]:
    routing = ExpertRouting(experts=64, topk=8, groups=8, group_topk=4)
    calls = [Collective("x", kind, ParallelDim.DP, size, Phase.FWD) for kind in CollectiveKind for size in _SIZES]
    calls += [Collective("a2a", CollectiveKind.ALL_TO_ALL, ParallelDim.EP, size, Phase.FWD, routing=routing)
              for size in _SIZES]
    return calls


def test_the_collective_pricer_gives_the_pricing_functions_float_for_every_shape_twice():
    cluster = load_cluster("dgx-h100", num_nodes=4)
    pricer = CollectivePricer(cluster)
    for _ in range(2):  # the second round reads the memo
        for coll in _calls():
            for layout in _LAYOUTS:
                assert pricer(coll, layout) == estimate_collective_s(coll, layout, cluster)


def test_calls_differing_only_in_name_dimension_phase_or_count_share_one_memo_entry():
    pricer = CollectivePricer(load_cluster("dgx-h100", num_nodes=2))
    layout = GroupLayout(8, 1, 8)
    pricer(Collective("a", CollectiveKind.ALL_REDUCE, ParallelDim.TP, 1.0e6, Phase.FWD), layout)
    pricer(Collective("b", CollectiveKind.ALL_REDUCE, ParallelDim.DP, 1.0e6, Phase.BWD_INPUT, count=3), layout)
    assert len(pricer.priced) == 1
    pricer(Collective("a", CollectiveKind.ALL_GATHER, ParallelDim.TP, 1.0e6, Phase.FWD), layout)
    pricer(Collective("a", CollectiveKind.ALL_REDUCE, ParallelDim.TP, 2.0e6, Phase.FWD), layout)
    pricer(Collective("a", CollectiveKind.ALL_REDUCE, ParallelDim.TP, 1.0e6, Phase.FWD), GroupLayout(8, 2, 4))
    assert len(pricer.priced) == 4


def test_cost_models_of_one_cluster_share_its_pricer_and_an_equal_copy_gets_its_own():
    cluster = load_cluster("dgx-h100", num_nodes=2)
    a = AnalyticalCostModel(cluster, Precision.BF16)
    b = AnalyticalCostModel(cluster, Precision.FP8)
    assert a._collective is b._collective
    twin = cluster.model_copy()
    assert twin == cluster
    assert AnalyticalCostModel(twin, Precision.BF16)._collective is not a._collective
    assert one_per(CollectivePricer, twin).cluster is twin


def test_a_pickled_cost_model_prices_alike_without_its_memo():
    cluster = load_cluster("dgx-a100", num_nodes=2)
    cm = AnalyticalCostModel(cluster, Precision.BF16)
    coll = Collective("x", CollectiveKind.ALL_REDUCE, ParallelDim.DP, 5.0e7, Phase.BWD_INPUT)
    layout = GroupLayout(16, 2, 8)
    before = cm.estimate_collective_s(coll, layout)
    copy = pickle.loads(pickle.dumps(cm))
    assert copy._collective.priced == {}
    assert copy.estimate_collective_s(coll, layout) == before


def test_clusters_made_on_the_fly_never_push_out_their_gpus_operator_pricer():
    cluster = load_cluster("dgx-h100", num_nodes=2)
    price = AnalyticalCostModel(cluster, Precision.BF16)._price
    for n in range(200):  # as a heterogeneous cluster's views: a new cluster object each time
        AnalyticalCostModel(cluster.model_copy(update={"num_nodes": 2 + n}), Precision.BF16)
    assert AnalyticalCostModel(cluster, Precision.BF16)._price is price


def test_a_calibration_fit_s_trial_gpus_never_push_out_the_cost_models_operator_pricer():
    from paraplan.costmodel import estimate_op_s
    from paraplan.inventory import Op, OpKind

    cluster = load_cluster("dgx-h100", num_nodes=1)
    price = AnalyticalCostModel(cluster, Precision.BF16)._price
    op = Op("gemm", OpKind.GEMM, "mlp", 1.0e12, 1.0e8, 2.0e12, 2.0e8)
    gpu = cluster.gpu
    for _ in range(200):  # as a fit's trials: a GPU copy per trial efficiency spec
        trial = gpu.model_copy(update={"efficiency": gpu.efficiency.model_copy()})
        assert estimate_op_s(op, Phase.FWD, trial, gpu.flops_for(Precision.BF16)) > 0
    assert AnalyticalCostModel(cluster, Precision.BF16)._price is price
