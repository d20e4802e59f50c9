"""Small models for the executor's tests: an MLP, a conv net with batch norm, a skip model, a tuple model."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from gpipe.skip import pop, skippable, stash


def balances(layers: int, parts: range = range(2, 5)) -> Iterator[list[int]]:
    """Every balance of ``layers`` layers over each number of partitions in ``parts``."""
    for n in parts:
        for cuts in itertools.combinations(range(1, layers), n - 1):
            bounds = (0, *cuts, layers)
            yield [b - a for a, b in itertools.pairwise(bounds)]


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))


def convnet() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Conv2d(4, 3, 3, padding=1), nn.Flatten())


@skippable(stash=["identity"])
class Keep(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 6)

    def forward(self, x: Tensor):  # type: ignore[no-untyped-def]
        yield stash("identity", x)
        return self.linear(x)


@skippable(pop=["identity"])
class AddBack(nn.Module):
    def forward(self, x: Tensor):  # type: ignore[no-untyped-def]
        identity = yield pop("identity")
        return x + 2 * identity


def skipnet() -> nn.Sequential:
    return nn.Sequential(Keep(), nn.Tanh(), nn.Linear(6, 6), AddBack(), nn.Linear(6, 3))


class Pair(nn.Module):
    """(a, b) -> (linear(a) * b, b): a layer of a model whose input is a tuple of tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 6)

    def forward(self, inputs: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        a, b = inputs
        return self.linear(a) * torch.sigmoid(b), b


class First(nn.Module):
    def forward(self, inputs: tuple[Tensor, Tensor]) -> Tensor:
        return inputs[0]


def tuplenet() -> nn.Sequential:
    return nn.Sequential(Pair(), Pair(), Pair(), First())


def tuple_input(batch: int) -> tuple[Tensor, Tensor]:
    return torch.randn(batch, 6), torch.randn(batch, 6)


class Noise(nn.Module):
    """Draws through every route a model may take: a functional, a tensor factory, a tensor method, a custom op."""

    def forward(self, x: Tensor) -> Tensor:
        x = nn.functional.dropout(x, 0.3, self.training)
        x = x + 0.1 * torch.rand_like(x)
        x = x * torch.bernoulli(torch.full_like(x, 0.8))
        x = x + 0.1 * torch.empty_like(x).normal_()
        return RandomScale.apply(x)


class RandomScale(torch.autograd.Function):
    """A user's op drawing in its own forward: scales each row by a random factor, saved for backward."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # type: ignore[no-untyped-def, override]
        scale = torch.rand(x.size(0), *([1] * (x.dim() - 1)), dtype=x.dtype, device=x.device) + 0.5
        ctx.save_for_backward(scale)
        return x * scale

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # type: ignore[no-untyped-def, override]
        (scale,) = ctx.saved_tensors
        return grad * scale


def dropnet() -> nn.Sequential:
    """Random draws in three of five layers: dropout modules, and every other route through :class:`Noise`."""
    return nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.5), Noise(), nn.Linear(8, 8), nn.Dropout(0.2))
