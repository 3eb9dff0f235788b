"""Intra-operator sharding search over communication-free blocks (CFP), on a JAX graph.

``search(fn, example_args, mesh)`` traces the step (:mod:`.graph`), costs every block's
strategies (:mod:`.strategies`; optionally compiled block by block, :mod:`.profile`), picks the
cheapest chain (:mod:`.chain`) and returns a :class:`~paraplan.sharding.plan.ShardingPlan`
whose ``verify`` compiles it with every block's layout pinned (:mod:`.apply`, :mod:`.verify`).
JAX is an optional extra (``pip install -e ".[sharding]"``), imported inside functions.
"""


def search(fn, example_args, mesh, **kwargs):
    """See :func:`paraplan.sharding.plan.search`."""
    from paraplan.sharding.plan import search as _search

    return _search(fn, example_args, mesh, **kwargs)
