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
