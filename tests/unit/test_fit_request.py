"""The fitting layer turns the words of `paraplan fit` into the fit to run; the command only
asks and renders."""

from __future__ import annotations

from pathlib import Path

import pytest

from paraplan.costmodel.fit_request import FitRequest
from paraplan.specs import ConfigError

CLUSTER = Path(__file__).resolve().parents[2] / "examples" / "tiny-cpu" / "cluster.yaml"


def _never_read(paths):
    raise AssertionError("read the samples of a request that should have been refused")


def test_a_fit_request_refuses_an_existing_models_file_before_reading_any_sample(tmp_path):
    (tmp_path / "a.models").write_bytes(b"keep me")
    with pytest.raises(ConfigError, match="already exists"):
        FitRequest.from_flags([tmp_path / "none.samples"], out_file=tmp_path / "a.models").run(_never_read)
    assert (tmp_path / "a.models").read_bytes() == b"keep me"


def test_a_fit_request_reads_the_cluster_files_for_hardware_the_catalog_lacks(tmp_path):
    request = FitRequest.from_flags([tmp_path / "a.samples"], out_file=tmp_path / "a.models",
                                    cluster_files=[CLUSTER], quick=True, seed=3)
    assert request.hardware.gpu("cpu-core").name == "cpu-core"
    assert (request.budget, request.seed, request.overwrite) == ("quick", 3, False)


def test_a_fit_request_names_a_missing_cluster_file(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.yaml"):
        FitRequest.from_flags([tmp_path / "a.samples"], out_file=tmp_path / "a.models",
                              cluster_files=[tmp_path / "nope.yaml"])


def test_a_fit_request_runs_without_a_terminal_and_says_which_regressors_stay_analytical(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    pytest.importorskip("sklearn")
    from paraplan.samples import import_gpumodeling, save_samples
    from paraplan.samples.merge import load_many

    folder = tmp_path / "ops"
    folder.mkdir()
    rows = [{"mp": mp, "b": b, "l": seq, "dim": dim, "F_dur(us)": 20 + seq * b * dim / mp / 1e5,
             "B_dur(us)": 40 + seq * b * dim / mp / 5e4}
            for mp in (1, 2, 4) for b in (2, 4) for seq in (1024, 2048) for dim in (2048, 4096)]
    pd.DataFrame(rows).to_csv(folder / "NVIDIAA100-SXM4-80GB_linear1_fp16.csv", index=False)
    pd.DataFrame(rows[:3]).to_csv(folder / "NVIDIAA100-SXM4-80GB_linear2_fp16.csv", index=False)
    result = import_gpumodeling([folder])
    save_samples(result.samples, tmp_path / "a100.samples", result.metadata())
    kept: dict[str, int] = {}
    request = FitRequest.from_flags([tmp_path / "a100.samples"], out_file=tmp_path / "a.models", quick=True)
    fitted = request.run(load_many, kept_analytical=kept.__setitem__)
    assert set(fitted.models) == {"op/A100-SXM4-80GB/fp16/linear1/fwd", "op/A100-SXM4-80GB/fp16/linear1/bwd"}
    assert kept == fitted.kept_analytical == {"op/A100-SXM4-80GB/fp16/linear2/fwd": 3,
                                              "op/A100-SXM4-80GB/fp16/linear2/bwd": 3}
    assert fitted.curves is None and (tmp_path / "a.models").exists()
