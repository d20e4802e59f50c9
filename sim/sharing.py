"""Processor sharing for SimPy: jobs on shared cores slow each other down, exactly, as they come and go."""

from __future__ import annotations

from typing import Any

import simpy

__all__ = ["SharedCores"]


class SharedCores:
    """Jobs that share cores: while ``k`` run, each progresses at ``1 / (1 + contention * (k - 1))``.

    Exact processor sharing in SimPy: each start or end brings every running job's remaining work up
    to date and schedules the next completion (one timer at a time; a change invalidates the old one).

    Args:
        env: the SimPy environment the jobs run in.
        contention: the slowdown per extra running job (>= 0); 0 means jobs never slow each other.
    """

    def __init__(self, env: simpy.Environment, contention: float) -> None:
        self.env = env
        self.contention = contention
        self.jobs: dict[int, list[Any]] = {}  # id -> [remaining work (seconds at full speed), done event]
        self.last = 0.0  # when the remaining work was last brought up to date
        self.version = 0  # invalidates the scheduled completion after every change
        self.ids = 0

    def _rate(self) -> float:
        return 1.0 / (1.0 + self.contention * (len(self.jobs) - 1)) if len(self.jobs) > 1 else 1.0

    def _advance(self) -> None:
        progress = (self.env.now - self.last) * self._rate()
        if progress > 0:
            for job in self.jobs.values():
                job[0] -= progress
        self.last = self.env.now

    def run(self, work: float) -> simpy.Event:
        """Start a job of ``work`` seconds at full speed.

        Returns:
            An event that fires when the job is done.
        """
        self._advance()
        done = self.env.event()
        self.ids += 1
        self.jobs[self.ids] = [work, done]
        self._reschedule()
        return done

    def _reschedule(self) -> None:
        self.version += 1
        if not self.jobs:
            return
        target = min(self.jobs, key=lambda k: self.jobs[k][0])
        version = self.version
        timer = self.env.timeout(max(self.jobs[target][0], 0.0) / self._rate())
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
