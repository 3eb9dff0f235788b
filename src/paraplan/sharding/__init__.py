"""Intra-operator sharding search over communication-free blocks (CFP), on a JAX graph.

Work in progress (issue 5): :mod:`paraplan.sharding.graph` traces a step function and groups
its operators into ParallelBlocks with the repeated segment (the layers) found once. JAX is an
optional extra (``pip install -e ".[sharding]"``), imported inside functions.
"""
