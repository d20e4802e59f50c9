"""The schedule search: for a placement, a micro-batch count, per-stage costs and a memory limit per device,
the fastest valid :class:`~gpipe.schedule.Schedule` it finds, beside every registered schedule's makespan.

Named schedules assume equal stages; the search takes each stage's own seconds. It is one more producer of the
one ``Schedule`` type (named ``"searched"``, checkpoint ``"never"``): nothing downstream knows it was searched::

    from gpipe.schedule.search import StageCosts, search

    result = search(8, [0, 1, 2, 3], StageCosts((1, 2, 2, 1), (2, 4, 4, 2), (1, 2, 2, 1)), memory_limit=4)
    result.schedule, result.makespan, result.lower_bound, result.named["zb-h1"]

Note [search candidates]: the search times every candidate with one model (Note [search timing] in
:mod:`gpipe.schedule.search_timing`) and keeps the fastest that fits the limit (Note [search memory]): the
greedy heuristic's orders under each rule (:mod:`gpipe.schedule.search_greedy`), micro-batch after
micro-batch, every registered schedule that places these stages, and the solver's answer
(:mod:`gpipe.schedule.search_solver`), warm-started from the best of those. So the result is never slower than
a named schedule that fits; when one wins, its task lists are returned as the searched schedule (without its
overlapped pairs, which the model runs in turn) and ``method`` names it. A tie goes to the solver, then the
heuristic, then the named schedules in registry order.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from gpipe.schedule.registry import SCHEDULES
from gpipe.schedule.schedule import Schedule
from gpipe.schedule.search_costs import Problem, StageCosts
from gpipe.schedule.search_greedy import QUICK, RULES, Lists, list_schedule, one_at_a_time, span
from gpipe.schedule.search_solver import load_cp_model, solve
from gpipe.schedule.search_timing import fits, least_memory, lower_bound, makespan, peak_memory
from gpipe.schedule.task import Op

__all__ = ["SOLVERS", "SearchResult", "StageCosts", "lower_bound", "makespan", "peak_memory", "search"]

#: The values of :func:`search`'s ``solver``.
SOLVERS = ("auto", "cp-sat", "greedy")
#: Above this many tasks ``solver="auto"`` runs the heuristic alone: the solver's model would take much of a
#: short time limit to build and rarely improve on the heuristic within it.
MAX_SOLVER_TASKS = 4_000
#: Above this many tasks the heuristic tries its ``QUICK`` rules only (each rule costs seconds there).
MANY_TASKS = 50_000
#: Tasks one rule of the heuristic orders per second on a slow machine (about half of what a busy two-core
#: machine does at 48,000 tasks): the rules tried are those this rate fits in half the time limit (Note [rule budget]).
RULE_TASKS_PER_SECOND = 25_000


@dataclass(frozen=True)
class SearchResult:
    """What :func:`search` found.

    Attributes:
        schedule: the searched schedule (name ``"searched"``, checkpoint ``"never"``), validated.
        makespan: its seconds, by :func:`makespan` (Note [search timing]).
        lower_bound: :func:`lower_bound`: no schedule is faster.
        named: every registered schedule: its makespan by the same model if its peak memory fits the limit,
            else one line that says why not (the memory it needs, or why it cannot place these stages).
        peak_memory: the searched schedule's peak memory per device (Note [search memory]).
        method: how it was found, e.g. ``"cp-sat, optimal"`` or ``"greedy (ortools is not installed)"``.
        optimal: whether no faster schedule exists (the solver proved it, or the makespan meets the bound).
    """

    schedule: Schedule
    makespan: float
    lower_bound: float
    named: dict[str, float | str]
    peak_memory: tuple[float, ...]
    method: str
    optimal: bool


def search(m: int, placement: Sequence[int], costs: StageCosts, memory_limit: float | Sequence[float] | None = None,
           *, time_limit: float = 10.0, seed: int = 0, solver: str = "auto") -> SearchResult:
    """The fastest valid schedule found of ``m`` micro-batches on ``placement`` under ``memory_limit``.

    Args:
        m: micro-batches (>= 1).
        placement: the device of each stage (``len(placement) == costs.n``; devices ``0..p-1`` all used).
        costs: seconds per stage and activations (:class:`StageCosts`).
        memory_limit: the most activation a device may hold at once (Note [search memory]), in the unit of
            ``costs.activation`` (micro-batches of the device's share when that is ``None``): one number for
            every device, one per device, or ``None`` for no limit.
        time_limit: seconds for the whole search, model building included: the heuristic tries the rules that fit
            half of it (Note [rule budget]), the solver stops within it.
        seed: the solver's random seed.
        solver: ``"auto"`` (CP-SAT when OR-Tools is installed and the problem is not too large, else the
            heuristic), ``"cp-sat"`` (the heuristic when OR-Tools is missing) or ``"greedy"``.

    Returns:
        The :class:`SearchResult`; the same input gives the same schedule (Note [search determinism] in
        :mod:`gpipe.schedule.search_solver`).

    Raises:
        ValueError: ``m < 1``; a placement that is not one device per stage without gaps; a bad memory limit,
            time limit, seed or solver; or a limit below what one micro-batch needs on a device (Note [least
            memory] in :mod:`gpipe.schedule.search_timing`). Each message names the argument and the fix.
    """
    clock = time.monotonic()
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; use one of {', '.join(map(repr, SOLVERS))}")
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not 0 < time_limit < math.inf:
        raise ValueError(f"time_limit is a number of seconds > 0, got {time_limit!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed is an int, got {seed!r}")
    problem = Problem.build(m, placement, costs, memory_limit)
    unit = " micro-batches" if costs.activation is None else ""
    if problem.limits is not None:
        for d, (need, limit) in enumerate(zip(least_memory(problem.placement, costs), problem.limits, strict=True)):
            if not fits(need, limit):
                raise ValueError(f"no schedule meets the memory limit: device {d} needs at least {need:g}{unit} "
                                 f"(one micro-batch of each of its stages), limit {limit:g}; raise memory_limit")
    lower = lower_bound(m, problem.placement, costs)
    named, fitting = _named(problem, unit)
    rules = (RULES if problem.size <= MANY_TASKS else RULES[:QUICK])[:_affordable_rules(problem.size, time_limit)]
    orders = [list_schedule(problem, rule) for rule in rules]
    safe = one_at_a_time(problem)
    orders.append((safe, span(problem, safe)))
    best_order, best = min(orders, key=lambda order: order[1])  # the first of the fastest
    base, solved = "greedy", None
    if solver != "greedy":
        known = min([best] + [float(named[name]) for name, _ in fitting])
        if load_cp_model() is None:
            base = "greedy (ortools is not installed)"
        elif solver == "auto" and problem.size > MAX_SOLVER_TASKS:
            base = "greedy (problem too large for the solver)"
        elif fits(known, lower):
            base = "greedy (at the lower bound, no solver needed)"
        else:  # the solver stops in time to read its answer back and build the schedule
            hints = [best_order] + [_as_order(problem, s) for _, s in fitting]
            deadline = clock + 0.95 * time_limit - 5e-5 * problem.size
            solved = solve(problem, hints, lower, time_limit=time_limit, deadline=deadline, seed=seed)
            base = solved.method if solved else "greedy (cp-sat found no schedule within the time limit)"
    # Note [search candidates]: (seconds, what, the schedule); the first of the fastest that fits wins
    candidates: list[tuple[float, str, Callable[[], Schedule]]] = []
    if solved is not None:
        candidates.append((span(problem, solved.lists), "solver", partial(_schedule, problem, solved.lists)))
    candidates.append((best, "the greedy order", partial(_schedule, problem, best_order)))
    candidates += [(float(named[name]), f"the named schedule {name}", partial(_renamed, s)) for name, s in fitting]
    what, schedule, peaks = _pick(candidates, problem)
    kept = what != "solver" and (solved is not None or what != "the greedy order")
    method = f"{base}; {what} is the fastest found" if kept else base
    seconds = makespan(schedule, costs)
    optimal = (what == "solver" and solved is not None and solved.optimal) or fits(seconds, lower)
    return SearchResult(schedule, seconds, lower, named, peaks, method, optimal)


# Note [rule budget]: each rule of the heuristic costs about the same per task, and a large problem's rules
# alone would outlast a short time limit (nine rules of 48,000 tasks: ten seconds). So the rules tried are the
# first that fit half the time limit at ``RULE_TASKS_PER_SECOND``, the first one always: a count of the input,
# not of the clock, so the same input still gives the same schedule (Note [search determinism]).
def _affordable_rules(size: int, time_limit: float) -> int:
    """How many of the heuristic's rules fit half of ``time_limit`` for ``size`` tasks (Note [rule budget])."""
    return max(1, math.floor(0.5 * time_limit * RULE_TASKS_PER_SECOND / max(size, 1)))


def _named(problem: Problem, unit: str) -> tuple[dict[str, float | str], list[tuple[str, Schedule]]]:
    """Every registered schedule under the problem's limit: its makespan or why not, and those that fit."""
    named: dict[str, float | str] = {}
    fitting: list[tuple[str, Schedule]] = []
    costs, limits = problem.costs, problem.limits
    for name, kind in SCHEDULES.items():
        if kind.copies > 1:  # Note [stage slots]: its stages are copies of fewer, not the problem's stages
            named[name] = f"runs {kind.copies} copies of the model's stages; the search places one"
            continue
        try:
            schedule = kind(problem.m, problem.n, "never", placement=problem.placement)
            schedule.validate()
        except (ValueError, TypeError) as error:
            named[name] = f"cannot place these stages: {str(error).splitlines()[0]}"
            continue
        if schedule.placement != problem.placement or (schedule.m, schedule.n) != (problem.m, problem.n):
            named[name] = f"places the stages on {schedule.placement}, not {problem.placement}"
            continue
        peaks = peak_memory(schedule, costs)
        over = [d for d in range(problem.devices) if limits is not None and not fits(peaks[d], limits[d])]
        if limits is not None and over:
            d = over[0]
            named[name] = f"needs {peaks[d]:g}{unit} on device {d}, limit {limits[d]:g}"
            continue
        named[name] = makespan(schedule, costs)
        fitting.append((name, schedule))
    return named, fitting


def _as_order(problem: Problem, schedule: Schedule) -> Lists:
    """A named schedule's lists as the problem's task numbers: a ``W`` right after each ``B`` when the problem
    splits and the schedule does not, its ``W`` tasks left out when the problem does not split (they take no
    seconds, and freeing at ``B`` is freeing no later)."""
    mn = problem.m * problem.n
    lists: Lists = []
    for ts in schedule.tasks:
        order: list[int] = []
        for t in ts:
            if t.op is Op.W and not problem.splits:
                continue
            order.append(problem.number(t))
            if t.op is Op.B and problem.splits and not schedule.splits_weight_gradient:
                order.append(order[-1] + mn)
        lists.append(order)
    return lists


def _schedule(problem: Problem, lists: Lists) -> Schedule:
    """The searched schedule of ``lists``, validated."""
    tasks = tuple(tuple(problem.task(k) for k in ts) for ts in lists)
    return Schedule(problem.m, problem.n, "never", problem.placement, tasks, name="searched").validate()


def _pick(candidates: list[tuple[float, str, Callable[[], Schedule]]],
          problem: Problem) -> tuple[str, Schedule, tuple[float, ...]]:
    """The first of the fastest candidates whose peak memory fits, its schedule and peak memory: the greedy and the
    named ones fit by construction; the solver's may not, within its model's slack (Note [search ticks])."""
    fastest = min(seconds for seconds, *_ in candidates)
    ranked = sorted(candidates, key=lambda c: 0.0 if fits(c[0], fastest) else c[0])  # stable: ties keep their order
    for _, what, build in ranked:
        schedule = build()
        peaks = peak_memory(schedule, problem.costs)
        if problem.limits is None or all(map(fits, peaks, problem.limits)):
            return what, schedule, peaks
    raise AssertionError("no candidate fits the memory limit, not even micro-batch after micro-batch")


def _renamed(schedule: Schedule) -> Schedule:
    """A named schedule's lists as the searched schedule, without overlapped pairs (Note [search candidates])."""
    return Schedule(schedule.m, schedule.n, "never", schedule.placement, schedule.tasks, name="searched").validate()
