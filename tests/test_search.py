"""The schedule search (gpipe.schedule.search): valid schedules within the memory limit, never slower than a named
schedule that fits, at or above the lower bound; the closed forms it must meet; the same answer twice; the
heuristic alone when the solver is missing; every bad input named."""

from __future__ import annotations

import math
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpipe.schedule import SCHEDULES, Op, looped, one_f_one_b, v_shape, zb_h1, zb_v
from gpipe.schedule.search import SearchResult, StageCosts, lower_bound, makespan, peak_memory, search
from gpipe.schedule.search_timing import least_memory

SECONDS = st.floats(0.1, 4.0, allow_nan=False).map(lambda x: round(x, 2))


def layouts(p: int) -> list[tuple[int, ...]]:
    """One stage per device, looped with two per device, and the V, for ``p`` devices."""
    return [tuple(range(p)), looped(2 * p, p), v_shape(2 * p, p)]


def check(result: SearchResult, m: int, placement: tuple[int, ...], costs: StageCosts,
          limit: list[float] | None) -> None:
    """What every result holds: a valid searched schedule within the limit, timed and measured by the public
    model, between the lower bound and every named schedule that fits."""
    schedule = result.schedule
    assert schedule.validate() is schedule
    assert (schedule.name, schedule.checkpoint, schedule.m, schedule.placement) == ("searched", "never", m, placement)
    assert result.makespan == makespan(schedule, costs)
    assert result.peak_memory == peak_memory(schedule, costs)
    if limit is not None:
        assert all(peak <= cap + 1e-9 for peak, cap in zip(result.peak_memory, limit, strict=True))
    assert result.lower_bound == lower_bound(m, placement, costs)
    assert result.makespan >= result.lower_bound - 1e-9
    assert set(result.named) == set(SCHEDULES)
    for name, value in result.named.items():
        if isinstance(value, float):
            assert result.makespan <= value + 1e-9, (name, value, result.method)
        else:
            assert value and "\n" not in value
    if result.optimal and "cp-sat" not in result.method:
        assert result.makespan == pytest.approx(result.lower_bound)


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(p=st.integers(2, 3), layout=st.integers(0, 2), m=st.integers(2, 6), split=st.booleans(),
       copy=st.sampled_from([0.0, 0.25, 1.0]), data=st.data())
def test_searched_schedules_are_valid_fit_and_beat_the_named_ones(p: int, layout: int, m: int, split: bool,
                                                                  copy: float, data: st.DataObject) -> None:
    placement = layouts(p)[layout]
    n = len(placement)
    draw = lambda: tuple(data.draw(SECONDS) for _ in range(n))  # noqa: E731
    costs = StageCosts(draw(), draw(), draw() if split else (0.0,) * n, copy=copy)
    limit = data.draw(st.none() | st.lists(st.sampled_from([1.0, 1.0, 1.5, 2.0, 3.0]), min_size=p, max_size=p))
    result = search(m, placement, costs, limit, time_limit=1.0)
    check(result, m, placement, costs, limit)
    if "named schedule" not in result.method:  # a named schedule decides for itself
        assert result.schedule.splits_weight_gradient == split


@pytest.mark.parametrize(("p", "m"), [(4, 8), (3, 6), (2, 5)])
def test_zb_h1_makespan_under_1f1b_memory(p: int, m: int) -> None:
    """``F = B = W = 1``, one stage per device, the limit 1F1B's peak (``p`` micro-batches): ZB-H1's
    ``3m + p - 1``, which is the lower bound (the last device starts at ``p - 1`` and works ``3m``)."""
    costs = StageCosts.uniform(p, 1, 1, 1)
    limit = max(peak_memory(one_f_one_b(m, p), costs))
    assert limit == p
    result = search(m, range(p), costs, limit)
    check(result, m, tuple(range(p)), costs, [limit] * p)
    assert result.makespan == 3 * m + p - 1 == result.lower_bound and result.optimal


def test_1f1b_makespan_without_w_under_its_memory() -> None:
    """No ``W`` and free copies, under 1F1B's own peak per device (``p - d``): 1F1B's ``(m + p - 1)(F + B)``."""
    p, m = 4, 8
    costs = StageCosts.uniform(p, 1.0, 2.0)
    limit = list(peak_memory(one_f_one_b(m, p), costs))
    assert limit == [4, 3, 2, 1]
    result = search(m, range(p), costs, limit)
    check(result, m, tuple(range(p)), costs, limit)
    assert result.makespan == (m + p - 1) * 3 == makespan(one_f_one_b(m, p), costs) and result.optimal
    assert not result.schedule.splits_weight_gradient


def test_per_device_1f1b_memory_costs_zero_bubbles_time() -> None:
    """With each device held to 1F1B's own peak (``p - d``), ``W`` cannot wait on the later devices, so ZB-H1's
    makespan is out of reach: for ``p = m = 2``, ``F = B = W = 1``, device 1 holds one micro-batch, so it runs
    ``F0 B0 W0 F1 B1 W1`` from ``t = 1`` to 7, and device 0's ``B1`` and ``W1`` follow: 8, not ``3m + p - 1 = 7``."""
    costs = StageCosts.uniform(2, 1, 1, 1)
    result = search(2, (0, 1), costs, [2, 1])
    assert result.makespan == 8 and result.lower_bound == 7 and result.optimal and result.method == "cp-sat, optimal"
    assert result.named["zb-h1"] == "needs 2 micro-batches on device 1, limit 1"


def test_a_limit_at_a_named_schedules_exact_peak_leaves_the_solver_its_hint() -> None:
    """Activations that are no whole number of the solver's units (a third) round up, so a limit at ZB-H1's exact
    peak would turn away ZB-H1 itself, the solver's hint; the loosened limit keeps it (Note [search ticks]), and the
    solver proves ZB-H1's 70 optimal under its own memory, with every device within the limit."""
    pytest.importorskip("ortools")
    costs = StageCosts((2, 1, 1, 2), (4, 2, 2, 4), (2, 1, 1, 2), activation=(1 / 3, 0.7, 0.7, 1 / 3))
    limit = list(peak_memory(zb_h1(8, 4), costs))
    result = search(8, range(4), costs, limit, solver="cp-sat")
    check(result, 8, (0, 1, 2, 3), costs, limit)
    assert result.method.startswith("cp-sat") and result.makespan == 70 and result.optimal


@pytest.mark.slow
def test_the_same_input_gives_the_same_schedule() -> None:
    """A case the solver does not close within its limit, searched twice (Note [search determinism])."""
    costs = StageCosts((1, 2, 1, 3), (2, 3, 2, 5), (1, 1, 2, 2), copy=0.3)
    first, second = (search(8, range(4), costs, 3, time_limit=5.0, seed=5) for _ in range(2))
    if any("wall clock" in result.method for result in (first, second)):
        pytest.skip("the machine was too busy to reach the solver's deterministic limit within the time limit")
    assert first.method == "cp-sat, not proven optimal within the 5 s limit"
    assert first.schedule == second.schedule and first.method == second.method
    check(first, 8, (0, 1, 2, 3), costs, [3.0] * 4)


def test_a_named_schedule_that_wins_is_returned_as_the_searched_one() -> None:
    costs = StageCosts((2, 3, 2, 2), (2, 2, 3, 2), (2, 2, 0, 0))
    result = search(6, (0, 1, 1, 0), costs, 2, solver="greedy")
    assert result.method == "greedy; the named schedule zb-v is the fastest found"
    assert result.schedule.tasks == zb_v(6, 4).tasks and result.makespan == result.named["zb-v"]
    solved = search(6, (0, 1, 1, 0), costs, 2)
    check(solved, 6, (0, 1, 1, 0), costs, [2.0, 2.0])
    assert solved.makespan <= result.makespan


def test_named_schedules_say_why_they_do_not_fit() -> None:
    costs = StageCosts.uniform(4, 1, 1, 1)
    result = search(8, range(4), costs, 3)
    assert result.named["gpipe"] == "needs 8 micro-batches on device 0, limit 3"
    assert result.named["zb-v"].startswith("cannot place these stages: zb-v runs its own V placement")
    bytes_ = StageCosts((1, 1), (1, 1), (0, 0), activation=(1e9, 2e9))
    assert search(4, (0, 1), bytes_, 3e9).named["gpipe"] == "needs 4e+09 on device 0, limit 3e+09"


def test_without_ortools_the_heuristic_runs_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("ortools", "ortools.sat", "ortools.sat.python", "ortools.sat.python.cp_model"):
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    costs = StageCosts((1, 2, 1), (2, 3, 1), (1, 1, 1), copy=0.1)
    result = search(5, range(3), costs, 2, solver="cp-sat")
    assert result.method.startswith("greedy (ortools is not installed)")
    check(result, 5, (0, 1, 2), costs, [2.0] * 3)


def test_a_big_search_returns_a_valid_schedule_within_a_short_time_limit() -> None:
    p, n, m = 8, 16, 32
    costs = StageCosts(tuple(1 + 0.05 * s for s in range(n)), tuple(2 - 0.05 * s for s in range(n)), (1.0,) * n,
                       copy=0.05)
    clock = time.monotonic()
    result = search(m, v_shape(n, p), costs, p, time_limit=1.0)
    assert time.monotonic() - clock < 30  # about 1 s; generous on a loaded machine, short of the search's own end
    check(result, m, v_shape(n, p), costs, [float(p)] * p)
    assert len(list(result.schedule.all_tasks())) == 3 * m * n


def test_too_large_for_the_solver_runs_the_heuristic() -> None:
    costs = StageCosts.uniform(8, 1, 2, 1, copy=0.1)
    result = search(200, range(8), costs, 8, time_limit=5.0)
    assert result.method.startswith("greedy (problem too large for the solver)")
    assert result.makespan <= makespan(zb_h1(200, 8), costs)


def test_all_zero_weights_split_nothing_and_lower_bound_closed_form() -> None:
    costs = StageCosts.uniform(3, 1, 2)
    assert lower_bound(5, range(3), costs) == (5 + 3 - 1) * 3
    assert lower_bound(5, range(3), StageCosts.uniform(3, 1, 1, 1)) == 3 * 5 + 2
    result = search(5, range(3), costs)
    assert not any(t.op is Op.W for t in result.schedule.all_tasks())
    assert result.makespan == (5 + 3 - 1) * 3 and result.optimal


@pytest.mark.parametrize("placement", [(0, 1, 2, 3), looped(4, 2), v_shape(4, 2)])
def test_a_limit_below_one_micro_batch_per_device_is_refused(placement: tuple[int, ...]) -> None:
    """Note [least memory]: a device holds all its stages' activations of one micro-batch at some time."""
    costs = StageCosts((1,) * 4, (1,) * 4, (0,) * 4, activation=(1, 2, 3, 4))
    need = least_memory(placement, costs)
    device = max(range(len(need)), key=need.__getitem__)
    with pytest.raises(ValueError, match=f"no schedule meets the memory limit: device {device} needs at least "
                                         f"{need[device]:g}"):
        search(3, placement, costs, [x - (d == device) * 0.5 for d, x in enumerate(need)])
    check(search(3, placement, costs, list(need)), 3, placement, costs, list(need))
    with pytest.raises(ValueError, match="device 0 needs at least 1 micro-batches"):
        search(3, placement, StageCosts.uniform(4, 1, 1), 0.9)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: StageCosts((), (), ()), "StageCosts.forward is empty"),
    (lambda: StageCosts((1, -1), (1, 1), (0, 0)), r"StageCosts.forward\[1\] must be a finite number"),
    (lambda: StageCosts((1, 1), (1, math.nan), (0, 0)), r"StageCosts.backward\[1\] must be a finite number"),
    (lambda: StageCosts((1, 1), (1, 1), (0, math.inf)), r"StageCosts.weight\[1\] must be a finite number"),
    (lambda: StageCosts((1, 1), (1,), (0, 0)), "StageCosts.backward has 1 entries but forward has 2 stages"),
    (lambda: StageCosts((1, 1), (1, 1), (0, 0), copy=-1), "StageCosts.copy must be a finite number"),
    (lambda: StageCosts((1, 1), (1, 1), (0, 0), activation=(1,)), "StageCosts.activation has 1 entries"),
    (lambda: StageCosts((1, 0), (1, 0), (0, 0)), "stage 1 has forward and backward both 0"),
    (lambda: StageCosts((1, "a"), (1, 1), (0, 0)), r"StageCosts.forward\[1\] must be a finite number"),
    (lambda: StageCosts.uniform(0, 1, 1), "at least one stage"),
    (lambda: search(0, (0, 1), StageCosts.uniform(2, 1, 1)), "m is the number of micro-batches"),
    (lambda: search(True, (0, 1), StageCosts.uniform(2, 1, 1)), "m is the number of micro-batches"),
    (lambda: search(2, (0, 1, 2), StageCosts.uniform(2, 1, 1)), "placement has 3 entries but costs have 2 stages"),
    (lambda: search(2, (0, 2), StageCosts.uniform(2, 1, 1)), "without gaps"),
    (lambda: search(2, (0, -1), StageCosts.uniform(2, 1, 1)), "negative device"),
    (lambda: search(2, "01", StageCosts.uniform(2, 1, 1)), "placement is the device of each stage"),
    (lambda: search(2, (0, True), StageCosts.uniform(2, 1, 1)), "placement has 1 entries"),
    (lambda: search(2, (0, 1.5), StageCosts.uniform(2, 1, 1)), "placement holds device indices"),
    (lambda: search(2, (0, 1), StageCosts.uniform(2, 1, 1), [1.0]), "memory_limit is one number, or one per"),
    (lambda: search(2, (0, 1), StageCosts.uniform(2, 1, 1), math.nan), "memory_limit of device 0 must be"),
    (lambda: search(2, (0, 1), StageCosts.uniform(2, 1, 1), -2), "memory_limit of device 0 must be"),
    (lambda: search(2, (0, 1), StageCosts.uniform(2, 1, 1), solver="gurobi"), "unknown solver 'gurobi'"),
    (lambda: search(2, (0, 1), StageCosts.uniform(2, 1, 1), time_limit=0), "time_limit is a number of seconds"),
    (lambda: search(2, (0, 1), (1, 1)), "costs must be a StageCosts"),
    (lambda: makespan(zb_h1(2, 3), StageCosts.uniform(2, 1, 1)), "costs have 2 stages but the schedule has 3"),
])
def test_bad_input_is_named(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()  # type: ignore[operator]


def test_a_checkpointed_micro_batch_holds_its_activation_from_its_recompute() -> None:
    """Note [search memory]: with every micro-batch checkpointed each device holds one activation, from ``R`` to
    ``B`` (the simulator agrees on time and memory: tests/sim/test_search_timing.py)."""
    costs = StageCosts.uniform(2, 1, 2)
    assert peak_memory(one_f_one_b(4, 2, "always"), costs) == (1.0, 1.0)
    assert peak_memory(one_f_one_b(4, 2), costs) == (2.0, 1.0)
