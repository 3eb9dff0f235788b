"""Does the search rank the plan the authors ran near the top? (issue 4, part 7)

For each published run in ../shared/data/published/runs_dev.json, search tp x pp x vpp x
micro-batch for that model, cluster and global batch, with the authors' recompute policy and
ZeRO stage held fixed (they are choices of the run, not of the parallel layout), and report
where the authors' plan ranks by predicted time. Measured times are not used.

Run: python benchmarks/search_validation.py [path/to/shared/data] [--max-gpus N]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from paraplan.catalog import resolve_job
from paraplan.search import SearchSpace, search_plans
from paraplan.specs import Recompute
from paraplan.validate import load_runs
from paraplan.validate.published import job_mapping_from_published

args = [a for a in sys.argv[1:] if not a.startswith("--")]
DATA = Path(args[0]) if args else Path(__file__).resolve().parents[2] / "shared" / "data"
MAX_GPUS = int(sys.argv[sys.argv.index("--max-gpus") + 1]) if "--max-gpus" in sys.argv else 512


def main() -> None:
    print("| run | GPUs | authors' plan (tp, pp, vpp, mbs) | rank of it | plans ranked | best plan found | predicted gain | search s |")
    print("|---|---|---|---|---|---|---|---|")
    for run in load_runs(DATA / "published" / "runs_dev.json"):
        if run["num_gpus"] > MAX_GPUS:
            continue
        job = resolve_job(job_mapping_from_published(run))
        plan = job.parallel
        space = SearchSpace(
            micro_batch_size=(1, 2, 4, 8, 16),
            zero_stage=(plan.zero_stage,),
            recompute=(Recompute(plan.recompute),),
            vpp=(1, 2, 3, 4),
            sequence_parallel="with_tp" if plan.sequence_parallel else "both",
            extra={"scatter_gather_p2p": True},
        )
        start = time.perf_counter()
        result = search_plans(job.model, job.cluster, plan.global_batch_size, job.precision, space, screen=False)
        seconds = time.perf_counter() - start

        def key(p):
            q = p.job.parallel
            return (q.tp, q.pp, q.vpp, q.micro_batch_size, q.sequence_parallel)

        target = (plan.tp, plan.pp, plan.vpp, plan.micro_batch_size, plan.sequence_parallel)
        ranks = [i for i, p in enumerate(result.ranked, start=1) if key(p) == target]
        rank = str(ranks[0]) if ranks else "not feasible"
        best = result.ranked[0] if result.ranked else None
        authors = result.ranked[ranks[0] - 1] if ranks else None
        gain = f"{authors.iteration_s / best.iteration_s - 1:+.1%}" if best and authors else "-"
        b = best.job.parallel if best else None
        best_txt = f"{b.tp}, {b.pp}, {b.vpp}, {b.micro_batch_size}" if b else "-"
        print(
            f"| {run['id']} | {run['num_gpus']} | {plan.tp}, {plan.pp}, {plan.vpp}, {plan.micro_batch_size} | {rank} | "
            f"{len(result.ranked)} | {best_txt} | {gain} | {seconds:.1f} |"
        )


if __name__ == "__main__":
    main()
