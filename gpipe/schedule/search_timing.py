"""The schedule search's timing and memory model, public so a reader can price any schedule as the search does:
:func:`makespan`, :func:`peak_memory`, :func:`lower_bound`, and :func:`least_memory` (what no schedule avoids).

Note [search timing]: each device runs its list in order; a task starts when the device's previous task has
ended and each of its dependencies (Note [dependencies] in :mod:`gpipe.schedule.task`) has ended, plus
``copy`` when that dependency ran on another device, and it lasts its stage's seconds: ``F`` and ``R``
``forward[s]``, ``B`` ``backward[s]`` when the schedule has ``W`` tasks and ``backward[s] + weight[s]`` when not,
``W`` ``weight[s]``. Copies take no stream: any number travel at once. Overlapped pairs (Note [overlapped
pairs] in :mod:`gpipe.schedule.schedule`) run one after the other here, a valid run of the same order; the
simulator would let them share the device. With ``copy = 0`` this is the simulator with ideal costs.

Note [two timing models]: this closed model and the simulator's SimPy engine (``sim.core.engine``) answer two
questions. The closed model is a schedule's timing alone, linear in the tasks, so the search can score thousands of
orders; :func:`finish_times` is its one definition (the search's :func:`makespan`, the greedy's ``span``, the
solver's ticks). The engine predicts a run of a program: copies queue on streams and links, the runner adds host
seconds, cores are shared, pairs share a device, collectives run beside compute, memory is sampled in time. With
those off (ideal runner, free copies, pairs in turn) the two agree exactly, and a test holds the engine to this
model there (``tests/sim/test_search_timing.py``).

Note [search memory]: memory is the saved-bytes rule (Note [saved bytes] in :mod:`gpipe.schedule.saved`) with
``activation[s]`` saved per micro-batch on stage ``s``, nothing kept by a checkpointed ``F`` and all of it kept for
``W``: device ``d`` holds ``activation[s]`` for each (micro-batch ``i``, stage ``s`` on ``d``) from ``F(i, s)``
(from ``R(i, s)`` when checkpointed) until the end of ``W(i, s)`` (``B(i, s)`` without ``W`` tasks). A device's
tasks run one at a time in list order, so the peak depends on the order alone, never on the seconds, and the
greedy heuristic can check a limit as it builds the order.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TypeVar

from gpipe.schedule.placement import stage_placement
from gpipe.schedule.saved import held_bytes, held_while_running
from gpipe.schedule.schedule import Schedule
from gpipe.schedule.search_costs import StageCosts
from gpipe.schedule.task import Op, Task
from gpipe.schedule.validator import ScheduleError

__all__ = ["finish_times", "fits", "least_memory", "lower_bound", "makespan", "peak_memory"]

K = TypeVar("K", bound=Hashable)


def fits(peak: float, limit: float) -> bool:
    """Whether ``peak`` is within ``limit``, up to the rounding of a sum of floats."""
    return peak <= limit + 1e-9 * max(1.0, abs(limit))


def finish_times(lists: Sequence[Sequence[K]], deps: Callable[[K], Iterable[tuple[K, float]]],
                 seconds: Callable[[K], float]) -> dict[K, float]:
    """When each task ends under Note [search timing]: ``lists[d]`` runs in order on device ``d``, a task after
    each ``(dependency, delay)`` of ``deps(task)`` has ended plus the delay, for ``seconds(task)``.

    Each device runs its list as far as it can and waits on the first unfinished dependency, woken when that
    ends, so the walk is linear in the tasks and dependencies.

    Raises:
        ScheduleError: the lists deadlock (a validated schedule never does).
    """
    end: dict[K, float] = {}
    free = [0.0] * len(lists)
    heads = [0] * len(lists)
    waiting: dict[K, list[int]] = {}
    ready = list(range(len(lists)))
    while ready:
        d = ready.pop()
        ts = lists[d]
        while heads[d] < len(ts):
            t = ts[heads[d]]
            start = free[d]
            blocker = None
            for dep, delay in deps(t):
                e = end.get(dep)
                if e is None:
                    blocker = dep
                    break
                if e + delay > start:
                    start = e + delay
            if blocker is not None:
                waiting.setdefault(blocker, []).append(d)
                break
            end[t] = free[d] = start + seconds(t)
            heads[d] += 1
            ready.extend(waiting.pop(t, ()))
    if any(h < len(ts) for h, ts in zip(heads, lists, strict=True)):
        raise ScheduleError("the task lists deadlock: a device waits for a task that can never run")
    return end


def _check_shape(schedule: Schedule, costs: StageCosts) -> None:
    if not isinstance(costs, StageCosts):
        raise ValueError(f"costs must be a StageCosts, got {type(costs).__name__}")
    if costs.n != schedule.n:
        raise ValueError(f"costs have {costs.n} stages but the schedule has {schedule.n}: give one cost per stage")


def makespan(schedule: Schedule, costs: StageCosts) -> float:
    """Seconds from the first task's start to the last task's end, under Note [search timing].

    Raises:
        ScheduleError: the schedule is invalid.
        ValueError: ``costs`` has another number of stages than the schedule.
    """
    _check_shape(schedule, costs)
    schedule.validate()
    place, splits, copy = schedule.placement, schedule.splits_weight_gradient, costs.copy

    def deps(t: Task) -> Iterable[tuple[Task, float]]:
        return ((u, copy if place[u.stage] != place[t.stage] else 0.0) for u in schedule.dependencies(t))

    ends = finish_times(schedule.tasks, deps, lambda t: costs.seconds(t.op, t.stage, splits))
    return max(ends.values(), default=0.0)


def peak_memory(schedule: Schedule, costs: StageCosts) -> tuple[float, ...]:
    """Each device's most activation held at once, under Note [search memory].

    Raises:
        ScheduleError: the schedule is invalid.
        ValueError: ``costs`` has another number of stages than the schedule.
    """
    _check_shape(schedule, costs)
    schedule.validate()
    checkpointed = [schedule.is_checkpointed(i) for i in range(schedule.m)]
    held = held_bytes(checkpointed, schedule.splits_weight_gradient,
                      [float(a) for a in costs.activations(schedule.placement)])
    return tuple(float(held_while_running(ts, held).max(initial=0.0)) for ts in schedule.tasks)


def least_memory(placement: Sequence[int], costs: StageCosts) -> tuple[float, ...]:
    """The peak memory no schedule goes below, per device: one micro-batch's activation of all its stages.

    Note [least memory]: for any micro-batch ``i``, when ``F(i, t)`` starts on the last stage ``t`` of device ``d``,
    every ``F(i, s)`` of ``d`` has started and none has been freed (a ``W`` or ``B`` of ``i`` waits for the whole
    forward), so ``d`` holds all of ``i``'s activations there; running micro-batch after micro-batch, each
    through the whole pipeline and back, holds no more. So the least peak is the device's share of one
    micro-batch, for one stage per device, looped or V placements alike (1 when ``activation`` is ``None``).
    """
    place = stage_placement(costs.n, placement)
    activation = costs.activations(place)
    share = [0.0] * (max(place) + 1)
    for s, d in enumerate(place):
        share[d] += activation[s]
    return tuple(share)


def lower_bound(m: int, placement: Sequence[int], costs: StageCosts) -> float:
    """No schedule of ``m`` micro-batches is faster (Note [search timing]): the larger of the critical path of one
    micro-batch and, for the busiest device, its work plus the earliest it can start and, without ``W`` tasks,
    the backwards that must follow its last one.

    Raises:
        ValueError: ``m < 1``, or a placement that is not one device per stage without gaps.
    """
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"m is the number of micro-batches, an int >= 1; got {m!r}")
    if not isinstance(costs, StageCosts):
        raise ValueError(f"costs must be a StageCosts, got {type(costs).__name__}")
    if len(placement) != costs.n:
        raise ValueError(f"placement has {len(placement)} entries but costs have {costs.n} stages")
    place = stage_placement(costs.n, placement)
    n, splits = costs.n, costs.splits
    hop = [costs.copy if s and place[s] != place[s - 1] else 0.0 for s in range(n)]  # the copy into stage s
    back = [costs.seconds(Op.B, s, splits) for s in range(n)]
    head = [0.0] * n  # the earliest F(i, s) starts
    for s in range(1, n):
        head[s] = head[s - 1] + costs.forward[s - 1] + hop[s]
    tail = [0.0] * n  # from the end of B(i, s) to the end of B(i, 0)
    for s in range(1, n):
        tail[s] = tail[s - 1] + hop[s] + back[s - 1]
    critical = t = head[-1] + costs.forward[-1]
    for s in reversed(range(n)):
        t += back[s] + (hop[s + 1] if s < n - 1 else 0.0)
        critical = max(critical, t + costs.weight[s] if splits else t)
    busiest = 0.0
    for d in range(max(place) + 1):
        stages = [s for s in range(n) if place[s] == d]
        work = m * sum(costs.forward[s] + costs.backward[s] + costs.weight[s] for s in stages)
        after = 0.0 if splits else min(tail[s] for s in stages)  # its last task is a B (W tasks: maybe a W)
        busiest = max(busiest, min(head[s] for s in stages) + work + after)
    return max(critical, busiest)
