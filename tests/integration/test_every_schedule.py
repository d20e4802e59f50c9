"""Every registered schedule x every checkpoint policy it takes, on the executor (issue 22): ``step()`` gives the
plain model's loss and every gradient, each device runs its tasks in the scheduled order, and the bytes saved for
backward peak per device where the simulator predicts from the same step's bytes per task.

The cases are drawn at collection time from :data:`gpipe.schedule.SCHEDULES`, so a schedule registered by
``import gpipe.schedule`` is tested here without naming it. A schedule with a layout places 4 stages on 2
devices by it; one without runs a device per stage. A policy (or shape) a schedule refuses is skipped on the
``ValueError`` its generator raises, and :func:`test_every_schedule_runs_a_policy_on_every_shape` keeps that
from emptying a schedule's cases.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from gpipe import GPipe
from gpipe.schedule import (
    CHECKPOINT_MODES,
    SCHEDULES,
    Checkpoint,
    Op,
    Schedule,
    ScheduleKind,
    Task,
    gpipe,
    register,
    unregister,
)
from gpipe.schedule.timeline import Timeline
from sim.calibration.held_bytes import HeldBytes, held_stage_bytes, with_held_bytes
from sim.core.cost import CostModel
from sim.core.engine import simulate
from tests.gpipe.models import mlp, skipnet

F32 = 4  # bytes


@dataclass(frozen=True)
class Shape:
    """``m`` micro-batches of ``2`` rows over the stages of ``balance`` on ``devices`` CPU devices."""

    m: int
    balance: tuple[int, ...]
    devices: int

    @property
    def n(self) -> int:
        return len(self.balance)


MODELS: dict[str, tuple[Callable[[], nn.Sequential], tuple[int, ...], tuple[int, ...]]] = {
    # name: (model, balance on a device per stage (3), balance of 4 stages placed on 2 devices)
    "mlp": (mlp, (2, 2, 1), (1, 1, 2, 1)),
    "skip": (skipnet, (1, 2, 2), (1, 1, 1, 2)),  # stash on stage 0, pop on the last
}


def _shapes(kind: ScheduleKind, model: str) -> list[Shape]:
    _, one_each, placed = MODELS[model]
    if kind.copies > 1:  # copies of the stages (DualPipe): a stage per device, each device a copy of another too
        return [Shape(m, one_each, len(one_each)) for m in (6, 8)]
    if kind.place is not None:
        return [Shape(m, placed, 2) for m in (4, 8)]
    return [Shape(m, one_each, len(one_each)) for m in (3, 6)]


CASES = [pytest.param(name, checkpoint, model, shape,
                      id=f"{name}-{checkpoint}-{model}-m{shape.m}-n{shape.n}-p{shape.devices}")
         for name, kind in SCHEDULES.items() for model in MODELS for shape in _shapes(kind, model)
         for checkpoint in CHECKPOINT_MODES
         if kind.copies == 1 or model != "skip"]  # copies of the stages take no skip connections (GPipe refuses)


def _schedule(name: str, checkpoint: Checkpoint, shape: Shape) -> Schedule | ValueError:
    """The schedule of this case, or the ``ValueError`` its generator refuses it with (as documented)."""
    try:
        kind = SCHEDULES[name]
        return kind(shape.m, shape.n * kind.copies, checkpoint, devices=shape.devices).validate()
    except ValueError as refused:
        return refused


def _schedule_or_skip(name: str, checkpoint: Checkpoint, shape: Shape) -> Schedule:
    schedule = _schedule(name, checkpoint, shape)
    if isinstance(schedule, ValueError):
        pytest.skip(f"{name} refuses this case: {schedule}")
    return schedule


Step = tuple[GPipe, nn.Sequential, nn.Sequential, Tensor, Tensor]


def _step(name: str, checkpoint: Checkpoint, model: str, shape: Shape) -> Step:
    """One recorded ``step()`` of the case, and the plain model's loss (its gradients left in ``reference``)."""
    torch.manual_seed(0)
    module = MODELS[model][0]()
    reference = copy.deepcopy(module)
    x, y = torch.randn(2 * shape.m, 6), torch.randn(2 * shape.m, 3)  # equal micro-batches of 2 rows
    expected = nn.functional.mse_loss(reference(x), y)
    expected.backward()
    pipe = GPipe(module, list(shape.balance), devices=["cpu"] * shape.devices, chunks=shape.m, checkpoint=checkpoint,
                 schedule=name, record=True)
    loss = pipe.step(x, y, nn.functional.mse_loss)
    return pipe, module, reference, loss, expected.detach()


@pytest.fixture(scope="module")
def steps() -> Callable[[str, Checkpoint, str, Shape], Step]:
    """:func:`_step`, each case run once for the two tests that read it (half the file's time)."""
    done: dict[tuple[str, Checkpoint, str, Shape], Step] = {}

    def step(*case: Any) -> Step:
        if case not in done:
            done[case] = _step(*case)
        return done[case]

    return step


@pytest.mark.parametrize(("name", "checkpoint", "model", "shape"), CASES)
def test_step_trains_like_the_plain_model_in_the_scheduled_order(steps: Callable[..., Step], name: str,
                                                                 checkpoint: Checkpoint, model: str,
                                                                 shape: Shape) -> None:
    schedule = _schedule_or_skip(name, checkpoint, shape)
    pipe, module, reference, loss, expected = steps(name, checkpoint, model, shape)
    assert pipe.schedule == schedule and schedule.num_devices == shape.devices
    torch.testing.assert_close(loss, expected)
    for (what, p), q in zip(module.named_parameters(), reference.parameters(), strict=True):
        assert p.grad is not None, what
        torch.testing.assert_close(p.grad, q.grad, msg=lambda m, what=what: f"{what}: {m}")
    timeline = pipe.timeline
    assert timeline is not None
    for d in range(schedule.num_devices):
        assert timeline.task_order(d) == list(schedule.tasks[d]), f"device {d}"
        assert {s.device for s in timeline.compute_spans(d)} == {d}
        assert all(schedule.device_of(s.task.stage) == d for s in timeline.compute_spans(d))


def _changes(timeline: Timeline, d: int) -> list[int]:
    """The bytes device ``d`` held after each change, in time order (repeats of one value merged)."""
    values = [b for _, b in timeline.memory_series(d)]
    return [b for k, b in enumerate(values) if k == 0 or b != values[k - 1]]


@pytest.mark.parametrize(("name", "checkpoint", "model", "shape"), CASES)
def test_measured_peak_saved_bytes_are_the_predicted(steps: Callable[..., Step], name: str, checkpoint: Checkpoint,
                                                     model: str, shape: Shape) -> None:
    """The simulator, given the step's own bytes per (micro-batch, stage), predicts each device's peak and
    every change on the way (Note [memory] in sim.core.memory)."""
    schedule = _schedule_or_skip(name, checkpoint, shape)
    pipe, *_ = steps(name, checkpoint, model, shape)
    _predicted_as_measured(schedule, pipe.timeline)


def _predicted_as_measured(schedule: Schedule, measured: Timeline | None) -> Timeline:
    """The simulator's memory of ``schedule`` from ``measured``'s bytes per task, checked against it."""
    assert measured is not None
    cost = with_held_bytes(CostModel.uniform(schedule.n, 1.0, 2.0, recompute=1.0), measured)
    predicted = simulate(schedule, cost)
    for d in range(schedule.num_devices):
        assert measured.peak_memory(d) > 0
        assert predicted.peak_memory(d) == measured.peak_memory(d), f"device {d}"
        assert _changes(predicted, d) == _changes(measured, d), f"device {d}"
    return predicted


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_every_schedule_runs_a_policy_on_every_shape(name: str) -> None:
    """No registered schedule is tested by skips alone."""
    for model in MODELS:
        for shape in _shapes(SCHEDULES[name], model):
            refused = [_schedule(name, c, shape) for c in CHECKPOINT_MODES]
            assert not all(isinstance(r, ValueError) for r in refused), f"{name} refuses {shape}: {refused}"


def test_the_bytes_per_stage_are_what_autograd_saves() -> None:
    """mlp on [2, 2, 1], micro-batches of b rows: stage 0 keeps Linear(6, 8)'s input and ReLU's output, stage 1
    Linear(8, 8)'s input and Tanh's output, stage 2 Linear(8, 3)'s input and what the loss saves (its input and
    target: mse_loss keeps both); a checkpointed forward keeps the stage's input."""
    b = 2
    pipe, *_ = _step("gpipe", "except_last", "mlp", Shape(3, (2, 2, 1), 3))
    assert pipe.timeline is not None
    assert held_stage_bytes(pipe.timeline) == (HeldBytes(b * (6 + 8) * F32, b * 6 * F32),
                                               HeldBytes(b * (8 + 8) * F32, b * 8 * F32),
                                               HeldBytes(b * (8 + 3 + 3) * F32, b * 8 * F32))


def test_bytes_per_stage_need_a_recorded_step_of_equal_microbatches() -> None:
    pipe, *_ = _step("gpipe", "never", "mlp", Shape(3, (2, 2, 1), 3))
    assert pipe.timeline is not None
    simulated = simulate(pipe.schedule, CostModel.uniform(3, 1.0, 2.0))
    with pytest.raises(ValueError, match=r"record a training step \(GPipe\(\.\.\., record=True\)"):
        held_stage_bytes(simulated)
    with pytest.raises(ValueError, match="the cost model has 2 stages but the recorded step 3"):
        with_held_bytes(CostModel.uniform(2, 1.0, 2.0), pipe.timeline)

    torch.manual_seed(0)
    uneven = GPipe(mlp(), [2, 2, 1], devices=["cpu"] * 3, chunks=2, record=True)
    uneven.step(torch.randn(5, 6), torch.randn(5, 3), nn.functional.mse_loss)  # micro-batches of 3 and 2 rows
    assert uneven.timeline is not None
    rows = 2 * (6 + 8) * F32, 3 * (6 + 8) * F32  # what stage 0 saves of 2 rows (F1@0) and of 3 (R0@0)
    with pytest.raises(ValueError, match=rf"stage 0's micro-batches kept different saved bytes \({rows[0]} bytes: "
                                         rf"F1@0; {rows[1]} bytes: R0@0\); give every micro-batch the same size"):
        held_stage_bytes(uneven.timeline)


def _weights_last(m: int, n: int, checkpoint: Checkpoint = "never", placement: Sequence[int] | None = None
                  ) -> Schedule:
    """GPipe's fill-drain with the backward split, every ``W`` at the end of its device's list::

        n=2, m=2:   dev0  F0@0 F1@0 B1@0 B0@0 W1@0 W0@0
                    dev1  F0@1 F1@1 B1@1 B0@1 W1@1 W0@1
    """
    base = gpipe(m, n, checkpoint, placement)
    tasks = tuple((*ts, *(Task(Op.W, t.microbatch, t.stage) for t in ts if t.op is Op.B)) for ts in base.tasks)
    return dataclasses.replace(base, tasks=tasks, name="weights-last-test")


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
def test_a_split_backward_holds_its_bytes_until_w(checkpoint: Checkpoint) -> None:
    """``B`` of a split backward keeps the graph for ``W`` (Note [split backward] in gpipe.autograd.split_backward), so
    with every ``W`` last nothing is freed before them: each device peaks at all its micro-batches' bytes, measured and
    predicted alike."""
    m = 3
    register("weights-last-test", "GPipe's fill-drain, every W at the end of its device")(_weights_last)
    try:
        schedule = _weights_last(m, 3, checkpoint).validate()
        pipe, *_ = _step("weights-last-test", checkpoint, "mlp", Shape(m, (2, 2, 1), 3))
    finally:
        unregister("weights-last-test")
    assert pipe.timeline is not None
    assert [t.op for t in pipe.timeline.task_order(0)][-m:] == [Op.W] * m
    _predicted_as_measured(schedule, pipe.timeline)
    ck = sum(schedule.is_checkpointed(i) for i in range(m))  # each keeps its input and, once recomputed, the rest
    for j, held in enumerate(held_stage_bytes(pipe.timeline)):
        assert pipe.timeline.peak_memory(j) == m * held.saved + ck * held.checkpoint
