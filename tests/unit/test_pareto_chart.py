"""The Pareto chart counts nodes as nodes and GPUs as GPUs, and puts ticks where the front's
best plans sit (they seldom fall on the axis' round numbers)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.report.pareto import hardware_label


def test_a_cluster_count_is_nodes_and_the_gpus_follow():
    assert hardware_label("dgx-h100", 64, 8) == "8 x dgx-h100 (64 GPUs)"
    assert hardware_label("hetero-a100-a10", 32, None) == "hetero-a100-a10 (32 GPUs)"


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """Search two sizes of DGX A100 and keep what the chart drew (legend, edge ticks, front)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    seen: dict = {}
    draw = Figure.savefig

    def spy(fig, path, **kwargs):
        ax = fig.axes[0]
        seen["legend"] = [t.get_text() for t in ax.get_legend().get_texts()]
        top, right = (next(a for a in ax.child_axes if a._orientation == o) for o in ("x", "y"))
        seen["top"], seen["right"] = list(top.get_xticks()), list(right.get_yticks())
        return draw(fig, path, **kwargs)

    chart = tmp_path_factory.mktemp("pareto") / "pareto.png"
    mp = pytest.MonkeyPatch()
    mp.setattr(Figure, "savefig", spy)
    try:
        result = CliRunner().invoke(app, ["search", "--model", "gpt3-1.3b", "--cluster", "dgx-a100", "--sizes", "1,2",
                                          "--global-batch-size", "64", "--pareto", str(chart), "--format", "json"])
    finally:
        mp.undo()
    assert result.exit_code == 0, result.output
    return seen, json.loads(result.stdout)["pareto"]


def test_the_legend_names_nodes_and_gpus_never_gpus_as_nodes(drawn):
    legend = " | ".join(drawn[0]["legend"])
    assert "1 x dgx-a100 (8 GPUs)" in legend and "2 x dgx-a100 (16 GPUs)" in legend
    assert "16 x dgx-a100" not in legend and "8 x dgx-a100" not in legend


def test_the_top_and_right_edges_have_ticks_at_the_best_plans(drawn):
    seen, front = drawn
    best = front[0]
    seconds_per_million = 1e6 / best["tokens_per_s"]
    assert min(abs(t / seconds_per_million - 1) for t in seen["top"]) < 1e-6
    gib = best["memory_per_gpu_bytes"] / 2**30
    assert min(abs(t / gib - 1) for t in seen["right"]) < 1e-6


def test_the_front_plans_carry_their_interval_as_error_bars(drawn):
    assert any(label.startswith("80 % interval") for label in drawn[0]["legend"])
