"""The simulator against closed forms, hand-worked timelines and the paper's ablation switches."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpipe.schedule import Op, Schedule, ScheduleError, Task, gpipe, one_f_one_b, parse_tasks
from gpipe.schedule.timeline import COPY, Timeline
from sim.calibration.host import ExecutorCosts, ExecutorStage, Overheads, with_overheads
from sim.core.config import SimConfig
from sim.core.copies import ON_COMPUTE
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate
from sim.core.link import LinkSpec

GRID = [(m, n) for m in (1, 2, 3, 5, 8, 13) for n in (1, 2, 3, 4, 7)]
COSTS = [(1, 2), (2, 3), (1, 1), (3, 1)]


def spans(tl: Timeline, device: int) -> list[tuple[str, float, float]]:
    return [(str(s.task), s.start, s.end) for s in tl.compute_spans(device)]


# -- closed forms -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("m", "n"), GRID)
@pytest.mark.parametrize(("tf", "tb"), COSTS)
def test_gpipe_makespan_and_bubble_closed_form(m: int, n: int, tf: int, tb: int) -> None:
    tl = simulate(gpipe(m, n, "never"), CostModel.uniform(n, tf, tb))
    assert tl.makespan == (m + n - 1) * (tf + tb)
    assert all(tl.busy(d) == m * (tf + tb) for d in range(n))
    assert tl.bubble_fraction() == pytest.approx((n - 1) / (m + n - 1), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(("m", "n"), GRID)
@pytest.mark.parametrize(("tf", "tb"), COSTS)
def test_1f1b_has_the_same_makespan(m: int, n: int, tf: int, tb: int) -> None:
    tl = simulate(one_f_one_b(m, n, "never"), CostModel.uniform(n, tf, tb))
    assert tl.makespan == (m + n - 1) * (tf + tb)


def test_small_gpipe_timeline_exactly() -> None:
    tl = simulate(gpipe(3, 2, "never"), CostModel.uniform(2, 1, 2))
    assert spans(tl, 0) == [("F0@0", 0, 1), ("F1@0", 1, 2), ("F2@0", 2, 3),
                            ("B2@0", 6, 8), ("B1@0", 8, 10), ("B0@0", 10, 12)]
    assert spans(tl, 1) == [("F0@1", 1, 2), ("F1@1", 2, 3), ("F2@1", 3, 4),
                            ("B2@1", 4, 6), ("B1@1", 6, 8), ("B0@1", 8, 10)]
    assert tl.copy_spans() == []  # free copies leave no span
    assert tl.source == "simulated"
    assert tl.meta["schedule"] == "gpipe" and tl.meta["m"] == 3 and tl.meta["n"] == 2
    assert tl.meta["checkpoint"] == "never"


def test_recompute_runs_before_the_gradient_arrives() -> None:
    # R(i, j) needs only F(i, j): on stage 0, R6 runs while B7@0 still waits for its gradient
    tl = simulate(gpipe(8, 4, "always"), CostModel.uniform(4, 1, 2))
    r7, b7 = tl.span_of(Task(Op.R, 7, 0)), tl.span_of(Task(Op.B, 7, 0))
    assert r7.start == 8 and b7.start == 18  # stage 0 ended its forwards at 8, the gradient came at 18
    assert tl.makespan == 41  # 8 forwards, then (R + B) = 3 per micro-batch behind the last stage


def test_overheads_and_microbatch_scale() -> None:
    cost = with_overheads(CostModel.uniform(1, 2, 4), Overheads(task=0.5))
    cost = replace(cost, microbatch_scale=(1.0, 0.5))
    tl = simulate(gpipe(2, 1, "never"), cost)
    assert spans(tl, 0) == [("F0@0", 0, 2.5), ("F1@0", 2.5, 4), ("B1@0", 4, 6.5), ("B0@0", 6.5, 11)]


# -- memory -----------------------------------------------------------------------------------------

SAVED, INPUT = 1000, 7  # bytes per micro-batch: all activations, and the stage input (checkpointed)


@pytest.mark.parametrize(("m", "n"), GRID)
def test_1f1b_holds_at_most_n_minus_j_microbatches_gpipe_all(m: int, n: int) -> None:
    cost = CostModel.uniform(n, 1, 2, saved_bytes=SAVED, checkpoint_bytes=INPUT)
    f1b = simulate(one_f_one_b(m, n, "never"), cost)
    gp = simulate(gpipe(m, n, "never"), cost)
    for j in range(n):
        assert f1b.peak_memory(j) == min(m, n - j) * SAVED
        assert gp.peak_memory(j) == m * SAVED


@pytest.mark.parametrize(("m", "n"), GRID)
def test_checkpointing_holds_inputs_plus_one_recompute(m: int, n: int) -> None:
    cost = CostModel.uniform(n, 1, 2, saved_bytes=SAVED, checkpoint_bytes=INPUT)
    always = simulate(gpipe(m, n, "always"), cost)
    except_last = simulate(gpipe(m, n, "except_last"), cost)
    f1b = simulate(one_f_one_b(m, n, "always"), cost)
    for j in range(n):
        assert always.peak_memory(j) == m * INPUT + SAVED
        assert except_last.peak_memory(j) == (m - 1) * INPUT + SAVED
        assert f1b.peak_memory(j) == min(m, n - j) * INPUT + SAVED


def test_memory_samples_follow_the_tasks() -> None:
    cost = CostModel.uniform(1, 1, 2, saved_bytes=SAVED, checkpoint_bytes=INPUT)
    tl = simulate(gpipe(2, 1, "except_last"), cost)
    # F0 [0,1] keeps its input; F1 [1,2] keeps everything (last micro-batch); B1 [2,4] frees it;
    # R0 [4,5] recomputes from its start; B0 [5,7] frees all
    assert tl.memory_series(0) == [(0, 0), (1, INPUT), (2, INPUT + SAVED), (4, INPUT), (4, INPUT + SAVED), (7, 0)]


def test_model_state_per_device_in_meta() -> None:
    stages = [StageCost(1, 2, parameter_bytes=10 * (j + 1), gradient_bytes=1, optimizer_bytes=100) for j in range(3)]
    tl = simulate(gpipe(2, 3, "never", placement=[0, 0, 1]), CostModel(tuple(stages)))
    assert tl.meta["model_state_bytes"] == [10 + 20 + 2 * 101, 30 + 101]


def test_scaled_microbatches_scale_their_bytes() -> None:
    cost = replace(CostModel.uniform(1, 1, 1, saved_bytes=100), microbatch_scale=(1.0, 0.25))
    tl = simulate(gpipe(2, 1, "never"), cost)
    assert tl.peak_memory(0) == 125


# -- copies -----------------------------------------------------------------------------------------


def test_copies_on_copy_streams_overlap_compute_exactly() -> None:
    tl = simulate(gpipe(4, 2, "never"), CostModel.uniform(2, 1, 2, copy_seconds=0.5))
    assert spans(tl, 0)[:4] == [(f"F{i}@0", i, i + 1) for i in range(4)]  # the sender never waits
    assert [(str(s.task), s.start, s.end) for s in tl.copy_spans(1)] == [
        (f"F{i}@0", i + 1, i + 1.5) for i in range(4)]
    assert [str(s.task) for s in tl.copy_spans(0)] == ["B3@1", "B2@1", "B1@1", "B0@1"]
    assert all(s.stream == COPY and s.label == "" for s in tl.copy_spans())
    assert tl.makespan == 16


def test_copy_streams_are_strictly_cheaper_than_copies_on_compute() -> None:
    schedule, cost = gpipe(4, 2, "never"), CostModel.uniform(2, 1, 2, copy_seconds=0.5)
    streams = simulate(schedule, cost)
    compute = simulate(schedule, cost, SimConfig(copy_streams=False))
    assert streams.makespan < compute.makespan
    copies = compute.copy_spans()
    assert len(copies) == 8 and all(c.label == ON_COMPUTE for c in copies)
    for c in copies:  # a copy on the compute streams overlaps no compute of its sender or receiver
        sender = schedule.device_of(c.task.stage)
        for s in compute.compute_spans(sender) + compute.compute_spans(c.device):
            assert c.end <= s.start or s.end <= c.start


@pytest.mark.parametrize("kind", [gpipe, one_f_one_b])
@pytest.mark.parametrize(("m", "n"), [(2, 2), (4, 3), (8, 4)])
def test_copies_on_compute_never_beat_copy_streams(kind: object, m: int, n: int) -> None:
    schedule = kind(m, n, "except_last")  # type: ignore[operator]
    cost = CostModel.uniform(n, 1, 2, copy_seconds=0.25)
    assert simulate(schedule, cost, SimConfig(copy_streams=False)).makespan > simulate(schedule, cost).makespan


def test_free_copies_cost_nothing_on_either_stream() -> None:
    schedule, cost = gpipe(5, 3, "never"), CostModel.uniform(3, 1, 2)
    assert simulate(schedule, cost, SimConfig(copy_streams=False)).spans == simulate(schedule, cost).spans


def test_link_prices_copies_by_bytes_and_fifo_serialises_them() -> None:
    link = LinkSpec("slow", 0.5, 1.0)  # a copy of b bytes takes 0.5 + b seconds
    cost = CostModel.uniform(2, 1, 1, copy_seconds=None, send_bytes=2)
    tl = simulate(gpipe(3, 2, "never"), cost, SimConfig(link=link))
    # copies take 2.5 s each but the sender issues one per second: they queue on the 0 -> 1 link
    assert [(s.start, s.end) for s in tl.copy_spans(1)] == [(1, 3.5), (3.5, 6), (6, 8.5)]
    assert tl.meta["link"] == "slow"
    # a fixed copy time in the cost model wins over the link
    fixed = simulate(gpipe(3, 2, "never"), replace(cost, copy_seconds=0.0), SimConfig(link=link))
    assert fixed.makespan == (3 + 2 - 1) * 2


def test_activations_and_gradients_do_not_share_a_direction() -> None:
    tl = simulate(one_f_one_b(3, 2, "never"), CostModel.uniform(2, 1, 1, copy_seconds=3.0))
    down, up = tl.copy_spans(1), tl.copy_spans(0)
    assert [(s.start, s.end) for s in down[:2]] == [(1, 4), (4, 7)]  # F1@0 queues behind F0@0
    assert (up[0].start, up[0].end) == (6, 9)  # B0@1's gradient leaves at once, beside F1@0's copy
    assert all(s.task.op is Op.F for s in down) and all(s.task.op is Op.B for s in up)
    for same_way in (down, up):  # FIFO: one copy at a time per direction
        assert all(a.end <= b.start for a, b in zip(same_way, same_way[1:], strict=False))
    assert any(a.start < b.end and b.start < a.end for a in down for b in up)  # full duplex


def test_handoff_delays_the_consumer_not_the_link() -> None:
    cost = with_overheads(CostModel.uniform(2, 1, 1, copy_seconds=0.5), Overheads(handoff=0.25))
    tl = simulate(gpipe(2, 2, "never"), cost)
    assert tl.span_of(Task(Op.F, 0, 1)).start == 1.75
    assert [(s.start, s.end) for s in tl.copy_spans(1)] == [(1, 1.5), (2, 2.5)]


def test_same_device_stages_need_no_copy() -> None:
    tl = simulate(gpipe(3, 2, "never", placement=[0, 0]), CostModel.uniform(2, 1, 2, copy_seconds=5.0))
    assert tl.copy_spans() == [] and tl.makespan == 3 * 2 * 3


# -- the ablation switches --------------------------------------------------------------------------


def test_lockstep_waits_for_the_previous_clock_cycle() -> None:
    schedule, cost = gpipe(4, 2, "never"), CostModel.uniform(2, 1, 2, copy_seconds=0.5)
    free = simulate(schedule, cost)
    lock = simulate(schedule, cost, SimConfig(lockstep_forward=True))
    # cycle 2 (F2@0) waits for F0@1 of cycle 1, which waited for its copy
    assert lock.span_of(Task(Op.F, 2, 0)).start == free.span_of(Task(Op.F, 0, 1)).end == 2.5
    assert lock.makespan == free.makespan + 0.5
    assert simulate(schedule, CostModel.uniform(2, 1, 2), SimConfig(lockstep_forward=True)).makespan == 15


def test_no_fork_join_delays_gradients_behind_the_next_backward() -> None:
    tl = simulate(gpipe(2, 2, "never"), CostModel.uniform(2, 1, 2), SimConfig(enforce_backward_order=False))
    # B1@1's gradient leaves only when B0@1 ends (7); B0@1 is the device's last backward: at once
    assert spans(tl, 0) == [("F0@0", 0, 1), ("F1@0", 1, 2), ("B1@0", 7, 9), ("B0@0", 9, 11)]
    assert tl.makespan == 11 > (2 + 2 - 1) * 3


@pytest.mark.parametrize("kind", [gpipe, one_f_one_b])
@pytest.mark.parametrize(("m", "n"), [(1, 1), (2, 3), (5, 2), (8, 4), (6, 6)])
@pytest.mark.parametrize("copy", [0.0, 0.4])
def test_ablations_are_never_faster(kind: object, m: int, n: int, copy: float) -> None:
    schedule = kind(m, n, "except_last")  # type: ignore[operator]
    cost = CostModel.from_lists([1, 2, 1, 3, 1, 2][:n], [2, 3, 2, 5, 2, 3][:n], copy_seconds=copy)
    base = simulate(schedule, cost).makespan
    for config in (SimConfig(lockstep_forward=True), SimConfig(enforce_backward_order=False),
                   SimConfig(lockstep_forward=True, enforce_backward_order=False)):
        assert simulate(schedule, cost, config).makespan >= base - 1e-12


def test_no_fork_join_with_shared_devices_does_not_deadlock() -> None:
    # B(i, 2) -> B(i, 1) -> B(i, 0) with stages 0 and 2 on device 0: the next backward on device 0
    # waits for the very gradient held back; the copy is issued when nothing else can run
    schedule = gpipe(3, 3, "never", placement=[0, 1, 0])
    tl = simulate(schedule, CostModel.uniform(3, 1, 2), SimConfig(enforce_backward_order=False))
    assert len(tl.compute_spans()) == len(list(schedule.all_tasks()))


def test_lockstep_that_stalls_is_reported() -> None:
    tasks = parse_tasks("F0@0 F1@0 F2@0 F0@1 F1@1 F2@1 B2@1 B2@0 B1@1 B1@0 B0@1 B0@0")
    schedule = Schedule(3, 2, "never", (0, 0), (tasks,)).validate()
    assert simulate(schedule, CostModel.uniform(2, 1, 1)).makespan == 12
    with pytest.raises(ScheduleError, match="lockstep_forward.*F2@0"):
        simulate(schedule, CostModel.uniform(2, 1, 1), SimConfig(lockstep_forward=True))


# -- contention -------------------------------------------------------------------------------------


def test_contention_zero_changes_nothing() -> None:
    schedule, cost = one_f_one_b(6, 3, "always"), CostModel.uniform(3, 1, 2, copy_seconds=0.3)
    plain = simulate(schedule, cost)
    zero = simulate(schedule, with_overheads(cost, Overheads(contention=0.0)))
    assert plain.spans == zero.spans


def test_contention_is_exact_processor_sharing() -> None:
    cost = with_overheads(CostModel.from_lists([1, 2], [1, 1]), Overheads(contention=1.0))
    tl = simulate(gpipe(2, 2, "never"), cost)
    # two devices at once run at half speed: F1@0 (work 1) and F0@1 (work 2) share [1, 3], then F0@1
    # finishes its last unit alone; B1@0 and B0@1 share [7, 9]
    expected = {"F0@0": (0, 1), "F1@0": (1, 3), "F0@1": (1, 4), "F1@1": (4, 6), "B1@1": (6, 7),
                "B1@0": (7, 9), "B0@1": (7, 9), "B0@0": (9, 10)}
    got = {str(s.task): (s.start, s.end) for s in tl.compute_spans()}
    assert got.keys() == expected.keys()
    for key, (start, end) in expected.items():
        assert got[key] == (pytest.approx(start), pytest.approx(end)), key


def test_contention_stretches_stage_seconds_not_host_seconds() -> None:
    # Note [host seconds share nothing]: every task has 0.5 host seconds on top of its stage seconds.
    # F1@0 (1 + 0.5) and F0@1 (2 + 0.5) start together at 1.5: F1@0 takes 0.5 + 1 * (1 + 1) = 2.5
    # (rate 1 / (1 + 1/1.5)); F0@1 runs at 1 / (1 + 2/2.5) meanwhile and its last 2.5 - 2.5/1.8 alone.
    # B1@0 and B0@1 (1 + 0.5 each) take 2.5 s side by side.
    cost = with_overheads(CostModel.from_lists([1, 2], [1, 1]), Overheads(contention=1.0, task=0.5))
    tl = simulate(gpipe(2, 2, "never"), cost)
    f01 = 4.0 + 2.5 - 2.5 / 1.8
    expected = {"F0@0": (0, 1.5), "F1@0": (1.5, 4.0), "F0@1": (1.5, f01), "F1@1": (f01, f01 + 2.5),
                "B1@1": (f01 + 2.5, f01 + 4), "B1@0": (f01 + 4, f01 + 6.5), "B0@1": (f01 + 4, f01 + 6.5),
                "B0@0": (f01 + 6.5, f01 + 8)}
    got = {str(s.task): (s.start, s.end) for s in tl.compute_spans()}
    assert got.keys() == expected.keys()
    for key, (start, end) in expected.items():
        assert got[key] == (pytest.approx(start), pytest.approx(end)), key


def test_contention_slows_but_never_speeds() -> None:
    schedule = gpipe(6, 4, "except_last")
    cost = CostModel.uniform(4, 1, 2, copy_seconds=0.1)
    base = simulate(schedule, cost)
    slow = simulate(schedule, with_overheads(cost, Overheads(contention=0.5)))
    assert slow.makespan > base.makespan
    nominal = {s.task: s.duration for s in base.compute_spans()}
    for s in slow.compute_spans():
        assert nominal[s.task] - 1e-9 <= s.duration <= nominal[s.task] * (1 + 0.5 * 3) + 1e-9


# -- errors -----------------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="3 stages but the schedule has 2"):
        simulate(gpipe(2, 2), CostModel.uniform(3, 1, 1))
    with pytest.raises(ValueError, match="scales 1 micro-batches but the schedule has 2"):
        simulate(gpipe(2, 2), replace(CostModel.uniform(2, 1, 1), microbatch_scale=(1.0,)))
    broken = Schedule(2, 1, "never", (0,), (parse_tasks("F0@0 B0@0 F1@0"),))
    with pytest.raises(ScheduleError, match="missing B1@0"):
        simulate(broken, CostModel.uniform(1, 1, 1))
    with pytest.raises(TypeError, match="LinkSpec"):
        SimConfig(link="pcie4-x16")  # type: ignore[arg-type]


def test_simulate_never_mutates_its_inputs() -> None:
    schedule, cost = gpipe(4, 3, "except_last"), CostModel.uniform(3, 1, 2, copy_seconds=0.5)
    before = (schedule.tasks, cost.stages)
    first = simulate(schedule, cost, SimConfig(copy_streams=False))
    assert (schedule.tasks, cost.stages) == before
    assert simulate(schedule, cost, SimConfig(copy_streams=False)).spans == first.spans  # no state carried over


@pytest.mark.parametrize("checkpoint", ["always", "never"])
def test_stage_host_seconds_are_added_to_each_kind_of_task(checkpoint: str) -> None:
    """F not checkpointed and R get host_forward, checkpointed F host_nograd, B host_backward, on top of
    Overheads.task; the first task of each phase thread_start too (two phases: GPipe's forward(), then backward)."""
    stage = StageCost(forward=2.0, backward=3.0, forward_checkpointed=1.0)
    host = ExecutorStage(host_forward=0.5, host_nograd=0.25, host_backward=0.75, thread_start=4.0)
    cost = CostModel(stages=(stage,), runner=ExecutorCosts(Overheads(task=0.125), (host,)))
    timeline = simulate(gpipe(2, 1, checkpoint), cost, SimConfig(backward_after_forward=True))  # type: ignore[arg-type]
    durations = {str(s.task): s.duration for s in timeline.spans}
    if checkpoint == "always":
        assert durations == {"F0@0": 1.0 + 0.25 + 0.125 + 4.0, "F1@0": 1.0 + 0.25 + 0.125,
                             "R1@0": 2.0 + 0.5 + 0.125 + 4.0, "B1@0": 3.0 + 0.75 + 0.125,
                             "R0@0": 2.0 + 0.5 + 0.125, "B0@0": 3.0 + 0.75 + 0.125}
    else:
        assert durations == {"F0@0": 2.0 + 0.5 + 0.125 + 4.0, "F1@0": 2.0 + 0.5 + 0.125,
                             "B1@0": 3.0 + 0.75 + 0.125 + 4.0, "B0@0": 3.0 + 0.75 + 0.125}


def test_stage_host_seconds_must_be_finite_and_not_negative() -> None:
    with pytest.raises(ValueError, match="host_backward"):
        ExecutorStage(host_backward=-1.0)
