"""`paraplan calibrate operators|links` as a user runs it, on tiny synthetic GPUModeling folders
written in tmp_path: tables on stdout at 80 columns, the fitted YAML block, --out and --force,
--update-catalog, and one-line errors with exit code 2."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("scipy")
pytest.importorskip("pandas")

from typer.testing import CliRunner

from paraplan.calibrate import (
    OP_CURVE_MODES,
    SOFTMAX_TAGS,
    OpSamples,
    predict_ops,
)
from paraplan.calibrate._common import LOSSES
from paraplan.calibrate.cluster import TOPOLOGIES
from paraplan.catalog import load_cluster, load_gpu
from paraplan.cli import calibrate as cli
from paraplan.cli.app import app
from paraplan.costmodel import estimate_collective_s
from paraplan.inventory.samples import op_for_sample
from paraplan.samples.gpumodeling import NCCL_KINDS, collective_for_row, group_layout
from paraplan.specs import EfficiencyCurve, EfficiencySpec, GpuSpec, Precision
from readable import WIDTHS, assert_readable_text

runner = CliRunner()
GPU_FILE = "NVIDIAA100-SXM4-80GB"  # the file-name spelling of the catalog's A100-SXM4-80GB

TRUTH = EfficiencySpec(
    gemm=EfficiencyCurve(max_fraction=0.8, half_work=3e9),
    attention=EfficiencyCurve(max_fraction=0.5, half_work=4e9),
    memory=EfficiencyCurve(max_fraction=0.6, half_work=2e6),
    kernel_overhead_s=2e-6,
    source="synthetic truth",
)


def run(*args: str, width: int = 80):
    return runner.invoke(app, ["calibrate", *args], env={"COLUMNS": str(width)})


def _operator_folder(folder: Path, rows_per_tag: int = 16) -> Path:
    """GPUModeling operator CSVs (mp, b, h, l, dim, F_dur(us), B_dur(us)) whose times are the
    cost model's with ``TRUTH``, plus a tuning table that must be skipped."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    gpu = load_gpu("A100-SXM4-80GB")
    truth = gpu.model_copy(update={"efficiency": TRUTH})
    peak = gpu.flops_for(Precision.FP16)
    for tag in ("gelu", "linear1", "bmm", "layernorm"):
        lines = ["mp,b,h,l,dim,F_dur(us),B_dur(us)"]
        while len(lines) <= rows_per_tag:
            row = {"mp": float(rng.choice([1, 2, 4])), "b": float(rng.choice([2, 4])), "h": 32.0,
                   "l": float(rng.choice([1024, 2048, 4096])), "dim": float(rng.choice([2048, 4096, 8192]))}
            try:
                op = op_for_sample(tag, row)
            except ValueError:
                continue
            samples = OpSamples()
            for phase in ("fwd", "bwd"):
                samples.add(tag, phase, op, (), 1.0)
            fwd_us, bwd_us = predict_ops(samples, truth, peak) * 1e6
            lines.append(",".join(str(v) for v in (*row.values(), round(fwd_us, 3), round(bwd_us, 3))))
        (folder / f"{GPU_FILE}_{tag}_fp16.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / f"{GPU_FILE}.csv").write_text("kernel,n_estimators\nlinear1,100\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def operators_dir(tmp_path_factory) -> Path:
    return _operator_folder(tmp_path_factory.mktemp("ops") / "operators_A100")


def _block(text: str, first: str) -> dict:
    """The YAML block printed last, from its ``first`` line on."""
    return yaml.safe_load(text[text.rindex(first):])


@pytest.mark.parametrize("width", WIDTHS)
def test_operators_prints_tables_at_80_and_200_columns_and_the_efficiency_block(operators_dir, width):
    result = run("operators", str(operators_dir), "--gpu", "A100-SXM4-80GB", "--date", "2026-01-01", width=width)
    assert result.exit_code == 0, result.output
    out = result.stdout
    for title in ("Achieved fraction of peak", "Fit on", "Comparison fit", "Hold-out errors", "Final fit",
                  "In-sample errors"):
        assert title in out
    tables = out[: out.rindex("efficiency:")]  # the YAML block after them keeps its long source line
    assert_readable_text(tables, width)  # no number cut, no line past the terminal
    eff = EfficiencySpec.model_validate(_block(out, "efficiency:")["efficiency"])
    assert eff.gemm.max_fraction == pytest.approx(TRUTH.gemm.max_fraction, rel=0.02)
    assert eff.memory.max_fraction == pytest.approx(TRUTH.memory.max_fraction, rel=0.02)
    assert eff.source.startswith("fitted by paraplan calibrate operators")
    assert "on 2026-01-01" in eff.source
    # per-file notes and progress go to stderr, not into the results
    assert f"skip {GPU_FILE}.csv" in result.stderr and f"skip {GPU_FILE}.csv" not in out


def test_out_writes_the_block_and_refuses_to_overwrite_without_force(operators_dir, tmp_path):
    target = tmp_path / "a100.yaml"
    args = ("operators", str(operators_dir), "--gpu", "A100", "--compare", "off", "--op-curves", "none")
    first = run(*args, "--out", str(target))
    assert first.exit_code == 0, first.output
    assert "efficiency:" not in first.stdout  # the block went to the file
    written = target.read_text(encoding="utf-8")
    assert EfficiencySpec.model_validate(yaml.safe_load(written)["efficiency"]).ops == {}

    target.write_text("mine\n", encoding="utf-8")
    again = run(*args, "--out", str(target))
    assert again.exit_code == 2
    assert again.stderr.strip() == f"error: {target}: already exists (pass --force to replace it)"
    assert target.read_text(encoding="utf-8") == "mine\n"

    forced = run(*args, "--out", str(target), "--force")
    assert forced.exit_code == 0, forced.output
    assert target.read_text(encoding="utf-8").startswith("efficiency:")


def test_update_catalog_replaces_only_the_efficiency_block(operators_dir, tmp_path, monkeypatch):
    import paraplan.calibrate

    src = Path(paraplan.calibrate.catalog_file("gpus", "A100-SXM4-80GB"))
    copy = tmp_path / src.name
    copy.write_text(src.read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr(paraplan.calibrate, "catalog_file", lambda kind, name: copy)
    result = run("operators", str(operators_dir), "--gpu", "A100", "--compare", "off", "--update-catalog")
    assert result.exit_code == 0, result.output
    before, after = src.read_text(encoding="utf-8").splitlines(), copy.read_text(encoding="utf-8").splitlines()
    start = next(i for i, ln in enumerate(before) if ln.startswith("efficiency:"))
    assert after[:start] == before[:start]
    end = next((i for i in range(start + 1, len(before)) if before[i] and before[i][0] not in " \t#"), len(before))
    printed = result.stdout[result.stdout.rindex("efficiency:"):].rstrip("\n").splitlines()
    assert after[start:] == printed + before[end:]
    assert GpuSpec.model_validate(yaml.safe_load(copy.read_text(encoding="utf-8"))).efficiency.source.startswith(
        "fitted by paraplan calibrate operators"
    )


TRUTH_LINKS = {
    "intra_node": {"topology": "mesh", "efficiency": 0.7, "p2p_efficiency": 0.9, "latency_s": 8e-6},
    "inter_node": {"efficiency": 0.05, "p2p_efficiency": 0.13, "latency_s": 150e-6},
}


def _nccl_folder(folder: Path) -> Path:
    """GPUModeling NCCL CSVs (shape, nodes, GPUsPerNode, dur(us)) timed by the cost model on a
    Perlmutter node whose links are ``TRUTH_LINKS``."""
    folder.mkdir()
    base = load_cluster("perlmutter", num_nodes=2)
    truth = base.model_copy(update={side: getattr(base, side).model_copy(update=u) for side, u in TRUTH_LINKS.items()})
    for tag, n, m in (("allreduce", 1, 2), ("allreduce", 1, 4), ("allreduce", 2, 1), ("allreduce", 2, 4),
                      ("p2p", 1, 2), ("p2p", 2, 1), ("allgather_large", 2, 1)):
        lines = ["shape,nodes,GPUsPerNode,dur(us)"]
        for shape in 2.0 ** np.arange(21, 28):
            seconds = estimate_collective_s(collective_for_row(NCCL_KINDS[tag], shape, n, m), group_layout(n, m), truth)
            lines.append(f"{shape:.0f},{n},{m},{seconds * 1e6:.4f}")
        (folder / f"{GPU_FILE}_{tag}_fp16_{n}_{m}.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / f"{GPU_FILE}_allreduce_fp16.csv").write_text("shape,dur(us)\n", encoding="utf-8")  # pooled: skipped
    return folder


@pytest.mark.parametrize("width", WIDTHS)
def test_links_recovers_the_link_parameters_and_prints_their_yaml(tmp_path, width):
    folder = _nccl_folder(tmp_path / "nccl_perlmutter")
    result = run("links", str(folder), "--cluster", "perlmutter", "--date", "2026-01-01", width=width)
    assert result.exit_code == 0, result.output
    out = result.stdout
    tables = out[: out.rindex("# YAML")]
    assert_readable_text(tables, width)
    assert "Fitted links" in out and "Errors per collective and config" in out
    fitted = _block(out, "# YAML")
    assert fitted["intra_node"]["topology"] == "mesh"
    for side, truth in TRUTH_LINKS.items():
        for key in ("efficiency", "p2p_efficiency"):
            assert fitted[side][key] == pytest.approx(truth[key], abs=2e-4), (side, key)
    assert "pooled union of the _N_M files" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("operators", "{tmp}/missing", "--gpu", "A100"), "error: DIR {tmp}/missing: no such directory"),
        (("operators", "{ops}", "--gpu", "A100-SMX4"), "error: --gpu: unknown GPU 'A100-SMX4'; did you mean A100-SXM4-80GB?"),
        (("links", "{tmp}/missing", "--cluster", "perlmutter"), "error: DIR {tmp}/missing: no such directory"),
        (("links", "{ops}", "--cluster", "perlmuter"), "error: --cluster: unknown cluster 'perlmuter'"),
        (("links", "{ops}", "--cluster", "perlmutter"), "error: {ops}: no NCCL sample files"),
        (("operators", "{tmp}", "--gpu", "A100"), "error: {tmp}: no CSV files"),
        (("operators", "{ops}", "--gpu", "H100-SXM5-80GB"), "error: {ops}: no usable operator samples of H100"),
        (("operators", "{ops}", "--gpu", "A100", "--holdout", "1.5"), "error: holdout: expected a fraction"),
    ],
)
def test_bad_input_is_one_line_with_exit_code_2(operators_dir, tmp_path, args, message):
    fill = {"tmp": str(tmp_path), "ops": str(operators_dir)}
    result = run(*(a.format(**fill) for a in args))
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines()[-1].startswith(message.format(**fill))
    assert "Traceback" not in result.output


def test_a_missing_calibrate_extra_is_one_line_naming_the_install(operators_dir, monkeypatch):
    for name in ("pandas", "scipy.optimize", "scipy.sparse"):
        monkeypatch.setitem(sys.modules, name, None)
    result = run("operators", str(operators_dir), "--gpu", "A100")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert 'pip install -e ".[calibrate]"' in result.stderr


def test_the_cli_choices_are_the_librarys():
    assert [m.value for m in cli.OpCurves] == list(OP_CURVE_MODES)
    assert [m.value for m in cli.Compare] == [*OP_CURVE_MODES, "off"]
    assert [m.value for m in cli.SoftmaxCurve] == [*SOFTMAX_TAGS, "both"]
    assert [m.value for m in cli.Loss] == list(LOSSES)
    assert [m.value for m in cli.Topology] == list(TOPOLOGIES)
