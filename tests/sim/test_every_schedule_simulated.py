"""Every registered schedule (read from the registry when the tests are collected, so one added later is covered
too), for random shapes, policies and per-stage costs: each task exactly once, and in the simulated timeline
each task starts after its dependencies and the previous task on its device end (the two tasks of an
overlapped pair start together)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpipe.schedule import CHECKPOINT_MODES, SCHEDULES, Checkpoint, ScheduleError
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate

EPS = 1e-9
SECONDS = st.floats(0.05, 5.0, allow_nan=False)


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_every_schedule_runs_each_task_once_after_what_it_waits_for(name: str) -> None:
    """A shape the schedule's constraints reject is skipped only by its ``ValueError`` (never a
    :class:`ScheduleError`: that is an invalid schedule), and counted: real cases must run."""
    kind = SCHEDULES[name]
    outcomes: Counter[str] = Counter()

    @settings(max_examples=40, deadline=None, derandomize=True, database=None)
    @given(p=st.integers(1, 4), v=st.integers(1, 3), policy=st.sampled_from(CHECKPOINT_MODES), data=st.data())
    def check(p: int, v: int, policy: Checkpoint, data: st.DataObject) -> None:
        # m: anything, or whole rounds of p (what a looped schedule may need)
        m = data.draw(st.integers(1, 8) | st.integers(1, 3).map(lambda k: k * p), label="m")
        if kind.place is None:
            n, p = p * v, p * v  # one stage per device
        else:
            n = p * v
        try:
            placement = kind.layout(n, p)
            schedule = kind(m, n, policy, placement)
        except ScheduleError:
            raise
        except ValueError:
            outcomes["rejected"] += 1
            return
        schedule.validate()
        assert Counter(schedule.all_tasks()) == Counter(schedule.expected_tasks())  # each task exactly once
        assert schedule.placement == placement and schedule.num_devices == p
        stages = tuple(StageCost(data.draw(SECONDS), data.draw(SECONDS), data.draw(st.none() | SECONDS),
                                 weight=data.draw(SECONDS)) for _ in range(n))
        copy_seconds = data.draw(st.sampled_from([0.0, 0.3]))
        timeline = simulate(schedule, CostModel(stages, copy_seconds=copy_seconds))
        spans = {s.task: s for s in timeline.compute_spans()}
        assert Counter(s.task for s in timeline.compute_spans()) == Counter(schedule.all_tasks())
        for task, span in spans.items():
            assert span.device == placement[task.stage]
            for dep in schedule.dependencies(task):
                assert span.start >= spans[dep].end - EPS, (task, dep)
        partner = {b: a for a, b in schedule.pairs}  # an overlapped pair starts together (Note [overlapped pairs])
        for d, tasks in enumerate(schedule.tasks):
            if not schedule.pairs:
                assert timeline.task_order(d) == list(tasks)
            for before, after in zip(tasks, tasks[1:], strict=False):
                if partner.get(after) == before:
                    assert spans[after].start == pytest.approx(spans[before].start, abs=EPS), (before, after)
                    continue
                for earlier in (before, partner.get(before)):
                    if earlier is not None:
                        assert spans[after].start >= spans[earlier].end - EPS, (earlier, after)
        outcomes["ran"] += 1

    check()
    assert outcomes["ran"] >= 10, f"{name}: only {outcomes['ran']} real cases ({outcomes['rejected']} rejected)"
