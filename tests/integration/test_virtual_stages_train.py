"""The executor trains interleaved 1F1B and looped BFS, four stages on two CPU devices, exactly like the plain
model (loss and every gradient), each worker running its device's tasks in the schedule's order."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import nn

from gpipe import GPipe
from gpipe.schedule import CHECKPOINT_MODES, SCHEDULES, Checkpoint
from tests.gpipe.models import dropnet, mlp, skipnet

NAMES = ["interleaved-1f1b", "looped-bfs"]
MODELS = [(mlp, [1, 1, 2, 1]), (skipnet, [1, 1, 2, 1]), (skipnet, [1, 1, 1, 2])]  # skip: on one device, across


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
@pytest.mark.parametrize(("build", "balance"), MODELS, ids=["mlp", "skip-same-device", "skip-across"])
def test_step_trains_like_the_plain_model(name: str, checkpoint: Checkpoint, build: Callable[[], nn.Sequential],
                                          balance: list[int]) -> None:
    torch.manual_seed(0)
    model = build()
    reference = copy.deepcopy(model)
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    expected = nn.functional.mse_loss(reference(x), y)
    expected.backward()

    pipe = GPipe(model, balance, devices=["cpu"] * 2, chunks=4, checkpoint=checkpoint, schedule=name, record=True)
    schedule = pipe.schedule
    assert schedule == SCHEDULES[name](4, 4, checkpoint, devices=2)  # stage s on device s mod 2
    torch.testing.assert_close(pipe.step(x, y, nn.functional.mse_loss), expected.detach())
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    timeline = pipe.timeline
    assert timeline is not None and timeline.num_devices == 2
    assert all(span.device == span.task.stage % 2 for span in timeline.spans)
    for d in range(2):
        assert timeline.task_order(d) == list(schedule.tasks[d])


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
def test_looped_bfs_runs_forward_then_backward_too(checkpoint: Checkpoint) -> None:
    """Looped BFS runs every forward first, so ``forward()`` + ``loss.backward()`` runs it as well."""
    torch.manual_seed(0)
    model = mlp()
    reference = copy.deepcopy(model)
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    nn.functional.mse_loss(reference(x), y).backward()
    pipe = GPipe(model, [1, 1, 2, 1], devices=["cpu"] * 2, chunks=4, checkpoint=checkpoint, schedule="looped-bfs")
    assert pipe.schedule.forwards_first
    nn.functional.mse_loss(pipe(x), y).backward()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
def test_dropout_draws_what_gpipe_draws(checkpoint: Checkpoint) -> None:
    """A task's random draws depend on the task, not the order: both schedules' gradients equal GPipe's."""
    def grads(schedule: str, devices: int) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = dropnet()
        pipe = GPipe(model, [1, 1, 2, 1], devices=["cpu"] * devices, chunks=4, checkpoint=checkpoint,
                     schedule=schedule)
        torch.manual_seed(1)
        pipe.step(torch.randn(8, 6), torch.randn(8, 8), nn.functional.mse_loss)
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    expected = grads("gpipe", 4)
    for name in NAMES:
        for ours, theirs in zip(grads(name, 2), expected, strict=True):
            torch.testing.assert_close(ours, theirs)


def test_a_shape_the_schedule_cannot_run_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="use a number of stages that is a multiple of the 2 devices: 4 or 6"):
        GPipe(mlp(), [1, 1, 1, 1, 1], devices=["cpu"] * 2, chunks=3, schedule="interleaved-1f1b")
    with pytest.raises(ValueError, match=r"takes the option round=N \(N a positive integer"):
        GPipe(mlp(), [1, 1, 2, 1], devices=["cpu"] * 2, chunks=3, schedule="interleaved-1f1b:round=0")
