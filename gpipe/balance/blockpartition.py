"""The block-partition problem: cut a sequence of costs into contiguous blocks minimising the largest block.

Given per-layer costs ``c_0 .. c_{n-1}`` (seconds, bytes: any non-negative numbers) and ``k``, find cut
points that split the layers into exactly ``k`` non-empty contiguous blocks whose largest sum, the
*bottleneck*, is as small as possible. A pipeline runs at the pace of its slowest stage, so this is the
balance that a pipeline wants::

    costs     3  1  1  2  2  1  4      k = 3
    blocks   [3  1  1][2  2  1][4]     sums 5 5 4: bottleneck 5, and no split does better

Note [exact]: the optimal bottleneck is one of the sums of a contiguous run of costs. Those sums are
sorted and searched by bisection with a greedy check ("can ``k`` blocks of at most ``b`` cover the
costs?"), which is exact. Every sum is computed the same way, as a difference of one list of prefix
sums, so float costs are compared consistently and the answer is reproducible.

Note [ties]: many balances often share the optimal bottleneck. The one returned is the greedy one: each
block, from the first, takes as many layers as the bottleneck allows while leaving at least one layer
for every block still to come. It is the unique tie-break "earliest blocks as long as possible"
(the lexicographically largest list of block lengths among the optimal ones).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

__all__ = ["bottleneck", "solve"]


def solve(costs: Sequence[float], partitions: int) -> list[int]:
    """Split ``costs`` into ``partitions`` contiguous blocks with the smallest largest sum.

    Args:
        costs: per-layer costs, non-negative and finite.
        partitions: how many blocks (stages).

    Returns:
        The balance: the number of layers in each block, summing to ``len(costs)``.

    Raises:
        ValueError: ``partitions < 1``, more partitions than layers, or a negative or non-finite cost.
    """
    prefix = _prefix(costs, partitions)
    n = len(costs)
    limit = _optimal_bottleneck(prefix, partitions)
    balance = []
    start = 0
    for left in range(partitions, 0, -1):  # ``left`` blocks still to fill, this one included
        end = start + 1
        # Take layers while the block stays within the bottleneck and every later block keeps one.
        while end < n - (left - 1) and prefix[end + 1] - prefix[start] <= limit:
            end += 1
        if left == 1:
            end = n
        balance.append(end - start)
        start = end
    return balance


def bottleneck(costs: Sequence[float], balance: Sequence[int]) -> float:
    """The largest block sum of ``costs`` split by ``balance``.

    Args:
        costs: per-layer costs.
        balance: block lengths, summing to ``len(costs)``.

    Returns:
        The largest sum of one block.

    Raises:
        ValueError: ``balance`` has a non-positive length or does not sum to ``len(costs)``.
    """
    if any(b < 1 for b in balance) or sum(balance) != len(costs):
        raise ValueError(f"balance {list(balance)} does not split {len(costs)} layers into non-empty blocks")
    bounds = [0, *itertools.accumulate(balance)]
    return max(sum(costs[a:b]) for a, b in itertools.pairwise(bounds))


def _prefix(costs: Sequence[float], partitions: int) -> list[float]:
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise ValueError(f"partitions must be a positive integer, got {partitions!r}")
    if partitions > len(costs):
        raise ValueError(f"cannot split {len(costs)} layers into {partitions} partitions: "
                         "use at most one partition per layer")
    for k, c in enumerate(costs):
        if not isinstance(c, (int, float)) or math.isnan(c) or math.isinf(c) or c < 0:
            raise ValueError(f"costs must be non-negative finite numbers, got costs[{k}] = {c!r}")
    return [0, *itertools.accumulate(costs)]


def _fits(prefix: list[float], partitions: int, limit: float) -> bool:
    """Whether at most ``partitions`` blocks of sum ``<= limit`` cover all layers (greedy, O(n))."""
    blocks, start = 1, 0
    for end in range(1, len(prefix)):
        if prefix[end] - prefix[start] > limit:  # layer end-1 opens a new block
            start = end - 1
            blocks += 1
            if blocks > partitions or prefix[end] - prefix[start] > limit:
                return False
    return True


def _optimal_bottleneck(prefix: list[float], partitions: int) -> float:
    n = len(prefix) - 1
    candidates = sorted({prefix[b] - prefix[a] for a in range(n) for b in range(a + 1, n + 1)})
    lo, hi = 0, len(candidates) - 1  # the largest candidate (the whole sum) always fits
    while lo < hi:
        mid = (lo + hi) // 2
        if _fits(prefix, partitions, candidates[mid]):
            hi = mid
        else:
            lo = mid + 1
    return candidates[lo]
