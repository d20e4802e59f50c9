"""The block-partition problem: cut a sequence of costs into contiguous blocks minimising the largest block.

Given per-layer costs ``c_0 .. c_{n-1}`` (seconds, bytes: any non-negative numbers) and ``k``, find cut
points that split the layers into exactly ``k`` non-empty contiguous blocks whose largest sum, the
*bottleneck*, is as small as possible. A pipeline runs at the pace of its slowest stage, so this is the
balance that a pipeline wants::

    costs     3  1  1  2  2  1  4      k = 3
    blocks   [3  1  1][2  2  1][4]     sums 5 5 4: bottleneck 5, and no split does better

Note [exact]: the optimal bottleneck is the least run sum (a sum of contiguous costs) that passes the greedy
check "can ``k`` blocks of at most ``b`` cover the costs?". A bisection over bounds finds it without listing the
O(L^2) run sums. A bound that passes drops to the largest block the greedy made under it, a run sum that passes
too. The search ends when the bound just below that fails: the next float down, or one less for integer costs.
Every sum is a difference of one list of prefix sums, so float costs compare consistently and the answer is
reproducible: sums only grow with the run, which the bisections need. Integer costs are summed exactly; costs
with any float among them are summed as floats. A check finds each block's end by bisection: ``O(k log L)``.

Note [ties]: many balances often share the optimal bottleneck. The one returned is the greedy one: each
block, from the first, takes as many layers as the bottleneck allows while leaving at least one layer
for every block still to come. It is the unique tie-break "earliest blocks as long as possible"
(the lexicographically largest list of block lengths among the optimal ones).
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_right
from collections.abc import Collection, Sequence

__all__ = ["bottleneck", "solve"]


def solve(costs: Collection[float], partitions: int) -> list[int]:
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
    for left in range(partitions, 1, -1):  # ``left`` blocks still to fill, this one included
        # Take layers while the block stays within the bottleneck and every later block keeps one.
        end = min(max(_block_end(prefix, start, limit), start + 1), n - (left - 1))
        balance.append(end - start)
        start = end
    balance.append(n - start)
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


def _prefix(costs: Collection[float], partitions: int) -> list[float]:
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise ValueError(f"partitions must be a positive integer, got {partitions!r}")
    if partitions > len(costs):
        raise ValueError(f"cannot split {len(costs)} layers into {partitions} partitions: "
                         "use at most one partition per layer")
    for k, c in enumerate(costs):
        if not isinstance(c, (int, float)) or math.isnan(c) or math.isinf(c) or c < 0:
            raise ValueError(f"costs must be non-negative finite numbers, got costs[{k}] = {c!r}")
    # Note [exact]: integers stay exact; any float makes every cost a Python float (numpy's scalars included)
    values = list(costs) if all(isinstance(c, int) for c in costs) else [float(c) for c in costs]
    return [0, *itertools.accumulate(values)]


def _block_end(prefix: list[float], start: int, limit: float) -> int:
    """The last layer boundary ``end`` with ``prefix[end] - prefix[start] <= limit`` (``start`` when none past it)."""
    base = prefix[start]
    return bisect_right(prefix, limit, start, key=lambda x: x - base) - 1


def _greedy(prefix: list[float], partitions: int, limit: float) -> list[int] | None:
    """The ends of the blocks when each takes as many layers as ``limit`` allows, or ``None`` when more than
    ``partitions`` blocks are needed or a layer alone exceeds ``limit``."""
    ends: list[int] = []
    start, n = 0, len(prefix) - 1
    while start < n:
        end = _block_end(prefix, start, limit)
        if end == start or len(ends) == partitions:
            return None
        ends.append(end)
        start = end
    return ends


def _optimal_bottleneck(prefix: list[float], partitions: int) -> float:
    """Note [exact]: the least run sum that passes the greedy check."""
    integral = all(isinstance(x, int) for x in prefix)
    lo: float = 0  # fails unless every cost is 0
    hi = prefix[-1]  # the whole sum: passes
    if _greedy(prefix, partitions, lo) is not None:
        return lo
    while True:
        mid = (lo + hi) // 2 if integral else (lo + hi) / 2
        if not lo < mid < hi:
            return hi
        ends = _greedy(prefix, partitions, mid)
        if ends is None:
            lo = mid
            continue
        hi = max(prefix[b] - prefix[a] for a, b in itertools.pairwise([0, *ends]))  # a run sum <= mid
        below = hi - 1 if integral else math.nextafter(hi, -math.inf)
        if _greedy(prefix, partitions, below) is None:
            return hi
