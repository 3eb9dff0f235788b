"""A sharding plan asked for in words: the flags of ``paraplan sharding`` (a mesh as
``data=2,model=4``, a memory budget in units or from the cluster's GPU) read into the mesh and
budget the search takes; ``load`` imports the step function and its example arguments."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from paraplan.specs import ConfigError


@dataclass(frozen=True)
class ShardingRequest:
    """The mesh, memory budget, cluster and precision of one sharding search."""

    axes: tuple[tuple[str, int], ...]  # mesh axes, outermost first
    memory_budget: float | None  # bytes per device; None: no budget
    memory_budget_text: str  # the budget as the answer names it
    cluster: str
    precision: str

    @property
    def devices(self) -> int:
        """Devices of the mesh."""
        size = 1
        for _, n in self.axes:
            size *= n
        return size

    @classmethod
    def from_flags(cls, *, mesh: str, memory_budget: str | None, cluster: str, precision: str) -> ShardingRequest:
        """``--mesh`` and ``--memory-budget`` read (None: the cluster GPU's memory; 'none': no
        budget); a bad one raises a ``ConfigError`` naming it."""
        from paraplan.sharding.target import parse_mesh
        from paraplan.units import UnitError, format_bytes, parse_bytes

        axes = tuple(parse_mesh(mesh))
        if memory_budget is None:
            from paraplan.catalog import load_cluster

            budget: float | None = float(load_cluster(cluster).gpu.hbm_bytes)
            memory_budget = f"{format_bytes(budget)} (the GPU's memory)"
        elif memory_budget.strip().lower() == "none":
            budget = None
        else:
            try:
                budget = parse_bytes(memory_budget)
            except UnitError as exc:
                raise ConfigError(f"memory_budget: {exc}") from None
        return cls(axes=axes, memory_budget=budget, memory_budget_text=memory_budget, cluster=cluster,
                   precision=precision)

    def load(self, target: str, example_args: str, args: str | None, shapes_only: bool) -> tuple[Any, Any]:
        """The step function ``target`` names (FILE.py:FUNCTION or MODULE:FUNCTION) and the
        arguments its module's ``example_args`` function returns for ``args`` (NAME=VALUE,...)."""
        try:
            import jax  # noqa: F401
        except ImportError:
            raise ConfigError('sharding: needs JAX; install the extra: pip install -e ".[sharding]"') from None
        from paraplan.sharding.target import example_args as make_args
        from paraplan.sharding.target import load_target, parse_kwargs

        step = load_target(target)
        return step, make_args(step, example_args, parse_kwargs(args), shapes_only)

    def search(self, step: Any, call_args: Any, **kwargs: Any) -> Any:
        """The cheapest sharding of ``step`` within the budget (``kwargs``: profiled, progress)."""
        from paraplan.sharding.plan import search

        return search(step.fn, call_args, self.axes, cluster=self.cluster, precision=self.precision,
                      memory_budget=self.memory_budget, **kwargs)


__all__ = ["ShardingRequest"]
