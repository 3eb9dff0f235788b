"""One door: ``prediction.entry.predict_any`` chooses the homogeneous or heterogeneous path and
the cost model; ``paraplan.predict``, the CLI, the search and the exports all go through it."""

from __future__ import annotations

import subprocess
import sys

import pytest

import paraplan
from paraplan.catalog import resolve_job
from paraplan.catalog.jobs import demo_job_mapping
from paraplan.costmodel import AnalyticalCostModel
from paraplan.prediction import predict
from paraplan.prediction.entry import predict_any
from paraplan.prediction.hetero import predict_hetero
from paraplan.specs import ConfigError, HeteroJob


def demo_job():
    """The built-in demo job (``paraplan predict`` with no file)."""
    return resolve_job(demo_job_mapping())


NODE_GROUPS = {"model": "gpt2-xl", "cluster": "hetero-a100-a10",
               "parallel": {"tp": 1, "pp": 8, "global_batch_size": 64, "micro_batch_size": 1}}


def test_the_door_predicts_a_homogeneous_job_as_the_facade_does_with_the_roofline():
    job = demo_job()
    expected = predict(job, AnalyticalCostModel(job.cluster, job.precision))
    assert predict_any(job).iteration_s == expected.iteration_s
    assert paraplan.predict(job).iteration_s == expected.iteration_s
    assert predict_any(job).memory == expected.memory


def test_the_door_predicts_node_groups_of_different_gpus_on_the_heterogeneous_path():
    job = resolve_job(NODE_GROUPS)
    assert isinstance(job, HeteroJob)
    expected = predict_hetero(job)
    through_door = predict_any(job)
    assert through_door.iteration_s == expected.iteration_s and through_door.placement is not None
    assert paraplan.predict(NODE_GROUPS).iteration_s == expected.iteration_s


@pytest.mark.parametrize("kwargs", [{"backend": "learned"}, {"models": "a100.models"}])
def test_a_learned_backend_on_node_groups_is_refused_in_one_line_naming_the_backend(kwargs):
    with pytest.raises(ConfigError, match=r"^backend: a cluster with node groups of different GPUs is predicted analytically$"):
        paraplan.predict(NODE_GROUPS, **kwargs)


def test_an_unknown_backend_is_refused_naming_the_ones_there_are():
    with pytest.raises(ConfigError, match=r"^backend: unknown backend 'magic' \(available: analytical, learned\)$"):
        predict_any(demo_job(), backend="magic")


def test_reading_the_version_loads_no_prediction_code():
    code = ("import sys; from paraplan._version import __version__; import paraplan; "
            "loaded = [m for m in sys.modules if m.startswith('paraplan.')]; "
            "assert loaded == ['paraplan._version'], loaded; assert paraplan.__version__ == __version__")
    subprocess.run([sys.executable, "-c", code], check=True)
