"""Board power and block-scaled formats are catalog data with their sources (issue 27 audit):
a power cap on the 2026 GPUs scales their GEMMs instead of being ignored for want of a TDP,
and which block-scaled FP8 recipes a GPU runs is read from its ``block_scaled_formats``
(MI355X's CDNA 4 matrix cores read MXFP8), not from a list of Blackwell names."""

from __future__ import annotations

import pytest

from paraplan.catalog import catalog_names, load_cluster, load_gpu, resolve_job
from paraplan.costmodel import power_gaps
from paraplan.costmodel.roofline import sustained_gemm_factor
from paraplan.prediction import predict
from paraplan.specs import ClusterSpec, ConfigError

LLAMA = {"num_layers": 4, "hidden_size": 2048, "num_attention_heads": 16, "seq_length": 2048,
         "vocab_size": 32000, "ffn_hidden_size": 5632, "num_query_groups": 4}


def job(cluster: str, recipe: str | None = None):
    plan = {"tp": 1, "pp": 1, "dp": 8, "micro_batch_size": 1, "global_batch_size": 8}
    if recipe is not None:
        plan["fp8_recipe"] = recipe
    return resolve_job({"model": LLAMA, "cluster": {"name": cluster, "num_nodes": 1}, "parallel": plan,
                        "precision": "fp8"})


@pytest.mark.parametrize(("cluster", "watts"), [("gb200-nvl72", 1200), ("gb300-nvl72", 1400), ("hgx-h800", 700),
                                                ("amd-mi325x-platform", 1000), ("crusoe-mi355x", 1400),
                                                ("vista-gh200", 1000)])
def test_a_power_cap_on_a_2026_gpu_with_a_cited_board_power_slows_its_gemms_instead_of_being_ignored(cluster, watts):
    spec = load_cluster(cluster)
    assert spec.gpu.tdp_w == watts
    assert str(watts)[:2] in spec.gpu.sources["tdp_w"].replace(",", "")
    capped = ClusterSpec.model_validate({**spec.model_dump(), "power_cap_w": watts * 0.7})
    assert not any("no TDP" in n for n in power_gaps(capped))
    assert sustained_gemm_factor(capped) < sustained_gemm_factor(spec)


def test_b300_has_no_citable_board_power_so_a_cap_on_it_still_says_it_is_ignored():
    spec = load_cluster("dgx-b300")
    assert spec.gpu.tdp_w is None
    capped = ClusterSpec.model_validate({**spec.model_dump(), "power_cap_w": 800})
    assert any("ignored: no TDP for B300" in n for n in power_gaps(capped))


def test_every_gpu_stating_block_scaled_formats_cites_a_source_for_them():
    for name in catalog_names("gpus"):
        gpu = load_gpu(name)
        if gpu.block_scaled_formats:
            assert gpu.sources.get("block_scaled_formats"), name


def test_mi355x_runs_the_mxfp8_recipe_at_its_fp8_peak_and_refuses_nvfp4_naming_its_catalog_formats():
    gpu = load_gpu("MI355X")
    assert "mxfp8" in gpu.block_scaled_formats and "nvfp4" not in gpu.block_scaled_formats
    mx, delayed = predict(job("crusoe-mi355x", "mxfp8")), predict(job("crusoe-mi355x", "delayed"))
    assert delayed.iteration_s < mx.iteration_s < 1.2 * delayed.iteration_s  # the scale bytes, same peak
    with pytest.raises(ConfigError, match=r"^parallel\.fp8_recipe: nvfp4 needs .*MI355X .*mxfp8, mxfp6, mxfp4"
                                          r".*choose delayed \| current \| rowwise \| mxfp8$"):
        job("crusoe-mi355x", "nvfp4")


def test_the_mxfp8_refusal_reads_the_gpus_catalog_formats_and_names_no_hard_coded_gpu_list():
    with pytest.raises(ConfigError) as err:
        job("dgx-h100", "mxfp8")
    text = str(err.value)
    assert "H100-SXM5-80GB has block-scaled formats in the catalog: none" in text
    assert "Blackwell" not in text and "B200" not in text
    assert text.endswith("choose delayed | current | rowwise")
