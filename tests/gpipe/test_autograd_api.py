"""The autograd calls a user may make on a pipeline's output, against the same calls on the un-pipelined model."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn

from gpipe import GPipe
from gpipe.schedule import CHECKPOINT_MODES
from tests.gpipe.models import mlp


def _pair(checkpoint: str = "except_last") -> tuple[nn.Sequential, nn.Sequential, GPipe, Tensor, Tensor]:
    torch.manual_seed(0)
    model = mlp()
    reference = copy.deepcopy(model)
    pipe = GPipe(model, [2, 3], chunks=3, checkpoint=checkpoint)
    x = torch.randn(6, 6, requires_grad=True)
    return model, reference, pipe, x, x.detach().clone().requires_grad_()


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
def test_autograd_grad_on_parameters_returns_them_and_leaves_grad_alone(checkpoint: str) -> None:
    model, reference, pipe, x, x_ref = _pair(checkpoint)
    got = torch.autograd.grad(pipe(x).pow(2).sum(), list(model.parameters()))
    expected = torch.autograd.grad(reference(x_ref).pow(2).sum(), list(reference.parameters()))
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b)
    assert all(p.grad is None for p in model.parameters())
    assert x.grad is None


def test_autograd_grad_on_the_input_and_some_parameters() -> None:
    model, reference, pipe, x, x_ref = _pair()
    got = torch.autograd.grad(pipe(x).sum(), [x, model[4].weight])
    expected = torch.autograd.grad(reference(x_ref).sum(), [x_ref, reference[4].weight])
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b)
    assert all(p.grad is None for p in model.parameters())


def test_backward_inputs_fills_only_what_it_names() -> None:
    model, reference, pipe, x, x_ref = _pair()
    pipe(x).sum().backward(inputs=[x])
    reference(x_ref).sum().backward(inputs=[x_ref])
    torch.testing.assert_close(x.grad, x_ref.grad)
    assert all(p.grad is None for p in model.parameters())
    pipe(x).sum().backward(inputs=[model[2].weight])
    reference(x_ref).sum().backward(inputs=[reference[2].weight])
    torch.testing.assert_close(model[2].weight.grad, reference[2].weight.grad)
    assert [p.grad is None for p in model.parameters()] == [p.grad is None for p in reference.parameters()]


def test_create_graph_raises_at_once_and_trains_nothing() -> None:
    model, _, pipe, x, _ = _pair()
    with pytest.raises(RuntimeError, match="create_graph=True"):
        torch.autograd.grad(pipe(x).sum(), list(model.parameters()), create_graph=True)
    assert all(p.grad is None for p in model.parameters())


def test_retain_graph_backward_once_works_and_twice_raises_with_the_way_out() -> None:
    model, reference, pipe, x, x_ref = _pair()
    loss = pipe(x).sum()
    loss.backward(retain_graph=True)
    reference(x_ref).sum().backward()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    with pytest.raises(RuntimeError, match="retain_graph=True cannot run a second backward"):
        loss.backward()
