"""Megatron-FSDP's expert gradients as Megatron-LM reduces them: in fp32 unless the run says
--grad-reduce-in-bf16 (arguments.py sets ``accumulate_allreduce_grads_in_fp32`` for bf16 models,
``get_model`` passes it on as ``grad_reduce_in_fp32``), reduce-scattered every micro-batch over
the expert data-parallel group (megatron_fsdp.py ``no_sync``), which the records reader says when
a record leaves the dtype out."""

from __future__ import annotations

import json
from pathlib import Path

from paraplan.catalog import resolve_job
from paraplan.inventory import CollectiveKind, ParallelDim, count_job
from paraplan.validate.records import job_from_record

RUNS_MOE = Path(__file__).parents[2] / "benchmarks" / "data" / "runs_moe_dev.json"


def _record(suffix: str) -> dict:
    runs = json.loads(RUNS_MOE.read_text())
    return next(r for r in (runs if isinstance(runs, list) else runs["runs"]) if r["id"].endswith(suffix))


def _expert_reduce_scatter_bytes(mapping: dict) -> float:
    job = resolve_job(mapping)
    return sum(c.bytes for st in count_job(job).stages for c in st.per_microbatch_dp
               if c.dim is ParallelDim.EDP and c.kind is CollectiveKind.REDUCE_SCATTER)


def test_a_megatron_fsdp_record_that_does_not_state_the_reduce_dtype_is_said_to_reduce_in_fp32():
    fsdp = job_from_record(_record("ep8-fsdp"))
    assert any("fp32 every micro-batch" in a and "--grad-reduce-in-bf16" in a for a in fsdp.assumed)
    assert "grad_reduce_in_fp32" not in fsdp.mapping["parallel"]
    # the distributed optimizer (ZeRO-1) reduces once an iteration: the dtype is not said there
    assert not any("--grad-reduce-in-bf16" in a for a in job_from_record(_record("ep32-deepep")).assumed)


def test_a_record_stating_grad_reduce_in_bf16_reduce_scatters_half_the_expert_bytes():
    record = _record("ep8-fsdp")
    bf16 = {**record, "framework": record["framework"] + ", --grad-reduce-in-bf16"}
    said, default = job_from_record(bf16), job_from_record(record)
    assert said.mapping["parallel"]["grad_reduce_in_fp32"] is False
    assert not any("--grad-reduce-in-bf16" in a for a in said.assumed)
    fp32_bytes = _expert_reduce_scatter_bytes(default.mapping)
    assert fp32_bytes > 0
    assert _expert_reduce_scatter_bytes(said.mapping) == fp32_bytes / 2
