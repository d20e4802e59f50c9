"""What the simulator knows about the executor, and how calibration learns it.

Exact timelines for the executor's costs in :mod:`sim.core.engine` (the two phases, the gap between a
worker's tasks, the host costs of recording, measured pairwise contention), then the calibration
functions that measure them on this machine, the executor included.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import nn

from gpipe.schedule import Op, ScheduleError, Task, gpipe, one_f_one_b
from gpipe.schedule.timeline import Timeline
from sim.calibration.calibrate import _Scale, calibrate, calibrate_executor_overheads
from sim.calibration.host import ExecutorCosts, ExecutorStage, Overheads, executor_costs, with_overheads
from sim.calibration.primitives import count_saved_tensors, measure_saved_tensor_cost
from sim.calibration.thread_costs import measure_stage_extras
from sim.core.config import SimConfig
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate

TWO_PHASES = SimConfig(backward_after_forward=True)


def spans(tl: Timeline, device: int) -> list[tuple[str, float, float]]:
    return [(str(s.task), s.start, s.end) for s in tl.compute_spans(device)]


# -- the simulator's model of the executor -----------------------------------------------------------


def test_the_backward_phase_waits_for_every_forward_and_the_turnaround() -> None:
    cost = with_overheads(CostModel.uniform(2, 1, 2), Overheads(turnaround=0.5))
    tl = simulate(gpipe(2, 2, "always"), cost, TWO_PHASES)
    # the forwards as ever; the recomputes wait for the last forward (3) plus the turnaround
    assert spans(tl, 0) == [("F0@0", 0, 1), ("F1@0", 1, 2), ("R1@0", 3.5, 4.5), ("B1@0", 6.5, 8.5),
                            ("R0@0", 8.5, 9.5), ("B0@0", 9.5, 11.5)]
    assert spans(tl, 1) == [("F0@1", 1, 2), ("F1@1", 2, 3), ("R1@1", 3.5, 4.5), ("B1@1", 4.5, 6.5),
                            ("R0@1", 6.5, 7.5), ("B0@1", 7.5, 9.5)]
    free = simulate(gpipe(2, 2, "always"), cost)  # without the switch the turnaround is not used
    assert free.span_of(Task(Op.R, 1, 0)).start == 2


def test_two_phases_need_the_forwards_first() -> None:
    with pytest.raises(ScheduleError, match="backward_after_forward needs every device to run its forwards first"):
        simulate(one_f_one_b(4, 2), CostModel.uniform(2, 1, 2), TWO_PHASES)


def test_a_worker_pays_the_gap_between_two_tasks() -> None:
    cost = with_overheads(CostModel.uniform(1, 1, 2), Overheads(gap=0.25))
    tl = simulate(gpipe(2, 1, "never"), cost)
    assert spans(tl, 0) == [("F0@0", 0, 1), ("F1@0", 1.25, 2.25), ("B1@0", 2.5, 4.5), ("B0@0", 4.75, 6.75)]


def test_a_hand_off_and_the_gap_do_not_add_up() -> None:
    # F0@1 waits for F0@0's hand-off (1 + 0.5); F1@1 waits for the gap after F0@1 (2.5 + 0.1) and
    # for F1@0's hand-off (2 + 0.5): the later of the two, not their sum
    cost = with_overheads(CostModel.uniform(2, 1, 1), Overheads(handoff=0.5, gap=0.1))
    tl = simulate(gpipe(2, 2, "never"), cost)
    assert spans(tl, 1)[:2] == [("F0@1", 1.5, 2.5), ("F1@1", 2.6, 3.6)]


def test_recording_costs_grad_enabled_forwards_only_and_does_not_scale() -> None:
    stage = StageCost(forward=1.0, backward=2.0, forward_checkpointed=0.5)
    host = Overheads(task=0.125, recording=0.25, per_saved_tensor=0.0125,  # recorded forward: + 0.5
                     per_unpacked_tensor=0.025)  # backward: + 0.25
    cost = CostModel((stage,), runner=ExecutorCosts(host, (ExecutorStage(saved_tensors=10),)))
    tl = simulate(gpipe(2, 1, "except_last"), cost)
    durations = {str(s.task): s.duration for s in tl.compute_spans()}
    assert durations == pytest.approx({"F0@0": 0.625, "F1@0": 1.5, "B1@0": 2.375, "R0@0": 1.5, "B0@0": 2.375})
    half = simulate(gpipe(2, 1, "except_last"), replace(cost, microbatch_scale=(1.0, 0.5)))
    assert half.span_of(Task(Op.F, 1, 0)).duration == pytest.approx(0.5 + 0.5)  # stage seconds halve, host not


def test_measured_recorded_seconds_replace_the_per_tensor_estimate() -> None:
    stage = StageCost(forward=1.0, backward=2.0, forward_checkpointed=0.5)
    recorded = ExecutorStage(saved_tensors=10, forward_recorded=1.75, backward_recorded=2.5)
    host = Overheads(task=0.125, recording=0.25, per_saved_tensor=0.0125, per_unpacked_tensor=0.025)
    tl = simulate(gpipe(2, 1, "except_last"), CostModel((stage,), runner=ExecutorCosts(host, (recorded,))))
    durations = {str(s.task): s.duration for s in tl.compute_spans()}
    # recorded F and R: 1.75 + task + recording; B: 2.5 + task; the checkpointed F is not recorded
    assert durations == pytest.approx({"F0@0": 0.625, "F1@0": 2.125, "B1@0": 2.625, "R0@0": 2.125, "B0@0": 2.625})


def test_no_task_starts_before_the_workers_are_launched() -> None:
    cost = with_overheads(CostModel.uniform(2, 1, 2), Overheads(launch=0.5))
    for config in (SimConfig(), TWO_PHASES):
        tl = simulate(gpipe(2, 2, "never"), cost, config)
        assert spans(tl, 0)[0] == ("F0@0", 0.5, 1.5)
        assert min(s.start for s in tl.compute_spans()) == 0.5
    plain, launched = (simulate(gpipe(2, 2, "never"), c) for c in (CostModel.uniform(2, 1, 2), cost))
    assert max(s.end for s in launched.spans) == pytest.approx(max(s.end for s in plain.spans) + 0.5)


def test_a_fresh_worker_thread_pays_its_start_once_per_phase() -> None:
    cost = CostModel((StageCost(forward=1.0, backward=2.0),),
                     runner=ExecutorCosts(stages=(ExecutorStage(thread_start=0.5),)))
    two = simulate(gpipe(2, 1, "never"), cost, TWO_PHASES)
    assert spans(two, 0) == [("F0@0", 0, 1.5), ("F1@0", 1.5, 2.5), ("B1@0", 2.5, 5), ("B0@0", 5, 7)]
    one = simulate(gpipe(2, 1, "never"), cost)  # one thread for the whole step: paid once
    assert spans(one, 0) == [("F0@0", 0, 1.5), ("F1@0", 1.5, 2.5), ("B1@0", 2.5, 4.5), ("B0@0", 4.5, 6.5)]


def test_pairs_slow_only_the_pairs_they_name() -> None:
    # forwards share (each at half speed while both run), backwards do not meet
    pairs = (("F", 0, "F", 1, 1.0), ("F", 1, "F", 0, 1.0))
    cost = with_overheads(CostModel.uniform(2, 1, 1), Overheads(pairs=pairs))
    tl = simulate(gpipe(2, 2, "never"), cost)
    assert spans(tl, 0)[:2] == [("F0@0", 0, 1), ("F1@0", 1, 3)]
    assert spans(tl, 1)[:2] == [("F0@1", 1, 3), ("F1@1", 3, 4)]
    assert all(s.duration == 1 for s in tl.compute_spans() if s.task.op is Op.B)


def test_pairs_all_equal_are_the_scalar_contention() -> None:
    kinds = ("F", "Fc", "B")
    c = 0.375
    pairs = tuple((a, j, b, k, c) for a in kinds for b in kinds for j in range(3) for k in range(3) if j != k)
    cost = CostModel.from_lists([1.0, 2.0, 1.5], [2.0, 1.0, 3.0])
    scalar = simulate(gpipe(5, 3, "except_last"), with_overheads(cost, Overheads(contention=c)))
    paired = simulate(gpipe(5, 3, "except_last"), with_overheads(cost, Overheads(pairs=pairs)))
    got = {(s.task, s.stream): (s.start, s.end) for s in paired.spans}
    for s in scalar.spans:
        assert got[(s.task, s.stream)] == pytest.approx((s.start, s.end), abs=1e-9)


def test_overheads_reject_unknown_kinds() -> None:
    with pytest.raises(ValueError, match="task kinds are F, Fc, B"):
        Overheads(pairs=(("R", 0, "B", 1, 0.5),))
    with pytest.raises(ValueError, match="must be >= 0"):
        Overheads(pairs=(("F", 0, "B", 1, -0.5),))


# -- calibration ----------------------------------------------------------------------------------



def test_saved_tensors_are_counted_per_stage() -> None:
    # x * w saves x (for w's gradient) and, when x requires grad (every stage after the first), w
    assert count_saved_tensors([_Scale(), _Scale(), nn.Sequential(_Scale(), _Scale())], torch.randn(3, 2)) == [1, 2, 4]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    cost = calibrate(model, [2, 1], torch.randn(3, 4), warmup=0, repeats=1)
    assert [s.saved_tensors for s in executor_costs(cost).stages] == count_saved_tensors([model[:2], model[2:]],
                                                                                         torch.randn(3, 4))
    assert all(s.saved_tensors > 0 for s in executor_costs(cost).stages)


def test_the_per_tensor_hook_costs_are_microseconds() -> None:
    pack, unpack = measure_saved_tensor_cost(11, ops=8)
    assert 0 <= pack < 1e-3 and 0 <= unpack < 1e-3


@pytest.mark.parametrize("inputs", ["tensor", "tuple"])
def test_stage_extras_are_measured_per_partition(inputs: str) -> None:
    """Note [stage extras]: each stage alone in the executor; every field finite, >= 0 and below a task's
    worth of seconds for layers this small, and the model's parameters and gradients left as they were."""
    torch.manual_seed(0)
    if inputs == "tensor":
        parts = [nn.Sequential(nn.Linear(8, 16), nn.ReLU()), nn.Sequential(nn.Linear(16, 4))]
        sample: torch.Tensor | tuple[torch.Tensor, ...] = torch.randn(4, 8)
    else:
        parts = [nn.Sequential(_Pair(8, 16)), nn.Sequential(_Pair(16, 4))]
        sample = (torch.randn(4, 8), torch.randn(4, 8))
    before = [p.detach().clone() for part in parts for p in part.parameters()]
    cost = CostModel(stages=(StageCost(1e-4, 1e-4), StageCost(1e-4, 1e-4)))
    extras = measure_stage_extras(cost, parts, sample, steps=2, warmup_steps=1)
    assert len(extras) == 2
    for e in extras:
        for value in (e.thread_start, e.host_forward, e.host_nograd, e.host_backward):
            assert math.isfinite(value) and 0 <= value < 10  # seconds: milliseconds here, more on a loaded machine
    after = [p for part in parts for p in part.parameters()]
    assert all(p.grad is None for p in after)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_stage_extras_need_one_cost_per_partition() -> None:
    with pytest.raises(ValueError, match="2 partitions and 1 stage costs"):
        measure_stage_extras(CostModel(stages=(StageCost(1e-4, 1e-4),)), [nn.Linear(2, 2), nn.Linear(2, 2)],
                             torch.randn(2, 2))


class _Pair(nn.Module):
    """Takes a pair of tensors and returns a pair: a stage whose input and output are tuples."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__()
        self.linear = nn.Linear(a, b)

    def forward(self, pair: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = pair
        return self.linear(x), self.linear(y)


def test_executor_overheads_are_measured_from_the_executor() -> None:
    o = calibrate_executor_overheads(["cpu", "cpu"], steps=3, warmup_steps=1, saved_tensor_repeats=11)
    for name in ("task", "handoff", "contention", "gap", "turnaround", "launch", "recording", "per_saved_tensor",
                 "per_unpacked_tensor"):
        value = getattr(o, name)
        assert math.isfinite(value) and value >= 0, name
    assert 0 < o.launch  # magnitudes are the benchmarks' to report: a loaded machine stretches each of them
    assert calibrate_executor_overheads(["cpu"], steps=1, warmup_steps=0, contention=None,
                                        saved_tensor_repeats=3).contention == 0.0
