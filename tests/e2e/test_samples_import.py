"""`paraplan samples import gpumodeling` as a user runs it: the real GPUModeling25 folders
become one samples file, and every bad row the data's README warns about is excluded and
counted (skipped when ../shared/data/gpumodeling is absent)."""

from __future__ import annotations

import json

import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow")

from typer.testing import CliRunner  # noqa: E402

from paraplan.cli.samples import samples_app  # noqa: E402
from paraplan.samples import gpumodeling as gm  # noqa: E402
from paraplan.samples import load_samples  # noqa: E402

FOLDERS = ("operators_A100", "operators_GH200", "nccl_perlmutter", "nccl_vista")
runner = CliRunner()


def run(*args: str):
    return runner.invoke(samples_app, list(args), env={"COLUMNS": "200"})


@pytest.fixture(scope="module")
def imported(gpumodeling_dir, tmp_path_factory):
    """(samples frame, the command's JSON summary) of all four folders."""
    out = tmp_path_factory.mktemp("samples") / "all.samples"
    dirs = [str(gpumodeling_dir / f) for f in FOLDERS]
    result = run("import", "gpumodeling", *dirs, "--out", str(out), "--format", "json")
    assert result.exit_code == 0, result.output
    return load_samples(out), json.loads(result.stdout)


def _count(frame, **where) -> int:
    for col, value in where.items():
        frame = frame[frame[col] == value]
    return len(frame)


def _excluded(summary, folder: str) -> dict[str, int]:
    return {r["reason"]: r["records"] for r in summary["excluded"] if r["folder"] == folder}


#: The tests that read the real folders (through the ``imported`` fixture).
real_data = pytest.mark.shared_data


@real_data
def test_gh200_flash_attention_backward_is_excluded_and_a100s_kept(imported):
    samples, summary = imported
    assert _count(samples, device="GH200-120GB", name="flash_atten", phase="bwd") == 0
    assert _count(samples, device="GH200-120GB", name="flash_atten", phase="fwd") == 4068
    assert _count(samples, device="A100-SXM4-80GB", name="flash_atten", phase="bwd") == 4071
    assert _excluded(summary, "operators_GH200")[gm.EXCLUDE_RATIO] == 4068


@real_data
def test_residual_add_backward_copies_are_excluded_on_both_gpus(imported):
    samples, summary = imported
    for device in ("A100-SXM4-80GB", "GH200-120GB"):
        assert _count(samples, device=device, name="res_add", phase="bwd") == 0
        assert _count(samples, device=device, name="res_add", phase="fwd") == 351
    # res_add's 351 plus the rows of other files whose B_dur equals F_dur to the last digit
    assert _excluded(summary, "operators_A100")[gm.EXCLUDE_COPY] == 351 + 1
    assert _excluded(summary, "operators_GH200")[gm.EXCLUDE_COPY] == 351 + 364 + 45


@real_data
def test_gh200_first_stage_optimizer_outliers_are_excluded(imported):
    samples, summary = imported
    first = samples[(samples["device"] == "GH200-120GB") & (samples["variant"] == "firstStage_optimizer")]
    assert len(first) == 585 - 48
    assert first["time_s"].max() < 0.1  # the median step is 5.7 ms; the outliers took 3.5-54 s
    assert _excluded(summary, "operators_GH200")[gm.EXCLUDE_OUTLIER] == 48


@real_data
def test_gh200_all_gathers_faster_than_the_nic_are_excluded(imported):
    samples, summary = imported
    assert _excluded(summary, "nccl_vista") == {gm.EXCLUDE_BANDWIDTH: 382}  # 205 of them at ~117 us
    gathers = samples[(samples["device"] == "GH200-120GB") & (samples["name"] == "all_gather")]
    assert len(gathers) == 3 * 195 - 382
    assert 8 not in set(gathers["nodes"])  # every 8_1 row was impossible


@real_data
def test_perlmutter_collectives_are_all_kept_and_the_pooled_unions_not_doubled(imported, gpumodeling_dir):
    samples, summary = imported
    assert _excluded(summary, "nccl_perlmutter") == {}
    folder = gpumodeling_dir / "nccl_perlmutter"
    per_config = sum(len(pd.read_csv(p)) for p in folder.glob("*_fp16_*_*.csv"))
    assert _count(samples, device="A100-SXM4-80GB", kind="collective") == per_config == 28707
    assert set(samples.loc[samples["kind"] == "collective", "cluster"]) == {
        "perlmutter-gpumodeling",
        "vista-gpumodeling",
    }


@real_data
def test_the_old_a100_optimizer_sweep_is_excluded_as_undocumented(imported):
    samples, summary = imported
    assert _excluded(summary, "operators_A100")[gm.EXCLUDE_LAYOUT] == 319
    assert not samples["source"].str.endswith("NVIDIAA100-SXM4-80GB_optimizer_fp16.csv").any()


@real_data
def test_totals_match_the_file_metadata_and_duplicates_are_reported(imported):
    samples, summary = imported
    meta = samples.attrs["samples_metadata"]
    assert meta["excluded"] == summary["excluded_total"]
    assert sum(meta["excluded"].values()) == 319 + 1112 + 4068 + 382 + 48
    assert len(samples) == summary["records"] == 184106
    assert summary["duplicates"] == {"operators_A100/NVIDIAA100-SXM4-80GB_flash_atten_fp16.csv": 85}
    assert not samples["source"].str.startswith("/").any()  # no machine paths in the records


# ----------------------------------------------------------------------------------------
# bad input: one line, exit code 2 (no shared data needed)
# ----------------------------------------------------------------------------------------


def _one_line_error(result, message: str) -> None:
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_missing_folder_is_one_line_with_exit_code_2(tmp_path):
    result = run("import", "gpumodeling", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x.samples"))
    _one_line_error(result, "nowhere: no such folder")


def test_a_folder_without_csvs_is_one_line_with_exit_code_2(tmp_path):
    result = run("import", "gpumodeling", str(tmp_path), "--out", str(tmp_path / "x.samples"))
    _one_line_error(result, "no CSV files")


def test_an_existing_output_needs_force(tmp_path):
    folder = tmp_path / "ops"
    folder.mkdir()
    rows = [{"b": b, "l": 1024 * b, "dim": 2048, "F_dur(us)": 10.0 * b, "B_dur(us)": 17.0 * b} for b in (1, 2, 4)]
    pd.DataFrame(rows).to_csv(folder / "NVIDIAA100-SXM4-80GB_gelu_fp16.csv", index=False)
    out = tmp_path / "a.samples"
    out.write_text("keep me")
    _one_line_error(run("import", "gpumodeling", str(folder), "--out", str(out)), "already exists (pass --force to replace it)")
    assert out.read_text() == "keep me"
    result = run("import", "gpumodeling", str(folder), "--out", str(out), "--force")
    assert result.exit_code == 0, result.output
    assert "Records kept (6)" in result.output and "gelu" in result.output
    assert len(load_samples(out)) == 6


def test_import_without_out_is_a_usage_error(tmp_path):
    result = run("import", "gpumodeling", str(tmp_path))
    assert result.exit_code == 2
    assert "--out" in result.output


def test_samples_help_lists_the_import_command():
    result = run("import", "--help")
    assert result.exit_code == 0
    assert "gpumodeling" in result.output



def test_malformed_csvs_are_excluded_and_counted_not_a_traceback(tmp_path):
    folder = tmp_path / "ops"
    folder.mkdir()
    rows = [{"b": b, "l": 1024 * b, "dim": 2048, "F_dur(us)": 10.0 * b, "B_dur(us)": 17.0 * b} for b in (1, 2, 4)]
    rows[1]["l"] = "abc"
    pd.DataFrame(rows).to_csv(folder / "NVIDIAA100-SXM4-80GB_gelu_fp16.csv", index=False)
    (folder / "NVIDIAA100-SXM4-80GB_layernorm_fp16.csv").write_bytes(b"")
    (folder / "NVIDIAA100-SXM4-80GB_softmax_fp16.csv").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe" * 50)
    nccl = tmp_path / "nccl"
    nccl.mkdir()
    (nccl / "NVIDIAA100-SXM4-80GB_allreduce_fp16_1_4.csv").write_text(
        "shape,nodes,GPUsPerNode,dur(us)\nx,1,4,100\n134217728,1,4,2000\n"
    )
    out = tmp_path / "a.samples"
    result = run("import", "gpumodeling", str(folder), str(nccl), "--out", str(out), "--format", "json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["excluded_total"] == {gm.EXCLUDE_LAYOUT: 2, gm.EXCLUDE_NUMBER: 2 + 1}
    assert summary["records"] == 4 + 1
    notes = load_samples(out).attrs["samples_metadata"]["notes"]
    assert any(n.startswith("ops/NVIDIAA100-SXM4-80GB_softmax_fp16.csv: not readable as CSV") for n in notes)
    assert any(n.startswith("ops/NVIDIAA100-SXM4-80GB_layernorm_fp16.csv: not readable as CSV") for n in notes)


def test_an_unwritable_out_is_refused_before_importing(tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("imported before checking --out")

    monkeypatch.setattr(gm, "import_gpumodeling", never)
    folder = tmp_path / "ops"
    folder.mkdir()
    pd.DataFrame([{"b": 1, "l": 1024, "dim": 2048, "F_dur(us)": 10.0, "B_dur(us)": 17.0}]).to_csv(
        folder / "NVIDIAA100-SXM4-80GB_gelu_fp16.csv", index=False
    )
    missing = tmp_path / "nowhere" / "a.samples"
    _one_line_error(run("import", "gpumodeling", str(folder), "--out", str(missing)), "nowhere' does not exist")
    _one_line_error(run("import", "gpumodeling", str(folder), "--out", str(tmp_path), "--force"), "is a directory")
