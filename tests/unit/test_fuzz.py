"""Hostile job files and flag sets never get a traceback, a hang or an impossible answer, and
every rejection is one line naming what it refuses (issue 15). The cases and the judge are in
tests/fuzzing.py; benchmarks/fuzz.py runs 10,000 and more of them under a memory cap."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from fuzzing import DEFECTS, Case, cases, judge


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(cases())
def test_no_hostile_input_gets_a_traceback_a_hang_or_an_impossible_answer(case: Case):
    outcome = judge(case, timeout_s=20)
    assert outcome.kind not in DEFECTS, (outcome, case)
    if outcome.kind == "rejected":
        assert outcome.names_field, (outcome.message, case)
        assert len(outcome.message) < 400, outcome.message


def test_the_judge_calls_a_valid_job_an_answer_and_a_bad_one_a_named_rejection():
    """The judge itself: it must be able to fail (a fuzz suite that cannot fail proves nothing)."""
    good = judge(Case(b"model: gpt2\ncluster: dgx-a100\n"))
    assert good.kind == "answer", good
    bad = judge(Case(b"model: gpt2\ncluster: dgx-a100\nparallel: {tp: 3}\n", field="parallel.tp"))
    assert bad.kind == "rejected" and bad.names_field, bad
    unnamed = judge(Case(b"model: gpt2\ncluster: dgx-a100\nparallel: {tp: 3}\n", field="precision"))
    assert not unnamed.names_field


def test_a_flag_click_refuses_is_one_line_naming_the_flag_not_a_usage_box():
    outcome = judge(Case(args=("--dp", "nan"), field="dp"))
    assert outcome.kind == "rejected", outcome
    assert outcome.message.startswith("error: Invalid value for '--dp'")
    assert outcome.message.endswith("(see paraplan predict --help)")
