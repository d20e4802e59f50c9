"""The device process: one SimPy process per device walks its task list in order and holds its compute stream.

:func:`device` is the one loop, for every switch; it keeps the device's own clock (Note [local clocks]) and hands
an overlapped pair of tasks to :func:`sim.core.overlap.pair`.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from gpipe.schedule import Op, Task
from gpipe.schedule.timeline import COMPUTE, Span
from sim.core.copies import Sends
from sim.core.overlap import alone, pair
from sim.core.run import Run
from sim.core.tables import B, F, R, W

__all__ = ["device"]

_OP_F, _OP_B, _OP_R = Op.F, Op.B, Op.R
_KIND = {F: "F", R: "F", B: "B", W: "B"}  # a task's kind for RunnerCosts.pairs; a checkpointed F is "Fc"

# Note [local clocks]: a device keeps its own clock t. On the plain path (Run.local_clocks: no shared cores, copy
# streams, no lockstep, one phase, synchronous devices, no shared streams) it yields to SimPy only to wait for an
# input whose copy is not issued yet: copy times are fixed when issued and each directed pair's copies come from one
# process in task order, so the device needs nobody's clock but its own. One that reaches an input before its copy
# was issued moves to the issue time, as SimPy would wake it then, and t + (at - t) is SimPy's timeout(at - now).
# Off the plain path resources and events are shared through SimPy, so the device follows SimPy's clock: it yields
# each step of t as a timeout and t is env.now throughout; the rules and the arithmetic are the same. A stall (Note
# [fork/join]) releases held copies at the latest clock of a blocked or finished device.

# Note [collective tasks]: a device whose stages have collectives (sim.core.collectives) prices each task through
# its communication stream, which computes the task unit by unit behind the gathers it waits for and issues the
# reductions it makes due. The task keeps one compute span, from its first unit's start to its last unit's end, so a
# unit waiting for its gather shows as a longer task with the gather beside it on the collective stream.

# Note [host seconds share nothing]: sharing cores stretches a task's stage seconds, not its host seconds
# (SharedCores.run(seconds, key, host)); it still slows the others for its whole span. Contention and pairs are
# measured on loops of the stage's work alone, so the runner's host time was never in them, and stretching it
# too would add seconds nobody measured.


def device(run: Run, d: int) -> Generator[simpy.Event, Any, None]:
    """Walk device ``d``'s task list: wait for inputs, hold the compute stream, send results on."""
    env = run.env
    timeout, new_event = env.timeout, env.event
    checkpointed, table, scales, scaled, first = run.checkpointed, run.table, run.scales, run.scaled, run.first
    copies, memory, config = run.copies, run.memory, run.config
    arrival, issued, host_arrival, waiting = copies.arrival, copies.issued, copies.host_arrival, copies.waiting
    stride, at_once = run.stride, copies.at_once[d]
    append_span, track_memory, send = run.spans[d].append, memory.tracked, copies.on_streams
    fork_join, lockstep, forward_left = config.enforce_backward_order, config.lockstep_forward, run.forward_left
    tasks = run.schedule.tasks[d]
    backward_left = 0 if fork_join else sum(1 for t in tasks if t.op is _OP_B)
    # Note [gap]: a device's next task starts no earlier than ``gap`` after its previous one's host work
    # ended, and its first no earlier than ``launch``. A consumer that waited for a hand-off starts at
    # max(previous end + gap, arrival): ``handoff`` already covers the sending and the waking.
    gap, free_at = run.gap, run.launch
    follow = not run.local_clocks()  # Note [local clocks]: SimPy's clock is this device's
    two_phases, prefix, asynchronous = config.backward_after_forward, run.prefix[d], d in config.asynchronous
    fresh = prefix if two_phases else 0  # a fresh worker thread's first task: task 0, or the first of phase two
    stream, shared, cores = run.streams[d] if run.streams is not None else None, run.shared[d], run.cores
    starts, first_half = run.pair_starts[d], None
    comm = run.comms[d] if run.comms is not None else None  # only on the plain path (sim.core.engine)
    # Note [communication spans] in sim.core.overlap: F, R and B have a stage's communication, W none
    talking, communication = any(run.communication[B]), run.communication
    issued_by = 0.0  # an asynchronous device's host time once it has issued the task
    t = 0.0  # this device's clock
    for k, task in enumerate(tasks):
        o, i, j = task.op, task.microbatch, task.stage
        op = F if o is _OP_F else B if o is _OP_B else R if o is _OP_R else W
        row = table[checkpointed[i]][op][j]
        waits, sends, seconds, host = row
        base = i * stride
        for offset in waits:  # results from other devices
            slot = offset + base
            at = arrival[slot]
            if at is None:  # not issued yet: wait for it
                run.clock[d] = t
                event = waiting[slot] = new_event()
                yield event
                at = arrival[slot]
                assert at is not None
            if at > t:  # (a copy is issued no later than it arrives)
                if issued[slot] > t:  # SimPy wakes a consumer that reached it early when it is issued
                    t = issued[slot]
                if at > t:
                    if follow:
                        yield timeout(at - t)
                    t = t + (at - t)  # as SimPy's timeout(at - now) computes it
        if scaled:  # Note [host costs] in sim.core.tables
            seconds = seconds * scales[i] + host
        if k == 0 or k == fresh:
            seconds += first[j]
            host += first[j]
        if starts and k in starts:  # the first task of an overlapped pair starts with the next (sim.core.overlap)
            first_half = (task, op, i, j, sends, seconds)
            continue
        ready = free_at
        if follow:
            # Note [lockstep]: F(i, j) of clock cycle k = i + j waits until every forward of cycle k-1 has ended
            if lockstep and op == F and i + j and forward_left[i + j - 1]:
                yield run.cycle_event(i + j - 1)
                t = env.now
            issue = free_at  # Note [asynchronous devices]: when this device's host can issue the task
            if two_phases and k >= prefix:  # Note [two phases]: R, B and W wait for the backward phase to open
                if not run.backward_phase.triggered:
                    yield run.backward_phase
                    t = env.now
                if run.phase_open > issue:
                    issue = run.phase_open
            if asynchronous:
                for offset in waits:
                    if host_arrival[offset + base] > issue:
                        issue = host_arrival[offset + base]
                issued_by, ready = issue + host + run.issue[checkpointed[i]][op][j], issue
        if ready > t:
            if follow:
                yield timeout(ready - t)
            t = t + (ready - t)
        if first_half is not None:  # the second task of a pair: both run now
            if comm is not None:
                t = comm.pair((k - 1, k), t)
            t, backward_left = pair(run, d, first_half, (task, op, i, j, sends, seconds), t, backward_left)
            if comm is not None:
                comm.after_pair(k - 1, t)
                comm.after_pair(k, t)
            first_half = None
            if gap:
                free_at = t + gap
            continue
        if follow:
            if asynchronous and two_phases and op == F:
                run.forward_done(issued_by)
            held = request = None
            if shared is not None:  # a compute stream shared with other devices
                held = shared.request()
                yield held
            if stream is not None:  # Note [no copy streams] in sim.core.copies: copies hold it too
                request = stream.request()
                yield request
            t = env.now
        if track_memory:
            memory.start(d, op, i, j, t)
        start = t
        if comm is not None:  # Note [collective tasks]: unit by unit, beside the device's collectives
            start, t = comm.task(k, t, seconds)
        elif not follow:
            t = t + seconds
        else:
            # Note [asynchronous devices]: the host issues the task for its host seconds H (with the issue seconds);
            # the stream runs its kernel seconds K no earlier: start = max(stream free, inputs on the stream, issue),
            # end = max(start + K, issue + H). With every host term zero it is a synchronous device, exactly.
            if asynchronous:
                end = start + (row[2] * scales[i] if scaled else row[2] - row[3])  # the kernel seconds
                yield timeout((issued_by if issued_by > end else end) - start)
                run.host_end[d] = issued_by
            elif cores is None:
                yield timeout(seconds)
            else:  # Note [host seconds share nothing]; communication uses no core either (Note [communication])
                talk = run.communication[op][j] * (scales[i] if scaled else 1.0)
                yield cores.run(seconds, (_KIND[op] if op != F or not checkpointed[i] else "Fc", j),
                                min(host + talk, seconds) if talk else host)
            t = env.now
            if stream is not None and request is not None:
                stream.release(request)
            if shared is not None and held is not None:
                shared.release(held)
        append_span(Span(d, COMPUTE, task, start, t))
        if talking and communication[op][j]:  # Note [communication spans]; asynchronous: its kernels' end
            alone(run, d, task, op, i, j, start, end if asynchronous else t)
        if asynchronous:
            free_at = issued_by + gap
        elif gap:
            free_at = t + gap
        if follow:
            if two_phases and op == F and not asynchronous:
                run.forward_done(t)
            if lockstep and op == F:
                forward_left[i + j] -= 1
                if not forward_left[i + j] and i + j in run.cycle_done:
                    run.cycle_done.pop(i + j).succeed()
        if track_memory:
            memory.after(d, op, i, j, t)
        if sends and (fork_join or op != B) and stream is None:  # its copies leave now, on copy streams
            if at_once:  # Note [copies at once] in sim.core.copies: usable as they are issued
                for _dst, offset in sends:
                    slot = offset + base
                    arrival[slot] = issued[slot] = host_arrival[slot] = t
                    woken = waiting[slot]
                    if woken is not None:
                        waiting[slot] = None
                        woken.succeed()
            else:
                send(d, t, task, op, i, j, sends)
        elif sends or (op == B and not fork_join):
            t, backward_left = yield from _send(run, d, t, task, op, i, j, sends, backward_left)
    run.clock[d] = t


def _send(run: Run, d: int, t: float, task: Task, op: int, i: int, j: int, sends: Sends,
          backward_left: int) -> Generator[simpy.Event, Any, tuple[float, int]]:
    """Send what ``task`` makes due as it ends at ``t``, held back or on the compute streams; returns the clock after
    it and the backwards left.

    Note [fork/join]: without it, each gradient copy of a backward is issued when the device's next backward ends
    (its last backward's at once): the worst case of autograd not knowing the order."""
    due, backward_left = run.copies_due(d, task, op, i, j, sends, backward_left, run.config.enforce_backward_order)
    if run.streams is None:
        for copy in due:
            run.copies.on_streams(d, t, *copy)
    elif due:  # Note [no copy streams] in sim.core.copies: the device's process copies, then goes on
        for copy in due:
            yield from run.copies.on_compute(d, *copy)
        t = run.env.now
    return t, backward_left
