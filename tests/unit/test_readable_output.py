"""Output people can read at 80 columns (issue 14, part 1): every table keeps its numbers and
names whole at 80 and at 200 columns, and --help shows flags as flags."""

from __future__ import annotations

import json
import re

import pytest
import typer
import yaml
from rich.text import Text
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.report.catalog import catalog_rows, render_catalog
from paraplan.report.fitting import render_fit, render_learning_curves
from paraplan.report.layout import ReadableTable
from readable import WIDTHS, assert_readable, assert_readable_text, numbers_of, render

runner = CliRunner()


def cli(width: int, *args: str):
    result = runner.invoke(app, list(args), env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    return result


# -- the layout itself -------------------------------------------------------------------------


def _wide_table() -> ReadableTable:
    table = ReadableTable("A table wider than 80 columns")
    table.add_column("name")
    table.add_column("description of the thing", short="description", wrap=True)
    for header in ("first number", "second number", "third number", "fourth number"):
        table.add_column(header, short=header.split()[0], number=True)
    table.add_column("long notes", wrap=True, detail=True)
    for i in range(5):
        table.add_row(f"entry-with-a-long-name-{i}", "a sentence that can wrap between its words " * 2,
                      f"{1234567.891 * (i + 1):,.3f}", f"{-0.000123 * i:+.6f}", str(10**i), f"{i / 7:.4%}",
                      "notes notes notes " * 4)
    return table


@pytest.mark.parametrize("width", [30, 40, 60, 80, 100, 120, 200, 300])
def test_numbers_and_names_stay_whole_at_every_width(width):
    table = _wide_table()
    text = render(table, width)
    assert_readable_text(text, width, [*table.number_cells(), *(f"entry-with-a-long-name-{i}" for i in range(5))])


def test_the_layout_narrows_step_by_step():
    table = _wide_table()
    wide, eighty, narrow, narrowest = (render(table, w) for w in (300, 80, 50, 30))
    assert "┏" in wide and "first number" in wide and "headers:" not in wide  # boxed, full headers
    assert "headers: description = description of the thing" in eighty  # short headers, a legend
    assert "long notes by name" in eighty  # the detail column under the table
    blocks = [line for line in narrow.splitlines() if line.startswith("name ")]
    assert len(blocks) > 2 and "first" in "".join(blocks)  # blocks of columns, each repeating the name
    assert re.search(r"^  first number:\s*\n    1,234,567.891", narrowest, re.M)  # each value under its header


def test_where_no_block_of_columns_fits_each_row_is_a_block_of_lines():
    table = ReadableTable("long keys")
    table.add_column("key")
    table.add_column("size", number=True)
    table.add_row("a-key-of-forty-characters-for-a-narrow-x", "1,234,567")
    assert re.search(r"^  size: 1,234,567", render(table, 45), re.M)


def test_settings_every_row_shares_are_said_once_above_a_narrow_table():
    table = ReadableTable("plans", shared="every plan")
    table.add_column("#", number=True)
    table.add_column("tp", number=True, setting=True)
    table.add_column("recompute", setting=True, short="rc", legend="recompute (sel = selective)",
                     compact=lambda s: {"selective": "sel"}.get(s, s))
    table.add_column("name")
    for rank in (1, 2):
        table.add_row(str(rank), "8", "selective" if rank == 1 else "full", "a-name-of-fifty-characters-".ljust(50, "x"))
    wide, narrow = render(table, 300), render(table, 60)
    assert "every plan" not in wide and "selective" in wide  # wide: as it is
    assert "every plan: tp 8" in narrow and "sel " in narrow and "rc = recompute (sel = selective)" in narrow


def test_cells_are_data_not_markup():
    table = ReadableTable("variants")
    table.add_column("operator [variant]")
    table.add_column("n", number=True)
    table.add_row("softmax [ScaledUpperTriangMaskedSoftmax]", "305")
    table.add_row(Text("total", style="bold"), "305")
    for width in WIDTHS:
        assert "softmax [ScaledUpperTriangMaskedSoftmax]" in render(table, width)


def test_a_row_with_the_wrong_number_of_cells_is_a_bug():
    table = ReadableTable("t")
    table.add_column("a")
    with pytest.raises(ValueError, match="2 cells for 1 columns"):
        table.add_row("x", "y")


# -- catalog -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["gpus", "models", "clusters", "frameworks"])
def test_catalog_tables_keep_every_number_and_name(kind):
    rows = catalog_rows(kind)
    table = render_catalog(kind, rows)
    texts = assert_readable(table)
    names = [r["name"] for r in rows]
    for width, text in texts.items():
        assert_readable_text(text, width, names)
    for width in WIDTHS:  # the command prints the same
        assert_readable_text(cli(width, "catalog", kind).stdout, width, [*table.number_cells(), *names])


def test_catalog_gpus_at_80_columns_lists_every_alias():
    text = " ".join(cli(80, "catalog", "gpus").stdout.split())  # an alias may wrap between its words
    for row in catalog_rows("gpus"):
        for alias in row["aliases"].split(", "):
            assert alias in text


# -- predict -----------------------------------------------------------------------------------


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("job", ["examples/llama-3-70b-dgx-h100-tp8-pp4.yaml", "examples/gpt3-175b-h100-fp8-megatron.yaml"])
def test_predict_and_explain_keep_every_number(width, job):
    import paraplan
    from paraplan.report.tables import render_explain, render_prediction

    pred = paraplan.predict(job)
    numbers = numbers_of(render_prediction(pred)) + numbers_of(render_explain(pred))
    assert f"{pred.layer_ops[0].fwd_s * 1e3:.3f}" in numbers  # the model holds the operators' numbers
    assert_readable_text(cli(width, "predict", job, "--explain").stdout, width, numbers)


@pytest.mark.parametrize("width", WIDTHS)
def test_explain_names_every_operator_beside_its_model(width):
    import paraplan

    pred = paraplan.predict("examples/llama-3-70b-dgx-h100-tp8-pp4.yaml")
    text = cli(width, "predict", "examples/llama-3-70b-dgx-h100-tp8-pp4.yaml", "--explain").stdout
    rows = _rows(text)
    for op in pred.layer_ops:
        assert any(row.startswith(op.name + " ") and " ".join(op.source.split()) in row for row in rows), op


def _rows(text: str) -> list[str]:
    """Each table row with its wrapped cells' continuation lines (first cell blank) joined on,
    box lines dropped: a long model text (a ``fwd: ...; bwd: ...`` pair) wraps in its cell."""
    rows: list[str] = []
    for line in text.splitlines():
        cells = line.replace("│", " ")
        first = line.split("│")[1] if line.startswith("│") else line[:2]
        if rows and cells.strip() and not first.strip():
            rows[-1] += " " + cells.strip()
        else:
            rows.append(cells.strip())
    return [" ".join(row.split()) for row in rows]


def test_heterogeneous_stages_table_keeps_every_number():
    import paraplan
    from paraplan.report.tables import render_prediction

    pred = paraplan.predict({
        "model": "gpt2-xl", "cluster": "hetero-a100-a10",
        "parallel": {"tp": 1, "pp": 4, "micro_batch_size": 1, "global_batch_size": 64},
    })
    assert_readable(render_prediction(pred))


@pytest.mark.parametrize("width", WIDTHS)
def test_plain_predict_of_the_demo_job_keeps_every_number(width):
    import paraplan
    from paraplan.catalog.jobs import demo_job_mapping
    from paraplan.report.tables import render_prediction

    numbers = numbers_of(render_prediction(paraplan.predict(demo_job_mapping())))
    assert numbers
    assert_readable_text(cli(width, "predict").stdout, width, numbers)


# -- search ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def default_search() -> dict:
    return json.loads(cli(200, "search", "--format", "json").stdout)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_default_search_shows_every_plan_and_exclusion_whole(width, default_search):
    assert_readable_text(cli(width, "search").stdout, width, _search_numbers(default_search))


def _search_numbers(data: dict) -> list[str]:
    """The numbers a search's JSON holds as its table prints them."""
    numbers = [n for p in data["plans"] for n in (f"{p['iteration_s']:.2f}", f"{p['tokens_per_s']:,.0f}",
                                                  f"{p['memory_per_gpu_bytes'] / 2**30:.1f}")]
    return numbers + [f"{count:,}" for count in data["excluded"].values()]


MOE_SEARCH = ("search", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--num-nodes", "2",
              "--global-batch-size", "64", "--etp", "1", "--schedule", "1f1b,zb-h1,zb-v", "--framework", "fsdp",
              "--recompute", "full", "--pp", "2", "--top", "20")


@pytest.fixture(scope="module")
def moe_search() -> dict:
    return json.loads(cli(200, *MOE_SEARCH, "--format", "json").stdout)


@pytest.mark.parametrize("width", WIDTHS)
def test_a_mixture_of_experts_search_shows_ep_etp_and_schedule_whole(width, moe_search):
    text = cli(width, *MOE_SEARCH).stdout
    assert_readable_text(text, width, _search_numbers(moe_search))
    assert {"1f1b", "zb-v"} <= {p["schedule"] for p in moe_search["plans"]}
    assert re.search(r"^.*\bsched(ule)?\b.*tokens/s", text, re.M)  # the header row
    # ep is a column, or on the "every plan" line when every ranked plan shares it
    assert re.search(r"^.*\bep\b.*\bsched(ule)?\b.*tokens/s", text, re.M) or re.search(r"^every plan:.*\bep \d", text, re.M)
    assert re.search(r"\betp\b", text)  # torchtitan's experts are never tensor-parallel: etp 1, shared or a column


# -- calibrate ---------------------------------------------------------------------------------


def _tables_and_block(text: str, first: str) -> tuple[str, dict]:
    """The tables a calibrate command prints, and the YAML block after them (its lines may be
    long: it is pasted into the catalog as it is)."""
    at = text.rindex(first)
    return text[:at], yaml.safe_load(text[at:])


@pytest.mark.parametrize("width", WIDTHS)
def test_calibrate_attention_prints_its_fitted_curve_whole(width):
    tables, block = _tables_and_block(cli(width, "calibrate", "attention", "--gpu", "H100-SXM5-80GB").stdout,
                                      "attention:")
    assert_readable_text(tables, width, [f"{block['attention']['max_fraction']:.4f}",
                                         f"{block['attention']['half_work']:.3g}"])


@pytest.mark.parametrize("width", WIDTHS)
def test_calibrate_gemm_table_prints_its_fitted_curve_whole(width, xla_tables_dir):
    text = cli(width, "calibrate", "gemm-table", str(xla_tables_dir / "matmul.csv"), "--gpu-key", "sm_90",
               "--gpu", "H100-SXM5-80GB").stdout
    tables, block = _tables_and_block(text, "gemm:")
    assert_readable_text(tables, width, [f"{block['gemm']['max_fraction']:.4f}", f"{block['gemm']['half_work']:.3g}"])


@pytest.mark.parametrize("width", WIDTHS)
def test_calibrate_collective_table_prints_every_bandwidth_whole(width, xla_tables_dir):
    text = cli(width, "calibrate", "collective-table", str(xla_tables_dir / "collectives.csv"), "--gpu-key", "sm_90",
               "--cluster", "dgx-h100").stdout
    tables, block = _tables_and_block(text, "collectives:")
    bandwidths = [v.split()[0] for curve in block["collectives"].values() for v in curve["bus_bytes_per_s"].values()]
    assert len(bandwidths) == 13  # 3 group sizes x 4 collectives + the send/recv pair
    assert_readable_text(tables, width, bandwidths)


# -- fit ---------------------------------------------------------------------------------------

KEYS = [f"op/A100-SXM4-80GB/fp16/{op}/{way}" for op in ("RMSlayernorm", "linear_final", "cross_entropy")
        for way in ("fwd", "bwd")] + [f"collective/perlmutter-gpumodeling/{c}/{link}"
                                      for c in ("all_reduce", "send_recv") for link in ("inter", "intra")]


def test_fit_tables_keep_every_regressor_and_number():
    rows = [{"key": k, "algorithm": "xgboost" if i % 2 else "rforest", "samples": 11281 - 97 * i,
             "cv_error": 0.0123 * i, "holdout_error": 0.4567 + i / 1000, "analytical_holdout_error": 1.001 + i,
             "fit_seconds": 12.5 * i} for i, k in enumerate(KEYS)]
    texts = assert_readable(render_fit(rows, "/a/rather/long/path/to/the/models/file/a100.models"))
    curves = {k: [(0.1, 28 + i, 0.07), (0.25, 70, 0.055), (0.5, 141, 0.0345), (1.0, 2843 + i, 0.419)]
              for i, k in enumerate(KEYS)}
    curve_texts = assert_readable(render_learning_curves(curves))
    for width in WIDTHS:
        for key in KEYS:  # each regressor's name: its group's title, then the rest of its key
            group, name = key.rsplit("/", 2)[0], "/".join(key.rsplit("/", 2)[1:])
            assert f"{group}/" in texts[width] and re.search(rf"\b{re.escape(name)}\b", texts[width])
            assert re.search(rf"\b{re.escape(name)}\b", curve_texts[width])
        assert "2851" in curve_texts[width]  # n at 100 % of the last regressor


# -- validate ----------------------------------------------------------------------------------


@pytest.mark.shared_data
def test_validation_tables_keep_every_run_and_number(gpumodeling_dir, published_dir):
    from paraplan.report.validation import render_validation
    from paraplan.validate import load_runs, validate_runs

    results = [r for f in (gpumodeling_dir / "runs_perlmutter.json", published_dir / "runs_dev_modern.json")
               for r in validate_runs(load_runs(f), "analytical", None, [])]
    texts = assert_readable(render_validation(results))
    for width, text in texts.items():
        assert_readable_text(text, width, [r.run_id for r in results])


# -- samples -----------------------------------------------------------------------------------


def test_samples_import_tables_keep_every_count():
    from paraplan.cli.samples import _tables

    devices = ["A100-SXM4-80GB", "GH200-120GB", "H100-SXM5-80GB", "MI300X"]
    kept = [{"name": name, "variant": variant, "phase": phase, "device": d, "records": 1000 + 7 * i}
            for i, (name, variant, phase) in enumerate([("softmax", "ScaledUpperTriangMaskedSoftmax", "fwd"),
                                                        ("cross_entropy", "parallel_cross_entropy_128", "bwd"),
                                                        ("linear1", "", "fwd")])
            for d in devices]
    summary = {"kept": kept, "records": 12084, "duplicates": {}, "excluded_total": {"x": 4068},
               "excluded": [{"folder": "operators_GH200", "reason": "bwd faster than fwd (not fully captured)",
                             "records": 4068}]}
    for part in _tables(summary, "a.samples", 1.5):
        texts = assert_readable(part)
    for width in WIDTHS:
        text = render(_tables(summary, "a.samples", 1.5)[0], width)
        assert "[ScaledUpperTriangMaskedSoftmax]" in text.replace("\n", "")
    assert texts


# -- --help ------------------------------------------------------------------------------------

def _command_paths(command, path: tuple[str, ...] = ()) -> list[list[str]]:
    """Every command and group of the app, as the words that name it."""
    paths = [list(path)]
    for name, sub in getattr(command, "commands", {}).items():
        paths += _command_paths(sub, (*path, name))
    return paths


COMMANDS = _command_paths(typer.main.get_command(app))


def test_the_help_check_covers_every_command():
    assert ["report"] in COMMANDS and ["calibrate", "collective-table"] in COMMANDS
    assert ["samples", "import", "gpumodeling"] in COMMANDS


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "paraplan")
def test_help_shows_flags_as_flags_and_cuts_nothing(command, width):
    text = cli(width, *command, "--help").stdout
    assert "<bool>" not in text
    assert not re.search(r"\w\.\.\.$", text, re.M)  # no command summary cut short
    assert_readable_text(text, width)


def test_boolean_flags_read_as_a_typer_user_expects():
    text = cli(80, "predict", "--help").stdout
    assert "--sequence-parallel / --no-sequence-parallel" in text
    assert re.search(r"^\s+--explain\s+Also show", text, re.M)
    assert re.search(r"^\s+--components / --no-components", cli(80, "validate", "--help").stdout, re.M)
    assert re.search(r"^\s+--quick\s+Tiny tuning grid", cli(80, "fit", "--help").stdout, re.M)


def test_catalog_frameworks_at_80_columns_lists_each_preset_with_its_version_engine_and_sources():
    result = cli(80, "catalog", "frameworks")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())  # prose cells wrap between words
    for row in catalog_rows("frameworks"):
        for part in (row["name"], row["version"], row["engine"], *row["sources"].split(", ")):
            assert part in text
    assert "zero_stage 1" in text and "sequence_parallel true (tp>1)" in text  # nemo's, with when it applies
