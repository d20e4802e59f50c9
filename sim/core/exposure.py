"""How much of a timeline's all-to-all communication the device waits for: the seconds no task computes beside it.

A task that communicates (Note [communication] in :mod:`sim.core.cost`) has a compute span over its whole time and
an all-to-all span over its communication phase (Note [communication spans] in :mod:`sim.core.overlap`); its compute
is its span without that phase. Per device::

    communication  the seconds some all-to-all runs (the union of its all-to-all spans)
    exposed        of those, the seconds no task computes: the device waits on the network
    hidden         communication - exposed: under another task's compute (an overlapped pair's)

Closed forms: a task alone exposes its whole communication ``x``; an overlapped forward and backward of ``c`` compute
and ``x`` communication seconds each expose ``2 max(0, x - c)`` of their ``2 max(c, x)``
(:func:`sim.core.sharing.phased_pair_ends`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpipe.schedule import Task
from gpipe.schedule.timeline import ALL_TO_ALL, COLLECTIVE, COMPUTE, Span, Timeline

__all__ = ["Exposure", "exposure", "is_all_to_all"]

Interval = tuple[float, float]


@dataclass(frozen=True)
class Exposure:
    """A timeline's all-to-all seconds per device (see the module's table).

    Attributes:
        communication: per device, the seconds some all-to-all runs.
        exposed: per device, the seconds of those during which no task computes.
    """

    communication: tuple[float, ...]
    exposed: tuple[float, ...]

    @property
    def hidden(self) -> tuple[float, ...]:
        """Per device, the communication seconds under another task's compute."""
        return tuple(c - e for c, e in zip(self.communication, self.exposed, strict=True))

    @property
    def total_communication(self) -> float:
        return sum(self.communication)

    @property
    def total_exposed(self) -> float:
        return sum(self.exposed)


def is_all_to_all(span: Span) -> bool:
    """Whether ``span`` is a task's all-to-all: a collective span labelled ``collective_label("all-to-all", ...)``."""
    return span.stream == COLLECTIVE and span.label.startswith(ALL_TO_ALL + " ")


# Note [exposed once]: exposure is wall-clock time, the union of the all-to-alls less the union of the compute, not a
# sum over spans: in an overlapped pair whose communication outlasts its compute (x > c) both tasks' all-to-alls share
# the link at once for 2(x - c) seconds, and the device loses those seconds once. So the exposed seconds of a device
# plus its compute seconds are the seconds it is busy, and a schedule that exposes fewer seconds ends sooner by them.
def exposure(timeline: Timeline) -> Exposure:
    """The all-to-all seconds of each device of ``timeline``, and how many of them no task's compute hides."""
    communication, exposed = [], []
    for d in range(timeline.num_devices):
        spans = timeline.device_spans(d)
        talks: dict[Task, list[Interval]] = {}
        for s in spans:
            if is_all_to_all(s):
                talks.setdefault(s.task, []).append((s.start, s.end))
        if not talks:
            communication.append(0.0)
            exposed.append(0.0)
            continue
        talking = _union(i for phases in talks.values() for i in phases)
        computing = _union(piece for s in spans if s.stream == COMPUTE
                           for piece in _minus((s.start, s.end), _union(talks.get(s.task, ()))))
        communication.append(_length(talking))
        exposed.append(_length(talking) - _overlap(talking, computing))
    return Exposure(tuple(communication), tuple(exposed))


def _union(intervals: Iterable[Interval]) -> list[Interval]:
    """``intervals`` merged: disjoint, in time order, none empty."""
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _minus(interval: Interval, holes: list[Interval]) -> list[Interval]:
    """``interval`` less the disjoint, ordered ``holes``."""
    pieces, (start, end) = [], interval
    for a, b in holes:
        if a >= end:
            break
        if a > start:
            pieces.append((start, a))
        start = max(start, b)
    if end > start:
        pieces.append((start, end))
    return pieces


def _length(intervals: list[Interval]) -> float:
    return sum(end - start for start, end in intervals)


def _overlap(a: list[Interval], b: list[Interval]) -> float:
    """Seconds two disjoint, ordered lists of intervals share."""
    shared, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            shared += end - start
        if a[i][1] <= b[j][1]:
            i += 1
        else:
            j += 1
    return shared
