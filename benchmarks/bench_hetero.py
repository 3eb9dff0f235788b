"""Speed and quality of the uneven-stage search (issue 4, part 2): FASOP's heterogeneous case
and uneven splits on homogeneous clusters.

Run: python benchmarks/bench_hetero.py
Target (issue 4): FASOP's heterogeneous GPT-2 XL case (1 node of 4 A100 + 7 nodes of 4 A10)
searched in under 1 second on this 2-core machine. The process is pinned to one core; times
are the best of three after one warm-up search (catalog and curve caches).

The layer partition is exact for the pipeline's closed form (``search/partition.py``, proved
against brute force in tests); the last table measures how far the reported best is from the
best of *every* split predicted in full, on models cut to 12 and 16 layers so that brute
force is affordable.
"""

from __future__ import annotations

import itertools
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from paraplan.catalog import load_cluster, load_model
from paraplan.catalog.loader import load_any_cluster
from paraplan.prediction.hetero import predict_hetero
from paraplan.search import SearchSpace, search_plans
from paraplan.search.hetero import node_orders
from paraplan.specs import HeteroJob, Precision


def _pin_one_core() -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def _timed(fn, repeats: int = 3):
    fn()
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return out, best


def _plan(pred) -> str:
    p = pred.job.parallel
    layers = pred.plan_dict()["layers_per_stage"]
    text = f"tp{p.tp} pp{p.pp} dp{p.dp} mbs{p.micro_batch_size} ZeRO-{p.zero_stage} {p.recompute.value} layers {layers}"
    if pred.placement is not None:
        text += f" on {', '.join(pred.placement.stage_gpus)}"
    return text


def fasop_case() -> None:
    model, cluster = load_model("gpt2-xl"), load_any_cluster("hetero-a100-a10")
    print("FASOP's case: GPT-2 XL (48 layers), global batch 64, on 1 x 4 A100-40GB + 7 x 4 A10G (hetero-a100-a10)\n")
    print("| search | s | plans considered | timed exactly | best plan | tokens/s | $ / M tokens |")
    print("|---|---|---|---|---|---|---|")
    for objective in ("time", "cost"):
        result, seconds = _timed(lambda o=objective: search_plans(model, cluster, 64, objective=o))
        best = result.ranked[0]
        print(f"| objective {objective} | {seconds:.2f} | {result.considered:,} | {len(result.ranked)} | "
              f"{_plan(best)} | {best.tokens_per_s:,.0f} | {best.usd_per_million_tokens:.3f} |")
    for name in ("aws-g5.12xlarge", "aws-p4d.24xlarge"):
        nodes = 8 if name == "aws-g5.12xlarge" else 4
        homog = load_cluster(name, num_nodes=nodes)
        result, seconds = _timed(lambda h=homog: search_plans(model, h, 64))
        best = result.ranked[0]
        print(f"| {nodes} x {name} (homogeneous, even) | {seconds:.2f} | {result.considered:,} | "
              f"{len(result.ranked)} | {_plan(best)} | {best.tokens_per_s:,.0f} | {best.usd_per_million_tokens:.3f} |")


def uneven_homogeneous() -> None:
    print("\nUneven splits on homogeneous clusters (default space; even = Megatron-LM's equal stages)\n")
    print("| case | even: s | even: best | tokens/s | uneven: s | uneven: best | tokens/s | gain |")
    print("|---|---|---|---|---|---|---|---|")
    for model_name, cluster_name, nodes, gbs in [("gpt3-1.3b", "dgx-a100", 2, 64), ("llama-3-70b", "dgx-h100", 8, 512),
                                                 ("gpt3-175b", "dgx-a100", 16, 256)]:
        model, cluster = load_model(model_name), load_cluster(cluster_name, num_nodes=nodes)
        even, te = _timed(lambda m=model, c=cluster, g=gbs: search_plans(m, c, g, Precision.BF16, SearchSpace()), 1)
        un, tu = _timed(lambda m=model, c=cluster, g=gbs: search_plans(m, c, g, Precision.BF16,
                                                                      SearchSpace(uneven_layers=True)), 1)
        e, u = even.ranked[0], un.ranked[0]
        print(f"| {model_name} on {nodes} x {cluster_name}, gbs {gbs} | {te:.2f} | {_plan(e)} | {e.tokens_per_s:,.0f} | "
              f"{tu:.2f} | {_plan(u)} | {u.tokens_per_s:,.0f} | {u.tokens_per_s / e.tokens_per_s - 1:+.1%} |")


def against_brute_force() -> None:
    print("\nReported best against every split predicted in full (tp 1, pp 4 and 8, mbs 1-2, ZeRO-1, all 8 node orders)\n")
    print("| model | splits predicted | search best s/iter | brute-force best s/iter | gap |")
    print("|---|---|---|---|---|")
    cluster = load_any_cluster("hetero-a100-a10")
    space = SearchSpace(tp=(1,), pp=(4, 8), micro_batch_size=(1, 2), zero_stage=(1,), recompute=("none",))
    for layers in (12, 16):
        model = load_model("gpt2-xl").model_copy(update={"num_layers": layers, "name": f"gpt2-xl-{layers}"})
        found = search_plans(model, cluster, 64, Precision.BF16, space).ranked[0]
        best, count = None, 0
        for pp, mbs, order in itertools.product((4, 8), (1, 2), node_orders(cluster)):
            for cut in itertools.combinations(range(1, layers), pp - 1):
                bounds = (0, *cut, layers)
                split = tuple(bounds[i + 1] - bounds[i] for i in range(pp))
                job = HeteroJob(model=model, cluster=cluster, node_order=order, parallel={
                    "tp": 1, "pp": pp, "micro_batch_size": mbs, "global_batch_size": 64, "zero_stage": 1,
                    "layers_per_stage": split})
                pred = predict_hetero(job)
                count += 1
                if pred.fits and (best is None or pred.iteration_s < best.iteration_s):
                    best = pred
        print(f"| gpt2-xl cut to {layers} layers | {count:,} | {found.iteration_s:.4f} | {best.iteration_s:.4f} | "
              f"{found.iteration_s / best.iteration_s - 1:+.1%} |")


if __name__ == "__main__":
    _pin_one_core()
    fasop_case()
    uneven_homogeneous()
    against_brute_force()
