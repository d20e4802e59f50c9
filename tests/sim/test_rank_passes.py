"""The ranks' profiling passes of a multi-process run: gathered to rank 0, each stage's seconds land in that stage
of the cost model (medians over the passes, exactly), a rank with several stages included; each stage is fed the
input the model's chain gives it; a gather that does not match the placement is refused, naming the fix; the gap
between tasks is read only where a rank waited for nothing."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpipe.profiling.profile import RecordedSeconds
from gpipe.schedule import Op, Task
from gpipe.schedule.timeline import Span, Timeline
from sim.calibration.calibrate import partitions_of
from sim.calibration.host import ExecutorCosts, ExecutorStage, executor_costs
from sim.calibration.outcome import interleaved_cost
from sim.calibration.rank_passes import RankPass, gathered_passes, local_gaps, rank_pass, stage_inputs
from sim.core.cost import CostModel, StageCost


def _seconds(stage: int, step: int, split: bool = False) -> RecordedSeconds:
    """Distinct, exactly representable seconds for each (stage, step): stage in the tens, step in the units."""
    base = 10.0 * (stage + 1) + step
    return RecordedSeconds(forward=base, backward=base + 0.5, forward_nograd=base + 0.25,
                           weight=base + 0.125 if split else 0.0)


def _gathered(placement: tuple[int, ...], steps: int, split: bool = False) -> list[list[RankPass]]:
    """What rank 0 gathers: per rank, per step, that rank's own stages."""
    return [[{j: _seconds(j, k, split) for j, d in enumerate(placement) if d == r} for k in range(steps)]
            for r in range(max(placement) + 1)]


def _cost(n: int) -> CostModel:
    return CostModel(tuple(StageCost(forward=1.0, backward=2.0, send_bytes=64 * (j + 1)) for j in range(n)))


@pytest.mark.parametrize("placement", [(0, 1), (0, 1, 1, 0), (0, 1, 0, 1)])
def test_each_rank_s_seconds_land_in_its_stages(placement: tuple[int, ...]) -> None:
    passes = gathered_passes(_gathered(placement, steps=3), placement)
    assert passes == [[_seconds(j, k) for j in range(len(placement))] for k in range(3)]
    cost = interleaved_cost(_cost(len(placement)), passes, [])
    extras = executor_costs(cost).stages
    for j, (stage, extra) in enumerate(zip(cost.stages, extras, strict=True)):
        median = 10.0 * (j + 1) + 1  # the median of steps 0, 1, 2
        assert (extra.forward_recorded, extra.backward_recorded) == (median, median + 0.5)
        assert stage.forward_checkpointed == median + 0.25
        assert extra.weight_recorded is None  # not a split schedule
        assert stage.send_bytes == 64 * (j + 1)  # what the passes do not measure stays the launcher's


def test_a_split_schedule_s_weight_seconds_land_too() -> None:
    placement = (0, 1, 0, 1)
    # a split schedule's calibration has each stage's W seconds (stage_costs(..., split=True)); the passes replace them
    cost = CostModel(_cost(4).stages, runner=ExecutorCosts(stages=(ExecutorStage(weight_recorded=1.0),) * 4))
    cost = interleaved_cost(cost, gathered_passes(_gathered(placement, steps=2, split=True), placement), [])
    assert [e.weight_recorded for e in executor_costs(cost).stages] == [10.0 * (j + 1) + 0.625 for j in range(4)]


@pytest.mark.parametrize(("gathered", "message"), [
    ([[{0: _seconds(0, 0)}]], "passes of 1 ranks for a placement on 2"),
    ([[{0: _seconds(0, 0)}], []], "the ranks took [0, 1] passes"),
    ([[{0: _seconds(0, 0)}], [{0: _seconds(0, 0)}]], "rank 1's pass 0 has stages [0]"),
])
def test_a_gather_that_does_not_fit_the_placement_is_refused(gathered: list[list[RankPass]], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        gathered_passes(gathered, (0, 1))


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))


def test_each_stage_gets_the_input_the_chain_gives_it() -> None:
    model = _model()
    parts = partitions_of(model, [2, 1, 2])
    sample = torch.randn(3, 8)
    inputs = stage_inputs(parts, sample, [0, 2])
    assert sorted(inputs) == [0, 2]
    assert inputs[0] is sample
    expected = parts[1](parts[0](sample))
    assert torch.equal(inputs[2], expected.detach()) and inputs[2].requires_grad
    assert all(p.grad is None for p in model.parameters())


def test_a_rank_s_pass_times_its_own_stages_only() -> None:
    model = _model()
    parts = partitions_of(model, [2, 1, 2])
    inputs = stage_inputs(parts, torch.randn(3, 8), [0, 2])
    one = rank_pass(parts, inputs, streak=2, split=True)
    assert sorted(one) == [0, 2] and all(isinstance(s, RecordedSeconds) for s in one.values())
    assert all(p.grad is None for p in model.parameters())  # left as found


def test_the_gap_is_read_before_tasks_whose_inputs_are_local() -> None:
    # rank 0 runs stage 0, rank 1 stage 1 (times in ms, exact in binary): only the idle time before an R, a W or
    # the first stage's F counts; before a B or a later stage's F the rank may have waited for a message
    f, r, b, w = Op.F, Op.R, Op.B, Op.W
    spans = [(0, f, 0, 0, 0, 1), (0, f, 1, 0, 1.25, 2), (0, r, 0, 0, 9, 10), (0, b, 0, 0, 10.5, 12),
             (1, f, 0, 1, 2, 3), (1, f, 1, 1, 3.5, 4), (1, b, 1, 1, 4, 5), (1, w, 1, 1, 5.125, 6)]
    timeline = Timeline(tuple(Span(d, "compute", Task(op, i, j), s / 1e3, e / 1e3) for d, op, i, j, s, e in spans))
    assert [g * 1e3 for g in local_gaps(timeline)] == pytest.approx([0.25, 7.0, 0.125])
