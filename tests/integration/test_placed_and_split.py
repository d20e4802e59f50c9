"""The executor runs any placement and any split backward a schedule names; the simulator runs the same schedules.

Two schedules registered for these tests only, both GPipe's fill-drain underneath::

    looped (n=4 stages on 2 devices, stage j on device j % 2), m=2, never:
        dev0  F0@0 F1@0 F0@2 F1@2 B1@2 B0@2 B1@0 B0@0     (stages 0 and 2)
        dev1  F0@1 F1@1 F0@3 F1@3 B1@3 B0@3 B1@1 B0@1     (stages 1 and 3)

    split-w (every B then its W) and split-late (every W at the end of its device's list), n=2, m=2, never:
        dev0  F0@0 F1@0 B1@0 W1@0 B0@0 W0@0               dev0  F0@0 F1@0 B1@0 B0@0 W1@0 W0@0
        dev1  F0@1 F1@1 B1@1 W1@1 B0@1 W0@1               dev1  F0@1 F1@1 B1@1 B0@1 W1@1 W0@1
"""

from __future__ import annotations

import copy
import dataclasses
import traceback
from collections.abc import Callable, Iterator, Sequence

import pytest
import torch
from torch import Tensor, nn

from gpipe import GPipe
from gpipe.checks import TooFewDevices
from gpipe.interpreter.affinity import available_cores, supported
from gpipe.schedule import CHECKPOINT_MODES, Checkpoint, Op, Schedule, Task, gpipe, parse_tasks, register, unregister
from gpipe.schedule import looped as looped_layout
from sim.core.cost import CostModel
from sim.core.engine import simulate
from tests.gpipe.models import dropnet, mlp, skipnet

LOOPED, SPLIT, SPLIT_LATE = "looped-test", "split-w-test", "split-late-test"


def looped(m: int, n: int, checkpoint: Checkpoint = "except_last", placement: Sequence[int] | None = None) -> Schedule:
    """GPipe's fill-drain with stage ``j`` on device ``j % 2``."""
    placed = tuple(j % 2 for j in range(n)) if placement is None else placement
    return dataclasses.replace(gpipe(m, n, checkpoint, placed), name=LOOPED)


def _split(m: int, n: int, checkpoint: Checkpoint, placement: Sequence[int] | None, late: bool,
           name: str) -> Schedule:
    base = gpipe(m, n, checkpoint, placement)
    lists = []
    for tasks in base.tasks:
        out: list[Task] = []
        for t in tasks:
            out.append(t)
            if t.op is Op.B and not late:
                out.append(Task(Op.W, t.microbatch, t.stage))
        if late:
            out += [Task(Op.W, t.microbatch, t.stage) for t in tasks if t.op is Op.B]
        lists.append(tuple(out))
    return dataclasses.replace(base, tasks=tuple(lists), name=name)


def split_w(m: int, n: int, checkpoint: Checkpoint = "except_last", placement: Sequence[int] | None = None) -> Schedule:
    """GPipe's fill-drain with every backward split: ``B(i, j)`` then ``W(i, j)``."""
    return _split(m, n, checkpoint, placement, False, SPLIT)


def split_late(m: int, n: int, checkpoint: Checkpoint = "except_last",
               placement: Sequence[int] | None = None) -> Schedule:
    """GPipe's fill-drain with every weight gradient at the end of its device's list."""
    return _split(m, n, checkpoint, placement, True, SPLIT_LATE)


@pytest.fixture(autouse=True)
def registered() -> Iterator[None]:
    register(LOOPED, "GPipe's fill-drain, stage j on device j % 2")(looped)
    register(SPLIT, "GPipe's fill-drain, every B followed by its W")(split_w)
    register(SPLIT_LATE, "GPipe's fill-drain, every W at the end")(split_late)
    try:
        yield
    finally:
        for name in (LOOPED, SPLIT, SPLIT_LATE):
            unregister(name)


def test_the_schedules_look_like_the_diagram() -> None:
    s = looped(2, 4, "never").validate()
    assert s.placement == (0, 1, 0, 1) and s.num_devices == 2
    assert s.tasks == (parse_tasks("F0@0 F1@0 F0@2 F1@2 B1@2 B0@2 B1@0 B0@0"),
                       parse_tasks("F0@1 F1@1 F0@3 F1@3 B1@3 B0@3 B1@1 B0@1"))
    assert split_w(2, 2, "never").validate().tasks[0] == parse_tasks("F0@0 F1@0 B1@0 W1@0 B0@0 W0@0")
    assert split_late(2, 2, "never").validate().tasks[1] == parse_tasks("F0@1 F1@1 B1@1 B0@1 W1@1 W0@1")


def _reference(build: Callable[[], nn.Sequential], x: Tensor, y: Tensor) -> tuple[nn.Sequential, nn.Sequential,
                                                                                   Tensor]:
    torch.manual_seed(0)
    model = build()
    reference = copy.deepcopy(model)
    expected = nn.functional.mse_loss(reference(x), y)
    expected.backward()
    return model, reference, expected.detach()


def _same_grads(model: nn.Module, reference: nn.Module) -> None:
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
@pytest.mark.parametrize(("build", "balance"), [(mlp, [1, 1, 2, 1]), (skipnet, [1, 1, 2, 1]),
                                                (skipnet, [1, 1, 1, 2])], ids=["mlp", "skip-same", "skip-across"])
def test_a_looped_placement_trains_like_the_plain_model(checkpoint: str, build: Callable[[], nn.Sequential],
                                                        balance: list[int]) -> None:
    """Four partitions on two devices: two workers, each running two stages; spans on the placed devices."""
    x, y = torch.randn(9, 6), torch.randn(9, 3)
    model, reference, expected = _reference(build, x, y)
    pipe = GPipe(model, balance, devices=["cpu", "cpu"], chunks=3, checkpoint=checkpoint, schedule=LOOPED,
                 record=True)
    assert pipe.devices == [torch.device("cpu")] * 4 and pipe.schedule.num_devices == 2
    torch.testing.assert_close(pipe.step(x, y, nn.functional.mse_loss), expected)
    _same_grads(model, reference)
    timeline = pipe.timeline
    assert timeline is not None and timeline.num_devices == 2 and timeline.meta["placement"] == [0, 1, 0, 1]
    assert all(span.device == span.task.stage % 2 for span in timeline.spans)
    for d in range(2):
        assert timeline.task_order(d) == list(pipe.schedule.tasks[d])

    model.zero_grad()
    nn.functional.mse_loss(pipe(x), y).backward()  # forwards first: forward() + backward() runs it too
    _same_grads(model, reference)
    with torch.no_grad():
        torch.testing.assert_close(pipe(x), reference(x))


def test_the_simulator_runs_the_looped_schedule() -> None:
    schedule = looped(3, 4, "except_last")
    timeline = simulate(schedule, CostModel.uniform(4, 1.0, 2.0, recompute=1.0))
    assert timeline.num_devices == 2
    assert all(span.device == span.task.stage % 2 for span in timeline.spans)
    for d in range(2):
        assert timeline.task_order(d) == list(schedule.tasks[d])


def test_a_schedule_with_a_layout_places_its_stages_on_the_devices_given() -> None:
    """Fewer devices than stages: a schedule registered with a layout places them by it, and trains."""
    x, y = torch.randn(6, 6), torch.randn(6, 3)
    model, reference, expected = _reference(mlp, x, y)
    register("looped-by-layout", "GPipe's fill-drain, looped by its layout", layout=looped_layout)(gpipe)
    try:
        pipe = GPipe(model, [1, 1, 2, 1], devices=["cpu"] * 2, chunks=2, schedule="looped-by-layout")
        assert pipe.schedule.placement == (0, 1, 0, 1) and pipe.schedule_for(3).placement == (0, 1, 0, 1)
        torch.testing.assert_close(pipe.step(x, y, nn.functional.mse_loss), expected)
        _same_grads(model, reference)
    finally:
        unregister("looped-by-layout")


def test_placement_checks() -> None:
    with pytest.raises(TooFewDevices, match="or 2, one per device of the schedule"):
        GPipe(mlp(), [1, 1, 2, 1], devices=["cpu"], schedule=LOOPED)
    with pytest.raises(TooFewDevices):
        GPipe(mlp(), [1, 1, 2, 1], devices=["cpu", "cpu"])  # GPipe's own schedule: a device per stage
    if supported() and len(available_cores()) >= 2:
        a, b = available_cores()[:2]
        with pytest.raises(ValueError, match="places stages 0 and 2 on one worker"):
            GPipe(mlp(), [1, 1, 2, 1], devices=["cpu"] * 4, schedule=LOOPED, cpu_affinity=[{a}, {b}, {b}, {a}])
        pipe = GPipe(mlp(), [1, 1, 2, 1], devices=["cpu"] * 2, schedule=LOOPED, cpu_affinity=[{a}, {b}])
        assert pipe.cpu_affinity == [{a}, {b}, {a}, {b}]


class Boom(nn.Module):
    armed = True

    def forward(self, x: Tensor) -> Tensor:
        if self.armed:
            raise RuntimeError("boom in a placed stage")
        return x


def test_a_failure_in_a_placed_stage_surfaces_and_nothing_hangs() -> None:
    model = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), Boom(), nn.Linear(6, 3))  # stage 2: on device 0
    pipe = GPipe(model, [1, 1, 1, 1], devices=["cpu", "cpu"], chunks=3, schedule=LOOPED)
    with pytest.raises(RuntimeError, match="boom in a placed stage") as caught:
        pipe.step(torch.randn(6, 6), torch.randn(6, 3), nn.functional.mse_loss)
    assert any(frame.name == "forward" and frame.filename == __file__
               for frame in traceback.extract_tb(caught.value.__traceback__))  # the original traceback
    model[2].armed = False
    pipe.step(torch.randn(6, 6), torch.randn(6, 3), nn.functional.mse_loss)  # the next step runs


@pytest.mark.parametrize("name", [SPLIT, SPLIT_LATE])
@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
@pytest.mark.parametrize(("build", "balance"), [(mlp, [2, 2, 1]), (skipnet, [1, 2, 2])], ids=["mlp", "skipnet"])
def test_a_split_backward_trains_like_the_plain_model(name: str, checkpoint: str, build: Callable[[], nn.Sequential],
                                                      balance: list[int]) -> None:
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    model, reference, expected = _reference(build, x, y)
    pipe = GPipe(model, balance, devices=["cpu"] * 3, chunks=4, checkpoint=checkpoint, schedule=name, record=True)
    torch.testing.assert_close(pipe.step(x, y, nn.functional.mse_loss), expected)
    _same_grads(model, reference)
    timeline = pipe.timeline
    assert timeline is not None
    assert sum(span.task.op is Op.W for span in timeline.spans) == 4 * 3
    for d in range(3):
        assert timeline.task_order(d) == list(pipe.schedule.tasks[d])

    model.zero_grad()
    nn.functional.mse_loss(pipe(x), y).backward()  # forward() + backward(): W tasks in the backward phase
    _same_grads(model, reference)
    params = list(model.parameters())
    grads = torch.autograd.grad(nn.functional.mse_loss(pipe(x), y), params)  # W collects, leaves .grad alone
    for g, q in zip(grads, reference.parameters(), strict=True):
        torch.testing.assert_close(g, q.grad)
    _same_grads(model, reference)


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
def test_a_split_backward_draws_exactly_what_gpipe_draws(checkpoint: str) -> None:
    """Dropout: the draws are a function of the task (gpipe.autograd.rng), so splitting the backward changes nothing."""
    def grads(schedule: str) -> list[Tensor]:
        torch.manual_seed(0)
        model = dropnet()
        pipe = GPipe(model, [2, 3], devices=["cpu"] * 2, chunks=4, checkpoint=checkpoint, schedule=schedule)
        torch.manual_seed(1)
        pipe.step(torch.randn(8, 6), torch.randn(8, 8), nn.functional.mse_loss)
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    expected = grads("gpipe")
    for name in (SPLIT, SPLIT_LATE):
        for ours, theirs in zip(grads(name), expected, strict=True):
            torch.testing.assert_close(ours, theirs)


def test_a_failure_in_a_w_task_surfaces_and_nothing_hangs() -> None:
    torch.manual_seed(0)
    model = mlp()

    def refuse(grad: Tensor) -> Tensor:
        raise RuntimeError("boom in a weight gradient")

    handle = model[2].weight.register_hook(refuse)  # runs in W(i, 1) only: B takes the inputs' gradients alone
    pipe = GPipe(model, [2, 2, 1], devices=["cpu"] * 3, chunks=4, schedule=SPLIT)
    with pytest.raises(RuntimeError, match="boom in a weight gradient") as caught:
        pipe.step(torch.randn(8, 6), torch.randn(8, 3), nn.functional.mse_loss)
    assert any(frame.name == "refuse" for frame in traceback.extract_tb(caught.value.__traceback__))
    assert any(frame.name == "_weight" for frame in traceback.extract_tb(caught.value.__traceback__))
    handle.remove()
    model.zero_grad()
    pipe.step(torch.randn(8, 6), torch.randn(8, 3), nn.functional.mse_loss)  # the next step runs
