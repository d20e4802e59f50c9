"""Transparency: the pipeline computes what the un-pipelined model computes, loss and every gradient."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from gpipe import GPipe
from gpipe.autograd import rng
from gpipe.microbatch import scatter
from gpipe.schedule import CHECKPOINT_MODES
from tests.gpipe.models import balances, convnet, dropnet, mlp, skipnet, tuple_input, tuplenet

BATCH = 9  # divides none of 2, 4, 8: the last micro-batches are uneven
CHUNKS = (1, 2, 4, 8)


def _every_configuration(layers: int) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Every balance of ``layers`` layers over 2-4 partitions x chunks 1, 2, 4, 8 x every checkpoint mode."""
    def mark(test: Callable[..., None]) -> Callable[..., None]:
        test = pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)(test)
        test = pytest.mark.parametrize("chunks", CHUNKS)(test)
        return pytest.mark.parametrize("balance", list(balances(layers)), ids=str)(test)
    return mark


def _loss(out: Tensor) -> Tensor:
    weights = torch.linspace(-1.0, 1.0, out[0].numel()).reshape(out[0].shape)
    return (out * weights).sum() + out.pow(2).mean()


def _check(model: nn.Sequential, balance: list[int], chunks: int, checkpoint: str, inputs: object, *,
           per_microbatch: bool = False, **kwargs: object) -> None:
    reference = copy.deepcopy(model)
    pipe = GPipe(model, balance, devices=["cpu"] * len(balance), chunks=chunks, checkpoint=checkpoint, **kwargs)
    ref_in = tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in inputs) \
        if isinstance(inputs, tuple) else inputs.detach().clone().requires_grad_(inputs.requires_grad)
    if per_microbatch:  # batch norm normalises each micro-batch by its own statistics
        pieces = scatter(ref_in if isinstance(ref_in, tuple) else (ref_in,), chunks)
        expected = torch.cat([reference(p if isinstance(ref_in, tuple) else p[0]) for p in pieces])
    else:
        expected = reference(ref_in)
    out = pipe(inputs)
    torch.testing.assert_close(out, expected)
    _loss(out).backward()
    _loss(expected).backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, msg=lambda m, name=name: f"{name}: {m}")
    for a, b in zip(inputs if isinstance(inputs, tuple) else (inputs,),
                    ref_in if isinstance(ref_in, tuple) else (ref_in,), strict=True):
        if a.requires_grad:
            torch.testing.assert_close(a.grad, b.grad)


@_every_configuration(layers=5)
def test_mlp(balance: list[int], chunks: int, checkpoint: str) -> None:
    torch.manual_seed(0)
    _check(mlp(), balance, chunks, checkpoint, torch.randn(BATCH, 6, requires_grad=True))


@_every_configuration(layers=5)
def test_random_layers_draw_what_the_unpipelined_model_draws_with_the_same_seeds(
        balance: list[int], chunks: int, checkpoint: str) -> None:
    """Dropout, F.dropout, rand_like, bernoulli, normal_ and a custom op: the reference runs each micro-batch
    through each partition's layers with the draws of that task (Note [random state] in gpipe.autograd.rng)."""
    torch.manual_seed(0)
    model = dropnet()
    reference = copy.deepcopy(model)
    x = torch.randn(BATCH, 6, requires_grad=True)
    ref_x = x.detach().clone().requires_grad_()
    torch.manual_seed(7)
    seed = rng.step_seed()
    bounds = [sum(balance[:j]) for j in range(len(balance) + 1)]
    pieces = []
    for i, (piece,) in enumerate(scatter((ref_x,), chunks)):
        for j in range(len(balance)):
            for k, layer in enumerate(reference[bounds[j]:bounds[j + 1]]):
                with rng.TaskDraws(seed, i, j, k):
                    piece = layer(piece)
        pieces.append(piece)
    expected = torch.cat(pieces)
    pipe = GPipe(model, balance, devices=["cpu"] * len(balance), chunks=chunks, checkpoint=checkpoint)
    torch.manual_seed(7)
    out = pipe(x)
    torch.testing.assert_close(out, expected)
    _loss(out).backward()
    _loss(expected).backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=lambda m, name=name: f"{name}: {m}")
    torch.testing.assert_close(x.grad, ref_x.grad)
    assert (out == 0).any()  # dropout dropped something: the draws were real


@_every_configuration(layers=5)
def test_convnet_with_deferred_batch_norm(balance: list[int], chunks: int, checkpoint: str) -> None:
    torch.manual_seed(0)
    _check(convnet(), balance, chunks, checkpoint, torch.randn(BATCH, 2, 5, 5), per_microbatch=True,
           deferred_batch_norm=True)


@_every_configuration(layers=5)
def test_skip_connection_across_partitions(balance: list[int], chunks: int, checkpoint: str) -> None:
    torch.manual_seed(0)
    _check(skipnet(), balance, chunks, checkpoint, torch.randn(BATCH, 6, requires_grad=True))


@_every_configuration(layers=4)
def test_tuple_inputs(balance: list[int], chunks: int, checkpoint: str) -> None:
    torch.manual_seed(0)
    a, b = tuple_input(BATCH)
    _check(tuplenet(), balance, chunks, checkpoint, (a.requires_grad_(), b))


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
def test_partitions_starting_with_an_in_place_layer(checkpoint: str) -> None:
    """Note [checkpointing] in gpipe.interpreter.worker: such a partition's checkpointed forward runs on a copy of its
    input."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.ReLU(inplace=True), nn.Linear(6, 8), nn.ReLU(inplace=True), nn.Linear(8, 3))
    for _ in range(2):  # the second step runs with what the first learnt
        _check(model, [2, 2], 3, checkpoint, torch.randn(BATCH, 6))
        model.zero_grad()


def test_input_without_grad_and_frozen_first_partition() -> None:
    torch.manual_seed(0)
    model = mlp()
    for p in model[0].parameters():
        p.requires_grad_(False)
    reference = copy.deepcopy(model)
    pipe = GPipe(model, [2, 3], chunks=3)
    x = torch.randn(BATCH, 6)
    _loss(pipe(x)).backward()
    _loss(reference(x)).backward()
    assert model[0].weight.grad is None
    torch.testing.assert_close(model[2].weight.grad, reference[2].weight.grad)


def test_double_precision_cast_is_allowed() -> None:
    torch.manual_seed(0)
    model = mlp()
    reference = copy.deepcopy(model).double()
    pipe = GPipe(model, [2, 3], chunks=2).double()
    x = torch.randn(4, 6, dtype=torch.float64)
    torch.testing.assert_close(pipe(x), reference(x))
