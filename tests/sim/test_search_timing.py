"""The simulator's SimPy engine against the closed timing model, where both apply (Note [two timing models] in
gpipe.schedule.search_timing: an ideal runner, free copies, overlapped pairs in turn). Every registered schedule (read
from the registry when the tests are collected, so one added later is covered too) under every checkpoint policy,
and searched schedules, for unequal stage costs, end at the same time in both; and their peak memory is the same,
the one saved-bytes rule applied at the simulated times and in list order (a checkpointed micro-batch keeping
nothing until its recompute)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpipe.schedule import CHECKPOINT_MODES, SCHEDULES, Checkpoint, Schedule, looped, v_shape
from gpipe.schedule.search import StageCosts, makespan, peak_memory, search
from sim.core.config import SimConfig
from sim.core.cost import IDEAL_RUNNER, CostModel
from sim.core.engine import simulate

SECONDS = st.floats(0.1, 4.0, allow_nan=False).map(lambda x: round(x, 2))
# the search's model runs an overlapped pair's two tasks in turn (Note [search timing]); so does this switch
IN_TURN = SimConfig(overlap_pairs=False)


def simulated(schedule: Schedule, costs: StageCosts, activation: tuple[float, ...]) -> tuple[float, tuple[int, ...]]:
    """The simulator's makespan and per-device peak bytes of ``schedule``: ideal runner, copies free, a stage's
    micro-batch keeping ``activation[s]`` bytes, ``B`` the whole backward when the schedule has no ``W``."""
    splits = schedule.splits_weight_gradient
    backward = [b if splits else b + w for b, w in zip(costs.backward, costs.weight, strict=True)]
    model = CostModel.from_lists(costs.forward, backward, weight=list(costs.weight), saved_bytes=list(activation),
                                 copy_seconds=0.0, runner=IDEAL_RUNNER)
    timeline = simulate(schedule, model, IN_TURN)
    return timeline.makespan, tuple(timeline.peak_memory(d) for d in range(schedule.num_devices))


def layouts(p: int) -> list[tuple[int, ...]]:
    """One stage per device, looped with two per device, and the V, for ``p`` devices."""
    return [tuple(range(p)), looped(2 * p, p), v_shape(2 * p, p)]


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_every_schedule_times_as_the_simulator_does(name: str) -> None:
    kind = SCHEDULES[name]
    ran = 0

    @settings(max_examples=25, deadline=None, derandomize=True, database=None)
    @given(p=st.integers(1, 3), layout=st.integers(0, 2), m=st.integers(1, 7), split=st.booleans(),
           policy=st.sampled_from(CHECKPOINT_MODES), data=st.data())
    def check(p: int, layout: int, m: int, split: bool, policy: Checkpoint, data: st.DataObject) -> None:
        nonlocal ran
        placement = layouts(p)[layout]
        n = len(placement)
        try:
            schedule = kind(m, n, policy, placement=placement)
        except ValueError:
            return  # the schedule cannot place these stages
        draw = lambda: tuple(data.draw(SECONDS) for _ in range(n))  # noqa: E731
        costs = StageCosts(draw(), draw(), draw() if split else (0.0,) * n,
                           activation=tuple(data.draw(st.integers(1, 9)) for _ in range(n)))
        expected, peaks = simulated(schedule, costs, costs.activation or ())
        assert makespan(schedule, costs) == pytest.approx(expected, rel=1e-12)
        assert peak_memory(schedule, costs) == pytest.approx(peaks)
        ran += 1

    check()
    assert ran, f"{name} placed no shape"


@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(p=st.integers(1, 3), layout=st.integers(0, 2), m=st.integers(1, 5), split=st.booleans(), data=st.data())
def test_searched_schedules_time_as_the_simulator_does(p: int, layout: int, m: int, split: bool,
                                                       data: st.DataObject) -> None:
    placement = layouts(p)[layout]
    n = len(placement)
    draw = lambda: tuple(data.draw(SECONDS) for _ in range(n))  # noqa: E731
    activation = tuple(data.draw(st.integers(1, 9)) for _ in range(n))
    costs = StageCosts(draw(), draw(), draw() if split else (0.0,) * n, activation=activation)
    share = [sum(a for s, a in enumerate(activation) if placement[s] == d) for d in range(p)]
    limit = [x * data.draw(st.integers(1, 3)) for x in share]
    result = search(m, placement, costs, limit, time_limit=1.0)
    expected, peaks = simulated(result.schedule, costs, activation)
    assert result.makespan == pytest.approx(expected, rel=1e-12)
    assert result.peak_memory == pytest.approx(peaks)
