"""The one validator every consumer calls: each task once and on its stage's device, no deadlock; an error
shows the step x device grid with the failing step marked.

Note [linear validation]: :meth:`Schedule.validate <gpipe.schedule.Schedule.validate>` runs for every
simulation, so it must cost less than one. It numbers every task ``(op, i, j)`` as an integer and checks
Note [dependencies] (:mod:`gpipe.schedule.task`) on those numbers; the deadlock check lets each device run
its list as far as it can and parks a device on the first unfinished dependency of its head task, to be
woken when that task finishes. Each task finishes once and wakes its waiting devices once, so the check is
linear in the tasks (the unit-step grid is ``steps x devices``). An overlapped pair's first task also waits
for its second's dependencies (Note [overlapped pairs] in :mod:`gpipe.schedule.schedule`). Only an invalid
schedule pays for the grid, which its error message shows. A schedule is immutable, so it remembers that it passed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gpipe.schedule.grid import TaskLists, format_grid, pair_positions, run_unit_steps
from gpipe.schedule.task import Checkpoint, Op, Task, checkpointed

__all__ = ["ScheduleError", "check"]


class ScheduleError(ValueError):
    """An invalid schedule. The message shows the step x device grid with the failing step marked."""


class _Checked(TaskLists, Protocol):
    """What the validator reads of a :class:`~gpipe.schedule.Schedule`."""

    @property
    def m(self) -> int: ...

    @property
    def n(self) -> int: ...

    @property
    def checkpoint(self) -> Checkpoint: ...

    @property
    def placement(self) -> tuple[int, ...]: ...

    @property
    def name(self) -> str: ...

    @property
    def copies(self) -> int: ...

    def copy_of(self, microbatch: int) -> int: ...

    def expected_tasks(self) -> set[Task]: ...


def check(schedule: _Checked, *, standard_edges: bool) -> None:
    """Raise :class:`ScheduleError` for the first problem of ``schedule``; return if it is valid.

    Checks: positive shape; placement covers every stage with a real device; every task exactly once and on
    its stage's device; no deadlock (every device can run its list in order, each task after its
    dependencies). A deadlock's error shows the grid up to the stuck step and the cycle of waiting tasks.
    ``standard_edges``: the schedule's dependencies are Note [dependencies]'s, so the linear walk on task
    numbers applies (Note [linear validation]); else (a subclass with its own edges) they are followed on
    task objects.
    """
    m, n, placement, devices = schedule.m, schedule.n, schedule.placement, len(schedule.tasks)
    if m < 1:
        raise ScheduleError(f"a schedule needs at least one micro-batch, got m={m}")
    if n < 1:
        raise ScheduleError(f"a schedule needs at least one stage, got n={n}")
    checkpointed(schedule.checkpoint, 0, m)  # rejects an unknown policy
    copies = schedule.copies
    if not 1 <= copies <= min(n, m) or n % copies:
        raise ScheduleError(f"{copies} copies of the stages (Note [stage slots]) need a divisor of n={n} between "
                            f"1 and m={m}")
    if len(placement) != n:
        raise ScheduleError(f"placement has {len(placement)} entries for {n} stages")
    for j, d in enumerate(placement):
        if not 0 <= d < devices:
            raise ScheduleError(f"stage {j} is placed on device {d}, but there are {devices} devices")
    ck = [checkpointed(schedule.checkpoint, i, m) for i in range(m)]
    starts = _check_pairs(schedule) if schedule.pairs else None
    weights = _walk(schedule, ck, starts) if standard_edges else -1
    if weights >= 0:  # every task ran once, in range, on its device, of a kind this shape has
        route = n // copies  # the stages each micro-batch runs
        if sum(map(len, schedule.tasks)) != m * route * (3 if weights else 2) + route * sum(ck):
            _raise_wrong_tasks(schedule)
        return
    # something is wrong (or a subclass has its own edges): name the first problem, in task order
    _check_tasks(schedule)
    if not _runs_to_completion(schedule):
        steps, stuck = run_unit_steps(schedule)
        assert stuck is not None, "the linear check and the unit-step run disagree"
        cycle = _waiting_cycle(schedule, stuck)
        grid = format_grid(schedule, steps, stuck)
        raise ScheduleError(
            f"schedule {schedule.name!r} deadlocks at step {len(steps)}: "
            f"waiting cycle {' -> '.join(map(str, cycle))}\n{grid}"
        )


def _check_pairs(schedule: _Checked) -> list[set[int]]:
    """Raise for the first overlapped pair that is not two adjacent tasks of one device's list, shares a task
    with another pair, or has a task that waits for the other; else return :func:`pair_positions`."""
    position = {t: (d, k) for d, ts in enumerate(schedule.tasks) for k, t in enumerate(ts)}
    paired: set[Task] = set()
    for a, b in schedule.pairs:
        where = f"overlapped pair {a}+{b}"
        for t in (a, b):
            if t not in position:
                raise ScheduleError(f"{where}: {t} is in no device's list; pair two tasks of the schedule")
            if t in paired:
                raise ScheduleError(f"{where}: {t} is already in another pair; a task overlaps one other at most")
            paired.add(t)
        (da, ka), (db, kb) = position[a], position[b]
        if da != db or kb != ka + 1:
            raise ScheduleError(f"{where}: {b} must come right after {a} in one device's list, but they are "
                                f"task {ka} of device {da} and task {kb} of device {db}; move them together")
        for x, y in ((a, b), (b, a)):
            if y in schedule.dependencies(x):
                raise ScheduleError(f"{where}: {x} waits for {y}, so the two cannot start together; pair {x} "
                                    f"with a task it does not wait for, or run them one after the other")
    return pair_positions(schedule)


def _check_tasks(schedule: _Checked) -> None:
    """Raise for the first task, in device and list order, that is out of range, repeated or on the wrong
    device; then for missing or unexpected tasks."""
    m, n, placement = schedule.m, schedule.n, schedule.placement
    seen: dict[Task, int] = {}
    for d, ts in enumerate(schedule.tasks):
        for t in ts:
            if t in seen:
                grid = format_grid(schedule, *run_unit_steps(schedule))
                raise ScheduleError(f"task {t} appears twice (devices {seen[t]} and {d})\n{grid}")
            seen[t] = d
            if t.stage >= n or t.microbatch >= m:
                raise ScheduleError(f"task {t} is outside m={m}, n={n}")
            if placement[t.stage] != d:
                raise ScheduleError(
                    f"task {t} is on device {d}, but stage {t.stage} is placed on device {placement[t.stage]}"
                )
    if seen.keys() != schedule.expected_tasks():
        _raise_wrong_tasks(schedule)


def _raise_wrong_tasks(schedule: _Checked) -> None:
    """The error for a schedule whose tasks are not exactly its expected tasks, each once."""
    expected = schedule.expected_tasks()
    seen = {t for ts in schedule.tasks for t in ts}
    missing = sorted(expected - seen)
    extra = sorted(seen - expected)
    parts = []
    if missing:
        parts.append("missing " + ", ".join(map(str, missing[:12])) + (" ..." if len(missing) > 12 else ""))
    if extra:
        parts.append("unexpected " + ", ".join(map(str, extra[:12])) + (" ..." if len(extra) > 12 else ""))
    raise ScheduleError(f"schedule {schedule.name!r} has the wrong tasks: {'; '.join(parts)}")


def _walk(schedule: _Checked, ck: Sequence[bool], starts: list[set[int]] | None = None) -> int:
    """Note [linear validation]: run every device's list in order, each task once its dependencies
    (Note [dependencies]) have run, parking a device on the first missing one; ``starts[d]``: where device
    ``d``'s overlapped pairs start (their first task waits for the second's dependencies too).

    Returns the number of ``W`` tasks when every task ran, exactly once, within ``m`` and ``n``, on its
    stage's device and its micro-batch's route (Note [stage slots] in :mod:`gpipe.schedule.schedule`), and an
    ``R`` only for a checkpointed micro-batch; -1 otherwise (a deadlock, or a
    problem :func:`_check_tasks` names). Missing tasks are for the caller to count.
    """
    m, n, placement = schedule.m, schedule.n, schedule.placement
    lists = schedule.tasks
    mn = m * n
    f_op, b_op, r_op = Op.F, Op.B, Op.R
    route = n // schedule.copies
    copy = [schedule.copy_of(i) for i in range(m)]
    done = bytearray(4 * mn)  # task (op, i, j) is number op * m * n + i * n + j, op = F 0, B 1, R 2, W 3
    awaited = bytearray(4 * mn)  # whether a device waits for the task (cheaper to test than the dict)
    waiting: dict[int, list[int]] = {}  # task number -> devices whose head task waits for it
    heads = [0] * len(lists)
    ready = list(range(len(lists)))
    weights = 0
    while ready:
        d = ready.pop()
        ts = lists[d]
        k, end = heads[d], len(ts)
        while k < end:
            t = ts[k]
            o, i, j = t.op, t.microbatch, t.stage
            if i >= m or j >= n or placement[j] != d or j // route != copy[i]:
                return -1
            base = i * n + j
            if o is f_op:
                code, blocker = 0, (base - 1 if j % route and not done[base - 1] else -1)
            elif o is b_op:
                code = 1
                if not done[base]:
                    blocker = base  # its own forward
                elif ck[i] and not done[2 * mn + base]:
                    blocker = 2 * mn + base  # its recompute
                elif (j + 1) % route and not done[mn + base + 1]:
                    blocker = mn + base + 1  # the gradient of the next stage
                else:  # on the route's last stage the loss needs its own forward, done
                    blocker = -1
            elif o is r_op:
                if not ck[i]:
                    return -1
                code, blocker = 2, (base if not done[base] else -1)
            else:
                code, blocker = 3, (mn + base if not done[mn + base] else -1)
            if starts is not None and blocker < 0 and k in starts[d]:  # a pair starts when both can
                blocker = _blocker(ts[k + 1], done, ck, m, n, route)
            if blocker >= 0:
                waiting.setdefault(blocker, []).append(d)
                awaited[blocker] = 1
                break
            key = code * mn + base
            if done[key]:
                return -1  # a second copy of a task
            done[key] = 1
            weights += code == 3
            k += 1
            if awaited[key]:
                ready.extend(waiting.pop(key))
        heads[d] = k
    if any(heads[d] < len(ts) for d, ts in enumerate(lists)):
        return -1
    return weights


def _blocker(t: Task, done: bytearray, ck: Sequence[bool], m: int, n: int, route: int) -> int:
    """The number :func:`_walk` gives the first unfinished dependency of ``t`` (an overlapped pair's second
    task), or -1; also -1 when ``t`` is out of range, which :func:`_walk` reports when it reaches it. ``route``:
    the stages of each micro-batch's route."""
    i, j, mn = t.microbatch, t.stage, m * n
    if i >= m or j >= n:
        return -1
    base = i * n + j
    if t.op is Op.F:
        return base - 1 if j % route and not done[base - 1] else -1
    if t.op is Op.B:
        for ready, number in ((done[base], base), (not ck[i] or done[2 * mn + base], 2 * mn + base),
                              (not (j + 1) % route or done[mn + base + 1], mn + base + 1)):
            if not ready:
                return number
        return -1
    if t.op is Op.R:
        return base if not done[base] else -1
    return mn + base if not done[mn + base] else -1


def _runs_to_completion(schedule: TaskLists) -> bool:
    """Whether every device can run its list in order under the schedule's own dependencies (any
    subclass's), as :func:`_walk` does, on task objects."""
    lists = schedule.tasks
    starts = pair_positions(schedule)
    done: set[Task] = set()
    waiting: dict[Task, list[int]] = {}
    heads = [0] * len(lists)
    ready = list(range(len(lists)))
    while ready:
        d = ready.pop()
        ts = lists[d]
        while heads[d] < len(ts):
            t = ts[heads[d]]
            blocker = next((dep for dep in _needs(schedule, starts, d, heads[d]) if dep not in done), None)
            if blocker is not None:
                waiting.setdefault(blocker, []).append(d)
                break
            done.add(t)
            heads[d] += 1
            ready.extend(waiting.pop(t, ()))
    return all(heads[d] == len(ts) for d, ts in enumerate(lists))


def _waiting_cycle(schedule: TaskLists, heads: list[int]) -> list[Task]:
    """Follow 'stuck head waits for a task held behind another device's stuck head' to a cycle."""
    lists = schedule.tasks
    starts = pair_positions(schedule)
    position = {t: (d, k) for d, ts in enumerate(lists) for k, t in enumerate(ts)}
    done = {t for d, ts in enumerate(lists) for t in ts[: heads[d]]}
    start = next(d for d in range(len(lists)) if heads[d] < len(lists[d]))
    chain: list[Task] = []
    visited: dict[int, int] = {}
    d = start
    while d not in visited:
        visited[d] = len(chain)
        head = lists[d][heads[d]]
        chain.append(head)
        blocker = next(dep for dep in _needs(schedule, starts, d, heads[d]) if dep not in done)
        d = position[blocker][0] if blocker in position else -1
        if d < 0:  # a dependency no device runs; the task check reports missing tasks before this
            return chain + [blocker]
    cycle = chain[visited[d]:]
    return cycle + [cycle[0]]


def _needs(schedule: TaskLists, starts: list[set[int]], d: int, k: int) -> list[Task]:
    """What task ``k`` of device ``d`` waits for: its dependencies, and its pair's second task's."""
    ts = schedule.tasks[d]
    return [dep for t in ts[k: k + (2 if k in starts[d] else 1)] for dep in schedule.dependencies(t)]
