"""DualPipeV in the executor: four stages in a V on two CPU workers, every backward split, overlapped pairs run in
turn (Note [a pair in turn] in gpipe.interpreter.worker); it trains exactly like the plain model."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from gpipe import GPipe
from gpipe.schedule import CHECKPOINT_MODES, Op
from tests.gpipe.models import mlp, skipnet


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
@pytest.mark.parametrize("build", [mlp, skipnet], ids=["mlp", "skipnet"])
def test_dualpipe_v_trains_like_the_plain_model(checkpoint: str, build: type) -> None:
    torch.manual_seed(0)
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    model = build()
    reference = copy.deepcopy(model)
    expected = nn.functional.mse_loss(reference(x), y)
    expected.backward()
    pipe = GPipe(model, [1, 1, 2, 1], devices=["cpu"] * 2, chunks=4, checkpoint=checkpoint, schedule="dualpipe-v",
                 record=True)
    schedule = pipe.schedule
    assert schedule.placement == (0, 1, 1, 0) and schedule.pairs and schedule.splits_weight_gradient
    torch.testing.assert_close(pipe.step(x, y, nn.functional.mse_loss), expected.detach())
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    timeline = pipe.timeline
    assert timeline is not None
    for d in range(2):
        assert timeline.task_order(d) == list(schedule.tasks[d])
    assert sum(span.task.op is Op.W for span in timeline.compute_spans()) == 4 * 4


def test_dualpipe_v_refuses_forward_then_backward_and_too_few_chunks() -> None:
    pipe = GPipe(mlp(), [1, 1, 2, 1], devices=["cpu"] * 2, chunks=4, schedule="dualpipe-v")
    with pytest.raises(RuntimeError, match="train with pipe.step"):
        nn.functional.mse_loss(pipe(torch.randn(8, 6)), torch.randn(8, 3)).backward()
    with pytest.raises(ValueError, match="raise chunks to 4 or more"):
        GPipe(mlp(), [1, 1, 2, 1], devices=["cpu"] * 2, chunks=2, schedule="dualpipe-v")
