"""Asynchronous devices and shared streams in the simulator (sim.core.device, Note [asynchronous devices]).

Closed forms: with kernels longer than the host's work the host hides behind them; with the host slower,
the stream waits for it; with no host costs at all, an asynchronous device is a synchronous one.
"""

from __future__ import annotations

import itertools

import pytest

from gpipe.schedule import Op, Task, gpipe, one_f_one_b
from gpipe.schedule.timeline import Timeline
from sim.calibration.host import ExecutorCosts, ExecutorStage, Overheads, with_overheads
from sim.core.config import SimConfig
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate

ALL = frozenset(range(4))


def spans(tl: Timeline, device: int) -> list[tuple[str, float, float]]:
    return [(str(s.task), s.start, s.end) for s in tl.compute_spans(device)]


@pytest.mark.parametrize("m", [1, 3])
def test_long_kernels_hide_the_host(m: int) -> None:
    """Host 0.25 s per task and 0.125 s between tasks, kernels of 1 s and 2 s: the stream never waits
    after the launch, so the step (first start to last end) is the kernels, while a synchronous device
    adds every host term."""
    cost = with_overheads(CostModel.uniform(1, 1, 2), Overheads(task=0.25, gap=0.125, launch=0.5))
    schedule = gpipe(m, 1, "never")
    asynchronous = simulate(schedule, cost, SimConfig(asynchronous=ALL & {0}))
    synchronous = simulate(schedule, cost)
    assert asynchronous.makespan == 3 * m
    assert synchronous.makespan == m * (3 + 2 * 0.25) + (2 * m - 1) * 0.125
    assert spans(asynchronous, 0)[0] == ("F0@0", 0.5, 1.5)
    assert all(b[1] == a[2] for a, b in itertools.pairwise(spans(asynchronous, 0)))  # back to back


def test_a_slow_host_paces_the_stream() -> None:
    """Kernels of 0.25 s, host 1 s per task, 0.5 s between tasks: each span lasts from its issue to the
    end of its host work, and the step is the launch plus every task's and gap's host time."""
    cost = with_overheads(CostModel.uniform(1, 0.25, 0.25), Overheads(task=1.0, gap=0.5, launch=0.5))
    tl = simulate(gpipe(2, 1, "never"), cost, SimConfig(asynchronous=frozenset({0})))
    assert spans(tl, 0) == [("F0@0", 0.5, 1.5), ("F1@0", 2.0, 3.0), ("B1@0", 3.5, 4.5), ("B0@0", 5.0, 6.0)]


@pytest.mark.parametrize("make", [gpipe, one_f_one_b])
@pytest.mark.parametrize(("m", "n"), [(1, 2), (4, 2), (3, 4)])
@pytest.mark.parametrize("checkpoint", ["never", "always"])
def test_without_host_costs_asynchronous_is_synchronous(make: object, m: int, n: int, checkpoint: str) -> None:
    schedule = make(m, n, checkpoint)  # type: ignore[operator]
    cost = CostModel.from_lists([1.0, 0.5, 2.0, 1.5][:n], [2.0, 1.0, 3.0, 2.5][:n], copy_seconds=0.25)
    synchronous = simulate(schedule, cost)
    asynchronous = simulate(schedule, cost, SimConfig(asynchronous=frozenset(range(n))))
    assert asynchronous.spans == synchronous.spans
    assert asynchronous.memory == synchronous.memory


def test_the_backward_phase_opens_on_the_host() -> None:
    """Two phases: the host's backward starts ``turnaround`` after its last forward was issued, but the
    stream still runs the forwards' kernels then, so the first backward starts when they end."""
    cost = with_overheads(CostModel.uniform(1, 2, 2), Overheads(task=0.25, turnaround=1.0))
    config = SimConfig(backward_after_forward=True, asynchronous=frozenset({0}))
    tl = simulate(gpipe(2, 1, "never"), cost, config)
    # the host issued F1 by 0.5 and opens the backward phase at 1.5; the stream ends F1 at 4
    assert tl.span_of(Task(Op.B, 1, 0)).start == 4.0
    assert tl.makespan == 8.0
    # a synchronous device waits for the turnaround after its last forward, and pays every host term
    assert simulate(gpipe(2, 1, "never"), cost, SimConfig(backward_after_forward=True)).makespan == 4.5 + 1 + 4.5


def test_hand_offs_reach_the_next_host_after_the_producers_host() -> None:
    """Stage 1's host takes F0's output at the producer's host end plus the hand-off; its stream waits for
    the producer's kernels and the copy."""
    cost = with_overheads(CostModel.uniform(2, 2, 2, copy_seconds=0.5), Overheads(task=0.25, handoff=3.0))
    tl = simulate(gpipe(1, 2, "never"), cost, SimConfig(asynchronous=frozenset({0, 1})))
    # host of stage 0 ends F0 at 0.25, so stage 1's host issues at 3.25; the copy arrived at 2.5
    assert tl.span_of(Task(Op.F, 0, 1)).start == 3.25
    assert tl.span_of(Task(Op.F, 0, 0)).end == 2.0


def test_shared_streams_run_one_task_at_a_time() -> None:
    """Two stages on one GPU's stream: the step is the sum of every task, and no two spans overlap."""
    cost = CostModel.uniform(2, 1, 2)
    tl = simulate(gpipe(4, 2, "never"), cost, SimConfig(shared_streams=(0, 0)))
    assert tl.makespan == 4 * 2 * 3
    intervals = sorted((s.start, s.end) for s in tl.compute_spans())
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(intervals))
    # separate streams overlap the stages
    assert simulate(gpipe(4, 2, "never"), cost, SimConfig(shared_streams=(0, 1))).makespan == (4 + 1) * 3


def test_shared_streams_with_copies_on_compute_do_not_deadlock() -> None:
    cost = CostModel.uniform(3, 1, 2, copy_seconds=0.5)
    config = SimConfig(copy_streams=False, shared_streams=(0, 0, 1), asynchronous=frozenset({0, 1, 2}))
    tl = simulate(gpipe(3, 3, "except_last"), cost, config)
    assert len(tl.compute_spans()) == len(list(itertools.chain.from_iterable(gpipe(3, 3).tasks)))


def test_bad_configs_are_refused() -> None:
    cost = CostModel.uniform(2, 1, 1)
    with pytest.raises(ValueError, match="asynchronous names device 2"):
        simulate(gpipe(2, 2), cost, SimConfig(asynchronous=frozenset({2})))
    with pytest.raises(ValueError, match="device indices"):
        SimConfig(asynchronous=frozenset({-1}))
    with pytest.raises(ValueError, match="shared_streams has 3 entries"):
        simulate(gpipe(2, 2), cost, SimConfig(shared_streams=(0, 0, 1)))


def test_executor_config_marks_cuda_devices_and_shared_gpus() -> None:
    from sim.calibration.executor_costs import executor_config

    assert executor_config(["cpu", "cpu"]) == SimConfig(overlap_pairs=False)  # workers run a pair in turn
    assert executor_config(["cpu", "cpu"], two_phases=True) == SimConfig(backward_after_forward=True,
                                                                         overlap_pairs=False)
    one = executor_config(["cuda:0", "cuda:1"])
    assert one.asynchronous == {0, 1} and one.shared_streams is None
    shared = executor_config(["cuda:0", "cpu", "cuda:0", "cuda:1"])
    assert shared.asynchronous == {0, 2, 3}
    assert shared.shared_streams == (0, 3, 0, 1)


def test_issue_seconds_pace_an_asynchronous_host_only() -> None:
    """A task's launch (StageCost.issue_*) is host time on an asynchronous device: with 1 s of launching and
    0.25 s of kernels each task lasts its launch; a synchronous device ignores it (its host's work is the task)."""
    stage = StageCost(0.25, 0.25, forward_checkpointed=0.25)
    issue = ExecutorStage(issue_forward=1.0, issue_nograd=0.5, issue_backward=1.0)
    cost = CostModel((stage,), runner=ExecutorCosts(stages=(issue,)))
    tl = simulate(gpipe(2, 1, "except_last"), cost, SimConfig(asynchronous=frozenset({0})))
    assert spans(tl, 0) == [("F0@0", 0.0, 0.5), ("F1@0", 0.5, 1.5), ("B1@0", 1.5, 2.5), ("R0@0", 2.5, 3.5),
                            ("B0@0", 3.5, 4.5)]
    assert simulate(gpipe(2, 1, "except_last"), cost).makespan == 5 * 0.25
