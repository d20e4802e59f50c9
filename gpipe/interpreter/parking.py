"""Where a training forward's workers wait for its backward: Note [parked workers].

Note [parked workers]: a training ``forward()`` starts the workers once, for both phases: after its
forward tasks each worker parks on an event of its own, and ``backward()`` wakes them (the last stage's
last) instead of starting fresh threads: starting two threads again, each a scheduler's wake-up on busy
cores, would sit on the critical path between the last forward and the first backward, which ``step()`` runs
back to back (``benchmarks/executor_speed.py`` times both entry points). The parking is the driver's
(:class:`gpipe.interpreter.threads.ThreadRun` and its thread loop), not the interpreter's: a worker knows nothing of it.
Parked workers hold nothing but the run: a failure, an interrupt, or the forward's graph freed before its
backward (:class:`Parked`, held by that graph) sends them away.
"""

from __future__ import annotations

import threading
from typing import Protocol

__all__ = ["Gate", "Parked"]


class Gate:
    """One event per schedule device, on which its worker waits between the phases (Note [parked workers]).

    ``parked`` is true from the forward's launch until :meth:`open`; a worker woken while it is still true was
    sent away (:meth:`cancel`, :meth:`release`), and its end was already counted with the forward phase.
    """

    def __init__(self, devices: int) -> None:
        self.parked = False  # the workers wait (or will) for the backward phase
        self.cancelled = False  # ... and were told to leave instead
        self.go = [threading.Event() for _ in range(devices)]

    def wait(self, d: int) -> bool:
        """Park device ``d``'s worker; whether it was woken by :meth:`open` (else it must leave, uncounted)."""
        self.go[d].wait()
        return not self.parked

    def open(self, first: int) -> None:
        """Wake the parked workers for the backward phase; device ``first``'s last (Note [launch order] in
        :mod:`gpipe.interpreter.threads`). The caller has armed the phase (its count of workers) before."""
        self.parked = False
        for d, go in enumerate(self.go):
            if d != first:
                go.set()
        self.go[first].set()

    def cancel(self) -> None:
        """Send parked workers away: their backward will not come. Safe from any thread."""
        if self.parked:
            self.cancelled = True
            self.release()

    def release(self) -> None:
        """Wake every worker, parked or not yet (a failure: they leave)."""
        for go in self.go:
            go.set()


class _Cancellable(Protocol):
    def cancel(self) -> None: ...


class Parked:
    """Held by a training forward's autograd graph: freed before its backward ran, it sends the run's parked
    workers away (Note [parked workers])."""

    __slots__ = ("run",)

    def __init__(self, run: _Cancellable) -> None:
        self.run = run

    def __del__(self) -> None:
        self.run.cancel()
