"""Processor sharing for SimPy: jobs on shared cores slow each other down, exactly, as they come and go."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import simpy

__all__ = ["COMPUTING", "TALKING", "Phase", "Ran", "SharedCores", "pair_ends", "phased_pair", "phased_pair_ends",
           "task_phases"]

#: What a phase of a task uses (Note [communication] in :mod:`sim.core.cost`): the device's compute, or its link.
COMPUTING, TALKING = 0, 1

#: One phase of a task: ``(COMPUTING or TALKING, seconds at full speed)``.
Phase = tuple[int, float]

#: One phase of a task as it ran: ``(COMPUTING or TALKING, start, end)``.
Ran = tuple[int, float, float]


def pair_ends(start: float, a: float, b: float) -> tuple[float, float]:
    """When two jobs of ``a`` and ``b`` seconds end that start together at ``start`` on one device and share its
    rate: each runs at half speed while both run, then the longer at full speed. The shorter ends at
    ``start + 2 min(a, b)``, the longer at ``start + a + b``: the pair costs what the two cost one after the
    other, and neither ends sooner than it would alone (an overlapped pair shares the device; it is not free).
    """
    shorter = a if a <= b else b
    both = start + 2.0 * shorter
    later = both + ((b if a <= b else a) - shorter)
    return (both, later) if a <= b else (later, both)


def task_phases(compute: float, communication: float, communicates_first: bool) -> tuple[Phase, ...]:
    """A task's phases in order, as it runs in an overlapped pair (Note [communication] in :mod:`sim.core.cost`):
    ``compute`` seconds on the device and ``communication`` on its link, the communication first for a backward
    (``communicates_first``) and last for a forward; a phase of no seconds is left out."""
    phases = ((TALKING, communication), (COMPUTING, compute)) if communicates_first \
        else ((COMPUTING, compute), (TALKING, communication))
    return tuple((use, seconds) for use, seconds in phases if seconds > 0)


def phased_pair_ends(start: float, a: Sequence[Phase], b: Sequence[Phase]) -> tuple[float, float]:
    """When two tasks end that start together at ``start``, each running its phases in order, while the device's
    compute and its link are each shared equally by the tasks in a phase on it (Note [communication] in
    :mod:`sim.core.cost`). Without communication it is :func:`pair_ends` exactly; a forward and a backward of
    ``c`` compute and ``x`` communication seconds each both end at ``start + 2 max(c, x)``::

        c >= x:      0 .. x       x .. 2c - x        2c - x .. 2c
              F  computes    computes, shared    sends              the backward's link time under the
              B  receives    computes, shared    computes           forward's compute, and the other way round

        c < x:       0 .. c       c .. 2x - c        2x - c .. 2x
              F  computes    sends, shared       sends              the link shared where neither computes:
              B  receives    receives, shared    computes           2(x - c) of the pair's 2x

    :func:`phased_pair` gives when each phase runs.
    """
    if all(use == COMPUTING for use, _ in (*a, *b)):
        return pair_ends(start, sum((s for _, s in a), 0.0), sum((s for _, s in b), 0.0))
    ran = phased_pair(start, a, b)
    return (ran[0][-1][2] if ran[0] else start), (ran[1][-1][2] if ran[1] else start)


def phased_pair(start: float, a: Sequence[Phase], b: Sequence[Phase]) -> tuple[tuple[Ran, ...], tuple[Ran, ...]]:
    """When each phase of two tasks runs that start together at ``start`` (:func:`phased_pair_ends`' sharing):
    each task's phases in order, as ``(use, start, end)``; the last one's end is the task's."""
    ran: tuple[list[Ran], list[Ran]] = ([], [])
    left, began, t = [list(a), list(b)], [start, start], start
    while left[0] or left[1]:
        using = [phases[0][0] for phases in left if phases]
        rates = [1.0 / using.count(phases[0][0]) if phases else 0.0 for phases in left]
        step = min(phases[0][1] / rate for phases, rate in zip(left, rates, strict=True) if phases)
        t = t + step
        for k, phases in enumerate(left):
            if not phases:
                continue
            use, seconds = phases[0]
            remaining = seconds - step * rates[k]
            if remaining <= 1e-12 * max(1.0, seconds):  # this phase is done (the one that set the step exactly)
                phases.pop(0)
                ran[k].append((use, began[k], t))
                began[k] = t
            else:
                phases[0] = (use, remaining)
    return tuple(ran[0]), tuple(ran[1])


class SharedCores:
    """Jobs that share cores, each slowed by the others it runs beside.

    A job ``x`` running beside the set ``Y`` progresses at ``1 / (1 + sum over y in Y of c(x, y))``,
    where ``c(x, y)`` is the slowdown measured for the pair of the jobs' keys (``pairs``) or
    ``contention`` for a pair not listed. Without pairs every job runs at
    ``1 / (1 + contention * (k - 1))`` while ``k`` run. A job may hold ``host`` seconds that the others do
    not slow (Note [host seconds share nothing] in :mod:`sim.core.device`): its slowdowns are scaled by
    ``(work - host) / work``, so beside a steady set ``Y`` it takes ``work + (work - host) * sum c``, its
    host seconds spread evenly over it; it still slows the others for as long as it runs.

    Exact processor sharing in SimPy: each start or end brings every running job's remaining work up
    to date at the rates that held since the last change, recomputes the rates and schedules the next
    completion (one timer at a time; a change invalidates the old one).

    Args:
        env: the SimPy environment the jobs run in.
        contention: the slowdown per other running job (>= 0); 0 means jobs never slow each other.
        pairs: ``(key, other key, c)``: how much a job of the first key slows beside one of the second.
    """

    def __init__(self, env: simpy.Environment, contention: float,
                 pairs: Iterable[tuple[Hashable, Hashable, float]] = ()) -> None:
        self.env = env
        self.contention = contention
        self.pairs = {(x, y): c for x, y, c in pairs}
        # id -> [remaining work (seconds at full speed), done event, key, rate, share of the work others slow]
        self.jobs: dict[int, list[Any]] = {}
        self.last = 0.0  # when the remaining work was last brought up to date
        self.version = 0  # invalidates the scheduled completion after every change
        self.ids = 0

    def _rates(self) -> None:
        jobs = list(self.jobs.values())
        for job in jobs:
            slow = sum(self.pairs.get((job[2], other[2]), self.contention) for other in jobs if other is not job)
            job[3] = 1.0 / (1.0 + slow * job[4])

    def _advance(self) -> None:
        elapsed = self.env.now - self.last
        if elapsed > 0:
            for job in self.jobs.values():
                job[0] -= elapsed * job[3]
        self.last = self.env.now

    def run(self, work: float, key: Hashable = None, host: float = 0.0) -> simpy.Event:
        """Start a job of ``work`` seconds at full speed; ``key`` names it for ``pairs``.

        Args:
            work: seconds at full speed (>= 0).
            key: the job's name in ``pairs``.
            host: seconds of ``work`` that other jobs do not slow (``0 <= host <= work``).

        Returns:
            An event that fires when the job is done.

        Raises:
            ValueError: ``host`` outside ``[0, work]``.
        """
        if not 0.0 <= host <= work:
            raise ValueError(f"host seconds must lie in [0, work = {work}], got {host}")
        self._advance()
        done = self.env.event()
        self.ids += 1
        self.jobs[self.ids] = [work, done, key, 1.0, (work - host) / work if work > 0 else 1.0]
        self._reschedule()
        return done

    def _reschedule(self) -> None:
        self.version += 1
        if not self.jobs:
            return
        self._rates()
        target = min(self.jobs, key=lambda k: self.jobs[k][0] / self.jobs[k][3])
        version = self.version
        job = self.jobs[target]
        timer = self.env.timeout(max(job[0], 0.0) / job[3])
        timer.callbacks.append(lambda _event: self._complete(version, target))

    def _complete(self, version: int, target: int) -> None:
        if version != self.version:
            return  # something started or ended since; a newer completion is scheduled
        self._advance()
        tolerance = 1e-12 * max(1.0, self.env.now)
        finished = [k for k, job in self.jobs.items() if k == target or job[0] <= tolerance]
        for k in finished:
            self.jobs.pop(k)[1].succeed()
        self._reschedule()
