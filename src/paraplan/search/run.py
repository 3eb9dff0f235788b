"""Run a search: screen every plan (time and memory, vectorised), predict the shortlist exactly, rank."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from paraplan.inventory import count_job
from paraplan.prediction import Prediction
from paraplan.prediction.entry import predict_any
from paraplan.prediction.memory import estimate_memory, usable_hbm_bytes
from paraplan.search.pareto import PARETO_AXES, near_front
from paraplan.search.screen import screen_plans, screenable
from paraplan.search.space import SearchSpace, enumerate_plans, iter_unique, preset_model
from paraplan.specs import ClusterSpec, ConfigError, HeteroClusterSpec, ModelSpec, Precision, short_repr
from paraplan.units import format_bytes

OBJECTIVES = ("time", "cost")


@dataclass(eq=False)
class Scored:
    """The plans of one search (one cluster at one size) that fit and meet the bounds, as the
    search scored them: the screen's numbers, the exact ones for the plans it predicted."""

    cluster: str
    num_gpus: int
    gpu: str  # "H100-SXM5-80GB", or "4 x A100-SXM4-40GB + 28 x A10G" for node groups
    usd_per_s: float | None  # the whole cluster's price per second
    seconds_per_token: np.ndarray
    memory_bytes: np.ndarray  # the worst stage's, per GPU
    num_nodes: int | None = None  # the cluster's nodes (num_gpus is not a node count)

    @property
    def usd_per_token(self) -> np.ndarray | None:
        return None if self.usd_per_s is None else self.usd_per_s * self.seconds_per_token

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Scored):
            return NotImplemented
        return (self.cluster, self.num_gpus, self.gpu, self.usd_per_s) == (
            other.cluster, other.num_gpus, other.gpu, other.usd_per_s) and all(
            np.array_equal(a, b) for a, b in ((self.seconds_per_token, other.seconds_per_token),
                                              (self.memory_bytes, other.memory_bytes)))


@dataclass
class Closest:
    """When no plan is left: the one nearest to the bounds that excluded everything, and by how
    much it misses them: bound ("deadline", "budget", "memory") -> (needed, limit) in seconds to
    train, dollars to train, bytes per GPU."""

    pred: Prediction
    over: dict[str, tuple[float, float]]

    @property
    def gap(self) -> float:
        """The worst needed / limit (> 1)."""
        return max((need / limit for need, limit in self.over.values()), default=1.0)

    @property
    def rank(self) -> tuple[bool, float]:
        """Nearer first: a plan that fits before one that does not, then the smaller gap."""
        return ("memory" in self.over, self.gap)


@dataclass
class SearchResult:
    ranked: list[Prediction]  # feasible plans, best first
    excluded: Counter  # reason -> plans removed
    considered: int
    objective: str
    scored: list[Scored] = field(default_factory=list)  # per search (cluster and size)
    # exact predictions of the plans the screen put on or near the Pareto front (``pareto``);
    # the front itself is ``pareto_front`` over ``ranked`` and these
    front: list[Prediction] = field(default_factory=list)
    closest: Closest | None = None  # with no ranked plan: the nearest miss (None when no plan passed the rules)

    @property
    def configurations(self) -> list[tuple[str, int, str]]:
        """(cluster, GPUs, GPU type) of every search merged here, in order."""
        return list(dict.fromkeys((s.cluster, s.num_gpus, s.gpu) for s in self.scored))


def merge_results(results: list[SearchResult]) -> SearchResult:
    """One ranking over several searches (e.g. cluster sizes or GPU types)."""
    objective = results[0].objective
    ranked = sorted((p for r in results for p in r.ranked), key=lambda p: _score(p, objective))
    excluded: Counter = Counter()
    for r in results:
        excluded.update(r.excluded)
    closest = None
    if not ranked:
        misses = [r.closest for r in results if r.closest is not None]
        closest = min(misses, key=lambda c: c.rank) if misses else None
    return SearchResult(ranked, excluded, sum(r.considered for r in results), objective,
                        scored=[s for r in results for s in r.scored], front=[p for r in results for p in r.front],
                        closest=closest)


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
#: Plans the screen puts within this fraction of the Pareto front (in time; in cost too for
#: the cost axis) are predicted exactly: the screen's time equals the exact one to rounding for
#: one stage, GPipe, DeepSpeed's 1F1B and zero-bubble plans (within 1 % past their exact range),
#: is within 0.1 % for Megatron-LM's 1F1B on most plans (2.6 % on GPT-3 175B over 32 stages) and
#: ~1 % for interleaved plans (3.7 % the worst case found); tests/unit/test_screen.py checks each
#: bound.
FRONT_SLACK = 0.04


def _check_bounds(global_batch_size: int, budget_usd: float | None, deadline_s: float | None) -> None:
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int | np.integer) or global_batch_size < 1:
        raise ConfigError(f"global_batch_size: expected a whole number >= 1, got {short_repr(global_batch_size)}")
    for name, value in (("budget", budget_usd), ("deadline", deadline_s)):
        if value is not None and not 0 < value < np.inf:
            raise ConfigError(f"{name}: expected a positive finite number, got {short_repr(value)}")


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
    pareto: str | None = None,
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

    ``pareto`` ("cost" or "memory"): the plans the screen puts on or near the front of time
    against that axis are also predicted exactly (``SearchResult.front``). Every plan that fits
    and meets the bounds is in ``SearchResult.scored``; with none, ``SearchResult.closest`` is
    the nearest miss.
    """
    if objective not in OBJECTIVES:
        raise ConfigError(f"objective: {objective!r} is not one of {', '.join(OBJECTIVES)}")
    if pareto is not None and pareto not in PARETO_AXES:
        raise ConfigError(f"pareto: {pareto!r} is not one of {', '.join(PARETO_AXES)}")
    _check_bounds(global_batch_size, budget_usd, deadline_s)
    if (budget_usd is not None or deadline_s is not None) and train_tokens is None:
        raise ConfigError("train_tokens: a budget or a deadline needs the number of tokens to train")
    space = (space or SearchSpace()).on_nodes(cluster.num_nodes)  # before the grid: screen and exact agree
    model = preset_model(model, space)  # the preset's model code (an eager RMSNorm), as a job file's
    limits = (train_tokens, budget_usd, deadline_s)
    mixed = len(set(model.moe_layers)) > 1  # dense and MoE layers (DeepSeek-V3): exact path
    if isinstance(cluster, HeteroClusterSpec) or (space.uneven_layers and not mixed):
        if mixed:
            raise ConfigError(
                f"search: the heterogeneous-cluster search needs every layer alike, and {model.name} mixes "
                "dense and mixture-of-experts layers; predict its plans one by one with paraplan predict"
            )
        if isinstance(cluster, ClusterSpec):
            cluster = HeteroClusterSpec(name=cluster.name, node_groups=(cluster,))
        if space.schedule is not None:
            raise ConfigError("schedule: the uneven-stage search (node groups, --uneven-layers) tries the plan's own "
                              "schedule; leave the schedule axis out")
        if space.ep is not None and set(space.ep) != {1}:
            raise ConfigError("ep: the uneven-stage search (node groups, --uneven-layers) keeps ep = 1")
        if budget_usd is not None and cluster.price_per_hour_usd is None:
            raise ConfigError("budget: a node group of the cluster has no price_per_gpu_hour")
        return _uneven_search(model, cluster, global_batch_size, precision, space, objective, limits,
                              progress, shortlist, shortlist_within, pareto)
    if budget_usd is not None and cluster.price_per_gpu_hour is None:
        raise ConfigError("budget: the cluster has no price_per_gpu_hour")
    if screen and screenable(space, model):
        return _screened_search(model, cluster, global_batch_size, precision, space, objective, limits,
                                progress, shortlist, shortlist_within, pareto)
    cands = enumerate_plans(model, cluster, global_batch_size, precision, space, train_tokens)
    excluded = Counter(cands.excluded)
    jobs = list(iter_unique(cands.jobs))
    ranked: list[Prediction] = []
    missed: list[Closest] = []
    smallest = None  # (bytes, job) of the plan needing the least memory, when none fits
    hbm = usable_hbm_bytes(cluster.gpu.hbm_bytes, space.memory_headroom)
    for i, job in enumerate(jobs):
        if progress is not None:
            progress(i, len(jobs))
        worst = max(m.total for m in estimate_memory(count_job(job)))
        if worst > hbm:
            excluded[_no_fit(hbm)] += 1
            if smallest is None or worst < smallest[0]:
                smallest = (worst, job)
            continue
        pred = predict_any(job)
        reason = _over_limits(pred.time_to_train_s, pred.cost_to_train_usd, limits)
        if reason:
            excluded[reason] += 1
            missed.append(Closest(pred, _misses(pred, limits)))
            continue
        ranked.append(pred)
    ranked.sort(key=lambda p: _score(p, objective))
    considered = len(jobs) + sum(cands.excluded.values())
    closest = None
    if not ranked and missed:
        closest = min(missed, key=lambda c: c.rank)
    elif not ranked and smallest is not None:
        pred = predict_any(smallest[1])
        closest = Closest(pred, _misses(pred, limits))
    scored = _scored(cluster, np.array([1.0 / p.tokens_per_s for p in ranked]),
                     np.array([p.worst_memory.total for p in ranked]))
    return SearchResult(ranked=ranked, excluded=excluded, considered=considered, objective=objective,
                        scored=[scored], closest=closest)


def _scored(cluster: ClusterSpec | HeteroClusterSpec, seconds_per_token: np.ndarray, memory: np.ndarray) -> Scored:
    if isinstance(cluster, HeteroClusterSpec):
        groups = cluster.node_groups
        gpu = groups[0].gpu.name if len(groups) == 1 else " + ".join(f"{g.num_gpus} x {g.gpu.name}" for g in groups)
        hourly = cluster.price_per_hour_usd
    else:
        gpu = cluster.gpu.name
        price = cluster.price_per_gpu_hour
        hourly = None if price is None else price * cluster.num_gpus
    return Scored(cluster.name, cluster.num_gpus, gpu, None if hourly is None else hourly / 3600.0,
                  np.asarray(seconds_per_token, dtype=float), np.asarray(memory, dtype=float), cluster.num_nodes)


def _no_fit(limit: float) -> str:
    """The reason for plans that need more than ``limit`` bytes (the GPU's memory less the
    headroom)."""
    return f"does not fit in {format_bytes(limit)} per GPU (its memory less the headroom)"


def _over_limits(time_to_train_s, cost_to_train_usd, limits) -> str | None:
    _, budget_usd, deadline_s = limits
    if deadline_s is not None and time_to_train_s > deadline_s:
        return "misses the deadline"
    if budget_usd is not None and cost_to_train_usd > budget_usd:
        return "exceeds the budget"
    return None


def _misses(pred: Prediction, limits) -> dict[str, tuple[float, float]]:
    """Which bounds ``pred`` misses: bound -> (needed, limit)."""
    _, budget_usd, deadline_s = limits
    over = {}
    if not pred.fits:
        over["memory"] = (pred.memory.total, pred.memory.usable(pred.memory.stage))
    if deadline_s is not None and pred.time_to_train_s > deadline_s:
        over["deadline"] = (pred.time_to_train_s, deadline_s)
    if budget_usd is not None and pred.cost_to_train_usd is not None and pred.cost_to_train_usd > budget_usd:
        over["budget"] = (pred.cost_to_train_usd, budget_usd)
    return over


def _limit_gap(seconds_per_token: np.ndarray, usd_per_s: float | None, limits) -> np.ndarray:
    """Per plan, the worst of time to train / deadline and cost to train / budget (0 unbounded)."""
    train_tokens, budget_usd, deadline_s = limits
    gap = np.zeros(len(seconds_per_token))
    if train_tokens is None:
        return gap
    seconds = train_tokens * seconds_per_token
    if deadline_s is not None:
        gap = np.maximum(gap, seconds / deadline_s)
    if budget_usd is not None and usd_per_s is not None:
        gap = np.maximum(gap, usd_per_s * seconds / budget_usd)
    return gap


def _pareto_y(scored: Scored, axis: str) -> np.ndarray | None:
    return scored.memory_bytes if axis == "memory" else scored.usd_per_token


def _screened_search(model, cluster, global_batch_size, precision, space, objective, limits, progress,
                     shortlist, shortlist_within, pareto=None) -> SearchResult:
    train_tokens = limits[0]
    sc = screen_plans(model, cluster, global_batch_size, precision, space, train_tokens)
    excluded = Counter(sc.excluded)
    hbm = sc.memory_limit
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
    exact: dict[int, Prediction] = {}

    def exact_of(i: int) -> Prediction:
        if i not in exact:
            exact[i] = predict_any(sc.job(i))
        return exact[i]

    price = cluster.price_per_gpu_hour
    usd_per_s = None if price is None else price * cluster.num_gpus / 3600.0
    meets = np.zeros(len(sc), dtype=bool)  # fits and meets the bounds (exactly where predicted)
    ranked: list[tuple[float, int, Prediction]] = []
    for n, i in enumerate(chosen):
        if progress is not None:
            progress(n, len(chosen))
        pred = exact_of(int(i))
        reason = _over_limits(pred.time_to_train_s, pred.cost_to_train_usd, limits)
        if reason:
            excluded[reason] += 1
            continue
        meets[i] = True
        ranked.append((_score(pred, objective), int(i), pred))
    ranked.sort(key=lambda t: (t[0], t[1]))

    reason_names = (SCREENED_OUT, "misses the deadline", "exceeds the budget")

    def screened_reasons(plans: np.ndarray) -> np.ndarray:
        """Which reason (an index into ``reason_names``) each plan left out of the shortlist
        is counted under, by its screened time: the deadline or the budget it misses (as
        ``_over_limits``), else SCREENED_OUT."""
        codes = np.zeros(len(plans), dtype=np.int64)
        if train_tokens is None:
            return codes
        seconds = train_tokens / (1.0 / sc.seconds_per_token[plans])
        _, budget_usd, deadline_s = limits
        if budget_usd is not None and usd_per_s is not None:
            codes[usd_per_s * seconds > budget_usd] = 2
        if deadline_s is not None:
            codes[seconds > deadline_s] = 1
        return codes

    if len(rest):
        codes = screened_reasons(rest)
        meets[rest] = codes == 0
        for code, count in enumerate(np.bincount(codes, minlength=3).tolist()):
            if count:
                excluded[reason_names[code]] += count
    seconds_per_token = sc.seconds_per_token.copy()
    for i, pred in exact.items():
        seconds_per_token[i] = 1.0 / pred.tokens_per_s
    closest = None
    if not ranked and len(feasible):  # every plan that fits misses a bound: the nearest miss
        gap = _limit_gap(seconds_per_token[feasible], usd_per_s, limits)
        i = int(feasible[np.argmin(gap)])
        pred = exact_of(i)
        over = _misses(pred, limits)
        if over:
            closest = Closest(pred, over)
        else:  # the screen counted it out, the exact prediction meets the bounds
            excluded[reason_names[int(screened_reasons(np.array([i]))[0])]] -= 1
            ranked.append((_score(pred, objective), i, pred))
            meets[i] = True
    elif not ranked and len(sc):  # nothing fits: the plan that needs the least memory
        pred = exact_of(int(np.argmin(sc.memory_bytes)))
        closest = Closest(pred, _misses(pred, limits))
    scored = _scored(cluster, seconds_per_token[meets], sc.memory_bytes[meets])
    front = []
    y = None if pareto is None else _pareto_y(scored, pareto)
    if y is not None:
        near = near_front(scored.seconds_per_token, y, FRONT_SLACK, FRONT_SLACK if pareto == "cost" else 0.0)
        for i in np.flatnonzero(meets)[near].tolist():
            pred = exact_of(i)
            if _over_limits(pred.time_to_train_s, pred.cost_to_train_usd, limits) is None:
                front.append(pred)
    return SearchResult(ranked=[t[2] for t in ranked], excluded=+excluded, considered=sc.considered,
                        objective=objective, scored=[scored], front=front, closest=closest)


def _uneven_search(model, cluster, global_batch_size, precision, space, objective, limits, progress,
                   shortlist, shortlist_within, pareto=None) -> SearchResult:
    from paraplan.search.hetero import enumerate_hetero, hetero_job, rank_candidates

    train_tokens = limits[0]
    cands, excluded, considered = enumerate_hetero(model, cluster, global_batch_size, precision, space, train_tokens)
    preds, left = rank_candidates(model, cluster, precision, train_tokens, cands, shortlist, shortlist_within, progress)
    price = cluster.price_per_hour_usd
    ranked, missed = [], []
    for pred in preds:
        reason = _over_limits(pred.time_to_train_s, pred.cost_to_train_usd, limits)
        if reason:
            excluded[reason] += 1
            missed.append(Closest(pred, _misses(pred, limits)))
        elif not pred.fits:  # the partition's memory is exact; kept as a guard
            excluded[_no_fit(pred.memory.usable(pred.memory.stage))] += 1
        else:
            ranked.append(pred)
    meeting = []  # the candidates left out that meet the bounds by their estimate
    for cand in left:  # by their estimate, as the screened plans of the homogeneous search
        tokens_per_s = cand.plan["global_batch_size"] * model.seq_length / cand.estimate_s
        seconds = None if train_tokens is None else train_tokens / tokens_per_s
        usd = None if seconds is None or price is None else price * seconds / 3600.0
        reason = _over_limits(seconds, usd, limits) if seconds is not None else None
        excluded[reason or SCREENED_OUT] += 1
        if reason is None:
            meeting.append(cand)
    ranked.sort(key=lambda p: _score(p, objective))
    spt = [1.0 / p.tokens_per_s for p in ranked] + [
        c.estimate_s / (c.plan["global_batch_size"] * model.seq_length) for c in meeting]
    memory = [p.worst_memory.total for p in ranked] + [c.memory_bytes for c in meeting]
    scored = _scored(cluster, np.array(spt), np.array(memory))
    front = []
    y = _pareto_y(scored, pareto) if pareto is not None else None
    if y is not None and len(y):
        near = near_front(scored.seconds_per_token, y, FRONT_SLACK, FRONT_SLACK if pareto == "cost" else 0.0)
        for j in near.tolist():
            if j < len(ranked):
                front.append(ranked[j])
                continue
            pred = predict_any(hetero_job(model, cluster, precision, train_tokens, meeting[j - len(ranked)]))
            if pred.fits and _over_limits(pred.time_to_train_s, pred.cost_to_train_usd, limits) is None:
                front.append(pred)
    closest = min(missed, key=lambda c: c.rank) if not ranked and missed else None
    return SearchResult(ranked=ranked, excluded=excluded, considered=considered, objective=objective,
                        scored=[scored], front=front, closest=closest)
