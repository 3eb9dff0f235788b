"""`--executor ray`: the same searches on a local Ray instance give exactly the serial results."""

import json

import pytest
from typer.testing import CliRunner

from paraplan.catalog import load_cluster, load_model
from paraplan.cli.app import app
from paraplan.search import SearchSpace
from paraplan.search.executors import run_searches
from paraplan.specs import ConfigError

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow  # each Ray start takes a few seconds

SPACE = SearchSpace(micro_batch_size=(1, 2), zero_stage=(0, 1))
SEARCH = ["search", "--model", "gpt3-1.3b", "--cluster", "dgx-a100", "--sizes", "1,2",
          "--global-batch-size", "64", "--format", "json", "--top", "100"]


def two_searches(**extra):
    model = load_model("gpt3-1.3b")
    return [
        dict(model=model, cluster=load_cluster("dgx-a100", num_nodes=n), global_batch_size=64, space=SPACE, **extra)
        for n in (1, 2)
    ]


@pytest.fixture(autouse=True)
def no_ray_address(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # a local instance, whatever the shell says


def test_the_ray_executor_starts_a_local_ray_returns_the_serial_results_in_order_and_stops_it():
    searches = two_searches()
    serial = run_searches(searches, "serial")
    assert not ray.is_initialized()
    on_ray = run_searches(searches, "ray", workers=2)
    assert not ray.is_initialized()  # it started Ray, so it shut it down
    for a, b in zip(serial, on_ray, strict=True):
        assert [p.job.parallel for p in a.ranked] == [p.job.parallel for p in b.ranked]
        assert [p.iteration_s for p in a.ranked] == [p.iteration_s for p in b.ranked]
        assert a.excluded == b.excluded and a.considered == b.considered
    assert on_ray == serial
    assert [r.ranked[0].job.cluster.num_nodes for r in on_ray] == [1, 2]


@pytest.fixture(scope="module")
def callers_ray():
    """A Ray the caller started: the executor must use it and leave it running."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def test_a_ray_the_caller_started_is_used_left_running_and_reports_progress(callers_ray):
    searches = two_searches()
    seen = []
    on_ray = run_searches(searches, "ray", progress=lambda done, total: seen.append((done, total)))
    assert ray.is_initialized()
    assert on_ray == run_searches(searches, "serial")
    assert seen == [(1, 2), (2, 2)]


def test_an_error_inside_a_ray_task_is_raised_as_the_serial_run_raises_it(callers_ray):
    searches = two_searches(objective="cost")  # dgx-a100 has no price
    with pytest.raises(ConfigError) as serial:
        run_searches(searches, "serial")
    with pytest.raises(ConfigError) as on_ray:
        run_searches(searches, "ray")
    assert type(on_ray.value) is ConfigError  # not Ray's wrapper with the worker's traceback
    assert str(on_ray.value) == str(serial.value)
    assert "\n" not in str(on_ray.value)


def test_the_search_command_on_ray_prints_the_serial_plans(callers_ray):
    runner = CliRunner()
    serial = runner.invoke(app, [*SEARCH, "--executor", "serial"])
    on_ray = runner.invoke(app, [*SEARCH, "--executor", "ray"])
    assert on_ray.exit_code == 0, on_ray.output
    assert json.loads(on_ray.stdout) == json.loads(serial.stdout)
    assert {p["gpus"] for p in json.loads(on_ray.stdout)["plans"]} == {"8 x A100-SXM4-80GB", "16 x A100-SXM4-80GB"}


def test_the_search_command_on_ray_reports_an_error_in_a_task_in_one_line(callers_ray):
    result = CliRunner().invoke(app, [*SEARCH, "--executor", "ray", "--objective", "cost"],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: objective: 'cost' needs a price (price_per_gpu_hour on the cluster)"
    ]
