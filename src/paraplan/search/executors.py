"""Run several searches (cluster sizes x GPU types) serially, on local processes, or on Ray.

Each search is independent and deterministic, so every executor returns the same results in
the same order; only the wall time differs. Ray is optional (``pip install "paraplan[ray]"``)
and imported only when asked for.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from paraplan.search.run import SearchResult, search_plans
from paraplan.specs import ConfigError

EXECUTORS = ("serial", "processes", "ray")


def _one(kwargs: dict[str, Any]) -> SearchResult:
    return search_plans(**kwargs)


def run_searches(
    searches: Sequence[dict[str, Any]],
    executor: str = "serial",
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[SearchResult]:
    """``search_plans(**kwargs)`` for each mapping of ``searches``, in order."""
    if executor not in EXECUTORS:
        raise ConfigError(f"executor: {executor!r} is not one of {', '.join(EXECUTORS)}")
    if executor == "serial" or len(searches) <= 1:
        results = []
        for i, kwargs in enumerate(searches):
            results.append(_one(kwargs))
            if progress is not None:
                progress(i + 1, len(searches))
        return results
    if executor == "processes":
        with ProcessPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
            return list(pool.map(_one, searches))
    try:
        import ray
    except ImportError:
        raise ConfigError('executor: Ray is not installed (pip install "paraplan[ray]")') from None
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS"), ignore_reinit_error=True, log_to_driver=False)
    remote = ray.remote(_one)
    return ray.get([remote.remote(kwargs) for kwargs in searches])
