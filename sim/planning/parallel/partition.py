"""Block partition for the planner: the executor's exact solver (:func:`gpipe.balance.blockpartition.solve`)."""

from __future__ import annotations

from collections.abc import Collection

from gpipe.balance.blockpartition import solve

__all__ = ["block_partition"]


# Note [balance]: each configuration is balanced by block partition, minimising the largest stage cost
# (forward + backward + recompute of the layers at the configuration's micro-batch size), with the solver
# balance_by_time uses: one rule, so a planned balance is the one the executor would pick for the same costs.
def block_partition(weights: Collection[float], n: int) -> tuple[int, ...]:
    """Split ``weights`` into ``n`` contiguous non-empty blocks minimising the largest block sum.

    Returns:
        Block sizes (layers per stage), summing to ``len(weights)``.

    Raises:
        ValueError: fewer weights than blocks, ``n < 1`` or a negative or non-finite weight.
    """
    return tuple(solve(weights, n))
