"""The space of parallel plans for one model on one cluster, and the rules that prune it.

Every candidate is checked against the same rules Megatron-LM enforces (the Job validator)
plus the search's own placement rule, and each excluded plan is counted under its reason so
the user sees why a whole family of plans is missing.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from paraplan.specs import ClusterSpec, ConfigError, Job, ModelSpec, Precision, Recompute


def _powers_of_two(limit: int) -> list[int]:
    out, x = [], 1
    while x <= limit:
        out.append(x)
        x *= 2
    return out


@dataclass(frozen=True)
class SearchSpace:
    """What may vary. Degrees default to powers of two up to the cluster size; ``None`` in a
    list-valued field means "every sensible value"."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    cp: tuple[int, ...] = (1,)
    micro_batch_size: tuple[int, ...] = (1, 2, 4, 8)
    zero_stage: tuple[int, ...] = (0, 1)
    recompute: tuple[Recompute, ...] = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
    vpp: tuple[int, ...] = (1,)
    sequence_parallel: str = "with_tp"  # "with_tp": on whenever tp > 1; "both": try on and off
    allow_tp_across_nodes: bool = False
    framework: str = "megatron"
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Candidates:
    jobs: list[Job]
    excluded: Counter  # reason -> number of plans


def _reason(message: str) -> str:
    """A reason for a family of plans: the validator's message without the plan's numbers
    where they would split one family into many lines."""
    field_name, _, rest = message.partition(": ")
    return f"{field_name}: {rest}" if rest else message


def enumerate_plans(
    model: ModelSpec,
    cluster: ClusterSpec,
    global_batch_size: int,
    precision: Precision,
    space: SearchSpace,
    train_tokens: float | None = None,
) -> Candidates:
    """Every plan of ``space`` that passes the divisibility and placement rules."""
    n = cluster.num_gpus
    tps = space.tp or tuple(_powers_of_two(n))
    pps = space.pp or tuple(p for p in range(1, min(model.num_layers, n) + 1) if n % p == 0)
    sps = (True, False) if space.sequence_parallel == "both" else (None,)
    excluded: Counter = Counter()
    jobs: list[Job] = []
    for tp, pp, cp, vpp, mbs, zero, recompute, sp in itertools.product(
        tps, pps, space.cp, space.vpp, space.micro_batch_size, space.zero_stage, space.recompute, sps
    ):
        if n % (tp * pp * cp):
            excluded["tp*pp*cp does not divide the number of GPUs"] += 1
            continue
        dp = n // (tp * pp * cp)
        if tp > cluster.gpus_per_node and not space.allow_tp_across_nodes:
            excluded[f"tp > {cluster.gpus_per_node} crosses the node's NVLink domain"] += 1
            continue
        if global_batch_size % (mbs * dp):
            excluded["global batch is not a multiple of micro-batch x dp"] += 1
            continue
        if vpp > 1 and (pp < 2 or model.num_layers % (pp * vpp) or (global_batch_size // (mbs * dp)) % pp):
            excluded["interleaving needs layers divisible by pp*vpp and micro-batches by pp"] += 1
            continue
        if model.num_layers % pp:
            excluded["pp does not divide the layers evenly (uneven splits are off)"] += 1
            continue
        plan = {
            "tp": tp,
            "pp": pp,
            "dp": dp,
            "cp": cp,
            "vpp": vpp if vpp > 1 else None,
            "sequence_parallel": (tp > 1) if sp is None else (sp and tp > 1),
            "micro_batch_size": mbs,
            "global_batch_size": global_batch_size,
            "zero_stage": zero,
            "recompute": recompute,
            "framework": space.framework,
            **space.extra,
        }
        try:
            jobs.append(
                Job(
                    name=f"tp{tp}-pp{pp}-dp{dp}" + (f"-cp{cp}" if cp > 1 else "") + (f"-vpp{vpp}" if vpp > 1 else ""),
                    model=model,
                    cluster=cluster,
                    parallel=plan,
                    precision=precision,
                    train_tokens=train_tokens,
                )
            )
        except ValidationError as err:
            from paraplan.specs import format_validation_error

            excluded[_reason(format_validation_error(err))] += 1
        except ConfigError as err:
            excluded[_reason(str(err))] += 1
    return Candidates(jobs=jobs, excluded=excluded)


def iter_unique(jobs: list[Job]) -> Iterator[Job]:
    seen = set()
    for job in jobs:
        key = job.parallel.model_dump_json()
        if key not in seen:
            seen.add(key)
            yield job
