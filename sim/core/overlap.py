"""An overlapped pair of tasks on one device (Note [overlapped pairs] in :mod:`gpipe.schedule.schedule`): it starts
once both tasks' inputs are in, the two share the device's compute and its link (:func:`sim.core.sharing.pair_ends`,
:func:`sim.core.sharing.phased_pair_ends` with communication, Note [communication] in :mod:`sim.core.cost`), and
each ends, sends and frees as its own work is done. :func:`sim.core.device.device` waits for both tasks' inputs and
prices each task as it prices any other, then hands the two to :func:`pair`.

Pairs run on the plain path's rules (copy streams, synchronous devices, no shared cores, no lockstep, one
phase), on the device's own clock (Note [local clocks] in :mod:`sim.core.device`): :func:`check_pairs` refuses the
other switches, which would need their own model of a shared device. ``SimConfig(overlap_pairs=False)`` runs a
pair's tasks in turn instead, as this executor does, on every path.
"""

from __future__ import annotations

from gpipe.schedule import Task
from gpipe.schedule.timeline import COMPUTE, Span
from sim.core.copies import Sends
from sim.core.run import Run
from sim.core.sharing import Phase, phased_pair_ends, task_phases
from sim.core.tables import B

__all__ = ["Half", "check_pairs", "pair"]

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


def _phases(run: Run, half: Half) -> tuple[Phase, ...]:
    """The phases of one task of a pair: its seconds alone split into compute and communication."""
    _, op, i, j, _, seconds = half
    talk = run.communication[op][j]
    if run.scaled:
        talk = talk * run.scales[i]
    return task_phases(seconds - talk if talk else seconds, talk, op == B)


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
    start, ends = t, phased_pair_ends(t, _phases(run, a), _phases(run, b))
    for q in sorted((0, 1), key=lambda q: ends[q]):  # the clock steps as SimPy's would, end by end
        t = t + (ends[q] - t)
        backward_left = _end(run, d, (a, b)[q], start, t, backward_left)
    return t, backward_left
