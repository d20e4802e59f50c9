"""The step x device grid: every task takes one step and each device runs as soon as it can; the picture of a
schedule, and of where a deadlocking one stops.

The grid shows the bubble (``.`` is an idle step); ``gpipe(2, 2, "never").grid()``::

    step   dev0  dev1
       0   F0@0     .
       1   F1@0  F0@1
       2      .  F1@1
       3      .  B1@1
       4   B1@0  B0@1
       5   B0@0     .

A deadlocking schedule prints up to the step where it stops, then a row marked ``!`` with each device's
stuck task marked ``>``. An overlapped pair (Note [overlapped pairs] in :mod:`gpipe.schedule.schedule`) takes
one step, once both its tasks are ready, and prints as ``F3@0+B1@7``. The functions read a schedule through
:class:`TaskLists` (its task lists, pairs and dependency rule), so the validator can draw the grid too.
"""

from __future__ import annotations

from typing import Protocol

from gpipe.schedule.task import Task

__all__ = ["TaskLists", "format_grid", "pair_positions", "run_unit_steps", "step_grid"]

Steps = list[list[Task | None]]  # steps[s][d]: device d's task at unit step s (None: idle; a pair: its first task)


class TaskLists(Protocol):
    """What the grid reads of a :class:`~gpipe.schedule.Schedule`: its per-device task lists and what each
    task waits for."""

    @property
    def tasks(self) -> tuple[tuple[Task, ...], ...]: ...

    @property
    def pairs(self) -> tuple[tuple[Task, Task], ...]: ...

    def dependencies(self, task: Task) -> tuple[Task, ...]: ...


class _Checkable(TaskLists, Protocol):
    def validate(self) -> object: ...


def step_grid(schedule: _Checkable) -> Steps:
    """``grid[s][d]``: the task device ``d`` runs at unit step ``s`` (``None`` when idle; a pair's first task
    for an overlapped pair, which runs in one step).

    Raises:
        ScheduleError: the schedule deadlocks (or is invalid otherwise).
    """
    steps, stuck = run_unit_steps(schedule)
    if stuck is not None:
        schedule.validate()
    return steps


def pair_positions(schedule: TaskLists) -> list[set[int]]:
    """For each device, the positions ``k`` in its list where an overlapped pair starts: its tasks ``k`` and
    ``k + 1`` are a pair of :attr:`~gpipe.schedule.Schedule.pairs`. A pair whose tasks are not adjacent in one
    list is left out (the validator names it)."""
    lists = schedule.tasks
    starts: list[set[int]] = [set() for _ in lists]
    if not schedule.pairs:
        return starts
    partner = dict(schedule.pairs)
    for d, ts in enumerate(lists):
        for k in range(len(ts) - 1):
            if partner.get(ts[k], None) == ts[k + 1]:
                starts[d].add(k)
    return starts


def run_unit_steps(schedule: TaskLists) -> tuple[Steps, list[int] | None]:
    """Run every task in one unit step, each device as soon as its head task's dependencies are done; an
    overlapped pair runs in one step once both its tasks' dependencies are done.

    Returns the steps and, on deadlock, the stuck head index of each device (``None`` if it finished).
    """
    lists = schedule.tasks
    devices = len(lists)
    starts = pair_positions(schedule)
    heads = [0] * devices
    done: set[Task] = set()
    steps: Steps = []
    total = sum(len(ts) for ts in lists)
    finished = 0
    while finished < total:
        row: list[Task | None] = [None] * devices
        for d in range(devices):
            ts = lists[d]
            if heads[d] < len(ts):
                t = ts[heads[d]]
                pair = ts[heads[d]: heads[d] + (2 if heads[d] in starts[d] else 1)]
                if all(dep in done for u in pair for dep in schedule.dependencies(u)):
                    row[d] = t
        if all(t is None for t in row):
            return steps, heads
        for d, ready in enumerate(row):
            if ready is not None:
                size = 2 if heads[d] in starts[d] else 1
                done.update(lists[d][heads[d]: heads[d] + size])
                heads[d] += size
                finished += size
        steps.append(row)
    return steps, None


def format_grid(schedule: TaskLists, steps: Steps, stuck: list[int] | None) -> str:
    """The grid of :func:`run_unit_steps`' answer as text; ``stuck`` adds the marked row of stuck tasks."""
    lists = schedule.tasks
    devices = len(lists)
    partner = dict(schedule.pairs)

    def cell(t: Task) -> str:
        return f"{t}+{partner[t]}" if t in partner else str(t)

    rows: list[list[str]] = [[cell(t) if t is not None else "." for t in row] for row in steps]
    if stuck is not None:
        marked = [">" + cell(lists[d][stuck[d]]) if stuck[d] < len(lists[d]) else "" for d in range(devices)]
        rows.append(marked)
    width = max([len(c) for r in rows for c in r] + [5])
    header = "step  " + " ".join(f"{'dev' + str(d):>{width}}" for d in range(devices))
    lines = [header]
    for s, r in enumerate(rows):
        label = f"{s:>4}" + ("!" if stuck is not None and s == len(rows) - 1 else " ")
        lines.append(label + " " + " ".join(f"{c:>{width}}" for c in r))
    return "\n".join(lines)
