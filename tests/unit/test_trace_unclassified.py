"""`paraplan trace summarize` lists the kernels no rule of the kernel table names (class other)
with their time and share, most time first, names shortened at whole words to fit 80 columns;
nothing when every kernel has a class (as on HolisticTraceAnalysis's traces)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hta_traces import HTA, write_trace
from paraplan.cli.app import app
from paraplan.report.traces import render_trace_summary, short_kernel_name
from paraplan.traces.summary import summarize
from readable import assert_readable_text, render

runner = CliRunner()
LONG = ("void my_lab::fused_ops::(anonymous namespace)::my_very_special_fused_router_topk_kernel_"
        "bf16_128x256_32x3_warpspecialized_persistent<float, 4>(float*, int)")
KERNELS = [  # (name, microseconds): two calls of the first
    ("void my_lab::mystery_op_kernel<int>(int*)", 300), ("void my_lab::mystery_op_kernel<int>(int*)", 200),
    (LONG, 400), ("sm90_xmma_gemm_bf16bf16_bf16f32", 1000), ("histogram_kernel_v2", 100),
]


def _trace(tmp_path):
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0,
               "dur": 10}]
    ts = 20.0
    for c, (name, dur) in enumerate(KERNELS, start=1):
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": 1 + c, "dur": 1, "args": {"correlation": c}})
        events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
                       "args": {"correlation": c}})
        ts += dur
    return write_trace(events, tmp_path / "rank0.json.gz")


FUSED = "my_lab::fused_ops::my_very_special_fused_router_topk_kernel_bf16_128x256_32x3_warpspecialized_persistent"


def test_the_unclassified_kernels_are_listed_by_their_own_name_with_time_and_share(tmp_path):
    top = summarize([_trace(tmp_path)]).top_unclassified()
    assert [name for name, _, _ in top] == ["my_lab::mystery_op_kernel", FUSED, "histogram_kernel_v2"]
    assert [s for _, s, _ in top] == pytest.approx([500e-6, 400e-6, 100e-6])
    assert [share for _, _, share in top] == pytest.approx([0.25, 0.2, 0.05])  # of 2000 us of kernels


def test_at_most_five_are_listed(tmp_path):
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0,
               "dur": 10}]
    events += [{"ph": "X", "cat": "kernel", "name": f"mystery_{k}", "pid": 0, "tid": 7, "ts": 20 + 10 * k,
                "dur": 10 - k, "args": {}} for k in range(8)]
    top = summarize([write_trace(events, tmp_path / "rank0.json.gz")]).top_unclassified()
    assert [name for name, _, _ in top] == [f"mystery_{k}" for k in range(5)]


def test_the_table_lists_them_at_80_columns_with_every_number_whole(tmp_path):
    summary = summarize([_trace(tmp_path)])
    text = render(render_trace_summary(summary), 80)
    assert_readable_text(text, 80, ["0.50", "0.40", "0.10", "25.0 %", "20.0 %", "5.0 %"])
    assert "Unclassified kernels (class other), top 3" in text
    assert "my_lab::mystery_op_kernel" in text and "...::my_very_special" not in text
    shown = short_kernel_name(FUSED)
    assert shown in text and len(shown) <= 52 and shown.endswith("_persistent")


def test_json_holds_the_full_names(tmp_path):
    result = runner.invoke(app, ["trace", "summarize", str(_trace(tmp_path)), "--format", "json"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)["unclassified_kernels"]
    assert listed[1] == {"kernel": FUSED, "seconds": pytest.approx(400e-6), "share_of_kernel_time": pytest.approx(0.2)}


@pytest.mark.parametrize("name", [
    "at::native::elementwise_kernel",
    "ns_one::ns_two::ns_three::cutlass_80_tensorop_s1688gemm_128x256_32x3_nn_align4",
    "cutlass_80_tensorop_s1688gemm_128x256_32x3_nn_align4_and_some_more_words_1234567",
    "x" * 30 + "1234567890" * 3,
])
def test_a_shortened_name_fits_and_keeps_every_number_it_shows_whole(name):
    shown = short_kernel_name(name, 40)
    assert len(shown) <= 40
    for number in (n for n in shown.replace("...", " ").replace("_", " ").replace("x", " ").split() if n.isdigit()):
        assert number in name.replace("x", " ").replace("_", " ").split(), (number, shown)
    assert shown == name or "..." in shown


def test_a_name_that_fits_is_kept_whole():
    assert short_kernel_name("at::native::elementwise_kernel") == "at::native::elementwise_kernel"


def test_a_long_namespace_path_goes_first():
    assert short_kernel_name("aaaaaaaaaa::bbbbbbbbbb::gemm_kernel", 30) == "...::bbbbbbbbbb::gemm_kernel"


@pytest.mark.parametrize("name", ["A_vit128_sampled", "B_resnet_nccl_a100", "F_ns_resolution_v100"])
def test_hta_s_traces_have_no_unclassified_kernel_and_show_no_such_table(name):
    if not (HTA / name).is_dir():
        pytest.skip(f"../shared/data/traces/hta/{name} is not present")
    summary = summarize([HTA / name])
    assert summary.top_unclassified() == []
    assert "Unclassified kernels" not in render(render_trace_summary(summary), 80)
