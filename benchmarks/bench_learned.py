"""Speed of the learned backend on this machine: import, fit (quick or default), predict.

Run: python benchmarks/bench_learned.py [--default] [path/to/shared/data]
Targets (issue 3): fitting every regressor of one GPU <= 10 min with the default budget;
one prediction with loaded models <= 50 ms.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from paraplan.catalog import load_job
from paraplan.costmodel.fitting import fit_models, fit_tasks, training_metadata
from paraplan.prediction import predict
from paraplan.prediction.backends import load_model_file, make_cost_model
from paraplan.regress.store import save_models
from paraplan.samples import import_gpumodeling, save_samples

ROOT = Path(__file__).resolve().parents[1]
args = [a for a in sys.argv[1:] if not a.startswith("--")]
DATA = Path(args[0]) if args else ROOT.parent / "shared" / "data"
BUDGET = "default" if "--default" in sys.argv else "quick"


def main() -> None:
    gm = DATA / "gpumodeling"
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        result = import_gpumodeling([gm / "operators_A100", gm / "nccl_perlmutter"])
        samples_path = Path(tmp) / "a100.samples"
        save_samples(result.samples, samples_path, result.metadata())
        t_import = time.perf_counter() - start

        start = time.perf_counter()
        tasks = fit_tasks(result.samples)
        models = fit_models(tasks, budget=BUDGET)
        models_path = Path(tmp) / "a100.models"
        save_models(models_path, models, training_metadata(samples_path, result.samples, BUDGET, 0))
        t_fit = time.perf_counter() - start

        start = time.perf_counter()
        loaded = load_model_file(models_path)
        t_load = time.perf_counter() - start
        jobs = sorted((ROOT / "examples").glob("*perlmutter*.yaml"))
        per_job = []
        for path in jobs:
            job = load_job(path)
            predict(job, make_cost_model(job, "learned", loaded))  # warm
            start = time.perf_counter()
            for _ in range(5):
                predict(job, make_cost_model(job, "learned", loaded))
            per_job.append((time.perf_counter() - start) / 5)
    print(f"| step (A100 samples, {BUDGET} budget) | time |")
    print("|---|---|")
    print(f"| import operators_A100 + nccl_perlmutter ({len(result.samples):,} records) | {t_import:.1f} s |")
    print(f"| fit {len(models)} regressors | {t_fit:.0f} s |")
    print(f"| load the models file | {t_load:.2f} s |")
    print(f"| predict one job with loaded models (mean of {len(jobs)} Perlmutter jobs) | {1e3 * sum(per_job) / len(per_job):.0f} ms |")


if __name__ == "__main__":
    main()
