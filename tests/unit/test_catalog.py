"""The shipped catalog (GPUs, models, clusters) and the Hugging Face config importer."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
import yaml

from paraplan.catalog import catalog_names, load_cluster, load_gpu, load_model, loader, resolve_job
from paraplan.catalog.hf import model_from_hf_config
from paraplan.catalog.loader import catalog_key as _key
from paraplan.catalog.loader import load_any_cluster, load_catalog_entry, suggest_catalog_name
from paraplan.specs import ConfigError, ModelSpec, Precision

FIXTURES = Path(__file__).parent / "fixtures"
KINDS = ("gpus", "models", "clusters")
GiB = 2**30
MiB = 2**20

# meta-llama/Llama-2-70b-hf config.json (the fields that set the shape).
LLAMA_2_70B_HF = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "max_position_embeddings": 4096,
    "num_attention_heads": 64,
    "num_hidden_layers": 80,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}

SHAPE_FIELDS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "kv_channels",
    "ffn_hidden_size",
    "seq_length",
    "vocab_size",
    "activation",
    "normalization",
    "position_embedding",
    "rotary_percent",
    "parallel_residual",
    "untie_embeddings_and_output_weights",
    "add_bias_linear",
    "add_bias_mlp",
    "add_qkv_bias",
)


def _raw_entries(kind: str) -> dict[str, dict]:
    """file name -> raw YAML mapping, read straight from the package."""
    folder = resources.files("paraplan.catalog") / kind
    return {
        entry.name: yaml.safe_load(entry.read_text(encoding="utf-8"))
        for entry in folder.iterdir()
        if entry.name.endswith((".yaml", ".yml"))
    }


def _write_config(tmp_path: Path, config: dict) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def _shape(model: ModelSpec) -> dict:
    return {field: getattr(model, field) for field in SHAPE_FIELDS}


# --- every file ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", catalog_names("gpus"))
def test_every_gpu_file_validates_and_cites_a_source(name):
    gpu = load_gpu(name)
    for field in ("peak_flops", "hbm_bytes", "hbm_bandwidth"):
        assert gpu.sources.get(field, "").strip(), f"{name}: no source for {field}"
    if gpu.intra_node is not None:
        assert gpu.sources.get("intra_node", "").strip(), f"{name}: no source for intra_node"
    assert gpu.vendor in ("NVIDIA", "AMD")


@pytest.mark.parametrize("name", catalog_names("gpus"))
def test_every_gpu_has_dense_tensor_peaks_above_its_fp32_peak(name):
    gpu = load_gpu(name)
    assert Precision.FP32 in gpu.peak_flops and Precision.FP16 in gpu.peak_flops
    assert gpu.flops_for(Precision.FP16) >= 2 * gpu.flops_for(Precision.FP32)
    if Precision.BF16 in gpu.peak_flops:
        assert gpu.flops_for(Precision.BF16) == gpu.flops_for(Precision.FP16)
    if Precision.FP8 in gpu.peak_flops:
        assert gpu.flops_for(Precision.FP8) == pytest.approx(2 * gpu.flops_for(Precision.BF16), rel=0.02)


def test_fp8_peaks_are_given_only_for_gpus_with_fp8_tensor_cores():
    with_fp8 = {name for name in catalog_names("gpus") if Precision.FP8 in load_gpu(name).peak_flops}
    assert with_fp8 == {
        "H100-SXM5-80GB",
        "H100-PCIE-80GB",
        "H200-SXM-141GB",
        "GH200-120GB",
        "B200",
        "B300",
        "GB200",
        "GB300",
        "H800",
        "L40S",
        "MI300X",
        "MI325X",
        "MI355X",
    }


#: GPUs whose TF32 tensor-core peak a public datasheet gives (dense, not the 2:4-sparsity figure)
TF32_GPUS = {
    "A100-SXM4-40GB": 156e12,
    "A100-SXM4-80GB": 156e12,
    "A100-PCIE-80GB": 156e12,
    "H100-SXM5-80GB": 494.7e12,
    "H100-PCIE-80GB": 378e12,
    "H200-SXM-141GB": 494.7e12,
    "L40S": 183e12,
    "B200": 1100e12,
    "B300": 1125e12,
    "GB200": 1250e12,
    "GB300": 1250e12,
    "H800": 494.7e12,
}


def test_tf32_peaks_are_the_datasheets_dense_figures_and_only_where_confirmed():
    with_tf32 = {name: load_gpu(name).peak_flops[Precision.TF32] for name in catalog_names("gpus")
                 if Precision.TF32 in load_gpu(name).peak_flops}
    assert with_tf32 == pytest.approx(TF32_GPUS)


@pytest.mark.parametrize("name", sorted(TF32_GPUS))
def test_every_tf32_peak_lies_between_the_fp32_and_the_16_bit_peak_and_cites_its_datasheet(name):
    gpu = load_gpu(name)
    # below the 16-bit dense peak: a 2:4-sparsity TF32 figure would equal it or exceed it
    assert gpu.flops_for(Precision.FP32) < gpu.flops_for(Precision.TF32) < gpu.flops_for(Precision.BF16)
    assert "TF32" in gpu.sources.get("peak_flops_tf32", ""), f"{name}: no source for its tf32 peak"


def test_volta_and_cdna2_have_no_tf32_peak_so_a_tf32_job_on_them_is_refused():
    assert Precision.TF32 not in load_gpu("V100").peak_flops
    assert Precision.TF32 not in load_gpu("MI250X").peak_flops
    assert Precision.TF32 not in load_gpu("MI355X").peak_flops  # CDNA4 dropped CDNA3's XF32
    with pytest.raises(ConfigError, match="precision: GPU V100-SXM2-32GB has no tf32 peak"):
        resolve_job({"model": "gpt2", "cluster": "aws-p3dn.24xlarge", "precision": "tf32"})


def test_v100_has_no_bf16_peak_so_a_bf16_job_on_it_is_refused():
    assert Precision.BF16 not in load_gpu("V100").peak_flops
    with pytest.raises(ConfigError, match="precision: GPU V100-SXM2-32GB has no bf16 peak"):
        resolve_job({"model": "gpt2", "cluster": "aws-p3dn.24xlarge", "precision": "bf16"})


def test_datasheet_peaks_are_dense_not_sparse():
    assert load_gpu("A100").flops_for(Precision.BF16) == 312e12
    assert load_gpu("H100").flops_for(Precision.BF16) == pytest.approx(989.4e12)
    assert load_gpu("H100").flops_for(Precision.FP8) == pytest.approx(1978.9e12)
    assert load_gpu("B200").flops_for(Precision.BF16) == pytest.approx(2250e12)
    assert load_gpu("MI300X").flops_for(Precision.BF16) == pytest.approx(1307.4e12)


def test_memory_sizes_are_what_the_device_reports_in_binary_units():
    assert load_gpu("A100-SXM4-80GB").hbm_bytes == 80 * GiB  # nvidia-smi 81920 MiB
    assert load_gpu("A100-SXM4-40GB").hbm_bytes == 40 * GiB
    assert load_gpu("H100").hbm_bytes == 81559 * MiB
    assert load_gpu("H200").hbm_bytes == 143771 * MiB  # "141 GB" is ~140.4 GiB
    assert load_gpu("GH200").hbm_bytes == 97871 * MiB  # 96 GB HBM3, not the 120 GB LPDDR5X
    assert load_gpu("A10G").hbm_bytes == 23028 * MiB  # 24 GB GDDR6 less the ECC reserve


@pytest.mark.parametrize("name", catalog_names("models"))
def test_every_model_file_validates_and_cites_a_source(name):
    model = load_model(name)
    assert model.name == name
    assert model.source and len(model.source) > 20
    assert model.kv_channels * model.num_attention_heads >= model.hidden_size * 0.99


HOMOGENEOUS = [n for n in catalog_names("clusters") if "node_groups" not in load_catalog_entry("clusters", n)]
HETEROGENEOUS = sorted(set(catalog_names("clusters")) - set(HOMOGENEOUS))


@pytest.mark.parametrize("name", HOMOGENEOUS)
def test_every_cluster_resolves_its_gpu(name):
    cluster = load_cluster(name)
    assert cluster.gpu.name in catalog_names("gpus")
    assert cluster.sources, f"{name}: no sources"
    if cluster.gpus_per_node > 1:
        assert cluster.intra_node is not None
    if cluster.price_per_gpu_hour is not None:
        assert cluster.sources.get("price_per_gpu_hour", "").strip(), f"{name}: price has no source"


@pytest.mark.parametrize(
    "name", [n for n in HOMOGENEOUS if load_cluster(n).inter_node is not None]
)
def test_every_cluster_with_a_network_scales_to_many_nodes(name):
    cluster = load_cluster(name, num_nodes=4)
    assert cluster.num_gpus == 4 * cluster.gpus_per_node
    if cluster.intra_node is not None:
        assert cluster.inter_node.bandwidth_bytes_per_s < cluster.intra_node.bandwidth_bytes_per_s


@pytest.mark.parametrize("name", HETEROGENEOUS)
def test_every_heterogeneous_cluster_resolves_its_node_groups_and_cites_a_source(name):
    cluster = load_any_cluster(name)
    assert len(cluster.node_groups) > 1
    assert cluster.sources
    for group in cluster.node_groups:
        assert group.gpu.name in catalog_names("gpus")
    assert cluster.fabric is not None


def test_fasops_case_is_one_a100_node_and_seven_a10_nodes_of_four_gpus():
    cluster = load_any_cluster("fasop-a100-a10")
    assert [(g.gpu.name, g.num_nodes, g.gpus_per_node) for g in cluster.node_groups] == [
        ("A100-SXM4-40GB", 1, 4),
        ("A10G", 7, 4),
    ]
    # 4 A100 at p4d's per-GPU price + 28 A10G at g5.12xlarge's
    assert cluster.price_per_hour_usd == pytest.approx(4 * 32.7726 / 8 + 28 * 5.672 / 4, rel=1e-4)
    assert cluster.fabric.bandwidth_bytes_per_s == 1.25e9  # the slower NIC (40 Gbps / 4)


def test_a_heterogeneous_cluster_is_refused_where_one_gpu_type_is_needed():
    with pytest.raises(ConfigError, match=r"node groups of different GPUs.*paraplan search"):
        load_cluster("hetero-a100-a10")


def test_a_single_node_cloud_instance_refuses_many_nodes_without_a_network():
    with pytest.raises(ConfigError, match="inter_node"):
        load_cluster("lambda-8x-h100", num_nodes=2)


def test_inter_node_bandwidth_is_the_node_nic_bandwidth_per_gpu():
    assert load_cluster("dgx-h100").inter_node.bandwidth_bytes_per_s == 50e9  # 8 x 400 Gb/s / 8
    assert load_cluster("perlmutter").inter_node.bandwidth_bytes_per_s == 25e9  # 4 x 200 Gb/s / 4
    assert load_cluster("vista").inter_node.bandwidth_bytes_per_s == 50e9  # 1 x 400 Gb/s / 1
    assert load_cluster("p4d.24xlarge").inter_node.bandwidth_bytes_per_s == 6.25e9  # 400 Gbps / 8


def test_cloud_prices_are_per_gpu_hour():
    assert load_cluster("p5.48xlarge").price_per_gpu_hour == pytest.approx(98.32 / 8)
    assert load_cluster("p4d.24xlarge").price_per_gpu_hour == pytest.approx(32.7726 / 8, rel=1e-4)
    assert load_cluster("perlmutter").price_per_gpu_hour is None


# --- names and aliases ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_file_names_are_the_lowercased_entry_names(kind):
    for file_name, raw in _raw_entries(kind).items():
        assert file_name == f"{raw['name'].lower()}.yaml"


@pytest.mark.parametrize("kind", KINDS)
def test_aliases_are_unique_across_files(kind):
    owner: dict[str, str] = {}
    for file_name, raw in _raw_entries(kind).items():
        for key in {_key(str(alias)) for alias in [raw["name"], *raw.get("aliases", ())]}:
            assert key not in owner, f"{kind}: {key!r} is claimed by {owner.get(key)} and {file_name}"
            owner[key] = file_name


@pytest.mark.parametrize("kind", KINDS)
def test_each_files_name_and_aliases_read_as_text_are_what_its_yaml_says(kind):
    # a lookup parses only the file its text names (loader.plain_names): one name line and one
    # aliases line in flow style keep that true; written otherwise, every lookup parses them all
    folder = resources.files("paraplan.catalog") / kind
    for file_name, raw in _raw_entries(kind).items():
        text = (folder / file_name).read_text(encoding="utf-8")
        assert loader.plain_names(text) == [str(a) for a in [raw["name"], *raw.get("aliases", ())]], file_name


@pytest.mark.parametrize("kind", KINDS)
def test_every_name_and_alias_finds_the_entry_the_whole_catalog_gives_it(kind):
    index = loader._index(kind)
    assert set(loader._key_files(kind)) == set(index)
    for key, (name, raw) in index.items():
        assert loader._lookup(kind, key) == (name, raw)


def test_looking_up_one_name_parses_only_the_file_that_holds_it(monkeypatch):
    parsed = []
    monkeypatch.setattr(loader, "read_catalog_yaml", lambda text: parsed.append(text) or yaml.safe_load(text))
    for cached in (loader._files, loader._entry, loader._index, loader._key_files):
        cached.cache_clear()
    try:
        assert load_catalog_entry("models", "GPT-3")["name"] == "gpt3-175b"
        assert len(parsed) == 1
        with pytest.raises(ConfigError, match="did you mean"):  # an unknown name: the whole catalog, as before
            load_catalog_entry("models", "gpt3-175c")
        assert len(parsed) == len(_raw_entries("models"))
    finally:
        for cached in (loader._files, loader._entry, loader._index, loader._key_files):
            cached.cache_clear()


@pytest.mark.parametrize(
    "text",
    [
        "name: A100\naliases:\n  - a100-80gb\n",  # a block list
        "name: A100\naliases: ['a100-80gb']\n",  # quoted
        "name: A100\naliases: [yes, 1.0]\n",  # YAML reads booleans and numbers, not names
        "name: 'A100'\n",
        "name: A100\nname: A10\n",
        "name: A100\nnotes: {aliases: [x]}\n",
    ],
)
def test_names_written_any_other_way_are_left_to_the_parsed_catalog(text):
    assert loader.plain_names(text) is None


def test_plain_names_are_the_name_then_the_aliases():
    text = "name: A100-SXM4-80GB   # the SXM part\naliases: [A100, NVIDIA A100-SXM4-80GB]  # as printed\nvendor: NVIDIA\n"
    assert loader.plain_names(text) == ["A100-SXM4-80GB", "A100", "NVIDIA A100-SXM4-80GB"]
    assert loader.plain_names("name: gpt2\n") == ["gpt2"]


@pytest.mark.parametrize(
    "typed, canonical",
    [
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("NVIDIAGH200120GB", "GH200-120GB"),
        ("NVIDIA GH200 120GB", "GH200-120GB"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"),
        ("h100-sxm", "H100-SXM5-80GB"),
        ("h200", "H200-SXM-141GB"),
        ("AMD Instinct MI300X", "MI300X"),
        ("Tesla V100-SXM2-32GB", "V100-SXM2-32GB"),
    ],
)
def test_gpu_names_as_torch_and_nvidia_smi_print_them_resolve(typed, canonical):
    assert load_gpu(typed).name == canonical


@pytest.mark.parametrize(
    "typed, canonical",
    [
        ("meta-llama/Llama-2-7b-hf", "llama-2-7b"),
        ("Llama-2-70B", "llama-2-70b"),
        ("meta-llama/Llama-3.1-405B", "llama-3.1-405b"),
        ("GPT-3", "gpt3-175b"),
        ("gpt3-175B", "gpt3-175b"),
        ("megatron-529.6b", "megatron-530b"),
        ("mistralai/Mistral-7B-v0.1", "mistral-7b"),
    ],
)
def test_model_names_from_papers_and_the_hub_resolve(typed, canonical):
    assert load_model(typed).name == canonical


def test_unknown_gpu_suggests_the_closest_name():
    with pytest.raises(ConfigError, match=r"unknown GPU 'H100-SXM5-80G'; did you mean H100-SXM5-80GB\?"):
        load_gpu("H100-SXM5-80G")


def test_unknown_cluster_suggests_the_closest_name():
    with pytest.raises(ConfigError, match=r"did you mean perlmutter\?"):
        load_cluster("perlmuter")


# --- catalog shapes that the papers fix ------------------------------------------------------


def test_megatron_models_match_the_published_dev_runs():
    runs = Path("/work/shared/data/published/runs_dev.json")
    if not runs.exists():
        pytest.skip("published runs not available")
    by_params = {
        1.7: "megatron-1.7b", 3.6: "megatron-3.6b", 7.5: "megatron-7.5b", 18.4: "megatron-18b",
        39.1: "megatron-39b", 76.1: "megatron-76b", 145.6: "megatron-145b",
        310.1: "megatron-310b", 529.6: "megatron-530b", 1008.0: "megatron-1t",
    }
    for run in json.loads(runs.read_text()):
        if not run["id"].startswith("narayanan21-t1-"):
            continue
        published = run["model"]
        model = load_model(by_params[published["params_billion"]])
        for field in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size",
                      "seq_length", "vocab_size"):
            assert getattr(model, field) == published[field], (model.name, field)


def test_llama_3_1_405b_has_the_paper_shape():
    model = load_model("llama-3.1-405b")
    assert (model.num_layers, model.hidden_size, model.num_attention_heads) == (126, 16384, 128)
    assert (model.num_query_groups, model.ffn_hidden_size, model.vocab_size) == (8, 53248, 128256)
    assert model.seq_length == 8192


def test_gpt3_1_3b_keeps_the_papers_head_dimension():
    model = load_model("gpt3-1.3b")
    assert (model.num_attention_heads, model.kv_channels) == (24, 128)


# --- Hugging Face config.json ---------------------------------------------------------------


def test_hf_llama_config_imports_as_swiglu_rmsnorm_gqa(tmp_path):
    fields = model_from_hf_config(_write_config(tmp_path, LLAMA_2_70B_HF), {"hf_config": "x", "seq_length": 4096})
    model = ModelSpec.model_validate(fields)
    assert model.activation == "swiglu"
    assert model.normalization == "rmsnorm"
    assert model.position_embedding == "rotary"
    assert (model.num_attention_heads, model.num_query_groups) == (64, 8)
    assert model.untie_embeddings_and_output_weights is True
    assert model.add_bias_linear is False


def test_catalog_llama_2_70b_matches_hf_shape(tmp_path):
    fields = model_from_hf_config(_write_config(tmp_path, LLAMA_2_70B_HF), {"seq_length": 4096})
    assert _shape(ModelSpec.model_validate(fields)) == _shape(load_model("llama-2-70b"))


def test_catalog_llama_2_7b_matches_the_hf_fixture():
    fields = model_from_hf_config(FIXTURES / "llama-2-7b-config.json", {"seq_length": 4096})
    assert _shape(ModelSpec.model_validate(fields)) == _shape(load_model("llama-2-7b"))


def test_hf_gpt2_config_imports_with_learned_tied_embeddings_and_a_4h_mlp():
    fields = model_from_hf_config(FIXTURES / "gpt2-config.json", {"seq_length": 1024})
    model = ModelSpec.model_validate(fields)
    assert model.ffn_hidden_size == 4 * 768
    assert model.position_embedding == "learned"
    assert model.untie_embeddings_and_output_weights is False
    assert _shape(model) == _shape(load_model("gpt2"))


def test_hf_gpt_neox_config_imports_partial_rotary_and_parallel_residual(tmp_path):
    neox_20b = {
        "model_type": "gpt_neox", "hidden_act": "gelu", "hidden_size": 6144,
        "intermediate_size": 24576, "max_position_embeddings": 2048, "num_attention_heads": 64,
        "num_hidden_layers": 44, "rotary_pct": 0.25, "tie_word_embeddings": False,
        "use_parallel_residual": True, "vocab_size": 50432,
    }
    model = ModelSpec.model_validate(model_from_hf_config(_write_config(tmp_path, neox_20b), {"seq_length": 2048}))
    assert (model.rotary_percent, model.parallel_residual, model.activation) == (0.25, True, "gelu")
    assert model.untie_embeddings_and_output_weights is True


def test_hf_overrides_replace_derived_fields():
    fields = model_from_hf_config(
        FIXTURES / "llama-2-7b-config.json",
        {"hf_config": "ignored", "seq_length": 2048, "name": "my-llama"},
    )
    assert fields["seq_length"] == 2048 and fields["name"] == "my-llama"
    assert "hf_config" not in fields


def test_a_job_can_name_an_hf_config_relative_to_its_directory():
    job = resolve_job(
        {
            "model": {"hf_config": "llama-2-7b-config.json", "seq_length": 2048},
            "cluster": {"name": "dgx-h100", "num_nodes": 2},
            "parallel": {"tp": 8, "pp": 2},
        },
        base_dir=FIXTURES,
    )
    assert (job.model.num_layers, job.model.seq_length) == (32, 2048)
    assert job.parallel.dp == 1


def test_an_hf_config_needs_the_sequence_length_the_job_trains_on():
    """max_position_embeddings is the longest sequence a model accepts (131,072 for Qwen2-7B,
    pre-trained at 4K then extended): it must not become the training length silently."""
    raw = {"model": {"hf_config": "qwen2-7b-config.json"}, "cluster": "dgx-h100", "parallel": {"tp": 4}}
    with pytest.raises(ConfigError) as err:
        resolve_job(raw, base_dir=FIXTURES)
    message = str(err.value)
    assert message.startswith("model.seq_length: required with hf_config") and "131072" in message
    assert "\n" not in message
    job = resolve_job({**raw, "model": {**raw["model"], "seq_length": 4096}}, base_dir=FIXTURES)
    assert job.model.seq_length == 4096


def test_qwen2_counts_its_qkv_biases_and_keeps_its_rope_base():
    """Qwen2Attention has bias=True on q_proj, k_proj and v_proj only; Qwen/Qwen2-7B holds
    7,615,616,512 parameters (its safetensors index; Qwen2 report table 1: 7.6B)."""
    from paraplan.inventory import count_params

    job = resolve_job({"model": {"hf_config": "qwen2-7b-config.json", "seq_length": 4096},
                       "cluster": "dgx-h100", "parallel": {"tp": 4}}, base_dir=FIXTURES)
    m = job.model
    assert (m.add_qkv_bias, m.add_bias_linear, m.add_bias_mlp) == (True, False, False)
    assert count_params(job) == 7_615_616_512
    assert m.rope_theta == 1e6


def test_llama_attention_and_mlp_biases_land_on_their_own_projections(tmp_path):
    fields = model_from_hf_config(_write_config(tmp_path, {**LLAMA_2_70B_HF, "mlp_bias": True}), {"seq_length": 4096})
    model = ModelSpec.model_validate(fields)
    assert (model.add_qkv_bias, model.add_bias_linear, model.add_bias_mlp) == (False, False, True)
    fields = model_from_hf_config(_write_config(tmp_path, {**LLAMA_2_70B_HF, "attention_bias": True}), {"seq_length": 4096})
    model = ModelSpec.model_validate(fields)
    assert (model.add_qkv_bias, model.add_bias_linear, model.add_bias_mlp) == (True, True, False)


@pytest.mark.parametrize("name", ["llama-3-8b", "llama-3-70b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b"])
def test_catalog_llama_3_models_carry_their_rope_base_with_a_source(name):
    model = load_model(name)
    assert model.rope_theta == 500000
    assert "rope_theta 500000" in model.source


def test_a_rope_base_needs_rotary_positions():
    with pytest.raises(ValueError, match="rope_theta: only rotary"):
        ModelSpec(num_layers=1, hidden_size=64, num_attention_heads=1, seq_length=8, vocab_size=8,
                  position_embedding="learned", rope_theta=10000)


def test_hf_unknown_model_type_is_a_one_line_config_error(tmp_path):
    path = _write_config(tmp_path, {"model_type": "t5", "d_model": 512})
    with pytest.raises(ConfigError) as err:
        model_from_hf_config(path, {})
    message = str(err.value)
    assert message.startswith("model.hf_config: ") and "'t5'" in message and "llama" in message
    assert "\n" not in message


def test_hf_missing_file_is_a_one_line_config_error(tmp_path):
    with pytest.raises(ConfigError) as err:
        model_from_hf_config(tmp_path / "nope.json", {})
    assert str(err.value).startswith("model.hf_config: cannot read")
    assert "\n" not in str(err.value)


def test_hf_invalid_json_is_a_one_line_config_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^model\.hf_config: .*not valid JSON"):
        model_from_hf_config(path, {})


# --- jobs built from catalog names -----------------------------------------------------------


def test_a_job_resolves_catalog_model_and_cluster_names():
    job = resolve_job(
        {"model": "Llama-2-70B", "cluster": {"name": "p5.48xlarge", "num_nodes": 4},
         "parallel": {"tp": 8, "pp": 4}}
    )
    assert job.model.name == "llama-2-70b"
    assert job.cluster.gpu.name == "H100-SXM5-80GB"
    assert job.cluster.num_gpus == 32 and job.parallel.dp == 1


@pytest.mark.parametrize(
    ("typed", "meant"),
    [("H100-SMX5", "H100-SXM5-80GB"), ("A100-40G", "A100-SXM4-40GB"), ("MI300", "MI300X")],
)
def test_a_gpu_name_with_a_letter_mistyped_suggests_the_catalog_name(typed, meant):
    assert suggest_catalog_name("gpus", typed) == meant


@pytest.mark.parametrize("other_part", ["A800", "A6000", "A1000", "H20", "V100-16GB", "GB100"])
def test_a_gpu_whose_model_number_differs_is_not_suggested_as_a_typo(other_part):
    assert suggest_catalog_name("gpus", other_part) is None
    with pytest.raises(ConfigError, match=rf"unknown GPU '{other_part}', not in the catalog .*cluster: \{{gpu: \{{name, "):
        load_gpu(other_part)


@pytest.mark.parametrize("variant", ["MI300A", "B200A", "A10X", "GB200X", "H100X", "H100 NVL", "H200 NVL"])
def test_a_gpu_whose_variant_letter_differs_is_another_part_not_a_typo(variant):
    # MI300A is AMD's APU, not the MI300X; B200A a lower-power B200; H100 NVL a 94 GB PCIe board
    # (issue 24: say "not in the catalog" rather than suggest another part)
    assert suggest_catalog_name("gpus", variant) is None
    with pytest.raises(ConfigError, match=rf"unknown GPU '{variant}', not in the catalog "):
        load_gpu(variant)


def test_a_platform_word_beside_a_gpu_name_still_suggests_the_gpu():
    assert suggest_catalog_name("gpus", "B200 HGX") == "B200"


def test_a_model_size_that_differs_is_not_suggested_as_a_typo():
    assert suggest_catalog_name("models", "llama-2-8b") is None
    assert suggest_catalog_name("models", "lama-2-7b") == "llama-2-7b"


def test_the_inline_gpu_the_error_describes_is_a_gpu_the_job_file_accepts():
    with pytest.raises(ConfigError) as err:
        load_gpu("A800")
    message = str(err.value)
    assert all(field in message for field in ("peak_flops: {bf16:", "hbm_bytes", "hbm_bandwidth", "gpus_per_node"))
    gpu = {"name": "A800", "peak_flops": {"bf16": "312 TFLOPS"}, "hbm_bytes": "80 GiB",
           "hbm_bandwidth": "2.04 TB/s", "intra_node": {"bandwidth": "200 GB/s"}}
    job = resolve_job({"model": "llama-2-7b", "cluster": {"gpu": gpu, "gpus_per_node": 8},
                            "parallel": {"tp": 8}})
    assert job.cluster.gpu.name == "A800"


def test_a_catalog_cluster_whose_network_a_job_changed_is_not_named_as_the_catalog_cluster():
    slow = {"bandwidth": "10 Gb/s", "latency": "10 us"}
    cluster = load_cluster("aws-p5.48xlarge", num_nodes=4, inter_node=slow)
    assert cluster.name == "aws-p5.48xlarge with a changed inter_node"
    assert load_cluster("aws-p5.48xlarge", num_nodes=4).name == "aws-p5.48xlarge"


def test_a_job_that_repeats_the_catalogs_own_link_keeps_the_catalog_name():
    raw = load_catalog_entry("clusters", "aws-p5.48xlarge")
    assert load_cluster("aws-p5.48xlarge", inter_node=raw["inter_node"]).name == "aws-p5.48xlarge"


def test_a_gpu_named_on_another_gpus_node_gets_its_own_nvlink_never_the_nodes():
    """--cluster dgx-h100 --gpu B200 ran B200 over Hopper's 450 GB/s NVLink, silently."""
    blackwell = load_cluster("dgx-h100", gpu="B200")
    assert blackwell.intra_node.bandwidth_bytes_per_s == load_gpu("B200").intra_node.bandwidth_bytes_per_s == 900e9
    assert "B200's own intra-node link" in blackwell.name
    assert blackwell.inter_node == load_cluster("dgx-h100").inter_node  # the node's network stays


def test_a_gpu_with_the_same_nvlink_as_the_nodes_keeps_the_nodes_measured_link():
    hopper = load_cluster("dgx-h100", gpu="H200-SXM-141GB")
    assert hopper.intra_node == load_cluster("dgx-h100").intra_node
    assert "own intra-node link" not in hopper.name


@pytest.mark.parametrize(("gpu", "node", "nvlink", "topology", "cited"), [
    ("B200", "dgx-b200", 900e9, "switch", {"intra_node", "inter_node", "inter_node_efficiency", "host_memory"}),
    ("H200", "dgx-h200", 450e9, "switch", {"intra_node", "inter_node", "inter_node_efficiency", "host_memory"}),
    # MI300X's 8-GPU platform is fully connected: a mesh, not a switch
    ("MI300X", "azure-nd-mi300x-v5", 448e9, "mesh", {"gpu", "intra_node", "inter_node", "host_memory"}),
])
def test_a_gpu_has_a_reference_node_whose_numbers_are_cited(gpu, node, nvlink, topology, cited):
    cluster = load_cluster(node)
    assert load_gpu(gpu).reference_node == node and cluster.gpus_per_node == 8
    assert cluster.intra_node.bandwidth_bytes_per_s == nvlink and cluster.intra_node.topology == topology
    assert cluster.inter_node.bandwidth_bytes_per_s == 50e9
    assert cited <= set(load_catalog_entry("clusters", node)["sources"])
