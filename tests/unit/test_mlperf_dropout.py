"""NVIDIA's MLPerf v3.0 GPT-3 configuration runs without dropout (conf/megatron_gpt_config.yaml:
attention_dropout 0.0, hidden_dropout 0.0): the nemo-mlperf-3.0 preset says so as model defaults,
where the records reader would otherwise take Megatron-LM's GPT default of 0.1."""

from __future__ import annotations

import copy

import pytest

from paraplan.catalog import resolve_job
from paraplan.catalog.presets import _preset, find_preset
from paraplan.specs import ConfigError
from paraplan.validate.records import job_from_record

_GPT3 = {"name": "gpt3-like", "num_layers": 8, "hidden_size": 12288, "num_attention_heads": 96,
         "ffn_hidden_size": 49152, "seq_length": 2048, "vocab_size": 50257, "activation": "gelu"}

_MLPERF_RUN = {
    "id": "mlperf-v3.0-gpt3-nvidia-512gpu",
    "source": "MLPerf Training v3.0 GPT-3 175B closed division, NVIDIA submission",
    "gpu": "H100-SXM5-80GB (DGX H100)",
    "num_gpus": 512,
    "gpus_per_node": 8,
    "interconnect": None,
    "model": {"num_layers": 96, "hidden_size": 12288, "num_attention_heads": 96, "num_kv_heads": 96,
              "ffn_hidden_size": 49152, "seq_length": 2048, "vocab_size": None, "activation": "gelu"},
    "parallel": {"tp": 4, "pp": 8, "dp": 16, "cp": 1, "sp": True, "virtual_pipeline": 12, "zero_stage": 1,
                 "micro_batch_size": 1, "global_batch_size": 2048},
    "recompute": "none",
    "precision": "FP8 hybrid (Transformer Engine) + BF16 (megatron_amp_O2)",
    "framework": "NVIDIA NeMo/Megatron-Core (MLPerf v3.0 submission)",
    "measured": {"iteration_time_s": 12.074},
}


def _job(model=None):
    return resolve_job({"model": {**_GPT3, **(model or {})}, "cluster": {"name": "dgx-h100", "num_nodes": 1},
                        "precision": "fp8",
                        "parallel": {"framework": "nemo-mlperf-3.0", "tp": 4, "pp": 2, "sequence_parallel": True,
                                     "micro_batch_size": 1, "global_batch_size": 8}})


def test_the_mlperf_preset_s_dropout_defaults_cite_the_submission_s_model_config():
    preset = find_preset("nemo-mlperf-3.0")
    dropout = {d.field: d for d in preset.model_defaults}
    assert {k: d.value for k, d in dropout.items()} == {"attention_dropout": 0.0, "hidden_dropout": 0.0}
    assert all("conf/megatron_gpt_config.yaml" in d.source for d in dropout.values())


def test_the_mlperf_record_becomes_a_job_without_dropout_and_says_it_took_the_preset_s():
    record = job_from_record(copy.deepcopy(_MLPERF_RUN))
    assert "attention_dropout" not in record.mapping["model"] and "hidden_dropout" not in record.mapping["model"]
    assert "hidden_dropout 0.0 (nemo-mlperf-3.0's default)" in record.assumed
    job = resolve_job(record.mapping)
    assert (job.model.attention_dropout, job.model.hidden_dropout) == (0.0, 0.0)


def test_a_megatron_lm_gpt_record_keeps_megatron_s_dropout_of_0_1():
    run = copy.deepcopy(_MLPERF_RUN)
    run.update(id="megatron-gpt3-run", source="Narayanan et al. 2021", framework="Megatron-LM 2021")
    run["precision"] = "bf16"
    model = job_from_record(run).mapping["model"]
    assert (model["attention_dropout"], model["hidden_dropout"]) == (0.1, 0.1)


def test_a_job_stating_its_dropout_keeps_it_under_the_mlperf_preset_and_is_told():
    job = _job({"hidden_dropout": 0.1})
    assert (job.model.attention_dropout, job.model.hidden_dropout) == (0.0, 0.1)
    assert job.preset.model_overridden == {"hidden_dropout": (0.1, 0.0)}


def test_dropout_priced_by_the_preset_makes_the_layer_no_slower():
    from paraplan.prediction import predict

    assert predict(_job()).iteration_s < predict(_job({"attention_dropout": 0.1, "hidden_dropout": 0.1})).iteration_s


@pytest.mark.parametrize("value", [1.0, -0.1, True, "0.1"])
def test_a_preset_dropout_that_is_no_probability_is_refused(value):
    raw = {"name": "x", "version": "1", "label": "x", "engine": "megatron",
           "model_defaults": {"hidden_dropout": {"value": value, "source": "its config, cited"}}}
    with pytest.raises(ConfigError, match=r"model_defaults\.hidden_dropout"):
        _preset(raw, "x.yaml")
