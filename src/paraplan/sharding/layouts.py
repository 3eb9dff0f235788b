"""A strategy as ``PartitionSpec`` entries for a block's operands and result.

A strategy names, per mesh axis, the contraction dimension it splits (B, M, K, N; see
:mod:`paraplan.sharding.strategies`). On an array the axes land on the first dimension of that
kind: B on the first batch dimension, M on the activation's first free dimension (its batch),
N on the weight's first free dimension, K on the first contracted dimension. Reshapes into heads
put the split on the heads (head alignment), which is the outer factor the strategy respects.
"""

from __future__ import annotations

from paraplan.sharding.graph import ParallelBlock


def batch_major(strategies, axis_names: tuple[str, ...]) -> tuple[str, ...]:
    """The order of mesh axes within a batch (M) split over several of them: the axes most blocks
    split the batch over come first (major), so that a block adding an axis to the batch split
    takes a local slice of the common layout instead of a device permutation."""
    counts = {a: sum(1 for s in strategies if s[i] == "M") for i, a in enumerate(axis_names)}
    return tuple(sorted(axis_names, key=lambda a: (-counts[a], axis_names.index(a))))


def _place(ndim: int, home: dict[str, int | None], strategy, axis_names: tuple[str, ...],
           major: tuple[str, ...] | None = None) -> tuple:
    spec: list = [None] * ndim
    for dim, d in home.items():
        axes = tuple(a for a, c in zip(axis_names, strategy, strict=True) if c == dim)
        if dim == "M" and major is not None:
            axes = tuple(sorted(axes, key=major.index))
        if d is not None and axes:
            spec[d] = axes[0] if len(axes) == 1 else axes
    return tuple(spec)


def operand_spec(block: ParallelBlock, strategy, axis_names: tuple[str, ...], operand: int,
                 major: tuple[str, ...] | None = None) -> tuple:
    """PartitionSpec entries of the entry contraction's ``operand`` (0 or 1): the weight's when
    ``operand == block.weight_operand``, else the activation's."""
    eqn = block.entry
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    contract, batch = (lc, rc)[operand], (lb, rb)[operand]
    ndim = len(eqn.in_shapes[operand])
    free = [d for d in range(ndim) if d not in contract and d not in batch]
    own = "N" if operand == block.weight_operand else "M"
    home = {"B": batch[0] if batch else None, own: free[0] if free else None, "K": contract[0] if contract else None}
    return _place(ndim, home, strategy, axis_names, major)


def output_spec(block: ParallelBlock, strategy, axis_names: tuple[str, ...],
                major: tuple[str, ...] | None = None) -> tuple:
    """PartitionSpec entries of the entry's result (dot_general's order: batch dimensions, then
    the left operand's free dimensions, then the right's); K is summed away."""
    eqn = block.entry
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    free = [[d for d in range(len(eqn.in_shapes[o])) if d not in (lc, rc)[o] and d not in (lb, rb)[o]] for o in (0, 1)]
    x, w, nb = 1 - block.weight_operand, block.weight_operand, len(lb)
    start = {0: nb, 1: nb + len(free[0])}
    home = {"B": 0 if nb else None, "M": start[x] if free[x] else None, "N": start[w] if free[w] else None}
    return _place(len(eqn.shapes[0]), home, strategy, axis_names, major)
