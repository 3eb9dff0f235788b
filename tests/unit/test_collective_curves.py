"""Measured collective curves on a link: bus bandwidth against message and group size
(LinkSpec.collectives), fitted by paraplan calibrate collective-table."""

from __future__ import annotations

import pytest

from paraplan.catalog import load_cluster
from paraplan.costmodel import estimate_collective_s
from paraplan.inventory import Collective, CollectiveKind, GroupLayout, ParallelDim
from paraplan.specs import CollectiveCurve, Phase

CURVE = CollectiveCurve(bus_bytes_per_s={2: 200e9, 8: 300e9}, half_bytes=10e6)


def _node(**collectives):
    cluster = load_cluster("dgx-h100")
    link = cluster.intra_node.model_copy(update={"collectives": collectives})
    return cluster.model_copy(update={"intra_node": link})


def test_an_all_reduce_inside_a_node_follows_the_measured_curve():
    ar = Collective("x", CollectiveKind.ALL_REDUCE, ParallelDim.TP, 90e6, Phase.FWD)
    t = estimate_collective_s(ar, GroupLayout(8, 1, 8), _node(all_reduce=CURVE))
    # 2 * 7/8 * 90 MB moved at 300 GB/s * 90 / (90 + 10)
    assert t == pytest.approx(2 * 7 / 8 * 90e6 / (300e9 * 0.9))


def test_a_group_takes_the_largest_measured_group_size_not_above_it():
    assert CURVE.bus_for(4, 1e12) == pytest.approx(200e9, rel=1e-4)
    assert CURVE.bus_for(16, 1e12) == pytest.approx(300e9, rel=1e-4)
    assert CURVE.bus_for(1, 1e12) == pytest.approx(200e9, rel=1e-4)  # below every measured size


def test_collectives_across_nodes_and_kinds_without_a_curve_keep_the_alpha_beta_model():
    node = _node(all_reduce=CURVE)
    ag = Collective("x", CollectiveKind.ALL_GATHER, ParallelDim.TP, 90e6, Phase.FWD)
    assert estimate_collective_s(ag, GroupLayout(8, 1, 8), node) == pytest.approx(
        estimate_collective_s(ag, GroupLayout(8, 1, 8), _node()))
    ar = Collective("x", CollectiveKind.ALL_REDUCE, ParallelDim.DP, 90e6, Phase.FWD)
    assert estimate_collective_s(ar, GroupLayout(16, 2, 8), node) == pytest.approx(
        estimate_collective_s(ar, GroupLayout(16, 2, 8), _node()))


def test_the_dgx_h100_catalog_carries_measured_curves_for_the_three_collectives():
    link = load_cluster("dgx-h100").intra_node
    assert set(link.collectives) == {"all_reduce", "all_gather", "reduce_scatter"}
    # measured, so below NVLink 4's 450 GB/s line rate
    assert all(b < 450e9 for c in link.collectives.values() for b in c.bus_bytes_per_s.values())
