"""An overlapped pair shares its device: closed forms of its timing, and DualPipeV simulated."""

from __future__ import annotations

import dataclasses

import pytest

from gpipe.schedule import dualpipe_v
from sim.core.config import SimConfig
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate
from sim.core.sharing import pair_ends
from tests.test_dualpipe import _torch_order, paired


def test_pair_ends_closed_form() -> None:
    """Both at half speed until the shorter is done (2 min), the longer at full speed after: a + b in all."""
    assert pair_ends(10.0, 1.0, 3.0) == (12.0, 14.0)
    assert pair_ends(10.0, 3.0, 1.0) == (14.0, 12.0)
    assert pair_ends(0.0, 2.0, 2.0) == (4.0, 4.0)
    assert pair_ends(5.0, 0.0, 2.0) == (5.0, 7.0)


def test_a_pair_on_one_device_takes_both_tasks_seconds() -> None:
    """dev0: F0@0 (1 s), F0@1 (1 s), then F1@0 (1 s) beside B0@1 (3 s) from t=2: F1@0 ends at 2 + 2*1, B0@1 at
    2 + 1 + 3; then F1@1, B1@1, B1@0, B0@0 one after the other."""
    s = paired(2, 2, ["F0@0 F0@1 F1@0+B0@1 F1@1 B1@1 B1@0 B0@0"], placement=(0, 0))
    tl = simulate(s, CostModel((StageCost(1.0, 3.0), StageCost(1.0, 3.0))))
    times = {str(span.task): (span.start, span.end) for span in tl.compute_spans()}
    assert times == {"F0@0": (0, 1), "F0@1": (1, 2), "F1@0": (2, 4), "B0@1": (2, 6), "F1@1": (6, 7),
                     "B1@1": (7, 10), "B1@0": (10, 13), "B0@0": (13, 16)}
    assert tl.makespan == 2 * 2 * (1 + 3) and tl.busy(0) == tl.makespan  # the pair is not free
    assert tl.task_order(0) == list(s.tasks[0])  # F1@0 starts with B0@1 and ends first


@pytest.mark.parametrize("m", [2, 3, 6])
def test_dualpipe_v_on_one_device_is_all_its_work(m: int) -> None:
    """p = 1: every dependency stays on the one device and its list is a valid order, so it never idles; a pair
    costs t_F + t_B, so the makespan is 2m (t_F + t_B + t_W)."""
    f, b, w = 1.5, 2.0, 0.75
    tl = simulate(dualpipe_v(m, 2), CostModel((StageCost(f, b, weight=w),) * 2))
    assert tl.makespan == pytest.approx(2 * m * (f + b + w), abs=1e-12)


@pytest.mark.parametrize(("m", "p"), [(4, 2), (7, 2), (6, 3), (10, 4)])
def test_dualpipe_v_is_no_slower_than_torch_s_order(m: int, p: int) -> None:
    """Torch's ScheduleDualPipeV order, in our type, simulated on the same costs (copies take time too)."""
    s = dualpipe_v(m, 2 * p)
    lists, pairs = _torch_order(m, p)
    theirs = dataclasses.replace(s, tasks=lists, pairs=tuple(pairs), name="torch-dualpipe-v")
    cost = CostModel(tuple(StageCost(1.0, 1.25, weight=0.5) for _ in range(2 * p)), copy_seconds=0.1)
    ours = simulate(s, cost)
    assert ours.makespan <= simulate(theirs, cost).makespan
    work = 2 * m * (1.0 + 1.25 + 0.5)  # each device's compute, pairs included
    assert all(ours.busy(d) == pytest.approx(work) for d in range(p)) and ours.makespan >= work


def test_pairs_are_refused_where_they_are_not_modelled() -> None:
    s, cost = dualpipe_v(4, 4), CostModel.uniform(4, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"overlaps pairs of tasks.*SimConfig\(copy_streams=True\)"):
        simulate(s, cost, SimConfig(copy_streams=False))
    with pytest.raises(ValueError, match="without lockstep_forward"):
        simulate(s, cost, SimConfig(lockstep_forward=True))


def test_pairs_in_turn_run_as_the_executor_runs_them() -> None:
    """SimConfig(overlap_pairs=False): a pair's two tasks one after the other, in list order, on every path (the
    test above's schedule: F1@0 from 2 to 3, then B0@1 from 3 to 6; the same makespan, each ends later or sooner)."""
    s = paired(2, 2, ["F0@0 F0@1 F1@0+B0@1 F1@1 B1@1 B1@0 B0@0"], placement=(0, 0))
    cost = CostModel((StageCost(1.0, 3.0), StageCost(1.0, 3.0)))
    tl = simulate(s, cost, SimConfig(overlap_pairs=False))
    times = {str(span.task): (span.start, span.end) for span in tl.compute_spans()}
    assert times["F1@0"] == (2, 3) and times["B0@1"] == (3, 6) and tl.makespan == 16
    in_turn = simulate(dualpipe_v(4, 4), CostModel.uniform(4, 1.0, 1.0), SimConfig(copy_streams=False,
                                                                                    overlap_pairs=False))
    assert [in_turn.task_order(d) for d in range(2)] == [list(ts) for ts in dualpipe_v(4, 4).tasks]
