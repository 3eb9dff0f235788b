"""Transformer Engine's userbuffers TP overlap priced from its configuration file
(``parallel.tp_comm_overlap_cfg``, ``prediction.userbuffers``): ring exchange, pipelined and bulk
GEMMs, the SMs the communication kernels take, and the switch back to the measured floor."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.catalog import load_userbuffers, resolve_job
from paraplan.prediction import predict
from paraplan.prediction.userbuffers import beside, pipeline_exposed, ring_exposed
from paraplan.specs import ConfigError, UserbuffersSpec

MLPERF = "mlperf-3.0-h100tp4pp8mbs1"


def job(cfg=MLPERF, gpu="dgx-h100", **parallel):
    plan = {"tp": 4, "pp": 2, "sequence_parallel": True, "micro_batch_size": 1, "global_batch_size": 16,
            "tp_comm_overlap": True, "tp_comm_overlap_cfg": cfg, **parallel}
    return resolve_job({"model": {"name": "gpt3-175b", "num_layers": 8}, "cluster": {"name": gpu, "num_nodes": 1},
                        "parallel": plan, "precision": "fp8"})


def test_the_mlperf_configuration_is_the_file_the_v3_runs_named_with_its_source():
    cfg = load_userbuffers(MLPERF)
    assert cfg.te_version == "release_v0.8" and "h100tp4pp8mbs1_tp_comm_overlap_cfg.yaml" in cfg.source
    assert cfg.gemm("proj_fprop").method == "pipeline" and cfg.gemm("proj_fprop").num_sm == 24
    assert cfg.gemm("fc2_fprop").num_sm == 20 and cfg.gemm("fc2_fprop").set_sm_margin
    assert cfg.gemm("qkv_fprop").method == "ring_exchange" and cfg.gemm("fc2_dgrad").aggregate
    assert {cfg.gemm(g).method for g in ("qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad")} == {"bulk"}


def test_a_gemm_the_file_leaves_out_runs_transformer_engines_default():
    cfg = UserbuffersSpec(name="t", gemms={}, source="test", te_version="x")
    assert cfg.gemm("fc2_fprop").method == "pipeline" and cfg.gemm("fc2_fprop").num_splits == 4
    assert cfg.gemm("qkv_fprop").method == "ring_exchange" and cfg.gemm("qkv_wgrad").method == "bulk"


def test_a_configuration_with_an_unknown_gemm_or_method_is_refused():
    with pytest.raises(ValueError, match="qkv_fwd"):
        UserbuffersSpec(name="t", gemms={"qkv_fwd": {"method": "bulk"}}, source="test", te_version="x")
    with pytest.raises(ValueError, match="ring_exchange, pipeline, bulk"):
        UserbuffersSpec(name="t", gemms={"qkv_fprop": {"method": "fused"}}, source="test", te_version="x")


def test_the_mlperf_preset_runs_its_userbuffers_configuration():
    j = resolve_job({"model": {"name": "gpt3-175b", "num_layers": 8}, "cluster": {"name": "dgx-h100", "num_nodes": 1},
                     "parallel": {"framework": "nemo-mlperf-3.0", "tp": 4, "pp": 2, "sequence_parallel": True,
                                  "micro_batch_size": 1, "global_batch_size": 16}, "precision": "fp8"})
    assert j.parallel.tp_comm_overlap and j.parallel.tp_comm_overlap_cfg == MLPERF
    assert j.preset.taken["tp_comm_overlap_cfg"] == MLPERF


def test_an_unknown_configuration_is_refused_naming_the_field_and_the_known_ones():
    with pytest.raises(ConfigError, match=rf"parallel.tp_comm_overlap_cfg: .*'nope'.*{MLPERF}"):
        predict(job(cfg="nope"))


def test_a_gpu_without_an_sm_count_says_so_instead_of_guessing():
    with pytest.raises(ConfigError, match=r"no SM count"):
        predict(job(gpu="dgx-b200"))


def test_without_a_configuration_tp_comm_overlap_keeps_the_measured_floor_path():
    floor, ub = predict(job(cfg=None)), predict(job())
    assert floor.iteration_s != ub.iteration_s
    assert ub.breakdown.tp_communication_s < floor.breakdown.tp_communication_s
    # the chunked GEMMs on fewer SMs are compute: the forward's grows, never shrinks
    assert ub.breakdown.forward_compute_s > floor.breakdown.forward_compute_s


def test_a_configuration_is_unused_without_tp_comm_overlap():
    plain = predict(job(cfg=None, tp_comm_overlap=False))
    assert predict(job(tp_comm_overlap=False)).iteration_s == plain.iteration_s


def _layer(j):
    from paraplan.costmodel import AnalyticalCostModel
    from paraplan.inventory import count_job
    from paraplan.prediction.stages import CommCosts, LayerCost

    inv = count_job(j)
    cm = AnalyticalCostModel(j.cluster, j.precision)
    block = inv.stages[0].blocks[0]
    return [op.name for op in block.ops], LayerCost.of(block, cm, CommCosts(inv, cm))


def test_a_pipelined_gemm_runs_on_the_sms_its_communication_leaves():
    # proj_fprop keeps 108 of H100's 132 SMs, fc2_fprop 112: each forward is at least that much
    # slower than the GEMM alone (and split in four chunks besides)
    names, ub = _layer(job())
    _, alone = _layer(job(cfg=None))
    proj, fc2 = names.index("linear2"), names.index("linear4")
    assert ub.fwd[proj] >= alone.fwd[proj] * 132 / 108
    assert ub.fwd[fc2] >= alone.fwd[fc2] * 132 / 112
    # a bulk GEMM keeps every SM: QKV's weight gradient is the GEMM alone
    assert ub.wgrad_total == pytest.approx(alone.wgrad_total)


@settings(max_examples=200, deadline=None)
@given(st.floats(1e-6, 1.0), st.floats(0.0, 1.0), st.sampled_from([2, 4, 8]), st.booleans())
def test_a_ring_exchange_hides_every_copy_shorter_than_its_gemm_chunk(gemm, coll, tp, aggregate):
    exposed = ring_exposed(gemm, coll, tp, aggregate)
    assert 0.0 <= exposed <= coll + 1e-12
    if not aggregate:
        shard = coll / (tp - 1)
        assert exposed == pytest.approx(max(0.0, shard - gemm / tp) * (tp - 1))
    else:  # the first exchange before any GEMM is exposed (with tp 2, the whole gather)
        assert exposed >= coll / (tp - 1) - 1e-12


def test_an_aggregated_ring_waits_for_its_first_exchange():
    # tp 4: one shard (1/3 of the gather) before the first GEMM, then two-shard copies beside
    # GEMMs of half the rows; tp 2: the whole gather comes first (one step, nothing beside it)
    assert ring_exposed(1.0, 0.3, 4, True) == pytest.approx(0.1)
    assert ring_exposed(1.0, 0.3, 2, True) == pytest.approx(0.3)
    assert ring_exposed(1.0, 0.3, 4, False) == 0.0


def test_a_pipelined_reduce_scatter_leaves_its_last_chunk_exposed():
    # four chunks of 1 s of GEMM, 0.5 s of reduce-scatter each: only the last one shows
    assert pipeline_exposed(4.0, 2.0, 4, 0.8, True) == pytest.approx(0.5)
    # a reduce-scatter longer than the GEMM chunks is the critical path
    assert pipeline_exposed(4.0, 8.0, 4, 0.8, True) == pytest.approx(1.0 + 4 * 2.0 - 4.0)


def test_a_bulk_collective_costs_its_kernels_sms_beside_a_longer_gemm():
    # 16 of 128 SMs held for the collective's 1 s beside a 4 s GEMM: the GEMM loses 1/8 s
    assert beside(4.0, 1.0, 16 / 128, False) - 4.0 == pytest.approx(1.0 / 8)
    # a collective longer than its GEMM is exposed beyond it
    assert beside(1.0, 3.0, 16 / 128, False) == pytest.approx(3.0)
    # with the margin the GEMM was already slowed: the longer of the two
    assert beside(4.0, 1.0, 16 / 128, True) == 4.0


def test_an_all_gather_feeding_an_fp8_gemm_moves_its_fp8_copy_and_a_reduce_scatter_its_16_bit_output():
    from paraplan.inventory import CollectiveKind, count_job

    block = count_job(job()).stages[0].blocks[0]
    (qkv,) = [op for op in block.ops if op.name == "linear1"]
    assert qkv.fp8
    sizes = {(c.kind, c.name): c.bytes for c in block.collectives if c.bytes > 1000.0}
    rs = sizes[(CollectiveKind.REDUCE_SCATTER, "tp_reducescatter")]
    # the inventory sizes what userbuffers sends: the gathers (forward, the output gradient's,
    # the saved norm output's again) one byte an element, the reduce-scatters two
    assert {b for (kind, _), b in sizes.items() if kind is CollectiveKind.ALL_GATHER} == {rs / 2}
    assert (CollectiveKind.ALL_GATHER, "tp_allgather_saved") in sizes


def test_a_userbuffers_configuration_beside_separate_projections_is_a_one_line_error_naming_both(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from paraplan.cli.app import app

    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "model": {"name": "gpt3-175b", "qkv_fusion": False}, "cluster": {"name": "dgx-h100", "num_nodes": 64},
        "precision": "fp8",
        "parallel": {"framework": "nemo-mlperf-3.0", "tp": 4, "pp": 8, "sequence_parallel": True,
                     "micro_batch_size": 1, "global_batch_size": 256}}))
    result = CliRunner().invoke(app, ["predict", str(job)], env={"COLUMNS": "80"})
    assert result.exit_code == 2
    line = result.stderr.strip()
    assert "\n" not in line and "tp_comm_overlap_cfg" in line and "model.qkv_fusion" in line


def test_the_megatron_export_says_which_userbuffers_file_the_prediction_priced():
    from paraplan.catalog import resolve_job
    from paraplan.export.megatron import notes

    job = resolve_job({"model": "gpt3-175b", "cluster": {"name": "dgx-h100", "num_nodes": 64}, "precision": "fp8",
                       "parallel": {"framework": "nemo-mlperf-3.0", "tp": 4, "pp": 8, "sequence_parallel": True,
                                    "micro_batch_size": 1, "global_batch_size": 256}})
    assert job.parallel.tp_comm_overlap_cfg
    assert any("--tp-comm-overlap-cfg" in n and job.parallel.tp_comm_overlap_cfg in n for n in notes(job))


def _ignored(pred) -> list[str]:
    assert not any("tp_comm_overlap_cfg" in n for n in pred.uncalibrated)  # a setting, not a calibration gap
    return [n for n in pred.ignored_settings if n.startswith("parallel.tp_comm_overlap_cfg")]


def test_a_configuration_the_user_states_without_the_overlap_is_said_to_be_ignored():
    pred = predict(job(tp_comm_overlap=False))
    assert _ignored(pred) == [f"parallel.tp_comm_overlap_cfg {MLPERF}: Transformer Engine's userbuffers "
                              "run only with parallel.tp_comm_overlap true"]
    # priced as no configuration at all, and quiet where the overlap runs it
    assert pred.iteration_s == predict(job(cfg=None, tp_comm_overlap=False)).iteration_s
    assert _ignored(predict(job())) == []


def test_a_configuration_a_preset_fills_in_stays_quiet_without_the_overlap_and_a_stated_one_does_not():
    def preset_job(**parallel):
        return resolve_job({"model": {"name": "gpt3-175b", "num_layers": 8},
                            "cluster": {"name": "dgx-h100", "num_nodes": 1},
                            "parallel": {"framework": "nemo-mlperf-3.0", "tp": 4, "pp": 2, "sequence_parallel": True,
                                         "micro_batch_size": 1, "global_batch_size": 16, "tp_comm_overlap": False,
                                         **parallel}, "precision": "fp8"})

    filled = preset_job()
    assert filled.preset.taken["tp_comm_overlap_cfg"] == MLPERF and not filled.parallel.tp_comm_overlap
    assert _ignored(predict(filled)) == []
    assert len(_ignored(predict(preset_job(tp_comm_overlap_cfg=MLPERF)))) == 1
