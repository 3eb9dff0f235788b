"""Run a search: enumerate, screen memory, predict the survivors exactly, rank."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from paraplan.inventory import count_job
from paraplan.memory import estimate_memory
from paraplan.prediction import Prediction, predict
from paraplan.search.space import SearchSpace, enumerate_plans, iter_unique
from paraplan.specs import ClusterSpec, ConfigError, ModelSpec, Precision

OBJECTIVES = ("time", "cost")


@dataclass
class SearchResult:
    ranked: list[Prediction]  # feasible plans, best first
    excluded: Counter  # reason -> plans removed
    considered: int
    objective: str


def merge_results(results: list[SearchResult]) -> SearchResult:
    """One ranking over several searches (e.g. cluster sizes or GPU types)."""
    objective = results[0].objective
    ranked = sorted((p for r in results for p in r.ranked), key=lambda p: _score(p, objective))
    excluded: Counter = Counter()
    for r in results:
        excluded.update(r.excluded)
    return SearchResult(ranked, excluded, sum(r.considered for r in results), objective)


def _score(pred: Prediction, objective: str) -> float:
    if objective == "cost":
        usd = pred.usd_per_million_tokens
        if usd is None:
            raise ConfigError("objective: 'cost' needs a price (price_per_gpu_hour on the cluster)")
        return usd
    return 1.0 / pred.tokens_per_s


def search_plans(
    model: ModelSpec,
    cluster: ClusterSpec,
    global_batch_size: int,
    precision: Precision = Precision.BF16,
    space: SearchSpace | None = None,
    objective: str = "time",
    train_tokens: float | None = None,
    budget_usd: float | None = None,
    deadline_s: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SearchResult:
    """Every feasible plan of ``space``, ranked by ``objective`` (time: highest tokens/s;
    cost: lowest $ per million tokens), under an optional dollar budget and deadline for
    ``train_tokens``. Memory is checked before timing: a plan that does not fit is not timed."""
    if objective not in OBJECTIVES:
        raise ConfigError(f"objective: {objective!r} is not one of {', '.join(OBJECTIVES)}")
    if (budget_usd is not None or deadline_s is not None) and train_tokens is None:
        raise ConfigError("train_tokens: a budget or a deadline needs the number of tokens to train")
    if budget_usd is not None and cluster.price_per_gpu_hour is None:
        raise ConfigError("budget: the cluster has no price_per_gpu_hour")
    space = space or SearchSpace()
    cands = enumerate_plans(model, cluster, global_batch_size, precision, space, train_tokens)
    excluded = Counter(cands.excluded)
    jobs = list(iter_unique(cands.jobs))
    ranked: list[Prediction] = []
    hbm = cluster.gpu.hbm_bytes
    for i, job in enumerate(jobs):
        if progress is not None:
            progress(i, len(jobs))
        worst = max(m.total for m in estimate_memory(count_job(job)))
        if worst > hbm:
            excluded[f"does not fit in {hbm / 2**30:.0f} GiB per GPU"] += 1
            continue
        pred = predict(job)
        if deadline_s is not None and pred.time_to_train_s > deadline_s:
            excluded["misses the deadline"] += 1
            continue
        if budget_usd is not None and pred.cost_to_train_usd > budget_usd:
            excluded["exceeds the budget"] += 1
            continue
        ranked.append(pred)
    ranked.sort(key=lambda p: _score(p, objective))
    considered = len(jobs) + sum(cands.excluded.values())
    return SearchResult(ranked=ranked, excluded=excluded, considered=considered, objective=objective)
