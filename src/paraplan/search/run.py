"""Run a search: screen every plan (time and memory, vectorised), predict the shortlist exactly, rank."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from paraplan.inventory import count_job
from paraplan.prediction import Prediction, predict
from paraplan.prediction.memory import estimate_memory
from paraplan.search.screen import screen_plans, screenable
from paraplan.search.space import SearchSpace, enumerate_plans, iter_unique
from paraplan.specs import ClusterSpec, ConfigError, HeteroClusterSpec, ModelSpec, Precision

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


SHORTLIST = 50  # plans timed exactly after the screen, at least
SHORTLIST_WITHIN = 0.10  # and every plan within this fraction of the best screened time per token
SCREENED_OUT = "slower than the shortlist (screened, not timed exactly)"


def search_plans(
    model: ModelSpec,
    cluster: ClusterSpec | HeteroClusterSpec,
    global_batch_size: int,
    precision: Precision = Precision.BF16,
    space: SearchSpace | None = None,
    objective: str = "time",
    train_tokens: float | None = None,
    budget_usd: float | None = None,
    deadline_s: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    *,
    screen: bool = True,
    shortlist: int = SHORTLIST,
    shortlist_within: float = SHORTLIST_WITHIN,
) -> SearchResult:
    """The feasible plans of ``space``, ranked by ``objective`` (time: highest tokens/s;
    cost: lowest $ per million tokens), under an optional dollar budget and deadline for
    ``train_tokens``. Memory is checked before timing: a plan that does not fit is not timed.

    With ``screen`` (the default) every plan is timed and sized at once by the vectorised
    screen (:mod:`paraplan.search.screen`; its memory is the exact model's); the best
    ``shortlist`` plans by screened time per token, and every plan within ``shortlist_within``
    of the best, are then predicted exactly and ranked by the exact numbers. The other
    feasible plans are counted under "slower than the shortlist", or under the deadline or
    budget they miss by their screened time. Without ``screen`` (or for a space the screen
    does not model) every plan is predicted exactly, as ``ranked`` then holds all of them.
    """
    if objective not in OBJECTIVES:
        raise ConfigError(f"objective: {objective!r} is not one of {', '.join(OBJECTIVES)}")
    if (budget_usd is not None or deadline_s is not None) and train_tokens is None:
        raise ConfigError("train_tokens: a budget or a deadline needs the number of tokens to train")
    space = space or SearchSpace()
    limits = (train_tokens, budget_usd, deadline_s)
    if isinstance(cluster, HeteroClusterSpec) or space.uneven_layers:
        if isinstance(cluster, ClusterSpec):
            cluster = HeteroClusterSpec(name=cluster.name, node_groups=(cluster,))
        if budget_usd is not None and cluster.price_per_hour_usd is None:
            raise ConfigError("budget: a node group of the cluster has no price_per_gpu_hour")
        return _uneven_search(model, cluster, global_batch_size, precision, space, objective, limits,
                              progress, shortlist, shortlist_within)
    if budget_usd is not None and cluster.price_per_gpu_hour is None:
        raise ConfigError("budget: the cluster has no price_per_gpu_hour")
    if screen and screenable(space):
        return _screened_search(model, cluster, global_batch_size, precision, space, objective, limits,
                                progress, shortlist, shortlist_within)
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
            excluded[_no_fit(hbm)] += 1
            continue
        pred = predict(job)
        reason = _over_limits(pred.time_to_train_s, pred.cost_to_train_usd, limits)
        if reason:
            excluded[reason] += 1
            continue
        ranked.append(pred)
    ranked.sort(key=lambda p: _score(p, objective))
    considered = len(jobs) + sum(cands.excluded.values())
    return SearchResult(ranked=ranked, excluded=excluded, considered=considered, objective=objective)


def _no_fit(hbm: float) -> str:
    return f"does not fit in {hbm / 2**30:.0f} GiB per GPU"


def _over_limits(time_to_train_s, cost_to_train_usd, limits) -> str | None:
    _, budget_usd, deadline_s = limits
    if deadline_s is not None and time_to_train_s > deadline_s:
        return "misses the deadline"
    if budget_usd is not None and cost_to_train_usd > budget_usd:
        return "exceeds the budget"
    return None


def _screened_search(model, cluster, global_batch_size, precision, space, objective, limits, progress,
                     shortlist, shortlist_within) -> SearchResult:
    train_tokens = limits[0]
    sc = screen_plans(model, cluster, global_batch_size, precision, space, train_tokens)
    excluded = Counter(sc.excluded)
    hbm = cluster.gpu.hbm_bytes
    fits = sc.fits
    # The screen's memory is the exact formula; re-check any plan within rounding of the limit.
    for i in np.flatnonzero(np.abs(sc.memory_bytes - hbm) <= 1e-9 * hbm):
        fits[i] = max(m.total for m in estimate_memory(count_job(sc.job(int(i))))) <= hbm
    excluded[_no_fit(hbm)] += int(np.count_nonzero(~fits))
    if not excluded[_no_fit(hbm)]:
        del excluded[_no_fit(hbm)]
    feasible = np.flatnonzero(fits)
    per_token = sc.seconds_per_token[feasible]
    order = feasible[np.argsort(per_token, kind="stable")]  # ties keep the enumeration order
    if len(order):
        within = int(np.count_nonzero(per_token <= per_token.min() * (1.0 + shortlist_within)))
        k = max(shortlist, within)
    else:
        k = 0
    chosen, rest = np.sort(order[:k]), order[k:]
    ranked: list[tuple[float, int, Prediction]] = []
    for n, i in enumerate(chosen):
        if progress is not None:
            progress(n, len(chosen))
        pred = predict(sc.job(int(i)))
        reason = _over_limits(pred.time_to_train_s, pred.cost_to_train_usd, limits)
        if reason:
            excluded[reason] += 1
            continue
        ranked.append((_score(pred, objective), int(i), pred))
    ranked.sort(key=lambda t: (t[0], t[1]))
    if len(rest):
        tokens_per_s = 1.0 / sc.seconds_per_token[rest]
        reasons = Counter()
        if train_tokens is not None:
            seconds = train_tokens / tokens_per_s
            price = cluster.price_per_gpu_hour
            usd = None if price is None else price * cluster.num_gpus * seconds / 3600.0
            for j in range(len(rest)):
                reasons[_over_limits(seconds[j], None if usd is None else usd[j], limits) or SCREENED_OUT] += 1
        else:
            reasons[SCREENED_OUT] = len(rest)
        excluded.update(reasons)
    return SearchResult(ranked=[t[2] for t in ranked], excluded=excluded, considered=sc.considered, objective=objective)


def _uneven_search(model, cluster, global_batch_size, precision, space, objective, limits, progress,
                   shortlist, shortlist_within) -> SearchResult:
    from paraplan.search.hetero import enumerate_hetero, rank_candidates

    train_tokens = limits[0]
    cands, excluded, considered = enumerate_hetero(model, cluster, global_batch_size, precision, space, train_tokens)
    preds, left = rank_candidates(model, cluster, precision, train_tokens, cands, shortlist, shortlist_within, progress)
    price = cluster.price_per_hour_usd
    ranked = []
    for pred in preds:
        reason = _over_limits(pred.time_to_train_s, pred.cost_to_train_usd, limits)
        if reason:
            excluded[reason] += 1
        elif not pred.fits:  # the partition's memory is exact; kept as a guard
            excluded[_no_fit(min(pred.hbm_bytes))] += 1
        else:
            ranked.append(pred)
    for cand in left:  # by their estimate, as the screened plans of the homogeneous search
        tokens_per_s = cand.plan["global_batch_size"] * model.seq_length / cand.estimate_s
        seconds = None if train_tokens is None else train_tokens / tokens_per_s
        usd = None if seconds is None or price is None else price * seconds / 3600.0
        excluded[(_over_limits(seconds, usd, limits) if seconds is not None else None) or SCREENED_OUT] += 1
    ranked.sort(key=lambda p: _score(p, objective))
    return SearchResult(ranked=ranked, excluded=excluded, considered=considered, objective=objective)
