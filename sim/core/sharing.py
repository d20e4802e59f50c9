"""Processor sharing for SimPy: jobs on shared cores slow each other down, exactly, as they come and go."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

import simpy

__all__ = ["SharedCores", "pair_ends"]


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
