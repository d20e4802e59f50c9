"""The device process: one SimPy process per device walks its task list in order and holds its compute stream.

Two loops with the same rules: :func:`device`, the general one, and :func:`device_fast`, the plain path on a
local clock (Note [local clocks]); tests/sim/test_engine_properties.py proves them equal bit for bit. Each hands
an overlapped pair of tasks to :mod:`sim.core.overlap`.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from gpipe.schedule import Op
from gpipe.timeline import COMPUTE, MemorySample, Span
from sim.core.overlap import pair, pair_fast
from sim.core.run import Run
from sim.core.tables import B, F, R, W

__all__ = ["device", "device_fast"]

_OP_F, _OP_B, _OP_R = Op.F, Op.B, Op.R
_KIND = {F: "F", R: "F", B: "B", W: "B"}  # a task's kind for RunnerCosts.pairs; a checkpointed F is "Fc"

# Note [host seconds share nothing]: sharing cores stretches a task's stage seconds, not its host seconds
# (SharedCores.run(seconds, key, host)); it still slows the others for its whole span. Contention and pairs are
# measured on loops of the stage's work alone, so the runner's host time was never in them, and stretching it
# too would add seconds nobody measured.


def device(run: Run, d: int) -> Generator[simpy.Event, Any, None]:
    """Walk device ``d``'s task list: wait for inputs, hold the compute stream, send results on."""
    env = run.env
    timeout, new_event = env.timeout, env.event
    checkpointed, table, scales, scaled, first = run.checkpointed, run.table, run.scales, run.scaled, run.first
    copies, memory = run.copies, run.memory
    arrival, waiting, append_span, stride = copies.arrival, copies.waiting, run.spans[d].append, run.stride
    lockstep, forward_left, fork_join = run.config.lockstep_forward, run.forward_left, \
        run.config.enforce_backward_order
    stream, cores, track_memory = run.streams[d] if run.streams is not None else None, run.cores, memory.tracked
    tasks = run.schedule.tasks[d]
    backward_left = 0 if fork_join else sum(1 for t in tasks if t.op is _OP_B)
    # Note [gap]: a device's next task starts no earlier than ``gap`` after its previous one's host work
    # ended, and its first no earlier than ``launch``. A consumer that waited for a hand-off starts at
    # max(previous end + gap, arrival): ``handoff`` already covers the sending and the waking.
    gap, free_at = run.gap, run.launch
    two_phases, prefix = run.config.backward_after_forward, run.prefix[d]
    asynchronous, shared, host_arrival = d in run.config.asynchronous, run.shared[d], copies.host_arrival
    starts, paired = run.pair_starts[d], False
    for k, task in enumerate(tasks):
        if paired:  # the second task of a pair, run with the first
            paired = False
            continue
        if starts and k in starts:
            backward_left = yield from pair(run, d, k, free_at, backward_left)
            free_at, paired = env.now + gap if gap else free_at, True
            continue
        o, i, j = task.op, task.microbatch, task.stage
        op = F if o is _OP_F else B if o is _OP_B else R if o is _OP_R else W
        waits, sends, seconds, host = table[checkpointed[i]][op][j]
        issue = free_at  # Note [asynchronous devices]: when this device's host can issue the task
        for offset in waits:  # results from other devices
            slot = offset + i * stride
            at = arrival[slot]
            if at is None:
                event = waiting[slot] = new_event()
                yield event
                at = arrival[slot]
                assert at is not None
            if at > env.now:
                yield timeout(at - env.now)
            if host_arrival[slot] > issue:
                issue = host_arrival[slot]
        # Note [lockstep]: F(i, j) of clock cycle k = i + j waits until every forward of cycle k-1 has ended
        if lockstep and op == F and i + j and forward_left[i + j - 1]:
            yield run.cycle_event(i + j - 1)
        if two_phases and k >= prefix:  # Note [two phases]: R, B and W wait for the backward phase to open
            if not run.backward_phase.triggered:
                yield run.backward_phase
            if run.phase_open > issue:
                issue = run.phase_open
        if scaled:
            kernels = seconds * scales[i]
            seconds = kernels + host
        else:
            kernels = seconds - host
        if k == 0 or (two_phases and k == prefix):  # a fresh worker thread's first task
            seconds += first[j]
            host += first[j]
        # Note [asynchronous devices]: the host issues the task for its host seconds H (with the issue seconds);
        # the stream runs its kernel seconds K no earlier: start = max(stream free, inputs on the stream, issue),
        # end = max(start + K, issue + H). With every host term zero it is a synchronous device, exactly.
        if asynchronous:
            issued_by = issue + host + run.issue[checkpointed[i]][op][j]
            if issue > env.now:
                yield timeout(issue - env.now)
            if two_phases and op == F:
                run.forward_done(issued_by)
        elif free_at > env.now:
            yield timeout(free_at - env.now)
        held = None
        if shared is not None:
            held = shared.request()
            yield held
        request = None
        if stream is not None:
            request = stream.request()
            yield request
        if track_memory and op == R:
            memory.hold(d, i, j, run.cost.stages[j].saved_bytes, env.now)
        start = env.now
        if asynchronous:
            end = start + kernels
            yield timeout((issued_by if issued_by > end else end) - start)
            run.host_end[d] = issued_by
        elif cores is None:
            yield timeout(seconds)
        else:  # Note [host seconds share nothing]; communication uses no core either (Note [communication])
            talk = run.communication[op][j] * (scales[i] if scaled else 1.0)
            yield cores.run(seconds, (_KIND[op] if op != F or not checkpointed[i] else "Fc", j),
                            min(host + talk, seconds) if talk else host)
        if stream is not None and request is not None:
            stream.release(request)
        if shared is not None and held is not None:
            shared.release(held)
        append_span(Span(d, COMPUTE, task, start, env.now))
        if asynchronous:
            free_at = issued_by + gap
        elif gap:
            free_at = env.now + gap
        if two_phases and op == F and not asynchronous:
            run.forward_done(env.now)
        if track_memory:
            memory.after(d, op, i, j, env.now)
        if lockstep and op == F:
            forward_left[i + j] -= 1
            if not forward_left[i + j] and i + j in run.cycle_done:
                run.cycle_done.pop(i + j).succeed()
        # Note [fork/join]: without it, each gradient copy of a backward is issued when the device's next
        # backward ends (its last backward's at once): the worst case of autograd not knowing the order
        send, backward_left = run.copies_due(d, task, op, i, j, sends, backward_left, fork_join)
        for copy in send:
            if stream is None:
                copies.on_streams(d, env.now, *copy)
            else:
                yield from copies.on_compute(d, *copy)


def device_fast(run: Run, d: int) -> Generator[simpy.Event, Any, None]:
    """:func:`device` on the plain path (Note [local clocks]): the same times, from a local clock.

    Note [local clocks]: with no sharing, copy streams, no lockstep and one phase, a device keeps its own clock
    and yields to SimPy only to wait for an input whose copy is not issued yet. Copy times are fixed when
    issued, each directed pair's copies come from one process in task order, so every time is the general
    loop's: a consumer that reaches an input before its copy was issued moves to that issue time first, as
    SimPy wakes then, and ``t + (arrival - t)`` reproduces ``timeout(arrival - now)``. A stall (Note
    [fork/join]) releases held copies at the latest clock of a blocked or finished device.
    """
    new_event = run.env.event
    checkpointed, table, scales, scaled, first = run.checkpointed, run.table, run.scales, run.scaled, run.first
    copies, memory = run.copies, run.memory
    arrival, issued, waiting, stride = copies.arrival, copies.issued, copies.waiting, run.stride
    append_span, track_memory, free_copies = run.spans[d].append, memory.tracked, copies.free
    fork_join, stages, copy = run.config.enforce_backward_order, run.cost.stages, copies.on_streams
    tasks = run.schedule.tasks[d]
    backward_left = 0 if fork_join else sum(1 for t in tasks if t.op is _OP_B)
    gap, free_at = run.gap, run.launch  # Note [gap]
    held, current, frees_at, n = memory.held, memory.current, memory.frees_at, run.n
    shrinks_at_b = memory.shrinks_at_b
    mem_append = memory.samples[d].append
    starts, paired = run.pair_starts[d], False
    t = 0.0  # this device's time
    for k, task in enumerate(tasks):
        if paired:  # the second task of a pair, run with the first
            paired = False
            continue
        if starts and k in starts:
            t, backward_left = yield from pair_fast(run, d, k, t, free_at, backward_left)
            free_at, paired = t + gap if gap else free_at, True
            continue
        o, i, j = task.op, task.microbatch, task.stage
        op = F if o is _OP_F else B if o is _OP_B else R if o is _OP_R else W
        waits, sends, seconds, host = table[checkpointed[i]][op][j]
        for offset in waits:  # results from other devices
            slot = offset + i * stride
            at = arrival[slot]
            if at is None:  # not issued yet: wait for it
                run.clock[d] = t
                event = waiting[slot] = new_event()
                yield event
                at = arrival[slot]
                assert at is not None
            if free_copies:  # usable when issued
                if at > t:
                    t = at
                continue
            issued_at = issued[slot]
            if issued_at > t:  # device() would have waited for the copy until it was issued
                t = issued_at
            if at > t:
                t = t + (at - t)  # as a SimPy timeout(at - now) computes it
        if free_at > t:
            t = t + (free_at - t)
        if track_memory and op == R:
            memory.hold(d, i, j, stages[j].saved_bytes, t)
        if scaled:
            seconds = seconds * scales[i] + host
        if k == 0:  # a fresh worker thread's first task
            seconds += first[j]
        start, t = t, t + seconds
        append_span(Span(d, COMPUTE, task, start, t))
        if gap:
            free_at = t + gap
        if track_memory:  # Memory.after, inline
            if op == F:
                nbytes = stages[j].checkpoint_bytes if checkpointed[i] else stages[j].saved_bytes
                if scaled:
                    nbytes = round(nbytes * scales[i])
                if nbytes:
                    key = i * n + j
                    held[key] = held.get(key, 0) + nbytes
                    current[d] += nbytes
                    mem_append(MemorySample(d, t, current[d]))
            elif op == frees_at:
                freed = held.pop(i * n + j, 0)
                if freed:
                    current[d] -= freed
                    mem_append(MemorySample(d, t, current[d]))
            elif op == B and shrinks_at_b:
                memory.after(d, op, i, j, t)
        if op == B and not fork_join:  # Note [fork/join]
            send, backward_left = run.copies_due(d, task, op, i, j, sends, backward_left, fork_join)
            for c in send:
                copy(d, t, *c)
        elif sends:
            if free_copies:  # Copies.on_streams, inline: usable at once
                base = i * stride
                for _dst, offset in sends:
                    arrival[offset + base] = t
                    if waiting:
                        woken = waiting.pop(offset + base, None)
                        if woken is not None:
                            woken.succeed()
            else:
                copy(d, t, task, op, i, j, sends)
    run.clock[d] = t
