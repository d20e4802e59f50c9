"""An overlapped pair of tasks on one device (Note [overlapped pairs] in :mod:`gpipe.schedule.schedule`): it starts
once both tasks' inputs are in, the two share the device's compute and its link (:func:`sim.core.sharing.pair_ends`,
:func:`sim.core.sharing.phased_pair_ends` with communication, Note [communication] in :mod:`sim.core.cost`), and
each ends, sends and frees as its own work is done. :func:`pair_fast` serves :func:`sim.core.device.device_fast`,
:func:`pair` the general :func:`sim.core.device.device`; both compute the same times.

Pairs run on the plain path's rules (copy streams, synchronous devices, no shared cores, no lockstep, one
phase): :func:`check_pairs` refuses the other switches, which would need their own model of a shared device.
``SimConfig(overlap_pairs=False)`` runs a pair's tasks in turn instead, as this executor does, on every path.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from gpipe.schedule import Op, Task
from gpipe.timeline import COMPUTE, Span
from sim.core.copies import Sends
from sim.core.run import Run
from sim.core.sharing import Phase, phased_pair_ends, task_phases
from sim.core.tables import B, F, R, W

__all__ = ["check_pairs", "pair", "pair_fast"]

_OPCODE = {Op.F: F, Op.B: B, Op.R: R, Op.W: W}
# task, opcode, i, j, slots waited for, sends, its phases (Note [communication] in sim.core.cost)
Row = tuple[Task, int, int, int, list[int], Sends, tuple[Phase, ...]]


def check_pairs(run: Run) -> None:
    """Raise ``ValueError`` when the schedule has overlapped pairs and the run is off the plain path."""
    config = run.config
    off_path = run.cores is not None or not config.copy_streams or config.lockstep_forward \
        or config.backward_after_forward or bool(config.asynchronous) or any(run.shared)
    if run.schedule.pairs and config.overlap_pairs and off_path:
        raise ValueError(f"schedule {run.schedule.name!r} overlaps pairs of tasks, which the simulator models with "
                         "copy streams, synchronous devices and no core contention: use SimConfig(copy_streams=True) "
                         "without lockstep_forward, backward_after_forward, asynchronous or shared_streams, and a "
                         "cost model without contention or pairs, or SimConfig(overlap_pairs=False) to run each pair's "
                         "tasks in turn")


def _rows(run: Run, d: int, k: int) -> list[Row]:
    """Tasks ``k`` and ``k + 1`` of device ``d``: what each waits for, sends, and how long it takes alone."""
    rows = []
    for q in (k, k + 1):
        task = run.schedule.tasks[d][q]
        op, i, j = _OPCODE[task.op], task.microbatch, task.stage
        waits, sends, seconds, host = run.table[run.checkpointed[i]][op][j]
        talk = run.communication[op][j]
        if run.scaled:
            seconds = seconds * run.scales[i] + host
            talk = talk * run.scales[i]
        if q == 0:  # a fresh worker thread's first task
            seconds += run.first[j]
        phases = task_phases(seconds - talk if talk else seconds, talk, op == B)
        rows.append((task, op, i, j, [offset + i * run.stride for offset in waits], sends, phases))
    return rows


def _end(run: Run, d: int, row: Row, start: float, end: float, backward_left: int) -> int:
    """One task of a pair ends at ``end``: its span, memory and copies (Note [fork/join] in :mod:`sim.core.device`);
    returns the backwards left. The pair's tasks end in time order, so copies queue FIFO per link."""
    memory = run.memory
    task, op, i, j, _, sends, _ = row
    if memory.tracked and op == R:
        memory.hold(d, i, j, run.cost.stages[j].saved_bytes, start)
    run.spans[d].append(Span(d, COMPUTE, task, start, end))
    if memory.tracked:
        memory.after(d, op, i, j, end)
    send, backward_left = run.copies_due(d, task, op, i, j, sends, backward_left, run.config.enforce_backward_order)
    for copy in send:
        run.copies.on_streams(d, end, *copy)
    return backward_left


def pair_fast(run: Run, d: int, k: int, t: float, free_at: float,
              backward_left: int) -> Generator[simpy.Event, Any, tuple[float, int]]:
    """The pair at task ``k`` of device ``d`` on the local clock ``t`` (Note [local clocks] in
    :mod:`sim.core.device`); returns the clock after it and the backwards left."""
    copies, rows = run.copies, _rows(run, d, k)
    arrival, issued = copies.arrival, copies.issued
    for slot in rows[0][4] + rows[1][4]:
        at = arrival[slot]
        if at is None:
            run.clock[d] = t
            event = copies.waiting[slot] = run.env.event()
            yield event
            at = arrival[slot]
            assert at is not None
        if copies.free:
            if at > t:
                t = at
            continue
        if issued[slot] > t:
            t = issued[slot]
        if at > t:
            t = t + (at - t)
    if free_at > t:
        t = t + (free_at - t)
    start, ends = t, phased_pair_ends(t, rows[0][6], rows[1][6])
    for q in sorted((0, 1), key=lambda q: ends[q]):  # the clock steps as SimPy's would, end by end
        t = t + (ends[q] - t)
        backward_left = _end(run, d, rows[q], start, t, backward_left)
    return t, backward_left


def pair(run: Run, d: int, k: int, free_at: float, backward_left: int) -> Generator[simpy.Event, Any, int]:
    """The pair at task ``k`` of device ``d`` in SimPy's time; returns the backwards left."""
    env, copies, rows = run.env, run.copies, _rows(run, d, k)
    for slot in rows[0][4] + rows[1][4]:
        at = copies.arrival[slot]
        if at is None:
            event = copies.waiting[slot] = env.event()
            yield event
            at = copies.arrival[slot]
            assert at is not None
        if at > env.now:
            yield env.timeout(at - env.now)
    if free_at > env.now:
        yield env.timeout(free_at - env.now)
    start, ends = env.now, phased_pair_ends(env.now, rows[0][6], rows[1][6])
    for q in sorted((0, 1), key=lambda q: ends[q]):
        yield env.timeout(ends[q] - env.now)
        backward_left = _end(run, d, rows[q], start, env.now, backward_left)
    return backward_left
