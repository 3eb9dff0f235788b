"""Adaptive sampling: it measures the shapes the regressors know least and stops at a target."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("sklearn")

from paraplan.profile.adaptive import HeldOut, Pool, pools_from_samples, sample_adaptively, split_pool
from paraplan.samples.schema import COLUMNS

REPO = Path(__file__).resolve().parents[2]


def synthetic_pool(n: int = 1200, seed: int = 0) -> Pool:
    """Shapes in a 2-D space whose measured time is the baseline times a known residual: flat
    over 40 % of the space, a wave over the rest (where the median held-out shape lies)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.0, 1.0, n)
    z = rng.uniform(-2.0, 2.0, n)
    baseline = 1e-4 * np.exp(z)
    residual = np.where(x < 0.4, 0.0, 0.3 * np.sin(20.0 * x))
    points = pd.DataFrame({"shape_id": np.arange(n), "time_s": baseline * np.exp(residual)})
    return Pool("op/synthetic/fp16/wave/fwd", points, np.column_stack([x, z]), baseline, ["x", "log_b"])


def replay(points: pd.DataFrame) -> np.ndarray:
    return points["time_s"].to_numpy()


def recording():
    """(the shape ids asked, in order; a replay ``measure`` that records them)."""
    asked: list[int] = []

    def measure(points: pd.DataFrame) -> np.ndarray:
        asked.extend(points["shape_id"])
        return replay(points)

    return asked, measure


@pytest.fixture(scope="module")
def split():
    candidates, held = split_pool(synthetic_pool(), 0.2, random_state=0)
    return candidates, HeldOut.measured(held, replay)


def run(split, **settings):
    candidates, heldout = split
    options = {"target_error": 0.02, "batch_size": 10, "random_state": 0, **settings}
    return sample_adaptively(candidates, replay, heldout, **options)


def test_on_a_known_function_the_adaptive_loop_reaches_the_target_with_fewer_samples_than_random(split):
    seeds = range(5)
    adaptive = [run(split, random_state=seed) for seed in seeds]
    random = [run(split, order="random", random_state=seed) for seed in seeds]
    assert all(r.reached for r in adaptive + random)
    assert all(r.steps[-1].median_error <= 0.02 for r in adaptive)
    assert np.mean([r.n_samples for r in adaptive]) < np.mean([r.n_samples for r in random])


def test_it_never_measures_a_held_out_shape(split):
    candidates, held_pool = split_pool(synthetic_pool(), 0.2, random_state=0)
    asked, measure = recording()

    result = sample_adaptively(candidates, measure, HeldOut.measured(held_pool, replay), target_error=0.02)
    assert asked and not set(asked) & set(held_pool.points["shape_id"])
    assert sorted(asked) == sorted(candidates.points["shape_id"].iloc[result.chosen])
    assert len(set(asked)) == len(asked)  # and never one shape twice


def test_when_the_pool_runs_out_it_stops_and_says_the_error_it_reached(split):
    result = run(split, target_error=1e-6, batch_size=200)
    candidates, _ = split
    assert result.stop_reason == "pool exhausted" and not result.reached
    assert result.n_samples == len(candidates)
    assert 0.0 < result.median_error == result.steps[-1].median_error
    assert result.best_error <= result.median_error


def test_a_sample_budget_stops_it_early(split):
    result = run(split, target_error=1e-6, max_samples=35)
    assert result.stop_reason == "max_samples reached" and result.n_samples == 35


def test_a_spent_time_budget_stops_it_after_the_batch_in_hand_and_says_so(split):
    import time

    candidates, heldout = split
    calls = []

    def slow(points: pd.DataFrame) -> np.ndarray:
        calls.append(len(points))
        return replay(points)

    # the deadline passes during the seed batch: that batch is finished, no other is started
    deadline = time.monotonic() + 0.05
    result = sample_adaptively(candidates, lambda p: (time.sleep(0.1), slow(p))[1], heldout, target_error=1e-6,
                               batch_size=10, deadline=deadline)
    assert result.stop_reason == "time budget spent" and not result.reached
    assert calls == [10] and result.n_samples == 10
    late = sample_adaptively(candidates, slow, heldout, target_error=1e-6, deadline=time.monotonic() - 1)
    assert late.stop_reason == "time budget spent" and late.n_samples == 0 and calls == [10]


def test_the_same_seed_measures_the_same_shapes_in_the_same_order(split):
    first, again, other = run(split), run(split), run(split, random_state=1)
    assert np.array_equal(first.chosen, again.chosen)
    assert [s.median_error for s in first.steps] == [s.median_error for s in again.steps]
    assert not np.array_equal(first.chosen, other.chosen)


def test_a_measure_that_returns_bad_times_is_refused(split):
    candidates, heldout = split
    with pytest.raises(ValueError, match="finite positive"):
        sample_adaptively(candidates, lambda points: np.zeros(len(points)), heldout)


def test_a_samples_table_becomes_one_pool_per_regressor_with_duplicates_merged():
    rows = [
        {"kind": "op", "name": "gelu", "variant": "", "phase": "fwd", "mp": 1, "b": b, "h": 16, "l": 1024,
         "dim": 2048, "dtype": "fp16", "device": "A100-SXM4-80GB", "time_s": t}
        for b, t in [(2, 1e-4), (2, 4e-4), (4, 3e-4), (8, 5e-4)]
    ]
    pools = pools_from_samples(pd.DataFrame(rows).reindex(columns=list(COLUMNS)))
    assert [p.key for p in pools] == ["op/A100-SXM4-80GB/fp16/gelu/fwd"]
    (pool,) = pools
    assert len(pool) == 3 and pool.X.shape[0] == 3
    assert pool.points["time_s"].tolist() == pytest.approx([2e-4, 3e-4, 5e-4])  # geometric mean


def test_a_shape_measure_cannot_time_is_skipped_and_never_asked_again(split):
    candidates, heldout = split
    asked: list[int] = []

    def measure(points: pd.DataFrame) -> np.ndarray:
        asked.extend(points["shape_id"])
        times = replay(points).copy()
        times[points["shape_id"].to_numpy() % 3 == 0] = np.nan  # "out of memory"
        return times

    result = sample_adaptively(candidates, measure, heldout, target_error=1e-6, batch_size=100)
    assert result.stop_reason == "pool exhausted"
    assert len(asked) == len(set(asked)) == len(candidates)
    assert len(result.skipped) + result.n_samples == len(candidates)
    assert all(candidates.points["shape_id"].iloc[result.chosen] % 3 != 0)


def test_the_out_of_bag_stop_needs_no_held_out_set_and_stops_at_the_target(split):
    candidates, held_pool = split_pool(synthetic_pool(), 0.2, random_state=0)
    asked, measure = recording()

    for order in ("random", "adaptive"):
        asked.clear()
        result = sample_adaptively(candidates, measure, None, target_error=0.02, batch_size=10, order=order,
                                   stop="oob")
        assert result.reached and result.stop == "oob"
        assert result.stop_error == result.steps[-1].oob_error <= 0.02
        assert all(s.oob_error > 0.02 for s in result.steps[:-1])  # it stops at the first step there
        assert np.isnan(result.median_error)  # no held-out set was scored
        assert asked and not set(asked) & set(held_pool.points["shape_id"])
        assert sorted(asked) == sorted(candidates.points["shape_id"].iloc[result.chosen])


def test_the_out_of_bag_stop_only_scores_a_held_out_set_it_is_given(split):
    candidates, _ = split
    bare = sample_adaptively(candidates, replay, None, target_error=0.02, batch_size=10, stop="oob")
    scored = run(split, stop="oob")
    assert np.array_equal(bare.chosen, scored.chosen)  # the held-out set does not decide anything
    assert 0.0 < scored.median_error < 0.1  # but says where the error is after the stop
    again = run(split, stop="oob")
    assert np.array_equal(scored.chosen, again.chosen)
    assert [s.oob_error for s in scored.steps] == [s.oob_error for s in again.steps]


def test_a_held_out_stop_without_a_held_out_set_and_an_unknown_stop_are_refused(split):
    candidates, _ = split
    with pytest.raises(ValueError, match="held-out set is empty"):
        sample_adaptively(candidates, replay, None)
    with pytest.raises(ValueError, match="stop"):
        run(split, stop="never")


def test_a_live_sweep_with_the_out_of_bag_stop_times_no_held_out_shape():
    from paraplan.catalog.jobs import load_cluster_file
    from paraplan.costmodel.fitting import Hardware
    from paraplan.profile.adaptive_sweep import run_adaptive_sweep
    from paraplan.profile.grid import load_grid
    from paraplan.profile.ops import SweepSettings

    points = load_grid([REPO / "examples/tiny-cpu/grid.yaml"])
    hardware = Hardware.of([load_cluster_file(REPO / "examples/tiny-cpu/cluster.yaml")])

    class Fake:
        settings = SweepSettings(device_name="cpu-core")

        def __init__(self) -> None:
            self.asked: list[tuple[str, str]] = []

        def __call__(self, frame: pd.DataFrame) -> np.ndarray:
            self.asked += list(zip(frame["point"], frame["phase"], strict=True))
            size = frame[["b", "l", "dim"]].fillna(1).prod(axis=1).to_numpy(dtype=float)
            return 1e-6 + 1e-9 * size * (1.3 if frame["phase"].iloc[0] == "bwd" else 1.0)

    def sweep(stop: str) -> tuple[list, list]:
        fake = Fake()
        runs = run_adaptive_sweep(points, fake, target_error=0.05, stop=stop, order="random", hardware=hardware)
        assert runs and all(r is not None and r.stop == stop for r in runs)  # no pool measured whole
        assert len(fake.asked) == len(set(fake.asked))  # and no shape timed twice
        return runs, fake.asked

    runs, asked = sweep("oob")
    # every shape timed is one a regressor trained on (or could not time): none only to score
    assert len(asked) == sum(r.n_samples + len(r.skipped) for r in runs)
    runs, asked = sweep("holdout")
    assert len(asked) > sum(r.n_samples + len(r.skipped) for r in runs)  # the held-out 20 % too
    fake = Fake()
    spent = run_adaptive_sweep(points, fake, target_error=0.05, stop="oob", deadline=0.0, hardware=hardware)
    assert fake.asked == [] and len(spent) == len(runs)  # every pool is named, none measured
    assert all(r.stop_reason == "time budget spent" and r.n_samples == 0 for r in spent)


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["oob", "holdout"])
def test_profile_adaptive_measures_a_grid_into_a_samples_file_and_resumes_from_its_journal(tmp_path, stop):
    pytest.importorskip("torch")
    from typer.testing import CliRunner

    from paraplan.cli.app import app
    from paraplan.samples import load_samples

    grid = tmp_path / "grid.yaml"
    grid.write_text("gelu: {mp: [1], b: [1, 2], l: [32, 64, 128], dim: [32, 64, 128, 256]}\n")
    out = tmp_path / "cpu.samples"
    args = ["profile", "adaptive", "--grid", str(grid), "--device-name", "cpu-core", "--cluster",
            str(REPO / "examples/tiny-cpu/cluster.yaml"), "--target-error", "5%", "--out", str(out), "-f", "json",
            "--stop", stop, "--order", "random"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    record = json.loads(first.stdout)
    assert record["summary"]["measured_now"] > 0
    on = {"oob": "out-of-bag", "holdout": "held-out"}[stop]
    assert record["regressors"] and all(r["error_on"] == on for r in record["regressors"])
    assert len(load_samples(out)) == record["summary"]["rows"]
    again = CliRunner().invoke(app, [*args, "--force"])
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["summary"]["measured_now"] == 0  # all from the journal
    if stop == "oob":  # a budget spent before the first batch: an empty samples file, and says why
        short = CliRunner().invoke(app, [*(str(tmp_path / "none.samples") if a == str(out) else a for a in args),
                                         "--max-time", "1 ns"])
        assert short.exit_code == 0, short.output
        regressors = json.loads(short.stdout)["regressors"]
        assert regressors and all(r["stop"] == "time budget spent" and r["median_error"] is None
                                  for r in regressors)
        bad = CliRunner().invoke(app, [*args, "--force", "--max-time", "soon"])
        assert bad.exit_code == 2 and "--max-time" in bad.output
