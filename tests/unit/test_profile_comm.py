"""paraplan's collective sampler, run in 2-4 gloo processes on this CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from comm_workers import spawn, sweep_killed, sweep_logging_points, sweep_recording_buffers, sweep_slow_rank
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.inventory import CollectiveKind
from paraplan.profile.comm import CommConfig, parse_args
from paraplan.profile.comm_timing import TimingSettings
from paraplan.profile.launch import sbatch_script, torchrun_command
from paraplan.profile.records import journal_path
from paraplan.profile.sweep import Layout, auto_layouts, parse_layouts, sweep_points, sweep_sizes
from paraplan.report.profile_comm import comm_summary_rows, render_comm_summary
from paraplan.samples import load_samples, validate_samples
from paraplan.samples.schema import COLLECTIVE_NAMES
from paraplan.specs import ConfigError, Precision
from readable import assert_readable

pytest.importorskip("torch.distributed")
runner = CliRunner()
TINY_CLUSTER = Path(__file__).parents[2] / "examples" / "tiny-cpu" / "cluster.yaml"
FAST = TimingSettings(warmup=1, repeats=2, iters=1)


def _config(tmp_path, **kw) -> CommConfig:
    settings = {"out": tmp_path / "net.samples", "min_bytes": 1024, "max_bytes": 16384, "factor": 4.0,
                "timing": FAST, **kw}
    return CommConfig(**settings)


# -- the sweep (no processes) ------------------------------------------------------------------

def test_sizes_layouts_and_points():
    assert sweep_sizes(1024, 65536, 4) == [1024, 4096, 16384, 65536]
    assert sweep_sizes(1000, 1000, 2) == [1000]
    with pytest.raises(ConfigError, match="factor"):
        sweep_sizes(1, 10, 1.0)
    assert auto_layouts(1, 8) == [Layout(1, 2), Layout(1, 4), Layout(1, 8)]
    assert auto_layouts(2, 8) == [Layout(1, 2), Layout(1, 4), Layout(1, 8), Layout(2, 1), Layout(2, 8)]
    assert Layout(2, 2).ranks(4) == [0, 1, 4, 5]  # torchrun: rank = node * LOCAL_WORLD_SIZE + local rank
    assert parse_layouts("2x1, 1x4", 2, 4) == [Layout(1, 4), Layout(2, 1)]
    with pytest.raises(ConfigError, match="3x1"):
        parse_layouts("3x1", 2, 4)
    points = sweep_points(list(CollectiveKind), [Layout(1, 2), Layout(1, 3)], Precision.BF16, [1000])
    # send/recv only on two ranks; sizes rounded up to whole elements per rank where split
    assert {(p.kind.value, p.layout.size) for p in points if p.kind is CollectiveKind.SEND_RECV} == {("send_recv", 2)}
    gather3 = next(p for p in points if p.kind is CollectiveKind.ALL_GATHER and p.layout.size == 3)
    assert gather3.bytes == 1002 and gather3.bytes % (3 * 2) == 0
    assert next(p for p in points if p.kind is CollectiveKind.ALL_REDUCE).bytes == 1000


def test_every_collective_is_a_schema_name():
    assert {k.value for k in CollectiveKind} <= set(COLLECTIVE_NAMES)
    assert {"all_to_all", "broadcast"} <= set(COLLECTIVE_NAMES)


def test_command_line_of_the_module(tmp_path):
    config = parse_args(["--out", str(tmp_path / "x"), "--max-bytes", "1 MiB", "--collectives", "all_reduce,broadcast",
                         "--cluster-name", "dgx-a100", "--repeats", "3"])
    assert config.max_bytes == 2**20 and config.kinds == (CollectiveKind.ALL_REDUCE, CollectiveKind.BROADCAST)
    assert config.cluster == "dgx-a100" and config.timing.repeats == 3


# -- several processes ---------------------------------------------------------------------------

@pytest.mark.slow
def test_four_processes_on_two_emulated_nodes(tmp_path):
    """Rows valid for every collective and group; all-gather bytes = its TOTAL output,
    reduce-scatter bytes = its input (the buffers the processes really passed)."""
    config = _config(tmp_path)
    spawn(sweep_recording_buffers, 4, config, tmp_path / "calls", local_world=2)
    frame = load_samples(config.out)
    validate_samples(frame)
    assert set(frame["name"]) == {k.value for k in CollectiveKind}
    layouts = {(r.name, r.nodes, r.gpus_per_node) for r in frame.itertuples()}
    assert {(n, 1, 2) for n in ("all_reduce", "all_gather", "broadcast", "send_recv")} <= layouts
    assert {("all_reduce", 2, 1), ("all_reduce", 2, 2), ("send_recv", 2, 1)} <= layouts
    assert ("send_recv", 2, 2) not in layouts
    assert (frame["device"] == "cpu-core").all() and (frame["dtype"] == "fp32").all()
    assert len(frame) == len(set(zip(frame["name"], frame["nodes"], frame["gpus_per_node"], frame["bytes"], strict=True)))
    calls = json.loads((tmp_path / "calls.0").read_text())
    gathers = {(c["out"], c["in"]) for c in calls if "gather" in c["call"]}
    scatters = {(c["in"], c["out"]) for c in calls if "scatter" in c["call"]}
    for name, seen in (("all_gather", gathers), ("reduce_scatter", scatters)):
        rows = frame[frame["name"] == name]  # rank 0 is in every group
        want = {(int(r.bytes), int(r.bytes) // (r.nodes * r.gpus_per_node)) for r in rows.itertuples()}
        assert want == seen, name
    meta = frame.attrs["samples_metadata"]
    assert meta["importer"] == "paraplan.profile.comm" and meta["world_size"] == 4 and meta["backend"] == "gloo"
    table = render_comm_summary(comm_summary_rows(frame), "net.samples")
    assert_readable(table)


@pytest.mark.slow
def test_the_slowest_rank_is_recorded(tmp_path):
    """Rank 1 sleeps 50 ms inside each timed region after its call: rank 0, which writes,
    records rank 1's time."""
    config = _config(tmp_path, kinds=(CollectiveKind.ALL_REDUCE,), max_bytes=1024)
    spawn(sweep_slow_rank, 2, config)
    frame = load_samples(config.out)
    assert len(frame) == 1 and frame["time_s"].iloc[0] >= 0.05
    entry = json.loads(journal_path(config.out).read_text().splitlines()[1])
    assert min(entry["extra"]["repeats_s"]) >= 0.05


@pytest.mark.slow
def test_a_killed_sweep_resumes_where_it_stopped(tmp_path):
    config = _config(tmp_path, kinds=(CollectiveKind.ALL_REDUCE, CollectiveKind.BROADCAST), max_bytes=65536)
    total = 8
    from torch.multiprocessing import ProcessExitedException

    with pytest.raises(ProcessExitedException):  # every process exits with 9 at the 4th point
        spawn(sweep_killed, 2, config, 3)
    assert not config.out.exists()
    journal = journal_path(config.out).read_text().splitlines()
    done = [json.loads(line)["key"] for line in journal[1:]]
    assert len(done) == 3
    spawn(sweep_logging_points, 2, config, tmp_path / "timed")
    for rank in (0, 1):
        timed = json.loads((tmp_path / f"timed.{rank}").read_text())
        assert len(timed) == total - 3 and not set(timed) & set(done)
    frame = load_samples(config.out)
    assert len(frame) == total
    assert len(set(zip(frame["name"], frame["bytes"], strict=True))) == total


# -- launchers and the command ---------------------------------------------------------------

def test_sbatch_script_and_torchrun_command():
    args = ["--out", "/shared/net.samples", "--cluster-name", "my cluster"]
    text = sbatch_script(2, 8, args, partition="gpu")
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --partition=gpu", "set -euo pipefail",
                 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'):
        assert line in lines
    assert "srun --ntasks-per-node=1 torchrun \\" in lines
    assert '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"' in text and "--nproc-per-node=8" in text
    assert "-m paraplan.profile.comm" in text and "'my cluster'" in text
    body = text.split("srun", 1)[1]
    assert all(line.endswith("\\") for line in body.splitlines()[:-1])  # one command, continued
    assert "--gpus-per-node" not in sbatch_script(2, 8, args, gpus=False)
    cmd = torchrun_command(2, 8, args, "node0")
    assert cmd[:3] == ["torchrun", "--nnodes=2", "--nproc-per-node=8"] and "--rdzv-endpoint=node0:29500" in cmd


def test_cli_slurm_and_errors(tmp_path):
    out = tmp_path / "net.samples"
    result = runner.invoke(app, ["profile", "comm", "--out", str(out), "--launcher", "slurm", "--nnodes", "2",
                                 "--nproc-per-node", "8", "--cluster-name", "dgx-h100"])
    assert result.exit_code == 0, result.output
    script = tmp_path / "net.samples.sbatch"
    assert f"sbatch {script}" in result.stdout and f"--out {out.resolve()}" in script.read_text()
    again = runner.invoke(app, ["profile", "comm", "--out", str(out), "--launcher", "slurm"])
    assert again.exit_code == 2 and "--force" in again.output
    out.write_bytes(b"")
    for argv, message in (
        ([], "already exists (pass --force to replace it)"),
        (["--force", "--nnodes", "2"], "--launcher local runs on this machine"),
        (["--force", "--layouts", "4x1"], "layout '4x1'"),
        (["--force", "--collectives", "all_reduce,gossip"], "--collectives"),
        (["--force", "--max-bytes", "lots"], "lots"),
    ):
        result = runner.invoke(app, ["profile", "comm", "--out", str(out), *argv])
        assert result.exit_code == 2, (argv, result.output)
        assert message in result.output and len(result.output.strip().splitlines()) == 1
    result = runner.invoke(app, ["profile", "comm", "--out", str(tmp_path / "n2"), "--launcher", "torchrun",
                                 "--nnodes", "2", "--nproc-per-node", "4", "--master-addr", "node0"])
    assert result.exit_code == 0 and result.stdout.startswith("torchrun --nnodes=2 --nproc-per-node=4")


@pytest.mark.slow
def test_cli_local_run_then_fit_with_operator_samples(tmp_path):
    """`paraplan profile comm` runs 2 gloo processes here; `paraplan fit --quick` reads its
    file with an operator samples file of the same machine (cpu-core, examples/tiny-cpu)."""
    out = tmp_path / "net.samples"
    result = runner.invoke(app, ["profile", "comm", "--out", str(out), "--max-bytes", "512 KiB", "--factor", "2",
                                 "--cluster-name", "tiny-cpu-gloo", "--repeats", "2", "--iters", "2",
                                 "--warmup", "1"])
    assert result.exit_code == 0, result.output
    assert "all_to_all" in result.stdout and "busbw" in result.stdout
    assert set(load_samples(out)["device"]) == {"cpu-core"}
    grid = tmp_path / "grid.yaml"
    grid.write_text("gelu: {mp: [1, 2], b: [1, 2, 4], l: [16, 32], dim: [32, 64]}\n")
    ops = tmp_path / "cpu.samples"
    made = runner.invoke(app, ["profile", "ops", "--grid", str(grid), "--out", str(ops), "--format", "json"])
    assert made.exit_code == 0, made.output
    models = tmp_path / "cpu.models"
    fit = runner.invoke(app, ["fit", str(ops), str(out), "--out", str(models), "--quick", "--format", "json",
                              "--cluster", str(TINY_CLUSTER)])
    assert fit.exit_code == 0, fit.output
    keys = {m["key"] for m in json.loads(fit.stdout)["models"]}
    assert {f"collective/tiny-cpu-gloo/{k.value}/intra" for k in CollectiveKind} <= keys
    assert "op/cpu-core/fp32/gelu/fwd" in keys
