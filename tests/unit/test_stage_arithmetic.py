"""One stage's arithmetic, written once: ``stage_timing`` and ``estimate_stage_memory`` call it for
one plan with numbers, the search's screen for many plans with numpy arrays; each plan of an array
gets exactly what it gets alone."""

from __future__ import annotations

import numpy as np
import pytest

from paraplan.prediction.memory import activations_at_peak, stage_peak_bytes
from paraplan.prediction.offload import OffloadCosts
from paraplan.prediction.stage_arithmetic import PassWork, StagePasses, stage_passes, stage_work

N = 200
FIELDS = ("sharded_fwd", "sharded_bwd", "offload_fwd", "offload_bwd", "fwd_pass", "bwd_pass", "exposed_sync",
          "zero_fwd", "zero_bwd")


def _terms(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Cost terms of N stages: some without per-micro-batch data-parallel traffic (ZeRO 0-1), some
    with only the backward's (ZeRO-2), some whose host copies outlast the passes."""
    def seconds(scale: float) -> np.ndarray:
        return rng.uniform(0.0, scale, N)

    sharding = rng.integers(0, 3, N)  # 0: none, 1: backward only, 2: both passes
    return {
        "layers": rng.integers(1, 13, N).astype(np.float64), "f": seconds(0.05), "b": seconds(0.1),
        "w": seconds(0.03), "cf": seconds(0.02), "cb": seconds(0.02), "rc": seconds(0.04),
        "ef": seconds(0.01), "eb": seconds(0.02), "ew": seconds(0.01), "ecf": seconds(0.005), "ecb": seconds(0.005),
        "dp_f": np.where(sharding == 2, seconds(0.3), 0.0), "dp_b": np.where(sharding >= 1, seconds(0.3), 0.0),
        "reduce": seconds(0.5), "gather": seconds(0.5), "copy": seconds(2.0), "fetch": seconds(1.0),
        "zero": rng.integers(0, 4, N), "m": rng.integers(1, 65, N).astype(np.float64),
        "offloaded": rng.integers(0, 3, N).astype(np.float64), "layer_copy": seconds(0.02),
    }


def _passes(t: dict, i, overlap: bool, offload: str) -> StagePasses:
    """``stage_passes`` of stage ``i`` of the terms (a slice: all of them as arrays; an int: one, as numbers)."""
    def at(name):
        v = t[name][i]
        return v if isinstance(v, np.ndarray) else float(v)

    layer = PassWork(at("f"), at("b"), at("w"), at("cf"), at("cb"), at("rc"))
    ends = PassWork(at("ef"), at("eb"), at("ew"), at("ecf"), at("ecb"))
    n = at("layers")
    costs = None
    if offload == "optimizer":  # ZeRO-Offload: the gradient copy
        costs = OffloadCosts(at("copy"), at("zero"), at("m"))
    elif offload == "everything":  # ZeRO-Infinity's parameter fetch and Megatron-Core's activation offload too
        costs = OffloadCosts(at("copy"), at("zero"), at("m"), at("fetch"), at("offloaded"), at("layer_copy"))
    return stage_passes(stage_work(ends, ((n, layer),)), n, at("dp_f"), at("dp_b"), at("reduce"), at("gather"), 0.19,
                        overlap, costs)


@pytest.mark.parametrize("offload", ["none", "optimizer", "everything"])
@pytest.mark.parametrize("overlap", [False, True])
def test_each_plan_of_an_array_gets_exactly_the_stage_passes_it_gets_alone(overlap, offload):
    t = _terms(np.random.default_rng(26))
    many = _passes(t, slice(None), overlap, offload)
    for i in range(N):
        one = _passes(t, i, overlap, offload)
        for name in FIELDS:
            assert np.broadcast_to(getattr(many, name), (N,))[i] == getattr(one, name), (name, i)


def test_a_stage_without_per_microbatch_data_parallel_traffic_keeps_its_passes_as_they_are():
    """ZeRO 0-1 move nothing every micro-batch: the passes are the work's own sums, to the bit,
    with the overlap on (which would otherwise subtract the collectives it added back)."""
    t = _terms(np.random.default_rng(1))
    t["dp_f"][:], t["dp_b"][:] = 0.0, 0.0
    p = _passes(t, slice(None), True, "none")
    w = p.work
    assert np.array_equal(p.fwd_pass, w.forward + w.comm_fwd)
    assert np.array_equal(p.bwd_pass, w.backward + w.recompute + w.comm_bwd)
    assert not p.zero_fwd.any() and not p.zero_bwd.any()


def test_a_stage_sums_its_blocks_of_layers_and_its_ends():
    dense, moe = PassWork(1.0, 2.0, 0.5, 0.25, 0.5, 1.0), PassWork(3.0, 6.0, 1.5, 1.0, 2.0, 2.0)
    ends = PassWork(0.5, 1.0, 0.25, 0.125, 0.25)
    total = stage_work(ends, ((2, dense), (3, moe)))
    assert (total.forward, total.backward, total.wgrad) == (11.5, 23.0, 5.75)
    assert (total.comm_fwd, total.comm_bwd, total.recompute) == (3.625, 7.25, 8.0)


@pytest.mark.parametrize("offloaded", [0, 2])
def test_each_plan_of_an_array_gets_exactly_the_peak_memory_it_gets_alone(offloaded):
    rng = np.random.default_rng(27)

    def gib(scale: float) -> np.ndarray:
        return rng.uniform(0.0, scale, N) * 2**30

    held, working, saved, persistent = gib(2.0), gib(4.0), gib(1.0), gib(40.0)
    logits, gathered, buffers, runtime = gib(3.0), gib(2.0), gib(1.0), gib(1.5)
    gpipe, flight, layers = rng.random(N) < 0.5, rng.integers(1, 9, N).astype(np.float64), 6
    acts, off = activations_at_peak(held, working, saved, gpipe, flight, offloaded, layers)
    off = np.broadcast_to(off, (N,))
    total = stage_peak_bytes(persistent, acts, logits, gathered, buffers, runtime, 0.07)
    for i in range(N):
        a, o = activations_at_peak(float(held[i]), float(working[i]), float(saved[i]), bool(gpipe[i]),
                                   float(flight[i]), offloaded, layers)
        assert (acts[i], off[i]) == (a, o)
        assert total[i] == stage_peak_bytes(float(persistent[i]), a, float(logits[i]), float(gathered[i]),
                                            float(buffers[i]), float(runtime[i]), 0.07)
    # GPipe's order holds the ends' saved tensors for every micro-batch in flight (less the
    # offloaded layers' share), not just for the one being processed
    plain, _ = activations_at_peak(held, working, saved, False, flight, offloaded, layers)
    more = saved * (flight * (1.0 - offloaded / layers) - 1.0)
    assert np.allclose(acts - plain, np.where(gpipe, more, 0.0), rtol=1e-9, atol=1.0)
