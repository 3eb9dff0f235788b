"""A pipeline's breakdown is computed when first read: it needs second runs of the schedule
with free sends, which the plan search (reading no breakdown) never pays for; what is read
is what an eager computation gives, pickled or not."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from typer.testing import CliRunner

from paraplan.catalog import load_cluster, load_job, load_model
from paraplan.cli.app import app
from paraplan.prediction import facade, predict
from paraplan.search import SearchSpace, search_plans
from paraplan.specs import InternalError, Precision

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PIPELINED = [
    "llama-3-70b-dgx-h100-tp8-pp4.yaml",  # Megatron-LM, interleaved 1F1B (vpp 5), 256 micro-batches
    "gpt-neox-20b-perlmutter-pp4-tp4-dp8.yaml",  # GPT-NeoX on DeepSpeed's pipeline engine
]


@pytest.fixture
def free_send_runs(monkeypatch) -> list[str]:
    """Each run of a schedule with free sends (Megatron-LM's and FSDP's, or DeepSpeed's), by name."""
    calls: list[str] = []
    for name in ("free_sends_finish", "deepspeed_free_sends_finish"):
        run = getattr(facade, name)

        def counted(*args, _run=run, _name=name, **kwargs):
            calls.append(_name)
            return _run(*args, **kwargs)

        monkeypatch.setattr(facade, name, counted)
    return calls


@pytest.mark.parametrize("example", PIPELINED)
def test_a_pipelined_breakdown_computed_when_read_equals_the_one_computed_with_the_timeline(example, free_send_runs):
    job = load_job(EXAMPLES / example)
    eager = predict(job, keep_timeline=True)  # the timeline keeps the free-send runs: computed at once
    assert len(free_send_runs) == 1
    lazy = predict(job)
    assert len(free_send_runs) == 1  # nothing run until read
    assert lazy.iteration_s == eager.iteration_s
    assert lazy.breakdown == eager.breakdown
    assert lazy.bubble_fraction == eager.bubble_fraction
    assert lazy.breakdown.pipeline_bubble_s > 0 and lazy.breakdown.pipeline_p2p_s > 0
    lazy.to_dict()
    assert len(free_send_runs) == 2  # run once, on the first read, and kept


def test_a_prediction_pickled_before_its_breakdown_is_read_reads_the_same_breakdown_after():
    job = load_job(EXAMPLES / PIPELINED[0])
    pred = predict(job)
    unread = pickle.loads(pickle.dumps(pred))  # the search's process executor and Ray pickle it so
    assert pred.breakdown.pipeline_bubble_s > 0
    read = pickle.loads(pickle.dumps(pred))
    assert unread.breakdown == read.breakdown == predict(job, keep_timeline=True).breakdown
    assert unread.bubble_fraction == read.bubble_fraction
    assert unread == pred


def test_a_breakdown_computed_when_read_that_does_not_add_up_is_an_internal_error(monkeypatch):
    parts = facade.stage_parts

    def doubled(*args, **kwargs):  # the sends' wait counted twice
        out = parts(*args, **kwargs)
        out["pipeline_p2p_s"] *= 2
        return out

    monkeypatch.setattr(facade, "stage_parts", doubled)
    pred = predict(load_job(EXAMPLES / PIPELINED[0]))  # nothing read yet: nothing to refuse
    with pytest.raises(InternalError, match="breakdown adding up to"):
        pred.breakdown  # noqa: B018
    # the command still refuses it whole: exit code 3, one line, no part of a table
    result = CliRunner().invoke(app, ["predict", str(EXAMPLES / PIPELINED[0])], env={"COLUMNS": "80"})
    assert result.exit_code == 3
    assert result.output.startswith("internal error: ") and len(result.output.splitlines()) == 1


@pytest.mark.parametrize("screen", [True, False])
def test_the_searchs_exact_path_never_runs_the_free_send_schedule(screen, free_send_runs):
    space = SearchSpace(pp=(2, 4), vpp=(1, 2), micro_batch_size=(1, 2), zero_stage=(0,))
    result = search_plans(load_model("gpt3-1.3b"), load_cluster("dgx-a100", num_nodes=2), 64, Precision.BF16,
                          space, screen=screen)
    assert result.ranked and all(p.job.parallel.pp > 1 for p in result.ranked)
    assert free_send_runs == []
    assert result.ranked[0].breakdown.pipeline_bubble_s > 0  # the counter counts: a read runs it
    assert free_send_runs == ["free_sends_finish"]
