"""Context parallelism as the frameworks run it (issue 27 item 4): Transformer Engine's p2p ring,
its all-gather and Ulysses all-to-all (Megatron-Core --cp-comm-type), PyTorch's ring with its
all-gather or all-to-all rotation (torchtitan context_parallel_rotate_method)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from paraplan.catalog import resolve_job
from paraplan.cli.app import app
from paraplan.export.megatron import megatron_args
from paraplan.inventory import ParallelDim, count_job
from paraplan.prediction import predict
from paraplan.prediction.components import COMPONENTS
from paraplan.specs import ConfigError

MEGATRON = ("p2p", "a2a", "allgather")
TORCHTITAN = ("allgather", "alltoall")


def _job(cp: int = 2, seq: int = 16384, kind: str | None = None, framework: str = "megatron", **parallel):
    zero = {"megatron": {"zero_stage": 1}, "fsdp": {"zero_stage": 3}}.get(framework, {})  # a preset's own
    plan = {"cp": cp, "framework": framework, "global_batch_size": 16, **zero,
            **({"cp_comm_type": kind} if kind else {}), **parallel}
    return resolve_job({"name": "cp", "model": {"name": "llama-3-8b", "seq_length": seq},
                        "cluster": {"name": "dgx-h100", "num_nodes": 2}, "parallel": plan, "precision": "bf16"})


def _exposed(job) -> float:
    return predict(job).breakdown.cp_communication_s


@pytest.mark.parametrize("kind,framework", [*((k, "megatron") for k in MEGATRON), *((k, "fsdp") for k in TORCHTITAN)])
def test_at_cp_1_the_exchange_named_changes_nothing_in_the_prediction(kind, framework):
    plain = predict(_job(cp=1, framework=framework)).to_dict()
    named = predict(_job(cp=1, kind=kind, framework=framework)).to_dict()
    assert json.dumps(named, sort_keys=True) == json.dumps(plain, sort_keys=True)
    assert "cp_comm_type" not in plain["parallel"]


@pytest.mark.parametrize("kind,framework", [*((k, "megatron") for k in MEGATRON), *((k, "fsdp") for k in TORCHTITAN)])
def test_each_exchange_exposes_more_with_more_cp_ranks_and_longer_sequences(kind, framework):
    by_cp = [_exposed(_job(cp=cp, kind=kind, framework=framework)) for cp in (2, 4, 8)]
    assert 0.0 < by_cp[0] < by_cp[1] < by_cp[2]
    by_seq = [_exposed(_job(cp=4, seq=seq, kind=kind, framework=framework)) for seq in (8192, 16384, 32768)]
    assert by_seq[0] < by_seq[1] < by_seq[2]


def test_transformer_engine_s_all_gather_exposes_what_the_ring_hides_behind_attention():
    ring, gather = _exposed(_job(cp=8, kind="p2p")), _exposed(_job(cp=8, kind="allgather"))
    assert ring < gather
    # PyTorch's all-gather waits for the gather only at the second step: the first one hides it
    assert _exposed(_job(cp=8, kind="allgather", framework="fsdp")) < gather


def test_transformer_engine_s_all_gather_and_ulysses_all_to_alls_are_exposed_whole():
    for kind in ("allgather", "a2a"):
        job = _job(cp=4, kind=kind)
        inv = count_job(job)
        pred = predict(job)
        colls = [c for c in inv.stages[0].layer_collectives if c.dim is ParallelDim.CP]
        assert colls and all(c.count == 1 for c in colls)
        est = {(c.name, c.phase): c.seconds for c in pred.layer_collectives if c.dim == "cp"}
        st = pred.stages[0]
        assert st.cp_fwd_mb_s + st.cp_bwd_mb_s == pytest.approx(st.num_layers * sum(est.values()), rel=1e-9)


def test_the_exposed_exchange_is_cp_communication_and_only_the_ring_s_launches_change_compute():
    preds = {kind: predict(_job(cp=4, kind=kind)) for kind in MEGATRON}
    compute = {kind: (p.breakdown.forward_compute_s, p.breakdown.backward_compute_s, p.breakdown.recompute_s)
               for kind, p in preds.items()}
    assert compute["a2a"] == compute["allgather"]  # one launch (one wave of two side by side)
    # the ring's cp launches each ramp up; the same FLOPs
    assert compute["p2p"][0] > compute["a2a"][0] and compute["p2p"][1] > compute["a2a"][1]
    assert len({p.breakdown.cp_communication_s for p in preds.values()}) == 3
    assert next(c.label for c in COMPONENTS if c.field == "cp_communication_s") == "CP communication"
    for p in preds.values():
        assert p.breakdown.total_s == pytest.approx(p.iteration_s, rel=1e-9)


def test_the_exchange_is_the_framework_s_default_unless_stated():
    assert _job().parallel.cp_comm == "p2p"  # Megatron-Core --cp-comm-type default ['p2p']
    assert _job(framework="fsdp").parallel.cp_comm == "allgather"  # torchtitan's rotate method
    assert _job(kind="alltoall", framework="fsdp").parallel.cp_comm == "p2p"  # a ring shift per step
    assert _job(kind="all_gather").parallel.cp_comm == "allgather"  # Transformer Engine's spelling
    assert predict(_job(cp=4)).to_dict()["parallel"]["cp_comm_type"] == "p2p"


def test_a_preset_sets_its_cited_exchange_with_cp_and_a_stated_one_wins_and_is_said():
    titan = _job(framework="torchtitan")
    assert titan.parallel.cp_comm == "allgather" and titan.preset.taken["cp_comm_type"] == "allgather"
    assert "cp_comm_type" not in _job(cp=1, framework="torchtitan").preset.taken  # "with cp > 1"
    mcore = _job(framework="megatron-core", kind="a2a")
    assert mcore.parallel.cp_comm == "a2a"
    assert mcore.preset.overridden == {"cp_comm_type": ("a2a", "p2p")}
    ring = _job(framework="torchtitan", kind="alltoall")
    assert ring.parallel.cp_comm == "p2p" and ring.preset.overridden == {"cp_comm_type": ("alltoall", "allgather")}


@pytest.mark.parametrize("plan,words", [
    ({"tp": 8, "cp": 2, "cp_comm_type": "a2a"}, "num_query_groups / tp = 1 is not divisible by cp = 2"),
    ({"cp": 2, "cp_comm_type": "a2a+p2p"}, "not modelled"),
    ({"cp": 2, "cp_comm_type": "alltoall"}, "torchtitan's ring rotation"),
    ({"cp": 2, "cp_comm_type": "a2a", "framework": "fsdp"}, "Megatron-Core's"),
])
def test_an_exchange_the_framework_cannot_run_is_one_line_naming_the_field(plan, words):
    with pytest.raises((ConfigError, ValueError)) as err:
        resolve_job({"model": {"name": "llama-3-70b", "seq_length": 16384}, "cluster": {"name": "dgx-h100", "num_nodes": 2},
                     "parallel": plan})
    message = str(err.value)
    assert "parallel.cp_comm_type:" in message and words in message


def test_the_command_line_takes_the_exchange_and_refuses_ulysses_on_too_few_heads_in_one_line():
    run = CliRunner()
    ok = run.invoke(app, ["predict", "--model", "llama-3-8b", "--cp", "4", "--cp-comm-type", "a2a", "-f", "json"],
                    env={"COLUMNS": "80"})
    assert ok.exit_code == 0 and json.loads(ok.stdout)["parallel"]["cp_comm_type"] == "a2a"
    table = run.invoke(app, ["predict", "--model", "llama-3-8b", "--cp", "4", "--cp-comm-type", "a2a"],
                       env={"COLUMNS": "80"})
    assert table.exit_code == 0 and "cp=4 (a2a)" in table.stdout and "CP communication" in table.stdout
    bad = run.invoke(app, ["predict", "--model", "llama-3-70b", "--tp", "8", "--cp", "2", "--cp-comm-type", "a2a"],
                     env={"COLUMNS": "80"})
    assert bad.exit_code == 2
    assert bad.stderr.strip().count("\n") == 0 and "parallel.cp_comm_type" in bad.stderr


def test_a_megatron_recipe_names_the_exchange_it_was_predicted_with():
    assert "--cp-comm-type" not in megatron_args(_job(cp=2))  # p2p: Megatron-LM's default
    args = megatron_args(_job(cp=2, kind="a2a"))
    assert args[args.index("--cp-comm-type") + 1] == "a2a"
    args = megatron_args(_job(cp=2, kind="allgather"))
    assert args[args.index("--cp-comm-type") + 1] == "all_gather"  # Transformer Engine's name
