"""Run several searches (cluster sizes x GPU types) serially, on local processes, or on Ray.

Each search is independent and deterministic, so every executor returns the same results in
the same order; only the wall time differs. Ray is optional (``pip install "paraplan[ray]"``)
and imported only when asked for.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from paraplan.search.run import SearchResult, search_plans
from paraplan.specs import ConfigError

EXECUTORS = ("serial", "processes", "ray")

Progress = Callable[[int, int], None]


def _one(kwargs: dict[str, Any]) -> SearchResult:
    return search_plans(**kwargs)


def run_searches(
    searches: Sequence[dict[str, Any]],
    executor: str = "serial",
    workers: int | None = None,
    progress: Progress | None = None,
) -> list[SearchResult]:
    """``search_plans(**kwargs)`` for each mapping of ``searches``, in order.

    ``workers`` caps the local processes (``processes``) or the CPUs of a local Ray instance
    (``ray``); it defaults to the machine's cores. A single search always runs here, serially.
    ``progress(done, total)`` is called as searches finish. An error inside a search is raised
    as the serial run would raise it, whichever executor ran it.
    """
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
            futures = [pool.submit(_one, kwargs) for kwargs in searches]
            if progress is not None:
                for done, _ in enumerate(as_completed(futures), start=1):
                    progress(done, len(futures))
            return [f.result() for f in futures]
    return _run_on_ray(searches, workers, progress)


def _run_on_ray(searches: Sequence[dict[str, Any]], workers: int | None, progress: Progress | None) -> list[SearchResult]:
    """One Ray task per search, on the cluster at ``RAY_ADDRESS`` if it is set, else on a local
    Ray instance started for this call and shut down after it. A Ray the caller has already
    initialised is used as it is and left running."""
    try:
        import ray
    except ImportError:
        raise ConfigError('executor: Ray is not installed (pip install "paraplan[ray]")') from None
    started = not ray.is_initialized()
    if started:
        _start_ray(ray, workers or os.cpu_count() or 1, len(searches))
    try:
        task = ray.remote(num_cpus=1)(_one)
        refs = [task.remote(kwargs) for kwargs in searches]
        if progress is not None:
            pending = refs
            while pending:
                _, pending = ray.wait(pending, num_returns=1)
                progress(len(refs) - len(pending), len(refs))
        try:
            return ray.get(refs)  # in the order of ``refs``, whichever finished first
        except ray.exceptions.RayTaskError as exc:
            # Ray wraps the task's exception with the worker's traceback; raise the
            # original (a one-line ConfigError stays one line).
            cause = getattr(exc, "cause", None)
            if isinstance(cause, Exception):
                raise cause from None
            raise
    finally:
        if started:
            ray.shutdown()


def _start_ray(ray: Any, cpus: int, tasks: int) -> None:
    """Connect to ``RAY_ADDRESS`` (``auto``, ``host:port`` or ``ray://host:port``), or start a
    private local instance with no dashboard, as many CPUs as tasks (at most ``cpus``) and the
    workers' output kept out of this process's terminal."""
    quiet = dict(log_to_driver=False, configure_logging=False)
    address = os.environ.get("RAY_ADDRESS") or None
    if address is None:
        ray.init(address="local", num_cpus=max(1, min(cpus, tasks)), include_dashboard=False, **quiet)
        return
    try:
        ray.init(address=address, **quiet)
    except (ConnectionError, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"executor: cannot connect to Ray at RAY_ADDRESS={address!r}: {reason}") from None
