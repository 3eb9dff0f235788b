"""Sample records: one schema, stored as Parquet with metadata, and the GPUModeling importer's
data-quality rules, each shown on a small synthetic folder (no shared data needed)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow")

from paraplan.inventory import CollectiveKind  # noqa: E402
from paraplan.samples import (  # noqa: E402
    COLUMNS,
    collective_for_row,
    import_gpumodeling,
    load_samples,
    read_samples_metadata,
    save_samples,
    validate_samples,
)
from paraplan.samples import gpumodeling as gm  # noqa: E402
from paraplan.specs import ConfigError  # noqa: E402

A100, GH200 = "NVIDIAA100-SXM4-80GB", "NVIDIAGH200120GB"


def _samples() -> pd.DataFrame:
    """Two operator records and one collective record, as an importer would write them."""
    op = {"mp": 2, "b": 4, "h": 32, "l": 2048, "dim": 4096, "vp": None, "encoders": None}
    no_op = dict.fromkeys(op)
    no_coll = {"bytes": None, "nodes": None, "gpus_per_node": None}
    rows = [
        {"kind": "op", "name": "linear1", "variant": "", "phase": "fwd", **op, **no_coll, "time_s": 1.2e-3, "row": 0},
        {"kind": "op", "name": "linear1", "variant": "", "phase": "bwd", **op, **no_coll, "time_s": 2.4e-3, "row": 0},
        {
            "kind": "collective", "name": "all_gather", "variant": "allgather_large", "phase": "", **no_op,
            "bytes": 2 * 2**27 * 4, "nodes": 4, "gpus_per_node": 1, "time_s": 0.03, "row": 7,
        },
    ]  # fmt: skip
    frame = pd.DataFrame(rows)
    frame["dtype"] = "fp16"
    frame["device"] = ["A100-SXM4-80GB", "A100-SXM4-80GB", "GH200-120GB"]
    frame["cluster"] = ["", "", "vista-gpumodeling"]
    frame["source"] = ["ops/a.csv", "ops/a.csv", "nccl/b.csv"]
    return frame[list(COLUMNS)]


# ----------------------------------------------------------------------------------------
# schema and store
# ----------------------------------------------------------------------------------------


def test_samples_round_trip_through_parquet_with_their_metadata(tmp_path):
    path = tmp_path / "a100.samples"
    save_samples(_samples(), path, {"importer": "test", "sources": ["ops"], "excluded": {"copied bwd": 3}})
    loaded = load_samples(path)
    pd.testing.assert_frame_equal(loaded, validate_samples(_samples()))
    assert loaded["vp"].isna().all() and loaded.loc[2, "mp"] is pd.NA  # nulls stay null
    meta = loaded.attrs["samples_metadata"]
    assert meta["schema_version"] == 1 and meta["importer"] == "test"
    assert meta["excluded"] == {"copied bwd": 3} and meta["sources"] == ["ops"]
    assert meta["created"].startswith("20") and meta["paraplan_version"]
    assert {"paraplan", "pandas", "pyarrow", "python"} <= set(meta["tool_versions"])
    assert read_samples_metadata(path) == meta


def test_an_existing_samples_file_is_never_overwritten_silently(tmp_path):
    path = tmp_path / "a100.samples"
    save_samples(_samples(), path)
    before = path.read_bytes()
    with pytest.raises(ConfigError, match=r"a100.samples: already exists \(pass overwrite=True / --force to replace it\)"):
        save_samples(_samples().iloc[:1], path)
    assert path.read_bytes() == before
    save_samples(_samples().iloc[:1], path, overwrite=True)
    assert len(load_samples(path)) == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"kind,name\nop,linear1\n", "not a readable Parquet samples file"),
        (b"", "not a readable Parquet samples file"),
    ],
)
def test_a_file_that_is_not_parquet_is_a_one_line_error(tmp_path, content, message):
    path = tmp_path / "bad.samples"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message) as err:
        load_samples(path)
    assert "\n" not in str(err.value)


def test_a_truncated_samples_file_is_a_one_line_error(tmp_path):
    path = tmp_path / "cut.samples"
    save_samples(_samples(), path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ConfigError, match="not a readable Parquet samples file") as err:
        load_samples(path)
    assert "\n" not in str(err.value)


def test_a_missing_file_and_a_foreign_parquet_file_are_named(tmp_path):
    with pytest.raises(ConfigError, match=r"nothing\.samples: no such file"):
        load_samples(tmp_path / "nothing.samples")
    foreign = tmp_path / "foreign.parquet"
    _samples().to_parquet(foreign)
    with pytest.raises(ConfigError, match="without paraplan samples metadata"):
        load_samples(foreign)


def test_a_file_from_a_newer_schema_asks_for_an_upgrade(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(_samples(), preserve_index=False)
    table = table.replace_schema_metadata({b"paraplan.samples": json.dumps({"schema_version": 99}).encode()})
    pq.write_table(table, tmp_path / "new.samples")
    with pytest.raises(ConfigError, match="schema version 99 is newer"):
        load_samples(tmp_path / "new.samples")


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    "metadata",
    [
        b"[" * 200_000 + b"]" * 200_000,  # deeper than Python's recursion limit
        json.dumps({"schema_version": 1, "sources": _nested(100)}).encode(),
        b"\xff\xfe",  # not UTF-8
    ],
    ids=["past-the-recursion-limit", "deep-mapping", "not-utf8"],
)
def test_corrupt_or_deeply_nested_metadata_is_a_one_line_error(tmp_path, metadata):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(_samples(), preserve_index=False)
    pq.write_table(table.replace_schema_metadata({b"paraplan.samples": metadata}), tmp_path / "x.samples")
    for read in (load_samples, read_samples_metadata):
        with pytest.raises(ConfigError, match=r"x\.samples: corrupt samples metadata") as err:
            read(tmp_path / "x.samples")
        assert "\n" not in str(err.value)


def test_metadata_nested_deeper_than_a_reader_accepts_is_not_written(tmp_path):
    with pytest.raises(ConfigError, match="metadata is nested more than 32 levels deep"):
        save_samples(_samples(), tmp_path / "deep.samples", {"notes": _nested(40)})
    assert not (tmp_path / "deep.samples").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: f.drop(columns="time_s"), "column 'time_s': missing"),
        (lambda f: f.assign(tme_s=1.0), "column 'tme_s': not a samples column"),
        (lambda f: f.assign(kind="kernel"), "column 'kind': 'kernel' is not one of"),
        (lambda f: f.assign(name="matmul"), "column 'name': op row with name 'matmul'"),
        (lambda f: f.assign(time_s=0.0), "column 'time_s': not finite and positive"),
        (lambda f: f.assign(time_s=math.nan), "column 'time_s': not finite and positive"),
        (lambda f: f.assign(l=2048.5), "column 'l': not an integer"),
        (lambda f: f.assign(b=0), "column 'b': not a positive integer"),
        (lambda f: f.assign(dtype="fp12"), "column 'dtype': 'fp12' is not one of"),
        (lambda f: f.assign(device=None), "column 'device': null"),
    ],
)
def test_a_frame_that_breaks_the_schema_is_named_by_its_column(change, message):
    frame = change(_samples())
    with pytest.raises(ConfigError, match=message) as err:
        validate_samples(frame)
    assert "\n" not in str(err.value)


def test_operator_and_collective_columns_do_not_mix():
    frame = _samples()
    frame.loc[0, "bytes"] = 1024
    with pytest.raises(ConfigError, match="column 'bytes': set on an operator row"):
        validate_samples(frame)
    frame = _samples()
    frame.loc[2, "phase"] = "fwd"
    with pytest.raises(ConfigError, match="column 'phase': collective row with phase 'fwd'"):
        validate_samples(frame)


def test_a_frame_that_breaks_the_schema_is_not_written(tmp_path):
    with pytest.raises(ConfigError, match="column 'time_s'"):
        save_samples(_samples().assign(time_s=-1.0), tmp_path / "bad.samples")
    assert not (tmp_path / "bad.samples").exists()


# ----------------------------------------------------------------------------------------
# the GPUModeling importer on synthetic folders
# ----------------------------------------------------------------------------------------


def _write(folder: Path, name: str, rows: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _gemm_rows(bwd_over_fwd: float = 2.0) -> list[dict]:
    """A linear1-like grid whose time follows its FLOPs (plus a 20 us launch floor)."""
    rows = []
    for mp, b, seq, dim in itertools.product((1, 2, 4), (2, 4), (1024, 2048), (2048, 4096)):
        fwd = 20 + 2 * seq * b * dim * 3 * dim / mp / 200e12 * 1e6
        rows.append({"mp": mp, "b": b, "l": seq, "dim": dim, "F_dur(us)": round(fwd, 3), "B_dur(us)": round(bwd_over_fwd * fwd, 3)})
    return rows  # fmt: skip


def _flash_rows(bwd_over_fwd: float) -> list[dict]:
    rows = []
    for mp, b, h, seq, dim in itertools.product((1, 2), (4, 8), (16, 32), (1024, 2048), (2048, 4096)):
        fwd = 30 + 4 * b * seq * seq * dim / mp / 150e12 * 1e6
        rows.append({"mp": mp, "b": b, "h": h, "l": seq, "dim": dim, "F_dur(us)": fwd, "B_dur(us)": bwd_over_fwd * fwd})
    return rows  # fmt: skip


def _norm_rows() -> list[dict]:
    rows = []
    for b, seq, dim in itertools.product((2, 4, 8), (1024, 2048, 4096), (2048, 4096)):
        fwd = 5 + b * seq * dim * 4 / 1.5e12 * 1e6
        rows.append({"b": b, "l": seq, "dim": dim, "F_dur(us)": round(fwd, 4), "B_dur(us)": round(1.7 * fwd, 4)})
    return rows


def _optimizer_rows() -> list[dict]:
    rows = []
    for mp, dim, enc in itertools.product((1, 2, 4, 8), (2048, 2560, 3072, 3584, 4096), range(4, 9)):
        rows.append({"mp": mp, "dim": dim, "encoders": enc, "dur(us)": 200 + enc * 12 * dim * dim / mp / 1e5})
    return rows


def _one(result, **where) -> pd.DataFrame:
    frame = result.samples
    for col, value in where.items():
        frame = frame[frame[col] == value]
    return frame


def test_each_operator_row_becomes_a_fwd_and_a_bwd_record_with_its_shape_and_seconds(tmp_path):
    _write(tmp_path / "ops", f"{A100}_linear1_fp16.csv", _gemm_rows())
    result = import_gpumodeling([tmp_path / "ops"])
    assert len(result.samples) == 2 * 24 and result.excluded == {}
    first = result.samples.iloc[0]
    raw = _gemm_rows()[0]
    assert (first["kind"], first["name"], first["variant"], first["phase"]) == ("op", "linear1", "", "fwd")
    assert (first["mp"], first["b"], first["l"], first["dim"]) == (raw["mp"], raw["b"], raw["l"], raw["dim"])
    assert first["h"] is pd.NA and first["bytes"] is pd.NA
    assert first["time_s"] == pytest.approx(raw["F_dur(us)"] * 1e-6)
    assert (first["device"], first["dtype"], first["cluster"]) == ("A100-SXM4-80GB", "fp16", "")
    assert (first["source"], first["row"]) == (f"ops/{A100}_linear1_fp16.csv", 0)


def test_tags_that_differ_from_the_inventory_name_are_kept_as_the_variant(tmp_path):
    soft = [{**{k: r[k] for k in ("mp", "b", "l")}, "h": 16, "F_dur(us)": r["F_dur(us)"], "B_dur(us)": r["B_dur(us)"]} for r in _gemm_rows()]  # fmt: skip
    _write(tmp_path / "ops", f"{A100}_ScaledUpperTriangMaskedSoftmax_fp16.csv", soft)
    _write(tmp_path / "ops", f"{A100}_firstStage_optimizer_fp16.csv", _optimizer_rows())
    result = import_gpumodeling([tmp_path / "ops"])
    assert set(_one(result, variant="ScaledUpperTriangMaskedSoftmax")["name"]) == {"softmax"}
    step = _one(result, variant="firstStage_optimizer")
    assert set(step["name"]) == {"optimizer"} and set(step["phase"]) == {"step"} and len(step) == 100


def test_tuning_tables_are_skipped_with_a_note(tmp_path):
    _write(tmp_path / "ops", f"{A100}_gelu_fp16.csv", _gemm_rows())
    _write(tmp_path / "ops", f"{A100}.csv", [{"GPU": A100, "Function": "gelu", "Best_model": "rforest"}])
    result = import_gpumodeling([tmp_path / "ops"])
    assert len(result.samples) == 48
    assert any("regressor tuning table" in note for note in result.notes)


def test_a_backward_copied_from_the_forward_is_excluded(tmp_path):
    rows = [{**r, "B_dur(us)": r["F_dur(us)"]} for r in _norm_rows()]
    _write(tmp_path / "ops", f"{A100}_res_add_fp16.csv", rows)
    partly = _norm_rows()
    for r in partly[:5]:
        r["B_dur(us)"] = r["F_dur(us)"]
    _write(tmp_path / "ops", f"{A100}_layernorm_fp16.csv", partly)
    result = import_gpumodeling([tmp_path / "ops"])
    assert len(_one(result, name="res_add", phase="bwd")) == 0
    assert len(_one(result, name="res_add", phase="fwd")) == 18
    assert len(_one(result, name="layernorm", phase="bwd")) == 18 - 5
    assert result.excluded == {gm.EXCLUDE_COPY: 18 + 5}


def test_a_flash_attention_backward_faster_than_its_forward_is_excluded_by_the_ratio_rule(tmp_path):
    _write(tmp_path / "gh200", f"{GH200}_flash_atten_fp16.csv", _flash_rows(bwd_over_fwd=0.11))
    _write(tmp_path / "a100", f"{A100}_flash_atten_fp16.csv", _flash_rows(bwd_over_fwd=3.1))
    result = import_gpumodeling([tmp_path / "gh200", tmp_path / "a100"])
    assert len(_one(result, device="GH200-120GB", phase="bwd")) == 0
    assert len(_one(result, device="GH200-120GB", phase="fwd")) == 32
    assert len(_one(result, device="A100-SXM4-80GB", phase="bwd")) == 32
    assert result.excluded == {gm.EXCLUDE_RATIO: 32}
    assert any("median B/F 0.11" in note for note in result.notes)


def test_a_memory_bound_backward_may_be_faster_than_its_forward(tmp_path):
    rows = [{"mp": r["mp"], "b": r["b"], "l": r["l"], "F_dur(us)": r["F_dur(us)"], "B_dur(us)": r["F_dur(us)"] / 3} for r in _gemm_rows()]  # fmt: skip
    _write(tmp_path / "ops", f"{A100}_parallel_cross_entropy_128_fp16.csv", rows)
    result = import_gpumodeling([tmp_path / "ops"])
    assert len(_one(result, name="cross_entropy", phase="bwd")) == 24 and result.excluded == {}


def test_optimizer_steps_far_above_their_trend_and_median_are_outliers(tmp_path):
    rows = _optimizer_rows()
    block = [r for r in rows if r["mp"] == 1 and r["dim"] <= 3072]  # a contiguous block, as on GH200
    for r in block:
        r["dur(us)"] *= 1000
    _write(tmp_path / "ops", f"{GH200}_firstStage_optimizer_fp16.csv", rows)
    result = import_gpumodeling([tmp_path / "ops"])
    assert result.excluded == {gm.EXCLUDE_OUTLIER: len(block)} and len(block) == 15
    assert _one(result, name="optimizer")["time_s"].max() < 0.1


def test_small_kernels_on_a_launch_floor_are_not_outliers():
    """A power law under-predicts kernels stuck at a ~70 us launch floor by more than 10x;
    they are still within 10x of the file's median, so they stay."""
    shape = np.array(list(itertools.product((1, 2, 4, 8, 16), (2, 4, 8), (1024, 2048, 4096), (2048, 4096, 8192))), float)
    trend = shape[:, 1] * shape[:, 2] * shape[:, 3] ** 2 / shape[:, 0] * 5e-15  # 3 us .. 11 ms
    seconds = np.maximum(70e-6, trend)
    assert (seconds / trend).max() > 10
    assert not gm.outlier_mask(shape, seconds).any()


def test_nan_and_non_positive_times_exclude_only_their_own_record(tmp_path):
    rows = _gemm_rows()
    rows[0]["F_dur(us)"] = math.nan
    rows[1]["B_dur(us)"] = -3.0
    rows[2]["B_dur(us)"] = 0.0
    _write(tmp_path / "ops", f"{A100}_gelu_fp16.csv", rows)
    result = import_gpumodeling([tmp_path / "ops"])
    assert result.excluded == {gm.EXCLUDE_TIME: 3}
    assert len(result.samples) == 48 - 3
    assert set(result.rejected["row"]) == {0, 1, 2}


def test_a_shape_that_is_not_a_positive_integer_excludes_the_whole_row(tmp_path):
    rows = _gemm_rows()
    rows[4]["l"] = 1024.5
    rows[5]["dim"] = 0
    _write(tmp_path / "ops", f"{A100}_linear1_fp16.csv", rows)
    result = import_gpumodeling([tmp_path / "ops"])
    assert result.excluded == {gm.EXCLUDE_SHAPE: 4}
    assert not result.samples["row"].isin([4, 5]).any()


def test_grid_points_measured_twice_are_kept_and_counted(tmp_path):
    rows = _gemm_rows()
    rows.append({**rows[3], "F_dur(us)": rows[3]["F_dur(us)"] * 1.05})
    _write(tmp_path / "ops", f"{A100}_linear1_fp16.csv", rows)
    result = import_gpumodeling([tmp_path / "ops"])
    assert len(result.samples) == 2 * 25
    assert result.duplicates == {f"ops/{A100}_linear1_fp16.csv": 1}


def test_a_file_with_undocumented_columns_is_excluded_whole_and_counted(tmp_path):
    _write(tmp_path / "ops", f"{A100}_linear1_fp16.csv", _gemm_rows())
    sweep = [{"num_layers": 2, "hidden_size": 256 * i, "param_tensors": 28, "params": 1e7 * i, "dur": 9731.2} for i in range(1, 8)]  # fmt: skip
    _write(tmp_path / "ops", f"{A100}_optimizer_fp16.csv", sweep)
    _write(tmp_path / "ops", f"{A100}_mystery_fp16.csv", _gemm_rows()[:5])
    result = import_gpumodeling([tmp_path / "ops"])
    assert result.excluded == {gm.EXCLUDE_LAYOUT: 7 + 5}
    assert set(result.samples["name"]) == {"linear1"}
    assert any("num_layers" in note for note in result.notes)
    assert any("unknown operator tag 'mystery'" in note for note in result.notes)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"", "No columns to parse from file"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xd8" * 20, "'utf-8' codec can't decode"),
        (b"b,l,dim,F_dur(us),B_dur(us)\n1,2,3,4,5\n1,2,3,4,5,6,7\n", "Expected 5 fields in line 3, saw 7"),
    ],
    ids=["empty", "binary", "ragged"],
)
def test_a_file_that_cannot_be_read_as_csv_is_excluded_whole_and_counted(tmp_path, content, why):
    _write(tmp_path / "ops", f"{A100}_linear1_fp16.csv", _gemm_rows())
    (tmp_path / "ops" / f"{A100}_gelu_fp16.csv").write_bytes(content)
    result = import_gpumodeling([tmp_path / "ops"])
    assert result.excluded == {gm.EXCLUDE_LAYOUT: 1}  # one record stands for the unreadable file
    assert len(result.samples) == 48 and set(result.samples["name"]) == {"linear1"}
    note = next(n for n in result.notes if "gelu" in n)
    assert note.startswith(f"ops/{A100}_gelu_fp16.csv: not readable as CSV, excluded whole") and why in note
    assert result.metadata()["excluded_by_source"] == {f"ops/{A100}_gelu_fp16.csv": {gm.EXCLUDE_LAYOUT: 1}}


def test_non_numeric_cells_exclude_their_records_under_their_own_rule(tmp_path):
    rows = _gemm_rows()
    rows[0]["l"] = "abc"  # a shape cell: both records of the row
    rows[1]["F_dur(us)"] = "12,5"  # a time cell: only its own record
    rows[2]["B_dur(us)"] = " "
    rows[3]["dim"] = math.nan  # an empty cell stays under the shape rule
    _write(tmp_path / "ops", f"{A100}_linear1_fp16.csv", rows)
    _write(tmp_path / "ops", f"{A100}_gelu_fp16.csv", [{**r, "mp": "1e0"} for r in _gemm_rows()])  # a number
    result = import_gpumodeling([tmp_path / "ops"])
    assert result.excluded == {gm.EXCLUDE_NUMBER: 2 + 1 + 1, gm.EXCLUDE_SHAPE: 2}
    rejected = result.rejected[result.rejected["reason"] == gm.EXCLUDE_NUMBER]
    assert sorted(zip(rejected["row"], rejected["phase"], strict=True)) == [(0, "bwd"), (0, "fwd"), (1, "fwd"), (2, "bwd")]
    assert len(_one(result, name="linear1")) == 48 - 6 and len(_one(result, name="gelu")) == 48
    assert _one(result, name="linear1", row=1, phase="bwd")["time_s"].iloc[0] == pytest.approx(rows[1]["B_dur(us)"] * 1e-6)
    assert gm.EXCLUSION_REASONS.index(gm.EXCLUDE_NUMBER) == 1


def test_an_unknown_gpu_in_a_file_name_fails_visibly(tmp_path):
    _write(tmp_path / "ops", "NVIDIAA1000_linear1_fp16.csv", _gemm_rows())
    with pytest.raises(ConfigError, match=r"NVIDIAA1000_linear1_fp16\.csv: unknown GPU"):
        import_gpumodeling([tmp_path / "ops"])


def test_bad_folders_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="nowhere: no such folder"):
        import_gpumodeling([tmp_path / "nowhere"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="empty: no CSV files"):
        import_gpumodeling([tmp_path / "empty"])
    _write(tmp_path / "tables", f"{A100}.csv", [{"GPU": A100}])
    with pytest.raises(ConfigError, match="tables: no GPUModeling timing files"):
        import_gpumodeling([tmp_path / "tables"])


def test_a_folder_given_twice_is_read_once(tmp_path):
    _write(tmp_path / "ops", f"{A100}_linear1_fp16.csv", _gemm_rows())
    assert len(import_gpumodeling([tmp_path / "ops", tmp_path / "ops"]).samples) == 48


def test_progress_is_reported_once_per_file(tmp_path):
    _write(tmp_path / "ops", f"{A100}_linear1_fp16.csv", _gemm_rows())
    _write(tmp_path / "ops", f"{A100}.csv", [{"GPU": A100}])
    seen: list[str] = []
    import_gpumodeling([tmp_path / "ops"], progress=lambda p: seen.append(p.name))
    assert seen == [f"{A100}.csv", f"{A100}_linear1_fp16.csv"]


# ----------------------------------------------------------------------------------------
# collectives
# ----------------------------------------------------------------------------------------

SIZES = [2**27 + i * 2**22 for i in range(12)]  # fp16 elements per rank


def _nccl_rows(nodes: int, per_node: int, seconds_per_byte: float, scale: int = 1) -> list[dict]:
    """Rows whose time is ``seconds_per_byte`` x (per-rank bytes x ``scale``) plus 100 us."""
    return [
        {"shape": s, "nodes": nodes, "GPUsPerNode": per_node, "dur(us)": (100e-6 + 2 * s * scale * seconds_per_byte) * 1e6}
        for s in SIZES
    ]  # fmt: skip


def test_collective_bytes_follow_paraplans_convention():
    assert collective_for_row(CollectiveKind.ALL_REDUCE, 1000, 2, 4).bytes == 2000
    assert collective_for_row(CollectiveKind.SEND_RECV, 1000, 2, 1).bytes == 2000
    # all-gather: each rank's input chunk of 1000 elements, the whole output of 8 ranks
    assert collective_for_row(CollectiveKind.ALL_GATHER, 1000, 2, 4).bytes == 2000 * 8


def test_nccl_rows_become_collective_records_on_their_cluster(tmp_path):
    _write(tmp_path / "vista", f"{GH200}_allreduce_fp16_2_1.csv", _nccl_rows(2, 1, 1 / 40e9))
    _write(tmp_path / "vista", f"{GH200}_allgather_large_fp16_4_1.csv", _nccl_rows(4, 1, 1 / 40e9, scale=3))
    _write(tmp_path / "vista", f"{GH200}_p2p_fp16_2_1.csv", _nccl_rows(2, 1, 1 / 30e9))
    result = import_gpumodeling([tmp_path / "vista"])
    assert result.excluded == {}
    reduce = _one(result, name="all_reduce").iloc[0]
    assert (reduce["kind"], reduce["variant"], reduce["phase"]) == ("collective", "allreduce", "")
    assert (reduce["bytes"], reduce["nodes"], reduce["gpus_per_node"]) == (2 * SIZES[0], 2, 1)
    assert (reduce["device"], reduce["cluster"]) == ("GH200-120GB", "vista-gpumodeling")
    assert reduce["mp"] is pd.NA
    gather = _one(result, name="all_gather").iloc[0]
    assert gather["bytes"] == 2 * SIZES[0] * 4
    assert set(_one(result, variant="p2p")["name"]) == {"send_recv"}


def test_pooled_union_files_are_skipped_so_no_row_counts_twice(tmp_path):
    rows = _nccl_rows(2, 1, 1 / 40e9)
    _write(tmp_path / "vista", f"{GH200}_allreduce_fp16_2_1.csv", rows)
    _write(tmp_path / "vista", f"{GH200}_allreduce_fp16.csv", rows)
    _write(tmp_path / "vista", f"{GH200}.csv", [{"GPU": GH200, "Nodes": 0}])
    result = import_gpumodeling([tmp_path / "vista"])
    assert len(result.samples) == len(rows)
    assert any("row union" in note for note in result.notes)


def test_all_gathers_faster_than_the_link_allows_are_excluded(tmp_path):
    """GH200 4_1 all-gather rows at a constant ~117 us: 3 x 512 MiB through a 50 GB/s NIC
    cannot take 117 us."""
    rows = _nccl_rows(4, 1, 1 / 40e9, scale=3)
    for r in rows[:5]:
        r["dur(us)"] = 117.3
    _write(tmp_path / "vista", f"{GH200}_allgather_large_fp16_4_1.csv", rows)
    result = import_gpumodeling([tmp_path / "vista"])
    assert result.excluded == {gm.EXCLUDE_BANDWIDTH: 5}
    assert len(result.samples) == len(rows) - 5


def test_topology_columns_that_disagree_with_the_file_name_are_excluded(tmp_path):
    rows = _nccl_rows(2, 1, 1 / 40e9)
    rows[0]["nodes"] = 4
    _write(tmp_path / "vista", f"{GH200}_allreduce_fp16_2_1.csv", rows)
    result = import_gpumodeling([tmp_path / "vista"])
    assert result.excluded == {gm.EXCLUDE_TOPOLOGY: 1}


def test_non_numeric_nccl_cells_exclude_their_row(tmp_path):
    rows = _nccl_rows(2, 1, 1 / 40e9)
    rows[0]["shape"] = "x"
    rows[1]["dur(us)"] = "slow"  # ("n/a" is one of the empty markers pandas reads as NaN)
    rows[2]["GPUsPerNode"] = "one"
    _write(tmp_path / "vista", f"{GH200}_allreduce_fp16_2_1.csv", rows)
    (tmp_path / "vista" / f"{GH200}_p2p_fp16_2_1.csv").write_bytes(b"")
    result = import_gpumodeling([tmp_path / "vista"])
    assert result.excluded == {gm.EXCLUDE_LAYOUT: 1, gm.EXCLUDE_NUMBER: 3}
    assert len(result.samples) == len(rows) - 3


def test_more_gpus_per_node_than_the_cluster_has_fails_visibly(tmp_path):
    _write(tmp_path / "vista", f"{GH200}_allreduce_fp16_1_4.csv", _nccl_rows(1, 4, 1 / 40e9))
    with pytest.raises(ConfigError, match="4 GPUs per node but cluster vista-gpumodeling has 1"):
        import_gpumodeling([tmp_path / "vista"])


def test_the_import_result_carries_its_provenance_for_the_file(tmp_path):
    _write(tmp_path / "ops", f"{A100}_res_add_fp16.csv", [{**r, "B_dur(us)": r["F_dur(us)"]} for r in _norm_rows()])
    result = import_gpumodeling([tmp_path / "ops"])
    meta = result.metadata()
    assert meta["importer"] == "gpumodeling" and meta["sources"] == [str(tmp_path / "ops")]
    assert meta["excluded"] == {gm.EXCLUDE_COPY: 18}
    assert meta["excluded_by_source"] == {f"ops/{A100}_res_add_fp16.csv": {gm.EXCLUDE_COPY: 18}}
    assert "3rd to 7th smallest" in meta["reduction"]
    save_samples(result.samples, tmp_path / "out.samples", meta)
    assert load_samples(tmp_path / "out.samples").attrs["samples_metadata"]["excluded"] == {gm.EXCLUDE_COPY: 18}
