"""What each framework behaviour is worth on the five Perlmutter runs: switch one off at a time.

Run: python benchmarks/ablation_perlmutter.py [--models a100.models] [path/to/shared/data]
Prints a markdown table per backend (docs/learned.md): the mean |error| and each run's error
with the behaviour as shipped and with each one switched off. The behaviours come from the
frameworks' code and the runs' logged configuration; the runs are only compared with, nothing
is fitted to them.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from paraplan.catalog.jobs import resolve_job
from paraplan.prediction import predict
from paraplan.prediction.backends import load_model_file, make_cost_model
from paraplan.validate import load_runs
from paraplan.validate.gpumodeling import job_mapping_from_run

SWITCHES = {
    "nothing (as shipped)": {},
    "DeepSpeed's TrainSchedule (Megatron-LM's 1F1B order instead)": {"parallel": {"deepspeed_train_schedule": False}},
    "sliced pipeline messages (whole activations sent, none gathered: `scatter_gather_p2p: false`)": {
        "parallel": {"scatter_gather_p2p": False}
    },
    "`partition_activations` (one TP all-gather per layer backward)": {"parallel": {"partition_activations": False}},
    "`pipeline_mask` (the fp16 [s, s] mask sent with each activation)": {"parallel": {"pipeline_mask": False}},
    "unfused biases (`bias_dropout_fusion`, `bias_gelu_fusion` set true)": {
        "model": {"bias_dropout_fusion": True, "bias_gelu_fusion": True}
    },
    "gradient accumulation adds (`gradient_accumulation_fusion: true`)": {
        "parallel": {"gradient_accumulation_fusion": True}
    },
}


def _errors(runs, change, backend, models) -> list[float]:
    errors = []
    for run in runs:
        mapping = job_mapping_from_run(run)
        for part, values in change.items():
            mapping[part] = {**mapping[part], **values}
        job = resolve_job(mapping)
        pred = predict(job, make_cost_model(job, backend, models))
        measured = run["measured"]["iteration_time_s"]["min"]
        errors.append((pred.iteration_s - measured) / measured)
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", nargs="?", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    parser.add_argument("--models", type=Path, help="a models file from `paraplan fit` (adds the learned backend)")
    args = parser.parse_args()
    runs = load_runs(args.data / "gpumodeling" / "runs_perlmutter.json")
    backends = [("analytical", None)]
    if args.models is not None:
        backends.append(("learned", load_model_file(args.models)))
    for backend, models in backends:
        print(f"{backend} backend\n")
        print("| switched off | mean abs. error | " + " | ".join(r["id"] for r in runs) + " |")
        print("|---|---|" + "---|" * len(runs))
        for name, change in SWITCHES.items():
            errors = _errors(runs, change, backend, models)
            mae = statistics.fmean(abs(e) for e in errors)
            print(f"| {name} | {100 * mae:.1f} % | " + " | ".join(f"{100 * e:+.1f}" for e in errors) + " |")
        print()


if __name__ == "__main__":
    main()
