"""What ``step()`` leaves besides the parameters' gradients: the input's gradient, and plain batch norm's running
statistics moved once per micro-batch whatever the checkpoint mode (Note [batch norm in a recompute] in
:mod:`gpipe.interpreter.worker`)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpipe import GPipe
from gpipe.schedule import CHECKPOINT_MODES


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zb-h1"])
def test_step_leaves_the_inputs_gradient_as_backward_does(schedule: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 2))
    reference = copy.deepcopy(model)
    x, y = torch.randn(10, 4), torch.randn(10, 2)
    want = x.clone().requires_grad_()
    F.mse_loss(reference(want), y).backward()
    pipe = GPipe(model, [2, 3], devices=["cpu", "cpu"], chunks=4, schedule=schedule)
    got = x.clone().requires_grad_()
    pipe.step(got, y, F.mse_loss)
    assert got.grad is not None
    torch.testing.assert_close(got.grad, want.grad)


def test_step_carries_the_inputs_gradient_on_into_its_own_graph() -> None:
    """An input computed from a leaf (an embedding outside the pipeline, say): the gradient reaches the leaf."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
    reference = copy.deepcopy(model)
    scale, y = torch.randn(4), torch.randn(8, 2)
    base = torch.randn(8, 4)
    want = scale.clone().requires_grad_()
    F.mse_loss(reference(base * want), y).backward()
    got = scale.clone().requires_grad_()
    GPipe(model, [1, 2], devices=["cpu", "cpu"], chunks=4, schedule="1f1b").step(base * got, y, F.mse_loss)
    torch.testing.assert_close(got.grad, want.grad)


def _norm_model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 2))


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_plain_batch_norm_counts_each_micro_batch_once(checkpoint: str, schedule: str) -> None:
    torch.manual_seed(0)
    model = _norm_model()
    reference = copy.deepcopy(model)
    x, y = torch.randn(8, 4), torch.randn(8, 2)
    pipe = GPipe(model, [3, 1], devices=["cpu", "cpu"], chunks=4, checkpoint=checkpoint, schedule=schedule)
    pipe.step(x, y, F.mse_loss)
    for piece in x.split(2):  # what the layer would see without checkpointing: each micro-batch, once
        reference(piece)
    norm, want = pipe[1], reference[1]
    assert isinstance(norm, nn.BatchNorm1d) and isinstance(want, nn.BatchNorm1d)
    assert int(norm.num_batches_tracked) == 4  # type: ignore[arg-type]
    torch.testing.assert_close(norm.running_mean, want.running_mean)
    torch.testing.assert_close(norm.running_var, want.running_var)
    assert norm.track_running_stats


def test_batch_norm_in_a_recompute_still_normalises_by_the_micro_batch() -> None:
    """The recompute's output is the forward's: gradients equal the plain model's on the same micro-batches."""
    torch.manual_seed(0)
    model = _norm_model()
    reference = copy.deepcopy(model)
    x, y = torch.randn(8, 4), torch.randn(8, 2)
    pipe = GPipe(model, [3, 1], devices=["cpu", "cpu"], chunks=4, checkpoint="always")
    pipe.step(x, y, F.mse_loss)
    loss = sum(F.mse_loss(reference(xi), yi) * 2 / 8 for xi, yi in zip(x.split(2), y.split(2), strict=True))
    assert isinstance(loss, torch.Tensor)
    loss.backward()
    want = dict(reference.named_parameters())
    for name, p in pipe.named_parameters():
        torch.testing.assert_close(p.grad, want[name.split(".", 2)[2]].grad)
