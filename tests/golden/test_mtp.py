"""Issue 28 item 4: DeepSeek-V3's multi-token-prediction module as an option (``mtp_num_layers``,
Megatron-Core's ``--mtp-num-layers``).

DeepSeek-AI 2024, "DeepSeek-V3 Technical Report" (arXiv 2412.19437), section 2.2: D = 1 module of
two RMSNorms, a 2h -> h projection and one transformer block, with the embedding and output head
shared. deepseek-ai/DeepSeek-V3-Base README_WEIGHTS.md: the MTP module holds "11.5B unique
parameters, excluding the shared 0.9B Embedding and 0.9B output Head"; the model card: "685B,
which includes 671B of the Main Model weights and 14B of the Multi-Token Prediction (MTP) Module
weights" (the checkpoint stores the module's own copies of the embedding and head). Measured:
671,026,404,352 main parameters; the module's 11,610,067,968 unique ones (README's 11.5B to
0.96 %: its rounding); with the checkpoint's copies (1,853,358,080) 684,489,830,400, the model
card's 685B to 0.07 %."""

from __future__ import annotations

import pytest


def _job(mtp: int, pp: int = 16):
    from paraplan.catalog.jobs import resolve_job

    split = [4] * 13 + [3] * 3 if pp == 16 else None
    return resolve_job({"name": "t", "model": {"name": "deepseek-v3", "mtp_num_layers": mtp},
                        "cluster": {"name": "aws-p5.48xlarge", "num_nodes": 32},
                        "parallel": {"pp": pp, "ep": 8, "micro_batch_size": 1, "global_batch_size": 1024,
                                     **({"layers_per_stage": split} if split else {})},
                        "precision": "bf16"})


def test_deepseek_v3_with_its_mtp_module_has_the_published_685b_in_its_authors_convention():
    from paraplan.inventory.job import _unsharded, count_params
    from paraplan.inventory.mtp import mtp_checkpoint_params

    main, job = count_params(_job(0)), _job(1)
    assert main == pytest.approx(671e9, rel=1e-3)
    with_mtp = count_params(job)
    assert with_mtp - main == pytest.approx(11_610_067_968, rel=1e-6)
    assert with_mtp - main == pytest.approx(11.5e9, rel=0.01)  # README_WEIGHTS.md's rounding
    assert with_mtp + mtp_checkpoint_params(job.model, _unsharded(job)) == pytest.approx(685e9, rel=1e-3)


def test_the_mtp_module_runs_on_the_last_stage_only_with_its_block_and_shared_head():
    from paraplan.inventory.job import count_job

    off, on = count_job(_job(0)).stages, count_job(_job(1)).stages
    assert [s.end_ops for s in on[:-1]] == [s.end_ops for s in off[:-1]]
    mtp = [op for op in on[-1].end_ops if op.role.startswith("MTP")]
    assert {"mtp_eh_proj", "linear_final", "cross_entropy", "flash_atten"} <= {op.name for op in mtp}
    assert sum(op.params for op in mtp if op.name in ("linear_final", "embedding")) == 0  # shared
    assert on[-1].expert_params > off[-1].expert_params
    # the MoE block's expert-parallel all-to-alls come with it
    assert len(on[-1].end_collectives) > len(off[-1].end_collectives)


def test_the_mtp_module_makes_the_iteration_slower_and_off_changes_nothing():
    from paraplan.prediction.entry import predict_any

    off, on = predict_any(_job(0)).iteration_s, predict_any(_job(1)).iteration_s
    assert on > off
    assert predict_any(_job(0, pp=1)).iteration_s < predict_any(_job(1, pp=1)).iteration_s


def test_the_megatron_export_passes_the_mtp_layers_on():
    from paraplan.export.megatron import megatron_args

    assert "--mtp-num-layers 1" in " ".join(megatron_args(_job(1)))
    assert "--mtp-num-layers" not in " ".join(megatron_args(_job(0)))


def test_a_traced_deepseek_v3_runs_its_mtp_block_as_its_traced_last_layer_within_a_percent_of_hand():
    # measured: +0.61 % with the module (+0.78 % without), parameters equal to the unit
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from pathlib import Path

    from paraplan.catalog.jobs import resolve_job
    from paraplan.inventory.job import count_job, count_params
    from paraplan.prediction.entry import predict_any

    config = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "deepseek-v3.json"

    def job(inventory: str):
        return resolve_job({"name": "t", "model": {"hf_config": str(config), "seq_length": 1024, "mtp_num_layers": 1,
                                                   "inventory": inventory},
                            "cluster": {"name": "aws-p5.48xlarge", "num_nodes": 32},
                            "parallel": {"pp": 16, "ep": 8, "micro_batch_size": 1, "global_batch_size": 512,
                                         "layers_per_stage": [4] * 13 + [3] * 3}, "precision": "bf16"})

    hand, traced = job("hand"), job("traced")
    assert count_params(traced) == count_params(hand)
    assert predict_any(traced).iteration_s / predict_any(hand).iteration_s - 1 == pytest.approx(0, abs=0.01)
    mtp = [op for op in count_job(traced).stages[-1].end_ops if op.role.startswith("MTP")]
    assert any("traced" in op.role for op in mtp)  # the block is the traced last layer


def test_a_published_record_with_mtp_layers_keeps_them():
    from paraplan.validate.records import _experts

    assumed: list[str] = []
    run = {"model": {"num_layers": 61, "num_moe_experts": 256, "mtp_num_layers": 1}}
    assert _experts(run, assumed)["mtp_num_layers"] == 1
    assert not any("multi-token" in note for note in assumed)  # it was "left out (not modelled)"
