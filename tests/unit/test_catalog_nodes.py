"""Every GPU of the catalog has a reference node, and AMD's 2024-25 Instinct parts (MI325X,
MI355X) with their 8-GPU Infinity Fabric platforms are in it: GEMM and collective curves fitted
to XLA's gfx942 / gfx950 tables, everything else said to be a guess."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from paraplan import predict
from paraplan.catalog import load_cluster, load_gpu
from paraplan.catalog.jobs import apply_overrides, resolve_job
from paraplan.catalog.loader import catalog_names, load_catalog_entry
from paraplan.cli.app import app
from paraplan.costmodel import estimate_collective_s
from paraplan.inventory import Collective, CollectiveKind, GroupLayout, ParallelDim
from paraplan.specs import Phase

runner = CliRunner()

NEW_GPUS = ("MI325X", "MI355X")
NEW_NODES = ("amd-mi325x-platform", "crusoe-mi355x", "aws-g6e.48xlarge", "azure-nc-a100-v4",
             "oci-bm-gpu-a10.4", "lambda-1x-h100-pcie", "hpe-cray-ex235a")


def _fitting_extras() -> None:
    pytest.importorskip("scipy")
    pytest.importorskip("pandas")


INSTINCT_NODES = {"MI300X": "azure-nd-mi300x-v5", "MI325X": "amd-mi325x-platform", "MI355X": "crusoe-mi355x"}


@pytest.mark.parametrize("name", catalog_names("gpus"))
def test_every_catalog_gpu_names_a_reference_node_that_loads_with_that_gpu(name):
    gpu = load_gpu(name)
    assert gpu.reference_node is not None, f"{name} has no reference node"
    assert load_cluster(gpu.reference_node).gpu.name == gpu.name


@pytest.mark.parametrize("name", NEW_GPUS)
def test_each_new_instinct_gpu_cites_a_source_for_every_number(name):
    gpu = load_gpu(name)
    for field in ("peak_flops", "hbm_bytes", "hbm_bandwidth", "intra_node", "host_link"):
        assert gpu.sources.get(field, "").strip(), f"{name}: no source for {field}"
    assert gpu.vendor == "AMD"


@pytest.mark.parametrize("name", NEW_NODES)
def test_each_new_node_cites_its_gpu_its_links_and_its_host(name):
    cited = load_catalog_entry("clusters", name)["sources"]
    assert {"gpu", "intra_node", "price_per_gpu_hour"} <= set(cited)
    cluster = load_cluster(name)
    if cluster.inter_node is not None:
        assert "inter_node" in cited
        assert cluster.inter_node.bandwidth_bytes_per_s < cluster.intra_node.bandwidth_bytes_per_s
    if cluster.host is not None and cluster.host.memory_bytes is not None:
        assert "host_memory" in cited


def test_the_mi325x_is_an_mi300x_with_more_and_faster_memory():
    mi300x, mi325x = load_gpu("MI300X"), load_gpu("MI325X")
    assert mi325x.peak_flops == mi300x.peak_flops
    assert (mi325x.hbm_bytes / 2**30, mi325x.hbm_bandwidth_bytes_per_s) == (256, 6000e9)
    assert mi325x.intra_node.bandwidth_bytes_per_s == mi300x.intra_node.bandwidth_bytes_per_s == 448e9


def test_the_mi355x_peaks_are_256_cdna4_compute_units_at_2_4_ghz():
    mi355x = load_gpu("MI355X")
    fp8 = 256 * 8192 * 2.4e9  # CUs x FP8 FLOPs per CU per clock (ISSCC 2026) x peak clock
    assert mi355x.peak_flops["fp8"] == pytest.approx(fp8, rel=1e-4)
    assert mi355x.peak_flops["bf16"] == pytest.approx(fp8 / 2, rel=1e-4)
    # the same rule gives the MI300X datasheet's figure: 304 CUs x 4096 x 2.1 GHz
    assert load_gpu("MI300X").peak_flops["fp8"] == pytest.approx(304 * 4096 * 2.1e9, rel=1e-4)
    assert mi355x.intra_node.bandwidth_bytes_per_s == pytest.approx(7 * 76.8e9)


@pytest.mark.parametrize(("gpu", "node"), sorted(INSTINCT_NODES.items()))
def test_an_instinct_node_is_eight_gpus_on_a_fully_connected_mesh_with_measured_collectives(gpu, node):
    cluster = load_cluster(node)
    assert (cluster.gpu.name, cluster.gpus_per_node, cluster.intra_node.topology) == (gpu, 8, "mesh")
    curves = cluster.intra_node.collectives
    assert set(curves) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}
    assert cluster.intra_node.source and "collective-table" in cluster.intra_node.source
    # one send/recv of a pair reaches at most its one direct link
    assert curves["send_recv"].bus_bytes_per_s[2] < cluster.intra_node.bandwidth_bytes_per_s / 7
    # a direct-link mesh: a pair of GPUs reaches one link, all eight reach most of the seven
    bus = curves["all_reduce"].bus_bytes_per_s
    link = cluster.intra_node.bandwidth_bytes_per_s
    assert bus[2] < link / 7 < bus[4] < bus[8] < link


def test_a_pair_of_mi355x_all_reduces_over_one_infinity_fabric_link_not_the_gpus_whole_bandwidth():
    cluster = load_cluster("crusoe-mi355x")
    size = 256 * 2**20
    pair = estimate_collective_s(Collective("c", CollectiveKind.ALL_REDUCE, ParallelDim.TP, size, Phase.FWD),
                                 GroupLayout(2, 1, 2), cluster)
    eight = estimate_collective_s(Collective("c", CollectiveKind.ALL_REDUCE, ParallelDim.TP, size, Phase.FWD),
                                  GroupLayout(8, 1, 8), cluster)
    # bus bytes: size on 2 GPUs, 1.75 x size on 8; a pair gets ~70 GB/s, eight ~390 GB/s
    assert 3.0 < (pair / 1.0) / (eight / 1.75) < 8.0


@pytest.mark.parametrize("gpu", NEW_GPUS)
def test_a_job_naming_only_an_instinct_gpu_predicts_on_its_node_and_says_what_is_a_guess(gpu):
    job = resolve_job(apply_overrides({"model": "llama-3-8b", "parallel": {"tp": 2}}, {"gpu": gpu}))
    assert job.cluster.name == INSTINCT_NODES[gpu] and job.cluster.gpus_per_node == 8
    result = predict(job)
    assert result.iteration_s > 0
    notes = " ".join(result.uncalibrated)
    assert f"{gpu}: no measured curve for memory-bound kernels" in notes
    assert f"{gpu}: no measured curve for bf16 attention kernels" in notes
    assert "no measured curve for bf16 gemm" not in notes  # XLA's table measured it
    assert "intra-node collectives at a generic" not in notes
    if gpu == "MI325X":
        assert "MI325X: bf16 gemm kernels timed with curves measured on MI300X" in notes


def test_the_mi355x_runs_llama_3_8b_faster_than_the_mi300x_on_the_same_plan():
    plan = {"model": "llama-3-8b", "parallel": {"tp": 2}}
    mi300x = predict(resolve_job(apply_overrides(plan, {"gpu": "MI300X"})))
    mi355x = predict(resolve_job(apply_overrides(plan, {"gpu": "MI355X"})))
    assert mi355x.iteration_s < 0.8 * mi300x.iteration_s


def test_predict_on_the_mi355x_prints_its_node_and_its_uncalibrated_kernels_at_80_columns():
    result = runner.invoke(app, ["predict", "--model", "llama-3-8b", "--gpu", "MI355X"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "8 x MI355X (crusoe-mi355x)" in result.stdout
    assert "uncalibrated: MI355X: no measured curve for memory-bound kernels" in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 80


@pytest.mark.parametrize("kind", ["gpus", "clusters"])
def test_the_catalog_lists_the_new_hardware_whole_at_80_columns(kind):
    result = runner.invoke(app, ["catalog", kind], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    names = NEW_GPUS if kind == "gpus" else NEW_NODES
    assert all(name in result.stdout for name in names)


@pytest.mark.parametrize(("gpu", "key", "dtype", "precision"), [
    ("MI300X", "gfx942", "bf16xbf16->bf16", None),
    ("MI300X", "gfx942", "f8e4m3fnuzxf8e4m3fnuz->bf16", "fp8"),
    ("MI355X", "gfx950", "bf16xbf16->bf16", None),
    ("MI355X", "gfx950", "f8e4m3fnxf8e4m3fn->bf16", "fp8"),
])
def test_the_instinct_gemm_curves_are_what_the_gemm_table_command_fits(gpu, key, dtype, precision, xla_tables_dir):
    _fitting_extras()
    result = runner.invoke(app, ["calibrate", "gemm-table", str(xla_tables_dir / "matmul.csv"), "--gpu-key", key,
                                 "--gpu", gpu, "--dtype", dtype], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    eff = load_gpu(gpu).efficiency
    curve = eff.precisions[precision].gemm if precision else eff.gemm
    assert f"gemm: {{max_fraction: {curve.max_fraction:.4f}, half_work: {curve.half_work:.3g}}}" in result.stdout


def test_xla_rows_above_the_mi355x_dense_fp8_peak_are_refused(xla_tables_dir):
    _fitting_extras()
    result = runner.invoke(app, ["calibrate", "gemm-table", str(xla_tables_dir / "matmul.csv"), "--gpu-key", "gfx950",
                                 "--gpu", "MI355X", "--dtype", "f8e5m2xf8e4m3fn->bf16"], env={"COLUMNS": "80"})
    assert result.exit_code == 2
    assert "above MI355X's dense fp8 peak" in result.output
    assert "rejected as impossible" in load_gpu("MI355X").efficiency.precisions["fp8"].source


@pytest.mark.parametrize(("key", "node"), [("gfx942", "azure-nd-mi300x-v5"), ("gfx950", "crusoe-mi355x")])
def test_the_instinct_collective_curves_are_what_the_collective_table_command_fits(key, node, xla_tables_dir):
    _fitting_extras()
    result = runner.invoke(app, ["calibrate", "collective-table", str(xla_tables_dir / "collectives.csv"),
                                 "--gpu-key", key, "--cluster", node, "--min-mib", "32"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    curves = load_cluster(node).intra_node.collectives
    for kind, curve in curves.items():
        bus = ", ".join(f"{n}: {b / 1e9:.0f} GB/s" for n, b in sorted(curve.bus_bytes_per_s.items()))
        small = ", ".join(f"{n}: {t * 1e6:.1f} us" for n, t in sorted(curve.small_s.items()))
        points = ", ".join(f"{n}: {{" + ", ".join(f"{size}: {t * 1e6:.4g} us" for size, t in by_size.items()) + "}"
                           for n, by_size in curve.points.items())
        points = f", points: {{{points}}}" if points else ""
        assert curve.points, kind  # every kind keeps its measured times
        assert (f"{kind}: {{bus_bytes_per_s: {{{bus}}}, half_bytes: {curve.half_bytes:.3g}, "
                f"fit_bytes: {curve.fit_bytes:.0f}, small_s: {{{small}}}{points}}}") in result.stdout.replace("\n", "")


def test_an_instinct_gpu_named_on_another_instinct_node_gets_its_own_fabric_or_the_same_one():
    # an MI355X on MI300X's VM: its own 7 x 76.8 GB/s mesh and gfx950 curves, never the node's
    mi355x = load_cluster("azure-nd-mi300x-v5", gpu="MI355X")
    assert mi355x.intra_node.bandwidth_bytes_per_s == load_gpu("MI355X").intra_node.bandwidth_bytes_per_s
    assert mi355x.intra_node.collectives == load_gpu("MI355X").intra_node.collectives
    assert "MI355X's own intra-node link" in mi355x.name
    # an MI325X there: the same Infinity Fabric platform, so the node's measured link stays
    mi325x = load_cluster("azure-nd-mi300x-v5", gpu="MI325X")
    assert mi325x.intra_node == load_cluster("azure-nd-mi300x-v5").intra_node
    # on an NVSwitch node an Instinct GPU still gets its direct-link mesh
    assert load_cluster("dgx-h100", gpu="MI355X").intra_node.topology == "mesh"
