"""Alpha-beta times of NCCL collectives, in nccl-tests' bus-bandwidth convention.

A ring all-reduce of S bytes over n ranks moves 2(n-1)/n * S bytes through each rank's
link, an all-gather, reduce-scatter or all-to-all (n-1)/n * S, a (pipelined ring) broadcast
S; time = steps * latency + moved / busBw.
Within a node the bus bandwidth is the intra-node link's (on a direct-link mesh, the share of
it that reaches the group's peers), or the link's measured curve for that collective
(``LinkSpec.collectives``: bus bandwidth against message size and group size); across nodes each of the group's k GPUs on a node drives
its own NIC share, so the bus bandwidth is min(intra-node, k * per-GPU network bandwidth).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from paraplan.inventory import Collective, CollectiveKind, GroupLayout
from paraplan.inventory.moe import expected_units_touched
from paraplan.specs import ClusterSpec, CollectiveCurve, LinkSpec
from paraplan.units import format_bytes


def bus_factor(kind: CollectiveKind, n: int) -> float:
    """nccl-tests' bus bandwidth / algorithm bandwidth (bytes / time) of a collective on
    ``n`` ranks: the share of its size that crosses each rank's link."""
    if kind is CollectiveKind.ALL_REDUCE:
        return 2.0 * (n - 1) / n
    if kind in (CollectiveKind.BROADCAST, CollectiveKind.SEND_RECV):
        return 1.0
    return (n - 1) / n


def _intra_bus(link: LinkSpec, group_per_node: int, gpus_per_node: int) -> float:
    bus = link.bus_bytes_per_s
    if link.topology == "mesh" and gpus_per_node > 1:
        bus *= (group_per_node - 1) / (gpus_per_node - 1)
    return bus


# NCCL's tuning model of its LL protocol (NVIDIA/nccl src/graph/tuning.cc @ b647562, microseconds):
# baseLat (tree, ring), hwLat over NVLink and over the network (tree, ring), and the network post
# overhead an inter-node ring pays on every step (getNetOverhead: 1 us on an x86 Intel host, the
# default). NCCL picks the algorithm and protocol of least modelled time; at a few hundred bytes
# that is LL, its time the latency. LL carries a quarter of the ring's bus bandwidth (all-reduce,
# or any ring across nodes), a third otherwise; the tree's LL 0.92 / 3.8 of it, at half the
# algorithm bandwidth (llMaxBw's cap is not modelled).
_LL_BASE_US = (6.8, 6.6)
_LL_NVLINK_US = (0.6, 0.6)
_LL_NET_US = (5.0, 2.7)
_NET_OVERHEAD_US = 1.0
_LL_TREE_SHARE = 0.92 / 3.8 * 0.5


def _ll_latencies_us(kind: CollectiveKind, layout: GroupLayout) -> tuple[float, float | None] | None:
    """(ring, tree or None) LL latencies in microseconds of ``nccl_ll_latency_s``."""
    n, nodes = layout.size, layout.nodes
    if kind is CollectiveKind.BROADCAST:
        return _LL_BASE_US[1] + n * (_LL_NET_US[1] if nodes > 1 else _LL_NVLINK_US[1]), None
    if kind is CollectiveKind.ALL_REDUCE:
        steps, inter_steps = 2 * (n - 1), (2 * nodes if nodes > 1 else 0)
    elif kind in (CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER):
        steps, inter_steps = n - 1, nodes - 1
    else:
        return None
    intra = max(_LL_NVLINK_US[1], _NET_OVERHEAD_US) if nodes > 1 else _LL_NVLINK_US[1]
    ring = _LL_BASE_US[1] + (steps - inter_steps) * intra + inter_steps * _LL_NET_US[1]
    if kind is not CollectiveKind.ALL_REDUCE:
        return ring, None
    tree = _LL_BASE_US[0] + 2.0 * ((layout.per_node - 1) * _LL_NVLINK_US[0]
                                   + math.floor(math.log2(nodes)) * _LL_NET_US[0])
    return ring, tree


def nccl_ll_latency_s(kind: CollectiveKind, layout: GroupLayout) -> float | None:
    """Seconds of a call of a few bytes of ``kind`` on ``layout`` as NCCL's tuner models it with
    its LL protocol (``ncclTopoTuneModel``); None for a kind it has no model of (all-to-all and
    send/recv are NCCL point-to-point calls). A ring takes base + (nsteps - inter-node steps)
    intra-node steps (each at least the network post overhead across nodes) + its inter-node
    steps, with nsteps 2(n-1) for an all-reduce (2 x nodes of them across nodes), n-1 for an
    all-gather or reduce-scatter (nodes - 1 across nodes); a broadcast's ring base + n hops of
    the group's slowest link; an all-reduce may also take the tree, base + 2 x ((ranks per node
    - 1) NVLink hops + log2(nodes) network hops), the lesser. NCCL's NVLink constants stand for
    every intra-node link."""
    if layout.size <= 1:
        return 0.0
    lat = _ll_latencies_us(kind, layout)
    if lat is None:
        return None
    ring, tree = lat
    return (ring if tree is None else min(ring, tree)) * 1e-6


def _nccl_ll_s(coll: Collective, layout: GroupLayout, moved: float, bus: float) -> float | None:
    """NCCL's LL time of ``coll``: its latency plus its bytes at LL's share of the bus bandwidth
    ``bus`` (ring: moved bytes; tree: the message at its algorithm bandwidth), or None where NCCL
    has no model of the kind."""
    lat = _ll_latencies_us(coll.kind, layout)
    if lat is None:
        return None
    ring, tree = lat
    ar = coll.kind is CollectiveKind.ALL_REDUCE
    share = 0.25 if layout.nodes > 1 or ar else 1.0 / 3.0
    t = ring * 1e-6 + moved / (bus * share)
    if tree is not None:
        t = min(t, tree * 1e-6 + coll.bytes / (bus * _LL_TREE_SHARE))
    return t


def estimate_collective_s(coll: Collective, layout: GroupLayout, cluster: ClusterSpec) -> float:
    """Seconds for one call of ``coll`` on a group laid out as ``layout`` (``priced_collective``'s time)."""
    return priced_collective(coll, layout, cluster)[0]


# what priced a collective (``priced_collective``): the explain tables' "model" column
MEASURED, CURVE, LL, ALPHA_BETA = "measured", "fitted curve", "NCCL LL", "alpha-beta"


class PricedCall(NamedTuple):
    """One call's seconds, what priced them (``MEASURED``, ``CURVE``, ``LL``, ``ALPHA_BETA`` or the
    dispatcher's name), and the largest message size its group's measured points reach where
    the call is larger (its time carried along the fitted curve from that point), else None."""

    seconds: float
    label: str
    last_measured: float | None = None


def _intra_curve(kind: CollectiveKind, layout: GroupLayout, cluster: ClusterSpec) -> CollectiveCurve | None:
    """The intra-node link's measured curve of ``kind``; None across nodes (no curve prices a
    group that spans them) or where the link measured none."""
    intra = cluster.intra_node
    return None if layout.crosses_nodes or intra is None else intra.collectives.get(kind.value)


def _from_curve(curve: CollectiveCurve, group: int, size: float, seconds: float) -> PricedCall:
    """``seconds`` the curve gave a call of ``size`` bytes on ``group``: ``MEASURED`` where its
    measured times priced it (its points, or a small call's measured time below the fitted
    sizes), with the last measured size where the call lies past it, else ``CURVE``."""
    if curve.extrapolated(group, size):
        last = float(max(curve.points[group]))
        return PricedCall(seconds, f"{MEASURED}, extrapolated past {format_bytes(last)}", last)
    return PricedCall(seconds, MEASURED if group in curve.points or size < curve.fit_bytes else CURVE)


def priced_collective(coll: Collective, layout: GroupLayout, cluster: ClusterSpec) -> PricedCall:
    """One call of ``coll`` on a group laid out as ``layout``: its seconds (``estimate_collective_s``),
    what priced them (``MEASURED`` times, a ``CURVE``, NCCL's ``LL`` model, the ``ALPHA_BETA``
    link, or DeepEP's / HybridEP's own model), and past which measured size it was extrapolated.

    Inside a node with a measured curve for the kind: the curve, and for messages below its
    fitted sizes the measured small-call time of the group size (a send/recv: the pair's curve,
    whatever the group; an all-to-all with routing, DeepEP's or HybridEP's dispatch, keeps its
    own model, ``_flex_dispatch_s``). Everywhere else (across nodes,
    no curve, a group below every measured small-call size) the lesser of the alpha-beta time
    and NCCL's LL model (``nccl_ll_latency_s``), as NCCL's tuner picks the protocol of least
    modelled time: no tiny collective pays 2(n-1) whole link latencies."""
    n = layout.size
    if n <= 1 or coll.bytes <= 0.0:
        return PricedCall(0.0, ALPHA_BETA)
    if coll.routing is not None and coll.kind is CollectiveKind.ALL_TO_ALL:
        return PricedCall(_flex_dispatch_s(coll, layout, cluster), coll.routing.display)
    curve = _intra_curve(coll.kind, layout, cluster)
    if coll.kind is CollectiveKind.SEND_RECV:  # the pair's curve (XLA's permutes) in a node
        measured = None if curve is None else curve.seconds(2, coll.bytes, coll.bytes)
        if measured is not None:
            return _from_curve(curve, 2, coll.bytes, measured)
        return PricedCall(link_p2p_s(coll.bytes, layout, cluster), ALPHA_BETA)
    moved = bus_factor(coll.kind, n) * coll.bytes
    if curve is not None:
        measured = curve.seconds(n, coll.bytes, moved)
        if measured is not None:
            return _from_curve(curve, n, coll.bytes, measured)
        ll = _nccl_ll_s(coll, layout, moved, curve.peak_for(n))
        t = moved / curve.bus_for(n, coll.bytes)
        return PricedCall(t, CURVE) if ll is None or t <= ll else PricedCall(ll, LL)
    intra, inter = cluster.intra_node, cluster.inter_node
    if layout.crosses_nodes and coll.kind is CollectiveKind.ALL_TO_ALL:
        return PricedCall(_all_to_all_across_nodes_s(coll.bytes, layout, cluster), ALPHA_BETA)
    if layout.crosses_nodes:
        assert inter is not None
        bus = layout.per_node * inter.bus_bytes_per_s
        if layout.per_node > 1 and intra is not None:
            bus = min(bus, _intra_bus(intra, layout.per_node, cluster.gpus_per_node))
        latency = inter.latency_s
    else:
        assert intra is not None
        bus = _intra_bus(intra, layout.per_node, cluster.gpus_per_node)
        latency = intra.latency_s
    steps = 2 * (n - 1) if coll.kind is CollectiveKind.ALL_REDUCE else n - 1
    t = steps * latency + moved / bus
    ll = _nccl_ll_s(coll, layout, moved, bus)
    return PricedCall(t, ALPHA_BETA) if ll is None or t <= ll else PricedCall(ll, LL)


def _key(coll: Collective, layout: GroupLayout) -> tuple:
    """The parts of a call its price depends on (not its name, dimension, phase or count)."""
    return coll.kind, coll.bytes, coll.routing, layout.size, layout.nodes, layout.per_node


class CollectivePricer:
    """``priced_collective`` on one cluster, each (kind, bytes, routing, group layout) priced
    once (``_key``), so a repeated shape gets the same float, the same label of what priced it
    and the same last measured size (``priced_call``). Shared by every cost model of the
    cluster (``shared.one_per``); pickles without its memo, which the receiving process rebuilds."""

    __slots__ = ("cluster", "priced")
    LIMIT = 2048  # shapes kept at most: all are dropped past it

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster
        self.priced: dict[tuple, PricedCall] = {}

    def priced_call(self, coll: Collective, layout: GroupLayout) -> PricedCall:
        key = _key(coll, layout)
        priced = self.priced.get(key)
        if priced is None:
            if len(self.priced) >= self.LIMIT:
                self.priced.clear()
            priced = self.priced[key] = priced_collective(coll, layout, self.cluster)
        return priced

    def __call__(self, coll: Collective, layout: GroupLayout) -> float:
        return self.priced_call(coll, layout).seconds

    def source(self, coll: Collective, layout: GroupLayout) -> str:
        """What priced ``coll`` on ``layout`` (``priced_collective``'s label), from the same memo."""
        return self.priced_call(coll, layout).label

    def __reduce__(self):
        return (CollectivePricer, (self.cluster,))


def link_p2p_s(size: float, layout: GroupLayout, cluster: ClusterSpec) -> float:
    """One copy of ``size`` bytes to one peer over the link ``layout`` spans, at the link's
    point-to-point rate after one latency (on a direct-link mesh only the link to that peer):
    a send/recv where no measured curve prices it, and the copies that are not NCCL calls
    (async TP's symmetric-memory copies)."""
    link = cluster.inter_node if layout.crosses_nodes else cluster.intra_node
    assert link is not None
    rate = link.p2p_bytes_per_s
    if not layout.crosses_nodes and link.topology == "mesh" and cluster.gpus_per_node > 2:
        rate /= cluster.gpus_per_node - 1  # only the direct link to that one peer
    return link.latency_s + size / rate


def _all_to_all_across_nodes_s(size: float, layout: GroupLayout, cluster: ClusterSpec) -> float:
    """An all-to-all over nodes: each rank sends ``size``/n to every peer at once, the share
    for the n - k peers on other nodes through its own NIC (a ring's trick of sharing the
    node's NICs does not apply: every GPU's off-node bytes are its own), the share for its
    k - 1 node-mates over the node's links, both at the same time; one round of latency (NCCL
    posts every send and receive of an all-to-all together)."""
    n, k = layout.size, layout.per_node
    inter, intra = cluster.inter_node, cluster.intra_node
    assert inter is not None
    off_node = size * (n - k) / n / inter.bus_bytes_per_s
    on_node = 0.0
    if k > 1 and intra is not None:
        on_node = size * (k - 1) / n / _intra_bus(intra, k, cluster.gpus_per_node)
    return inter.latency_s + max(off_node, on_node)


def dispatch_bytes(coll: Collective, layout: GroupLayout) -> tuple[float, float]:
    """(bytes through the rank's NIC, bytes over NVLink) of one EP all-to-all call.

    alltoall: every top-k copy goes to its expert's rank, the copies for the n - k ranks on other
    nodes through the NIC, those for the k - 1 node-mates over NVLink.
    flex (DeepEP's normal kernels, ``internode_dispatch``; HybridEP alike): a token crosses the
    network once per destination node, to the GPU of the same local index there, which forwards
    it over NVLink once to each rank of its node that holds one of the token's experts
    (``is_token_in_rank``; the combine reduces the other way). So the NIC carries a token's
    hidden state E[distinct nodes] x (N - 1)/N times (the share off its own node), NVLink
    E[distinct ranks] x (k - 1)/k times (those not on the forwarding GPU itself), where the
    hidden state is the copies' buffer over top-k."""
    n, k = layout.size, layout.per_node
    routing = coll.routing
    if routing is None:
        return coll.bytes * (n - k) / n, coll.bytes * (k - 1) / n
    token = coll.bytes / routing.topk
    nodes = layout.nodes
    off_node = token * expected_units_touched(routing, nodes) * (nodes - 1) / nodes if nodes > 1 else 0.0
    return off_node, token * expected_units_touched(routing, n) * (k - 1) / k


def _flex_dispatch_s(coll: Collective, layout: GroupLayout, cluster: ClusterSpec) -> float:
    """DeepEP's (or HybridEP's) dispatch or combine: the NIC and NVLink shares of
    ``dispatch_bytes`` at once, one round of latency. Over NVLink the rate is NCCL's, which
    matches what DeepEP's normal kernels measure (docs/legacy.md of
    deepseek-ai/DeepEP, H800, 4096 tokens, hidden 7168, top-8 of 4 groups: 153-158 GB/s over
    NVLink of ~200 GB/s line rate, 0.77-0.79, beside NCCL's 0.82 of H100's; DeepEP V2 on B200:
    726-740 GB/s of 900, 0.81). Through the NIC the kernels reach less than NCCL: the link's
    ``dispatch_efficiency`` where a cluster states it (its 'RDMA bottleneck bandwidth', 58 GB/s
    at EP 32, counts a token once per node it reaches, its own node included, which no NIC
    carries: 3/4 of it, 43.5 GB/s, crossed the 400 Gb/s CX7 NIC, 0.87 of its 50 GB/s). Its low-
    latency kernels (pure RDMA, 77-194 us per dispatch at EP 8-256 for 128 tokens) serve
    inference decoding; Megatron-Core's flex dispatcher trains with the normal kernels."""
    intra, inter = cluster.intra_node, cluster.inter_node
    nic, nvlink = dispatch_bytes(coll, layout)
    t_nic = 0.0
    if nic > 0.0:
        assert inter is not None
        t_nic = nic / inter.dispatch_bytes_per_s
    t_nvl = 0.0
    if nvlink > 0.0 and intra is not None:
        t_nvl = nvlink / _intra_bus(intra, layout.per_node, cluster.gpus_per_node)
    link = inter if layout.crosses_nodes else intra
    latency = link.latency_s if link is not None else 0.0
    return latency + max(t_nic, t_nvl)
