"""Speed of the plan search (issue 4, part 4): the vectorised screen and the whole search.

Run: python benchmarks/bench_search.py [--sample N]
Targets (issue 4): >= 100,000 plans screened per second per core; the whole space for GPT-3
175B on 1,024 A100-80GB with global batch up to 2,048 searched in under 10 s. The Mixtral case
(issue 18) adds expert parallelism: ep x etp multiply the shard shapes and layouts costed once.

The process is pinned to one core. "Points" are all combinations of the space's axes (what
the divisibility rules, the Job validator and the screen get through); "plans" are the valid,
distinct plans the screen times and sizes. Screen seconds are time.perf_counter around
``screen_plans`` only, best of three. The search times the screen's shortlist exactly
(``predict``). The last table compares the screen with ``predict`` on a random sample.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import time

import numpy as np

from paraplan.catalog import load_cluster, load_model
from paraplan.prediction import predict
from paraplan.search import SearchSpace, search_plans
from paraplan.search.screen import screen_plans
from paraplan.specs import Precision

BATCHES = (512, 1024, 1536, 2048)
SPACES = {
    # tp and pp: powers of two / divisors (defaults); ZeRO 0-1; recompute none/selective/full
    "default": SearchSpace(global_batch_sizes=BATCHES),
    # every axis of issue 4's space: `paraplan search --space full` (cp 1-8, vpp 1-8, mbs 1-16,
    # ZeRO 0-3, Megatron-LM's recompute policies, sequence parallelism on and off)
    "whole": SearchSpace.full(global_batch_sizes=BATCHES),
}
CASES = {
    "GPT-3 175B, 1,024 A100-80GB (dgx-a100 x 128)": ("gpt3-175b", "dgx-a100", 128),
    "Llama-3-70B, 512 H100 (dgx-h100 x 64)": ("llama-3-70b", "dgx-h100", 64),
    # a mixture of experts (issue 18): every ep dividing the 8 experts, etp = tp (full: tp and 1)
    "Mixtral 8x7B, 64 H100 (dgx-h100 x 8)": ("mixtral-8x7b", "dgx-h100", 8),
}
SAMPLE = int(sys.argv[sys.argv.index("--sample") + 1]) if "--sample" in sys.argv else 300


def _pin_one_core() -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def _screen(model, cluster, space, repeats: int = 3):
    best, screen = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        screen = screen_plans(model, cluster, BATCHES[0], Precision.BF16, space)
        best = min(best, time.perf_counter() - start)
    return screen, best


def _plan(pred) -> str:
    p = pred.job.parallel
    text = f"tp{p.tp} pp{p.pp} dp{p.dp}" + (f" cp{p.cp}" if p.cp > 1 else "") + (f" vpp{p.vpp}" if p.vpp > 1 else "")
    text += (f" ep{p.ep}" if p.ep > 1 else "") + (f" etp{p.etp}" if pred.job.model.is_moe and p.etp != p.tp else "")
    return f"{text} mbs{p.micro_batch_size} gbs{p.global_batch_size} ZeRO-{p.zero_stage} {p.recompute.value}"


def main() -> None:
    _pin_one_core()
    loaded = {name: (load_model(m), load_cluster(c, num_nodes=n)) for name, (m, c, n) in CASES.items()}
    screens = {}
    print("Screen throughput, one core\n")
    print("| case | space | points | valid plans | screen s | points / s | plans / s | array phase plans / s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (model, cluster) in loaded.items():
        for label, space in SPACES.items():
            screen, seconds = _screen(model, cluster, space)
            screens[name, label] = screen
            combine = screen.timings["combine"]
            print(
                f"| {name} | {label} | {screen.considered:,} | {len(screen):,} | {seconds:.3f} | "
                f"{screen.considered / seconds:,.0f} | {len(screen) / seconds:,.0f} | {len(screen) / combine:,.0f} |"
            )
    print("\nEnd-to-end search (global batch 512, 1024, 1536, 2048; shortlist timed exactly)\n")
    print("| case | space | search s | plans timed exactly | best plan | tokens/s | exact path s | same best |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (model, cluster) in loaded.items():
        for label, space in SPACES.items():
            start = time.perf_counter()
            result = search_plans(model, cluster, BATCHES[0], Precision.BF16, space)
            seconds = time.perf_counter() - start
            best = result.ranked[0]
            exact_s, same = "-", "-"
            if label == "default":  # brute force: every plan predicted exactly
                start = time.perf_counter()
                brute = search_plans(model, cluster, BATCHES[0], Precision.BF16, space, screen=False)
                exact_s = f"{time.perf_counter() - start:.2f}"
                same = "yes" if brute.ranked[0].job.parallel == best.job.parallel else "NO"
            print(
                f"| {name} | {label} | {seconds:.2f} | {len(result.ranked)} | {_plan(best)} | "
                f"{best.tokens_per_s:,.0f} | {exact_s} | {same} |"
            )
    print(f"\nScreen against the exact prediction ({SAMPLE} random plans per row, and every plan the search timed)\n")
    print("| case | space | plans compared | max abs time error | 99th percentile | memory identical |")
    print("|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for (name, label), screen in screens.items():
        idx = rng.choice(len(screen), size=min(SAMPLE, len(screen)), replace=False)
        order = np.argsort(screen.seconds_per_token + np.where(screen.fits, 0.0, np.inf), kind="stable")
        idx = np.unique(np.concatenate([idx, order[:50]]))
        errors, same_memory = [], True
        for i in idx:
            pred = predict(screen.job(int(i)))
            errors.append(abs(screen.iteration_s[i] / pred.iteration_s - 1.0))
            same_memory &= bool(screen.memory_bytes[i] == max(m.total for m in pred.memory))
        errors = np.array(errors)
        print(
            f"| {name} | {label} | {len(idx)} | {100 * errors.max():.3f} % | {100 * np.percentile(errors, 99):.3f} % | "
            f"{'yes' if same_memory else 'NO'} |"
        )


if __name__ == "__main__":
    main()
