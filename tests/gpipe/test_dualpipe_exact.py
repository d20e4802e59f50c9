"""DeepSeek-V3's DualPipe in the executor (``schedule="dualpipe"``): the second copy of each stage synced before a
step and its gradients summed into the model's after it (Note [one model, two copies] in
:mod:`gpipe.interpreter.copies`), so the loss, every gradient and the trained weights equal the plain model's."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from gpipe import GPipe
from gpipe.schedule import CHECKPOINT_MODES, dualpipe
from gpipe.skip import pop, skippable, stash


def mlp(stages: int) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(5, 8)]
    for _ in range(2 * stages - 2):
        layers += [nn.Tanh(), nn.Linear(8, 8)]
    return nn.Sequential(*layers, nn.Linear(8, 3)).double()


def _balance(model: nn.Sequential, stages: int) -> list[int]:
    size = len(model) // stages
    return [size] * (stages - 1) + [len(model) - size * (stages - 1)]


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
@pytest.mark.parametrize(("stages", "chunks"), [(1, 2), (2, 4), (2, 5), (3, 6), (4, 8)])
def test_a_step_gives_the_plain_model_s_loss_and_gradients(checkpoint: str, stages: int, chunks: int) -> None:
    torch.manual_seed(0)
    model = mlp(stages)
    reference = copy.deepcopy(model)
    x, y = torch.randn(2 * chunks, 5, dtype=torch.float64), torch.randn(2 * chunks, 3, dtype=torch.float64)
    expected = nn.functional.mse_loss(reference(x), y)
    expected.backward()
    pipe = GPipe(model, _balance(model, stages), chunks=chunks, checkpoint=checkpoint, schedule="dualpipe")
    assert pipe.schedule == dualpipe(chunks, 2 * stages, checkpoint)  # type: ignore[arg-type]
    loss = pipe.step(x, y, nn.functional.mse_loss)
    torch.testing.assert_close(loss, expected.detach())
    assert len(list(pipe.parameters())) == len(list(reference.parameters()))  # the copies are not the model's
    for p, q in zip(pipe.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


def test_training_steps_keep_the_copies_in_step_with_the_model() -> None:
    """Three SGD steps on ``pipe.parameters()``: the weights equal the plain model's after each, so each step's
    copies took the weights the optimizer had just moved."""
    torch.manual_seed(1)
    model = mlp(3)
    reference = copy.deepcopy(model)
    pipe = GPipe(model, _balance(model, 3), devices=["cpu"] * 3, chunks=6, schedule="dualpipe")
    assert len(pipe.devices) == 6 and pipe.schedule.num_devices == 3  # a partition per slot, on 3 devices
    ours = torch.optim.SGD(pipe.parameters(), lr=0.1, momentum=0.9)
    theirs = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        x, y = torch.randn(12, 5, dtype=torch.float64), torch.randn(12, 3, dtype=torch.float64)
        ours.zero_grad()
        theirs.zero_grad()
        pipe.step(x, y, nn.functional.mse_loss)
        nn.functional.mse_loss(reference(x), y).backward()
        ours.step()
        theirs.step()
        for p, q in zip(pipe.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p, q)


def test_gradients_accumulate_over_steps_as_backward_does() -> None:
    torch.manual_seed(2)
    model = mlp(2)
    reference = copy.deepcopy(model)
    pipe = GPipe(model, _balance(model, 2), chunks=4, schedule="dualpipe")
    for _ in range(2):
        x, y = torch.randn(8, 5, dtype=torch.float64), torch.randn(8, 3, dtype=torch.float64)
        pipe.step(x, y, nn.functional.mse_loss)
        nn.functional.mse_loss(reference(x), y).backward()
    for p, q in zip(pipe.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


def test_the_recorded_timeline_follows_both_copies_lists() -> None:
    torch.manual_seed(3)
    model = mlp(2)
    pipe = GPipe(model, _balance(model, 2), chunks=4, schedule="dualpipe", record=True)
    pipe.step(torch.randn(8, 5, dtype=torch.float64), torch.randn(8, 3, dtype=torch.float64), nn.functional.mse_loss)
    timeline = pipe.timeline
    assert timeline is not None
    for d in range(2):
        assert timeline.task_order(d) == list(pipe.schedule.tasks[d])


def test_inference_runs_each_microbatch_through_its_own_copy() -> None:
    """``forward()`` without grad: each device's forwards first (Note [inference on copies] in gpipe.frontend),
    with the weights the model has now, as the plain model computes."""
    torch.manual_seed(4)
    model = mlp(3)
    reference = copy.deepcopy(model)
    pipe = GPipe(model, _balance(model, 3), chunks=6, schedule="dualpipe")
    with torch.no_grad():
        for p in pipe.parameters():
            p.mul_(1.5)  # a change the copies see at the next run
        for p in reference.parameters():
            p.mul_(1.5)
        x = torch.randn(12, 5, dtype=torch.float64)
        torch.testing.assert_close(pipe(x), reference(x))
        pipe.eval()
        torch.testing.assert_close(pipe(x[:7]), reference(x[:7]))  # fewer micro-batches, an odd count


def test_what_two_copies_cannot_run_is_refused() -> None:
    model = mlp(2)
    pipe = GPipe(model, _balance(model, 2), chunks=4, schedule="dualpipe")
    with pytest.raises(RuntimeError, match="runs copies of the stages.*train with pipe.step"):
        pipe(torch.randn(8, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="stage 0 has a BatchNorm1d layer, whose running statistics"):
        GPipe(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)), [2, 1], chunks=4,
              schedule="dualpipe")

    @skippable(stash=["x"])
    class Keep(nn.Module):
        def forward(self, x: torch.Tensor):  # type: ignore[no-untyped-def]
            yield stash("x", x)
            return x

    @skippable(pop=["x"])
    class Add(nn.Module):
        def forward(self, x: torch.Tensor):  # type: ignore[no-untyped-def]
            return x + (yield pop("x"))

    with pytest.raises(ValueError, match="skip connections between copies are not supported"):
        GPipe(nn.Sequential(Keep(), nn.Linear(3, 3), Add()), [1, 2], chunks=4, schedule="dualpipe")
