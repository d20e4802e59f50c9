"""The schedule search's heuristic: list scheduling in the search's timing model (Note [search timing] in
:mod:`gpipe.schedule.search_timing`), under a few priority rules, each kept within the memory limit.

Note [safe admission]: a device may start a forward only if the micro-batches before it could still finish
one after the other: for each earlier unfinished micro-batch ``k`` on that device, what the device would hold
once every micro-batch before ``k`` has finished, plus what ``k`` has still to start there, fits the limit.
Micro-batches enter stage 0 in order, so the oldest unfinished one always passes the test (it needs only its
own share, which the limit holds; Note [least memory]) and its next task can always run: the heuristic never
deadlocks, whatever the rule, for any limit at or above the least memory. Freeing memory and the oldest
micro-batch's own forwards keep the test true for everyone else, which is why it suffices to check forwards.

Note [forward queues]: a device runs each stage's forwards in micro-batch order and looks only at each
stage's first waiting one. The memory test grows with the micro-batch (a later one has more before it), so
when the first may not start, no later one may; a choice then costs the device's stages and a heap operation,
not the number of tasks waiting, which grows with the micro-batches when forwards pile up before a device.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpipe.schedule.search_costs import Problem
from gpipe.schedule.search_timing import finish_times, fits

__all__ = ["QUICK", "RULES", "Lists", "Rule", "list_schedule", "one_at_a_time", "span"]

Lists = list[list[int]]  # each device's task numbers in order (Note [search tasks] in search_costs)


@dataclass(frozen=True)
class Rule:
    """How a free device picks among its ready tasks: the lowest ``(rank of the op, micro-batch, -stage)``, or
    ``(rank, -stage, micro-batch)`` with ``deepest_first``.

    Attributes:
        name: the rule, for a result's ``method``.
        rank: the ranks of ``F``, ``B`` and ``W``; lower runs first.
        deepest_first: among tasks of one op, the later stage before the older micro-batch.
        fill: a ``W`` runs only where it ends before a ready-soon ``F`` or ``B`` arrives (it fills a bubble), or
            when nothing else can run; without it a ``W`` runs whenever it is the best task ready.
        warm_up: a device runs forwards ahead of their backwards only as far as 1F1B would at its stages
            (``n - s`` micro-batches on stage ``s``), the oldest micro-batch excepted, and runs them first.
    """

    name: str
    rank: tuple[int, int, int]
    deepest_first: bool = False
    fill: bool = False
    warm_up: bool = False


#: The rules tried; the best schedule among them is kept. Backward first keeps memory low and feeds the
#: devices upstream; forward first fills the pipeline as memory allows (GPipe's order when it is unlimited).
#: Each wins somewhere; the first ``QUICK`` are the best all-rounders, the ones a very large problem runs.
RULES = (
    Rule("backward first, weight gradients when idle", (1, 0, 2)),
    Rule("1F1B's warm-up, then backward and its weight gradient first", (2, 0, 1), warm_up=True),
    Rule("forward first, deepest stage first", (0, 1, 2), True),
    Rule("1F1B's warm-up, then backward first, weight gradients fill bubbles", (1, 0, 2), fill=True, warm_up=True),
    Rule("1F1B's warm-up, then backward first, deepest stage first", (1, 0, 2), True, True, True),
    Rule("backward first, weight gradients fill bubbles", (1, 0, 2), fill=True),
    Rule("backward first, deepest stage first, weight gradients fill bubbles", (1, 0, 2), True, True),
    Rule("backward then its weight gradient first", (2, 0, 1)),
    Rule("forward first", (0, 1, 2), fill=True),
)
QUICK = 3


def one_at_a_time(problem: Problem) -> Lists:
    """Micro-batch after micro-batch, each through the whole pipeline and back: it holds one micro-batch's
    share on each device (Note [least memory]), so it meets every limit that any schedule meets."""
    m, n, mn = problem.m, problem.n, problem.m * problem.n
    lists: Lists = [[] for _ in range(problem.devices)]
    for i in range(m):
        for s in range(n):
            lists[problem.placement[s]].append(i * n + s)
        for s in reversed(range(n)):
            lists[problem.placement[s]].append(mn + i * n + s)
            if problem.splits:
                lists[problem.placement[s]].append(2 * mn + i * n + s)
    return lists


def list_schedule(problem: Problem, rule: Rule) -> tuple[Lists, float]:
    """Each device's order under ``rule``, and its makespan: whenever a device is free it starts the best of its
    ready tasks, a forward only where Note [safe admission] allows it.

    Returns:
        ``(lists, makespan)``: ``lists[d]`` device ``d``'s task numbers in order.
    """
    return _ListScheduler(problem, rule).run()


class _ListScheduler:
    """One run of :func:`list_schedule`: the tasks whose dependencies have run wait on their device, a stage's
    forwards in micro-batch order (Note [forward queues]), backwards and weight gradients in two heaps (by ready
    time until the device is free at that time, then by the rule's key)."""

    def __init__(self, problem: Problem, rule: Rule) -> None:
        self.problem, self.rule = problem, rule
        m, n, size, devices = problem.m, problem.n, problem.size, problem.devices
        self.mn = mn = m * n
        rank = rule.rank
        self.key = [((rank[k // mn],) if not rule.warm_up else (k >= mn, rank[k // mn]))
                    + ((-(k % n), k // n % m) if rule.deepest_first else (k // n % m, -(k % n))) for k in range(size)]
        self.frees = (2 if problem.splits else 1) * mn  # the first task number of the op that frees memory
        self.waits = [len(d) for d in problem.deps]
        for i in range(1, m):
            self.waits[i * n] += 1  # micro-batches enter stage 0 in order (Note [safe admission])
        self.ready = [0.0] * size
        self.gone = bytearray(size)  # the backwards and weight gradients already placed
        self.free = [0.0] * devices
        self.order: Lists = [[] for _ in range(devices)]
        self.stages: list[list[int]] = [[] for _ in range(devices)]
        share, self.warm = [0.0] * devices, [0.0] * devices  # warm: what 1F1B holds at the device's stages
        for s, d in enumerate(problem.placement):
            self.stages[d].append(s)
            share[d] += problem.activation[s]
            self.warm[d] += (n - s) * problem.activation[s]
        self.forwards: list[list[int]] = [[] for _ in range(n)]  # per stage: heap of waiting forwards
        self.soon: list[list[tuple[float, int]]] = [[] for _ in range(devices)]  # (ready, task), not yet ready
        self.now: list[list[tuple[tuple[int, ...], int]]] = [[] for _ in range(devices)]  # (key, task), ready
        self.held = [[0.0] * m for _ in range(devices)]
        self.rest = [[share[d]] * m for d in range(devices)]  # what micro-batch i has still to start on device d
        self.left = [[len(self.stages[d])] * m for d in range(devices)]  # its stages on d not yet freed
        self.total = [0.0] * devices
        self.oldest = [0] * devices  # the first micro-batch not yet finished on each device
        self.ahead = [0.0] * devices  # activation of forwards whose backward has not run (Rule.warm_up)
        self.unfinished = [size // m] * m  # tasks left per micro-batch
        self.first = 0  # the first unfinished micro-batch
        heapq.heappush(self.forwards[0], 0)

    def admits(self, d: int, k: int) -> bool:
        """Note [safe admission] for forward ``k`` on device ``d``, and Rule.warm_up's limit."""
        problem, n, i = self.problem, self.problem.n, k // self.problem.n % self.problem.m
        a = problem.activation[k % n]
        if self.rule.warm_up and i != self.first and not fits(self.ahead[d] + a, self.warm[d]):
            return False
        if problem.limits is None:
            return True
        held, rest, left, oldest = self.held[d], self.rest[d], self.left[d], self.oldest
        while oldest[d] < i and not left[oldest[d]]:
            oldest[d] += 1
        worst = before = 0.0
        for j in range(oldest[d], i):
            worst = max(worst, rest[j] - before)
            before += held[j]
        return fits(self.total[d] + a + worst, problem.limits[d])

    def options(self, d: int, until: float, heads: list[int]) -> list[int]:
        """Device ``d``'s tasks that may start by ``until``: of ``heads`` (each stage's first forward that may
        start; Note [forward queues]) and of its backwards and weight gradients, those ready by then."""
        out = [k for k in heads if self.ready[k] <= until]
        if self.now[d]:
            out.append(self.now[d][0][1])
        out += [k for r, k in self.soon[d] if r <= until and not self.gone[k]]
        return out

    def decide(self, d: int) -> tuple[float, int]:
        """When device ``d`` starts its next task, and which (``inf, -1``: none can run yet)."""
        free, ready, key, soon, now, gone = self.free[d], self.ready, self.key, self.soon[d], self.now[d], self.gone
        while soon and (soon[0][0] <= free or gone[soon[0][1]]):
            k = heapq.heappop(soon)[1]
            if not gone[k]:
                heapq.heappush(now, (key[k], k))
        while now and gone[now[0][1]]:
            heapq.heappop(now)
        heads = [q[0] for s in self.stages[d] if (q := self.forwards[s]) and self.admits(d, q[0])]
        earliest = min([ready[k] for k in heads] + ([free] if now else []) + ([soon[0][0]] if soon else []),
                       default=math.inf)
        if earliest == math.inf:
            return earliest, -1
        t = max(free, earliest)
        k = min(self.options(d, t, heads), key=key.__getitem__)
        if self.rule.fill and k >= 2 * self.mn:  # a W: does it delay a task arriving before it ends?
            end = t + self.problem.seconds[k]
            arriving = [ready[x] for x in heads if t < ready[x] < end]
            arriving += [r for r, x in soon if t < r < end and not gone[x]]
            if arriving:
                t = min(arriving)
                k = min(self.options(d, t, heads), key=key.__getitem__)
        return t, k

    def run(self) -> tuple[Lists, float]:
        """Place every task: the device that can start soonest starts its choice (ties: the lower task number)."""
        problem, mn, n, m = self.problem, self.mn, self.problem.n, self.problem.m
        device, seconds, act, ready = problem.device, problem.seconds, problem.activation, self.ready
        decisions = [self.decide(d) for d in range(problem.devices)]
        for _ in range(problem.size):
            t, k = min(decisions)
            if k < 0:  # cannot happen (Note [safe admission]); keep the order that meets any limit
                lists = one_at_a_time(problem)
                return lists, span(problem, lists)
            d, i, s = device[k], k // n % m, k % n
            end = self.free[d] = t + seconds[k]
            self.order[d].append(k)
            if k < mn:
                heapq.heappop(self.forwards[s])
                self.total[d] += act[s]
                self.held[d][i] += act[s]
                self.rest[d][i] -= act[s]
                self.ahead[d] += act[s]
            else:
                self.gone[k] = 1  # left in its heap, skipped when met there
                if k < 2 * mn:
                    self.ahead[d] -= act[s]
            if self.frees <= k < self.frees + mn:
                self.total[d] -= act[s]
                self.held[d][i] -= act[s]
                self.left[d][i] -= 1
            touched = {d}
            self.unfinished[i] -= 1
            while self.first < m and not self.unfinished[self.first]:
                self.first += 1
                touched = set(range(problem.devices))  # the oldest micro-batch passes Rule.warm_up's test
            after: Sequence[tuple[int, float]] = problem.succs[k]
            if s == 0 and k < mn and i + 1 < m:
                after = (*after, (k + n, 0.0))
            for z, delay in after:
                ready[z] = max(ready[z], end + delay)
                self.waits[z] -= 1
                if not self.waits[z]:
                    if z < mn:
                        heapq.heappush(self.forwards[z % n], z)
                    else:
                        heapq.heappush(self.soon[device[z]], (ready[z], z))
                    touched.add(device[z])
            for e in touched:
                decisions[e] = self.decide(e)
        return self.order, max(self.free)


def span(problem: Problem, lists: Lists) -> float:
    """The makespan of ``lists`` (Note [search timing])."""
    ends = finish_times(lists, problem.deps.__getitem__, problem.seconds.__getitem__)
    return max(ends.values(), default=0.0)
