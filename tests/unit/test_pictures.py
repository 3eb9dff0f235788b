"""The data the pictures are drawn from, and the pictures themselves (breakdown, timeline,
memory, learning curves)."""

import pytest

from paraplan.catalog import resolve_job
from paraplan.prediction import predict
from paraplan.report.stagebars import stage_bars, timeline_bars

PNG = b"\x89PNG\r\n\x1a\n"


def _job(**parallel):
    return resolve_job(
        {
            "model": "llama-3-8b",
            "cluster": {"name": "dgx-a100", "num_nodes": 4},
            "parallel": {"tp": 4, "pp": 4, "micro_batch_size": 1, "global_batch_size": 64, "zero_stage": 1,
                         **parallel},
        }
    )


PLANS = [
    {},
    {"recompute": "full"},
    {"schedule": "interleaved", "vpp": 2},
    {"schedule": "gpipe"},
    {"pp": 1, "tp": 8},
    {"framework": "deepspeed", "zero_stage": 1},
]


@pytest.mark.parametrize("plan", PLANS)
def test_breakdown_bars_of_the_critical_stage_add_up_to_the_iteration(plan):
    pred = predict(_job(**plan), keep_timeline=True)
    bars = stage_bars(pred)
    assert len(bars) == pred.job.parallel.pp
    (crit,) = [b for b in bars if b.critical]
    assert crit.total_s == pytest.approx(pred.iteration_s, rel=1e-9)
    assert crit.as_dict()["pipeline p2p"] == pytest.approx(pred.breakdown.pipeline_p2p_s, rel=1e-9)
    assert crit.as_dict()["pipeline bubble (idle)"] == pytest.approx(pred.breakdown.pipeline_bubble_s, rel=1e-9)


@pytest.mark.parametrize("plan", PLANS)
def test_every_stage_bar_spans_the_iteration_and_its_sends_are_what_they_delay_it_by(plan):
    # a stage's p2p is what the sends delay its finish by (the schedule run again with free
    # sends), not the sends it holds: the breakdown's choice, so that a slower network never
    # shows as idle time
    from paraplan.prediction.facade import run_pipeline

    pred = predict(_job(**plan), keep_timeline=True)
    free = run_pipeline(pred.job, pred.stages, 0.0, 0.0).finish
    for bar in stage_bars(pred):
        assert bar.total_s == pytest.approx(pred.iteration_s, rel=1e-9)
        assert all(s >= 0 for s in bar.seconds)
        sends = pred.pipeline.finish[bar.stage] - free[bar.stage]
        assert bar.as_dict()["pipeline p2p"] == pytest.approx(sends, rel=1e-9, abs=1e-12)
        assert (sends > 0) == (pred.job.parallel.pp > 1)


def test_the_memory_pictures_totals_are_written_over_the_hbm_and_headroom_lines():
    pytest.importorskip("matplotlib")
    from paraplan.report.plots import figure_memory

    pred = predict(_job(), keep_timeline=True)
    ax = figure_memory(pred).axes[0]
    lines = max(c.get_zorder() for c in ax.collections if c.get_label() in ("HBM of the GPU",)
                or c.get_label().endswith("headroom"))
    labels = {f"{m.total / 2**30:.1f}" for m in pred.memory}
    totals = [t for t in ax.texts if t.get_text() in labels]
    assert len(totals) == len(pred.memory)
    for text in totals:  # a line through a total would strike its digits out
        assert text.get_zorder() > lines and text.get_bbox_patch().get_facecolor()[:3] == (1.0, 1.0, 1.0)


def test_the_bars_need_the_schedule_the_prediction_used():
    with pytest.raises(ValueError, match="keep_timeline=True"):
        stage_bars(predict(_job()))


def test_the_timeline_holds_every_task_of_the_schedule_and_ends_with_the_iteration():
    pred = predict(_job(schedule="interleaved", vpp=2), keep_timeline=True)
    bars = timeline_bars(pred)
    m, pp, v = pred.job.parallel.num_microbatches, 4, 2
    assert sum(b.kind == "forward" for b in bars) == m * pp * v
    assert sum(b.kind == "backward" for b in bars) == m * pp * v
    assert sum(b.kind == "optimizer" for b in bars) == pp
    assert max(b.end for b in bars) == pytest.approx(pred.iteration_s, rel=1e-9)


@pytest.mark.parametrize(("schedule", "chunks"), [("zb-h1", 1), ("zb-v", 2)])
def test_a_zero_bubble_timeline_draws_each_weight_gradient_pass_apart(schedule, chunks):
    pred = predict(_job(schedule=schedule, framework="fsdp", zero_stage=1), keep_timeline=True)
    bars = timeline_bars(pred)
    tasks = pred.job.parallel.num_microbatches * 4 * chunks
    assert sum(b.kind == "forward" for b in bars) == tasks
    assert sum(b.kind == "backward" for b in bars) == tasks
    assert sum(b.kind == "weight" for b in bars) == tasks


# --- paraplan predict --plot ----------------------------------------------------------------

def _run(*args):
    from typer.testing import CliRunner

    from paraplan.cli.app import app

    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def test_predict_draws_the_breakdown_and_the_timeline_named_by_their_file_names(tmp_path):
    result = _run("predict", "--plot", str(tmp_path / "breakdown.png"), "--plot", str(tmp_path / "run-timeline.svg"),
                  "--format", "json")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "breakdown.png").read_bytes()[:8] == PNG
    assert (tmp_path / "run-timeline.svg").read_text().startswith("<?xml")
    assert '"iteration_s"' in result.stdout


def test_a_plot_file_naming_no_kind_draws_all_three_pictures_beside_it(tmp_path):
    result = _run("predict", "--plot", str(tmp_path / "out.png"))
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "out.png").exists()
    for kind in ("breakdown", "timeline", "memory"):
        assert (tmp_path / f"out-{kind}.png").read_bytes()[:8] == PNG
        assert f"wrote {kind} picture to" in result.stderr


def test_plot_kind_names_the_picture_when_the_file_name_does_not(tmp_path):
    assert _run("predict", "--plot", str(tmp_path / "a.png"), "--plot-kind", "memory").exit_code == 0
    assert (tmp_path / "a.png").read_bytes()[:8] == PNG


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--plot", "{tmp}/memory-breakdown.png"], "names breakdown and memory; name one plot kind"),
        (["--plot", "{tmp}/old.png"], "old-breakdown.png: already exists"),
        (["--plot", "{tmp}/breakdown.txt"], "a plot file name ends in .png, .svg, .pdf"),
        (["--plot", "{tmp}/nowhere/breakdown.png"], "does not exist"),
        (["--plot", "{tmp}/old-breakdown.png"], "already exists (pass --force to replace it)"),
        (["--plot", "{tmp}/a.png", "--plot", "{tmp}/b.png", "--plot-kind", "memory"], "--plot-kind"),
        (["--plot", "{tmp}/a.png", "--plot-kind", "pie"], "unknown kind 'pie'"),
    ],
)
def test_predict_checks_its_plot_files_before_predicting(tmp_path, monkeypatch, args, message):
    import paraplan.prediction

    def never(*a, **k):
        raise AssertionError("predicted before checking the plot files")

    monkeypatch.setattr(paraplan.prediction, "predict", never)
    (tmp_path / "old-breakdown.png").write_bytes(b"mine")
    result = _run("predict", *[a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert (tmp_path / "old-breakdown.png").read_bytes() == b"mine"


def test_force_replaces_an_existing_picture(tmp_path):
    (tmp_path / "breakdown.png").write_bytes(b"mine")
    assert _run("predict", "--plot", str(tmp_path / "breakdown.png"), "--force").exit_code == 0
    assert (tmp_path / "breakdown.png").read_bytes()[:8] == PNG


def test_without_matplotlib_a_picture_is_a_one_line_error_naming_the_extra(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    result = _run("predict", "--plot", str(tmp_path / "breakdown.png"))
    assert result.exit_code == 2
    assert "pip install 'paraplan[plot]'" in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "breakdown.png").exists()


# --- the GEMM table and paraplan report ----------------------------------------------------

def test_each_gemm_row_carries_the_inventory_shape_and_its_flops():
    from paraplan.report.gemms import gemm_rows

    rows = gemm_rows(predict(_job()))
    assert [r.operator for r in rows] == ["linear1", "linear2", "linear3", "linear4"]
    for r in rows:
        assert r.flops == pytest.approx(2.0 * r.batch * r.m * r.n * r.k)
    qkv = rows[0]  # llama-3-8b at tp=4: 1 x 4096 tokens, (32 + 2 * 8) heads of 128 over 4 ranks
    assert (qkv.m, qkv.k, qkv.n) == (8192, 4096, (32 + 16) * 128 // 4)


def test_the_unfused_attention_core_lists_its_batched_matmuls():
    from paraplan.report.gemms import gemm_rows

    job = resolve_job({"model": {"name": "gpt3-1.3b", "attention": "unfused"}, "cluster": {"name": "dgx-a100"},
                       "parallel": {"tp": 2, "micro_batch_size": 2, "global_batch_size": 16}})
    rows = {r.operator: r for r in gemm_rows(predict(job))}
    scores, context = rows["baddbmm"], rows["bmm"]
    # gpt3-1.3b: 24 heads of 128, sequence 2048; micro-batch 2, 12 heads per rank at tp=2
    assert scores.batch == 2 * 24 // 2 and (scores.m, scores.k, scores.n) == (2048, 128, 2048)
    assert (context.m, context.k, context.n) == (2048, 2048, 128)
    assert scores.flops == pytest.approx(2.0 * scores.batch * 2048 * 128 * 2048)


def test_the_gemm_csv_gives_every_pass_its_matrix_dimensions():
    from paraplan.report.gemms import render_gemms_csv

    lines = render_gemms_csv(predict(_job())).splitlines()
    assert lines[0] == "operator,pass,batch,M,K,N,flops"
    assert lines[1:4] == [
        "linear1,fwd,1,8192,4096,1536,103079215104",
        "linear1,bwd_input,1,8192,1536,4096,103079215104",
        "linear1,bwd_weight,1,4096,8192,1536,103079215104",
    ]
    assert len(lines) == 1 + 4 * 3


def test_report_writes_one_self_contained_html_page_and_the_gemm_csv(tmp_path):
    import re
    from html.parser import HTMLParser

    result = _run("report", "-o", str(tmp_path / "r.html"), "--gemms", str(tmp_path / "g.csv"))
    assert result.exit_code == 0, result.output
    page = (tmp_path / "r.html").read_text()
    HTMLParser().feed(page)  # parses
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    for section in ("Where one iteration goes", "Pipeline schedule", "Memory per GPU", "Operators of one layer",
                    "GEMMs of one layer", "linear3"):
        assert section in page
    images = re.findall(r'<img[^>]* src="([^"]*)"', page)
    assert len(images) == 3 and all(src.startswith("data:image/png;base64,") for src in images)
    text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]*", "", page)
    assert not re.search(r"https?:|//|<script|<link|<iframe|url\(|@import", text, re.IGNORECASE)
    assert (tmp_path / "g.csv").read_text().startswith("operator,pass,batch,M,K,N,flops\n")


def test_the_report_is_headed_by_the_job_files_name_and_says_its_token_budget_in_words(tmp_path):
    job = tmp_path / "llama-8b-two-nodes.yaml"  # a job file that names itself nothing
    job.write_text("model: llama-3-8b\ncluster: {name: dgx-h100, num_nodes: 2}\nparallel: {tp: 2}\ntrain_tokens: 1T\n")
    result = _run("report", str(job), "-o", str(tmp_path / "r.html"))
    assert result.exit_code == 0, result.output
    page = (tmp_path / "r.html").read_text()
    assert "<h1>llama-8b-two-nodes: llama-3-8b on 16 x H100-SXM5-80GB</h1>" in page
    assert "time to train 1T tokens (1,000,000,000,000)" in page
    assert "Job job" not in page and "1e+12" not in page


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-o", "{tmp}/old.html"], "old.html: already exists (pass --force to replace it)"),
        (["-o", "{tmp}/r.htm"], "a report file name ends in .html"),
        (["-o", "{tmp}/nowhere/r.html"], "does not exist"),
        (["-o", "{tmp}/r.html", "--gemms", "{tmp}/old.csv"], "old.csv: already exists"),
        (["-o", "{tmp}/r.html", "--gemms", "{tmp}/g.txt"], "a GEMM file name ends in .csv"),
    ],
)
def test_report_checks_its_outputs_before_predicting(tmp_path, monkeypatch, args, message):
    import paraplan.prediction

    def never(*a, **k):
        raise AssertionError("predicted before checking the outputs")

    monkeypatch.setattr(paraplan.prediction, "predict", never)
    (tmp_path / "old.html").write_text("mine")
    (tmp_path / "old.csv").write_text("mine")
    result = _run("report", *[a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert (tmp_path / "old.html").read_text() == "mine" and (tmp_path / "old.csv").read_text() == "mine"


def test_report_with_force_replaces_the_page(tmp_path):
    (tmp_path / "r.html").write_text("mine")
    assert _run("report", "-o", str(tmp_path / "r.html"), "--force").exit_code == 0
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")


# --- learning curves as small multiples -----------------------------------------------------

def _fit_keys():
    ops = [f"op/{gpu}/fp16/{name}/{d}" for gpu in ("A100", "GH200")
           for name in ("linear1", "linear2", "flash_atten", "softmax") for d in ("fwd", "bwd")]
    return ops + [f"collective/perlmutter/{k}/{w}" for k in ("all_reduce", "all_gather") for w in ("intra", "inter")]


def test_learning_curves_get_one_panel_per_operator_and_per_collective_kind():
    from paraplan.report.learning_curves import curve_panels

    panels = curve_panels(_fit_keys())
    assert list(panels) == ["linear1", "linear2", "flash_atten", "softmax", "all_reduce (collective)",
                            "all_gather (collective)"]
    assert sorted(k for lines in panels.values() for k, _ in lines) == sorted(_fit_keys())
    assert [label for _, label in panels["linear1"]] == ["A100 fwd", "A100 bwd", "GH200 fwd", "GH200 bwd"]
    assert [label for _, label in panels["all_reduce (collective)"]] == ["intra", "inter"]


def test_the_learning_curve_plot_of_many_regressors_is_a_png(tmp_path):
    from paraplan.report.learning_curves import plot_learning_curves

    rows = [(0.1, 20, 0.3), (0.25, 50, 0.2), (0.5, 100, 0.1), (1.0, 200, 0.05)]
    out = plot_learning_curves({k: rows for k in _fit_keys()}, tmp_path / "curves.png")
    assert out.read_bytes()[:8] == PNG


def test_fit_without_matplotlib_stops_before_fitting_when_asked_for_learning_curves(tmp_path, monkeypatch):
    import sys

    import paraplan.costmodel.fitting

    def never(*a, **k):
        raise AssertionError("fitted before finding matplotlib missing")

    monkeypatch.setattr(paraplan.costmodel.fitting, "fit_models", never)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    (tmp_path / "a.samples").write_bytes(b"")
    result = _run("fit", str(tmp_path / "a.samples"), "--out", str(tmp_path / "a.models"),
                  "--learning-curves", str(tmp_path / "c.png"))
    assert result.exit_code == 2
    assert "pip install 'paraplan[plot]'" in result.output


def test_the_timeline_draws_what_each_task_waits_for_communication():
    slow = resolve_job({"model": "llama-3-8b",
                        "cluster": {"name": "aws-p5.48xlarge", "num_nodes": 4,
                                    "inter_node": {"bandwidth": "10 Gb/s", "latency": "20 us"}},
                        "parallel": {"tp": 1, "micro_batch_size": 2, "global_batch_size": 512, "zero_stage": 3,
                                     "recompute": "full", "framework": "fsdp"}})
    pred = predict(slow, keep_timeline=True)
    waits = [dict(b.waits) for b in timeline_bars(pred) if b.microbatch is not None]
    m = pred.job.parallel.num_microbatches
    gathers = sum(w.get("dp_communication_s", 0.0) for w in waits)
    t = pred.stages[0]
    assert gathers == pytest.approx(m * (t.zero_fwd_mb_s + t.zero_bwd_mb_s), rel=1e-9)
    assert gathers > 0.5 * pred.iteration_s


@pytest.mark.parametrize("plan", PLANS[:4])
def test_a_tasks_blocking_send_is_drawn_as_pipeline_p2p(plan):
    # the timeline draws what each task holds its stage for (its blocking send), the schedule's
    # busy time beyond the passes; the stage bars what the sends cost the stage's finish
    pred = predict(_job(**plan), keep_timeline=True)
    bars = timeline_bars(pred)
    m = pred.job.parallel.num_microbatches
    for stage, timing in enumerate(pred.stages):
        drawn = sum(dict(b.waits).get("pipeline_p2p_s", 0.0) for b in bars if b.stage == stage)
        held = pred.pipeline.busy[stage] - m * timing.busy_mb_s
        assert drawn == pytest.approx(held, rel=1e-6, abs=1e-9)
        assert drawn > 0
