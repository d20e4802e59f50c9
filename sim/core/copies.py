"""Copies between devices: links that serialise them per directed pair, or the compute streams they borrow.

A dependency produced on another device travels as a copy, issued when its producer ends; each copy has a
*slot* (:func:`sim.core.tables.remote_tables`) where its arrival is kept for the consumer. The docs page
*The simulator's model of a device* describes copies, links and ``copy_streams=False``.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

import simpy

from gpipe.schedule import Task
from gpipe.schedule.timeline import COPY, Span
from sim.core.cost import CostModel
from sim.core.link import LinkSpec
from sim.core.tables import B, F

__all__ = ["ON_COMPUTE", "Copies", "Sends"]

ON_COMPUTE = "on-compute"  # label of a copy that ran on the compute streams (Note [no copy streams])

#: ``(device, slot offset)`` of each copy of one result.
Sends = tuple[tuple[int, int], ...]


class Copies:
    """The copies of one simulation: when each slot's result arrives, on the stream and on the host.

    Note [copies]: a copy takes ``cost.copy_seconds`` when that is set, else the link's
    ``transfer_seconds(bytes)``, else nothing; the runner's ``handoff`` follows it as latency (it delays the
    consumer but does not occupy the link). Links are full duplex: copies queue FIFO per *directed* pair.
    A copy that takes zero seconds leaves no span.
    """

    def __init__(self, env: simpy.Environment, cost: CostModel, link: LinkSpec | None, scales: Sequence[float],
                 slots: int, stride: int, devices: int, asynchronous: frozenset[int], host_end: list[float],
                 streams: list[simpy.Resource] | None, stage_links: Sequence[LinkSpec] | None = None) -> None:
        self.env, self.cost, self.link, self.scales, self.stride = env, cost, link, scales, stride
        self.stage_links = stage_links  # the link after each stage, else ``link`` for all (SimConfig.stage_links)
        self.scaled = bool(cost.microbatch_scale)
        self.handoff = cost.runner.handoff
        self.asynchronous, self.host_end, self.streams = asynchronous, host_end, streams
        # copy seconds of the result of (op, j) at scale 1 (only F and B results travel)
        self.table = [[self.seconds(op, 0, j, 1.0) for j in range(cost.n)] for op in range(4)]
        self.arrival: list[float | None] = [None] * slots  # when a slot's result is usable (copy end + hand-off)
        self.host_arrival = [0.0] * slots  # when the consumer's host has it (Note [asynchronous devices])
        self.issued = [0.0] * slots  # when its copy was issued, or ended on compute streams (Note [local clocks])
        self.waiting: list[simpy.Event | None] = [None] * slots  # the event of a consumer that waits for the slot
        # [src][dst]: when the pair's last copy ends; a dict per sender, as a device sends to a few others only
        # (a list of lists took devices**2 floats: 2 GB for 16,000 stages, one per device)
        self.link_free: list[dict[int, float]] = [{} for _ in range(devices)]
        self.spans: list[list[Span]] = [[] for _ in range(devices)]  # per sending device, in issue order
        self.free = (cost.copy_seconds == 0.0 or (cost.copy_seconds is None and link is None and stage_links is None)
                     ) and not self.handoff
        # Note [copies at once]: a copy that takes no time, from a synchronous device and with no hand-off, is usable
        # when it is issued: on_streams's queue gives start = end = arrival = now for it, and it leaves no span. The
        # device loop, which sends once per task, writes such a copy's slot itself instead of calling on_streams, as a
        # call per task would weigh on the plain path (benchmarks/sim_speed.py, free copies); on_streams prices every
        # other copy, and the few of pairs and held-back gradients.
        self.at_once = [self.free and d not in asynchronous for d in range(devices)]

    def seconds(self, op: int, i: int, j: int, scale: float | None = None) -> float:
        """Seconds of a copy of the result of ``(op, i, j)`` (Note [copies])."""
        cost, link = self.cost, self.link
        if cost.copy_seconds is not None:
            return cost.copy_seconds
        if link is None and self.stage_links is None:
            return 0.0
        if scale is None:
            if not self.scaled:
                return self.table[op][j]
            scale = self.scales[i]
        # the activation of F(i, j) is stages[j].send_bytes; the gradient of B(i, j) as large as stage j-1's
        stage = j if op == F else j - 1 if op == B and j > 0 else -1
        if self.stage_links is not None and stage >= 0:
            link = self.stage_links[stage]
        if link is None:
            return 0.0
        return link.transfer_seconds(cost.stages[stage].send_bytes * scale if stage >= 0 else 0)

    def hand_off(self, src: int) -> tuple[float, float | None]:
        """What follows a copy from ``src``: the seconds its consumer's stream waits after the copy (``handoff`` for
        a synchronous producer, whose host is its stream), and when the consumer's host has it (``None``: when the
        stream has it; else the producer's host end plus ``handoff``; Note [asynchronous devices])."""
        if src in self.asynchronous:
            return 0.0, self.host_end[src] + self.handoff
        return self.handoff, None

    def deliver(self, slot: int, at: float, host_at: float) -> None:
        """A copy on the compute streams ends now: its result is usable at ``at``, on the host at ``host_at``."""
        self.arrival[slot] = at
        self.host_arrival[slot] = host_at
        self.issued[slot] = self.env.now
        event = self.waiting[slot]
        if event is not None:
            self.waiting[slot] = None
            event.succeed()

    def on_streams(self, src: int, now: float, task: Task, op: int, i: int, j: int, dsts: Sends) -> None:
        """Send ``task``'s result on copy streams at time ``now``: FIFO per directed pair, so each copy starts
        when it is issued (now) or when the pair's previous copy ends; computed at issue time, no process needed."""
        arrival, host_arrival, issued, waiting, base = self.arrival, self.host_arrival, self.issued, self.waiting, \
            i * self.stride
        handoff, host_at = self.hand_off(src)
        seconds = self.seconds(op, i, j) if self.scaled else self.table[op][j]
        free = self.link_free[src]
        for dst, offset in dsts:
            start = free.get(dst, 0.0)
            if start < now:
                start = now
            end = free[dst] = start + seconds
            if seconds > 0:
                self.spans[src].append(Span(dst, COPY, task, start, end))
            slot = offset + base
            arrival[slot] = end + handoff
            host_arrival[slot] = end + handoff if host_at is None else host_at
            issued[slot] = now
            event = waiting[slot]
            if event is not None:
                waiting[slot] = None
                event.succeed()

    def on_compute(self, src: int, task: Task, op: int, i: int, j: int,
                   dsts: Sends) -> Generator[simpy.Event, Any, None]:
        """Send ``task``'s result on the compute streams of sender and receiver, taken in device order.

        Note [no copy streams]: as a cross-device ``tensor.to()`` on the default stream, the copy starts once
        both streams are free and holds both; taking them in device order keeps two opposite copies from
        deadlocking. A zero-second copy synchronises nothing."""
        assert self.streams is not None
        seconds = self.seconds(op, i, j)
        handoff, host_at = self.hand_off(src)
        for dst, offset in dsts:
            if seconds > 0:
                first, second = (self.streams[k] for k in sorted((src, dst)))
                with first.request() as hold_first:
                    yield hold_first
                    with second.request() as hold_second:
                        yield hold_second
                        start = self.env.now
                        yield self.env.timeout(seconds)
                self.spans[src].append(Span(dst, COPY, task, start, self.env.now, ON_COMPUTE))
            at = self.env.now + handoff
            self.deliver(offset + i * self.stride, at, at if host_at is None else host_at)
