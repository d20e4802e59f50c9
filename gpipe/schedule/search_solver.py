"""The schedule search's exact method: the problem as a CP-SAT model (OR-Tools), warm-started from the best
schedules known, solved within a time limit.

Note [search ticks]: CP-SAT works on integers, so seconds become ticks: the smallest positive cost is at
least 100 ticks, at a whole multiple of the costs' decimal resolution when they have one (0.3 s and 2 s: 1,000
ticks a second), unless the horizon would pass ``MAX_HORIZON`` ticks. Each task lasts at least one tick, a
zero-second one too (which makes the model inexact), so that no two tasks of a device start together and the
start times give each device one order. Activations become integers at a millionth of the largest activation,
rounded up, and each device's limit is loosened by what that rounding can add (a unit per activation the device
can hold at once): the model admits every schedule that fits, so a named schedule at exactly the limit stays a
valid hint, and the search keeps the solver's schedule only if it fits the limit itself
(:func:`~gpipe.schedule.search_timing.fits`). A relaxed model's optimum that fits is the problem's optimum, so
only the ticks decide exactness: when every cost is a whole number of ticks, an optimum it proves is the optimum.

Note [search model]: one fixed-size interval per task, no overlap per device; a precedence per dependency,
with the copy's ticks across devices; per device a cumulative of intervals from each ``F``'s start to its
releasing task's end (Note [search memory]), their activations within the limit (a reservoir of the same
events propagates less and finds worse schedules); the makespan at least every task's end and the lower
bound. Micro-batches are interchangeable, so they enter stage 0 in order: any schedule is one such once its
micro-batches are renamed. Start times lie between each task's longest path from the start and its longest
path to the end under the hint's makespan, which also bounds the horizon.

Note [search determinism]: the solver interleaves its strategies (full searches and neighbourhood searches that
improve the hint) on one worker, with the caller's seed, and stops at a deterministic time limit (its count
of work, not seconds), ``WORK_PER_SECOND`` of the caller's seconds: the same input gives the same schedule on
any machine that reaches that limit in time. One plain search is deterministic too but cannot search
neighbourhoods, which find the better schedules here; several workers spent many more seconds per unit of
work on a busy two-core machine, so the wall clock stopped them first. The wall clock stays as a safety net;
a search it stops may differ from run to run, and its method then says "stopped by the wall clock".
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from gpipe.schedule.search_costs import Problem
from gpipe.schedule.search_greedy import Lists, span
from gpipe.schedule.search_timing import finish_times

__all__ = ["MAX_HORIZON", "WORK_PER_SECOND", "Solved", "load_cp_model", "solve"]

MAX_HORIZON = 10_000_000  # ticks (Note [search ticks])
WORK_PER_SECOND = 0.15  # deterministic time the solver may spend per second of the caller's time limit


@dataclass(frozen=True)
class Solved:
    """What the solver returned: each device's order, whether it proved it optimal, and in words."""

    lists: Lists
    optimal: bool
    method: str


def load_cp_model() -> ModuleType | None:
    """OR-Tools' CP-SAT module, or ``None`` when OR-Tools is not installed."""
    try:
        from ortools.sat.python import cp_model
    except ImportError:
        return None
    return cp_model


def _ticks(problem: Problem, upper_seconds: float) -> tuple[float, bool]:
    """Ticks per second, and whether every cost is a whole number of ticks (Note [search ticks])."""
    costs = [c for c in (*problem.seconds, problem.costs.copy) if c > 0]
    if not costs:
        return 1.0, False
    scale = 100 / min(costs)
    for digits in range(7):  # costs in whole tenths, hundredths, ...: a multiple of that resolution is exact
        if all(abs(c * 10**digits - round(c * 10**digits)) <= 1e-9 * c * 10**digits for c in costs):
            scale = 10**digits * math.ceil(scale / 10**digits)
            break
    if upper_seconds > 0:
        scale = min(scale, MAX_HORIZON / upper_seconds)
    exact = all(abs(c * scale - round(c * scale)) <= 1e-9 * c * scale for c in costs)
    return scale, exact and len(costs) == len(problem.seconds) + (problem.costs.copy > 0)


def _units(problem: Problem) -> tuple[list[int], list[int]] | None:
    """Activations rounded up to integers and each device's limit loosened by what that rounding can add (Note
    [search ticks]); ``None``: no limit."""
    if problem.limits is None:
        return None
    top = max(problem.activation)
    if top <= 0:
        return None
    unit = top / 1_000_000
    acts = []
    for a in problem.activation:
        x = a / unit
        acts.append(round(x) if abs(x - round(x)) <= 1e-6 else math.ceil(x))
    limits = []
    for d, limit in enumerate(problem.limits):
        held = problem.m * sum(1 for s in problem.placement if s == d)  # the most activations it can hold at once
        limits.append(math.floor(limit / unit + 1e-6) + held)
    return acts, limits


def solve(problem: Problem, hints: Sequence[Lists], lower: float, *, time_limit: float, deadline: float,
          seed: int) -> Solved | None:
    """The best schedule CP-SAT finds for ``problem`` (Note [search model]), or ``None`` when it finds none.

    Args:
        problem: the problem.
        hints: valid orders within the limit; the fastest in ticks warm-starts the solver and bounds the horizon.
        lower: a lower bound on the makespan, in seconds.
        time_limit: the caller's time limit; the solver's deterministic limit is proportional to it.
        deadline: when the solver must have stopped, by ``time.monotonic()``: a safety net (Note [search
            determinism]); the model is built first, so its building counts.
        seed: the solver's random seed.
    """
    cp_model = load_cp_model()
    if cp_model is None or not hints:
        return None
    size, device = problem.size, problem.device
    scale, exact = _ticks(problem, min(span(problem, lists) for lists in hints))
    dur = [max(1, round(c * scale)) for c in problem.seconds]
    copy = round(problem.costs.copy * scale)
    starts, horizon = min((_in_ticks(problem, lists, dur, copy) for lists in hints), key=lambda x: x[1])
    head, tail = _paths(problem, dur, copy)
    model = cp_model.CpModel()
    start = [model.new_int_var(head[k], horizon - tail[k], f"s{k}") for k in range(size)]
    intervals = [model.new_fixed_size_interval_var(start[k], dur[k], f"t{k}") for k in range(size)]
    for d in range(problem.devices):
        model.add_no_overlap([intervals[k] for k in range(size) if device[k] == d])
    for k in range(size):
        for a, delay in problem.deps[k]:
            model.add(start[k] >= start[a] + dur[a] + (copy if delay > 0 else 0))
    n = problem.n
    for i in range(1, problem.m):
        model.add(start[i * n] >= start[(i - 1) * n] + dur[(i - 1) * n])  # Note [search model]: entry order
    units = _units(problem)
    if units is not None:
        acts, limits = units
        mn = problem.m * n
        for d in range(problem.devices):
            if sum(acts[s] for s in range(n) if problem.placement[s] == d) * problem.m <= limits[d]:
                continue  # every micro-batch at once fits: no constraint
            held, demand = [], []
            for k in range(mn):
                if device[k] == d:
                    r = problem.releases(k)
                    length = model.new_int_var(0, horizon, f"h{k}")
                    model.add_hint(length, starts[r] + dur[r] - starts[k])
                    held.append(model.new_interval_var(start[k], length, start[r] + dur[r], f"m{k}"))
                    demand.append(acts[k % n])
            model.add_cumulative(held, demand, limits[d])
    bound = max(h + t for h, t in zip(head, tail, strict=True))  # the critical path in ticks
    if exact:  # else the bound in seconds need not hold for the rounded costs
        bound = max(bound, math.ceil(lower * scale - 1e-6))
    makespan = model.new_int_var(min(horizon, bound), horizon, "makespan")
    for k in range(size):
        if not problem.succs[k]:
            model.add(makespan >= start[k] + dur[k])
    model.minimize(makespan)
    for k in range(size):
        model.add_hint(start[k], starts[k])
    model.add_hint(makespan, horizon)
    solver = cp_model.CpSolver()
    params = solver.parameters
    params.num_workers = 1  # Note [search determinism]
    params.interleave_search = True
    params.random_seed = seed
    params.linearization_level = 0  # the LP relaxation costs far more time than its bounds help here
    params.max_deterministic_time = WORK_PER_SECOND * time_limit
    clock = time.monotonic()
    params.max_time_in_seconds = max(deadline - clock, 0.01)
    params.catch_sigint_signal = False  # Note [interrupted search]
    status = _interruptible(solver, model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    lists: Lists = [[] for _ in range(problem.devices)]
    for k in sorted(range(size), key=lambda k: (solver.value(start[k]), k)):
        lists[device[k]].append(k)
    if status == cp_model.OPTIMAL:
        return Solved(lists, exact, "cp-sat, optimal" if exact else "cp-sat, optimal for costs rounded to ticks")
    stopped = " (stopped by the wall clock)" if time.monotonic() - clock >= params.max_time_in_seconds * 0.98 else ""
    return Solved(lists, False, f"cp-sat, not proven optimal within the {time_limit:g} s limit{stopped}")


# Note [interrupted search]: CP-SAT catches SIGINT itself, stops and returns its best schedule as if its time
# limit had passed, so a Ctrl-C would read as a result. So it solves without its handler, in a thread of its own,
# while the caller waits where Python's handler raises KeyboardInterrupt; the search is then stopped and waited
# for, and the interrupt goes on up: an interrupted search returns nothing.
def _interruptible(solver: Any, model: Any) -> Any:
    """``solver.solve(model)``'s status; an exception in the caller's wait (Ctrl-C) stops the search and is raised
    once it has ended (Note [interrupted search])."""
    done = threading.Event()
    outcome: list[Any] = []

    def work() -> None:
        try:
            outcome.append(solver.solve(model))
        except BaseException as error:  # noqa: BLE001 - raised again in the caller's thread
            outcome.append(error)
        finally:
            done.set()

    threading.Thread(target=work, name="cp-sat", daemon=True).start()
    try:
        done.wait()
    except BaseException:
        while not done.is_set():  # stop_search does nothing until the solve has begun: ask until it ends
            try:
                solver.stop_search()
                done.wait(0.05)
            except KeyboardInterrupt:  # a second Ctrl-C: it is stopping already
                pass
        raise
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def _in_ticks(problem: Problem, lists: Lists, dur: Sequence[int], copy: int) -> tuple[list[int], int]:
    """Start ticks of ``lists`` under the timing model with ``dur`` ticks per task and ``copy`` per copy, and
    the makespan in ticks."""
    deps = [tuple((a, copy if d > 0 else 0) for a, d in ds) for ds in problem.deps]
    ends = finish_times(lists, deps.__getitem__, dur.__getitem__)
    return [round(ends[k]) - dur[k] for k in range(problem.size)], round(max(ends.values(), default=0.0))


def _paths(problem: Problem, dur: Sequence[int], copy: int) -> tuple[list[int], list[int]]:
    """Each task's longest path from the start (its earliest start) and to the end (its own ticks included)."""
    order = sorted(range(problem.size), key=lambda k: _rank(problem, k))
    head = [0] * problem.size
    for k in order:
        for a, d in problem.deps[k]:
            head[k] = max(head[k], head[a] + dur[a] + (copy if d > 0 else 0))
    tail = list(dur)
    for k in reversed(order):
        for z, d in problem.succs[k]:
            tail[k] = max(tail[k], dur[k] + (copy if d > 0 else 0) + tail[z])
    return head, tail


def _rank(problem: Problem, k: int) -> int:
    """A topological rank within a micro-batch: forwards up the stages, then each ``B`` down them, its ``W`` next."""
    op, s, n = problem.op(k), problem.stage(k), problem.n
    return s if op == 0 else n + 2 * (n - 1 - s) + (op == 2)
