"""An overlapped pair of tasks on one device (Note [overlapped pairs] in :mod:`gpipe.schedule.schedule`): it starts
once both tasks' inputs are in, the two share the device's compute and its link (:func:`sim.core.sharing.pair_ends`,
:func:`sim.core.sharing.phased_pair_ends` with communication, Note [communication] in :mod:`sim.core.cost`), and
each ends, sends and frees as its own work is done. :func:`sim.core.device.device` waits for both tasks' inputs and
prices each task as it prices any other, then hands the two to :func:`pair`.

Pairs run on the plain path's rules (copy streams, synchronous devices, no shared cores, no lockstep, one
phase), on the device's own clock (Note [local clocks] in :mod:`sim.core.device`): :func:`check_pairs` refuses the
other switches, which would need their own model of a shared device. ``SimConfig(overlap_pairs=False)`` runs a
pair's tasks in turn instead, as this executor does, on every path.

A task that communicates, in a pair or alone (:func:`alone`), also gets a span of its communication phase on the
device's collective stream (Note [communication spans]).
"""

from __future__ import annotations

from gpipe.schedule import Task
from gpipe.schedule.timeline import ALL_TO_ALL, COLLECTIVE, COMPUTE, Span, collective_label
from sim.core.copies import Sends
from sim.core.run import Run
from sim.core.sharing import TALKING, pair_ends, phased_pair, task_phases
from sim.core.tables import B

__all__ = ["Half", "alone", "check_pairs", "pair"]

# Note [communication spans]: a task that communicates (Note [communication] in sim.core.cost) gets one span of its
# communication phase on the device's collective stream, an all-to-all named after the task, when the phase runs:
# alone, the first seconds of a backward and the last of a forward (as sim.core.sharing.task_phases orders them); in
# a pair, as sim.core.sharing.phased_pair shares the link. One span per task, not one per dispatch and per combine:
# the cost model gives one number for both, which the simulator runs as one phase. The task's compute span still
# covers its whole time, so what reads compute spans is unchanged; sim.core.exposure tells the phase from the compute.

#: One task of a pair as the device loop priced it: task, opcode, i, j, its sends, its seconds alone (with the
#: runner's host seconds and its communication, Note [communication] in sim.core.cost).
Half = tuple[Task, int, int, int, Sends, float]


def check_pairs(run: Run) -> None:
    """Raise ``ValueError`` when the schedule has overlapped pairs and the run is off the plain path."""
    if run.schedule.pairs and run.config.overlap_pairs and not run.local_clocks():
        raise ValueError(f"schedule {run.schedule.name!r} overlaps pairs of tasks, which the simulator models with "
                         "copy streams, synchronous devices and no core contention: use SimConfig(copy_streams=True) "
                         "without lockstep_forward, backward_after_forward, asynchronous or shared_streams, and a "
                         "cost model without contention or pairs, or SimConfig(overlap_pairs=False) to run each pair's "
                         "tasks in turn")


def _talk(run: Run, op: int, i: int, j: int) -> float:
    """Seconds task ``op`` of micro-batch ``i`` on stage ``j`` communicates (Note [communication] in
    :mod:`sim.core.cost`)."""
    talk = run.communication[op][j]
    return talk * run.scales[i] if talk and run.scaled else talk


def _talked(run: Run, d: int, task: Task, i: int, j: int, start: float, end: float) -> None:
    """Record ``task``'s communication phase, from ``start`` to ``end`` (Note [communication spans])."""
    nbytes = run.cost.stages[j].communication_bytes * (run.scales[i] if run.scaled else 1.0)
    run.talks[d].append(Span(d, COLLECTIVE, task, start, end, collective_label(ALL_TO_ALL, "dispatch and combine",
                                                                               nbytes)))


def alone(run: Run, d: int, task: Task, op: int, i: int, j: int, start: float, end: float) -> None:
    """A task that communicates ran alone from ``start`` to ``end``: its communication span, first for a backward
    and last for a forward (Note [communication spans])."""
    talk = _talk(run, op, i, j)
    if op == B:
        _talked(run, d, task, i, j, start, start + talk)
    else:
        _talked(run, d, task, i, j, end - talk, end)


def _end(run: Run, d: int, half: Half, start: float, end: float, backward_left: int) -> int:
    """One task of a pair ends at ``end``: its span, memory and copies (Note [fork/join] in :mod:`sim.core.device`);
    returns the backwards left. The pair's tasks end in time order, so copies queue FIFO per link."""
    memory = run.memory
    task, op, i, j, sends, _ = half
    if memory.tracked:
        memory.start(d, op, i, j, start)
    run.spans[d].append(Span(d, COMPUTE, task, start, end))
    if memory.tracked:
        memory.after(d, op, i, j, end)
    send, backward_left = run.copies_due(d, task, op, i, j, sends, backward_left, run.config.enforce_backward_order)
    for copy in send:
        run.copies.on_streams(d, end, *copy)
    return backward_left


def pair(run: Run, d: int, a: Half, b: Half, t: float, backward_left: int) -> tuple[float, int]:
    """Tasks ``a`` and ``b`` of device ``d`` start together at its clock ``t``, their inputs in and the device
    free; returns the clock after both have ended and the backwards left."""
    start, xa, xb = t, _talk(run, a[1], a[2], a[3]), _talk(run, b[1], b[2], b[3])
    if xa or xb:  # each task's seconds alone split into compute and communication, phase by phase
        ran = phased_pair(t, task_phases(a[5] - xa, xa, a[1] == B), task_phases(b[5] - xb, xb, b[1] == B))
        ends = (ran[0][-1][2] if ran[0] else start, ran[1][-1][2] if ran[1] else start)
        for (task, _, i, j, _, _), phases in zip((a, b), ran, strict=True):
            for use, began, ended in phases:
                if use == TALKING:  # Note [communication spans]
                    _talked(run, d, task, i, j, began, ended)
    else:
        ends = pair_ends(t, a[5], b[5])
    for q in sorted((0, 1), key=lambda q: ends[q]):  # the clock steps as SimPy's would, end by end
        t = t + (ends[q] - t)
        backward_left = _end(run, d, (a, b)[q], start, t, backward_left)
    return t, backward_left
