"""Small layers that keep a model with skip connections a plain ``nn.Sequential``, by passing tuples.

A skip connection becomes a tuple that travels down the sequential: :class:`Fork` starts one,
:class:`OnFirst` applies a layer to the first element and carries the rest along, and the layer that
ends the skip (a residual add, a concatenation) takes the tuple apart. So every layer stays its own
entry of the sequential (a pipeline may cut between any two), and a cut inside a skip sends the
carried tensors along with the activation, which is what a pipeline must move anyway.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Fork", "OnFirst", "State", "first"]

#: What flows between layers: one tensor, or a tuple of them (the activation first).
State = torch.Tensor | tuple[torch.Tensor, ...]


def first(x: State) -> torch.Tensor:
    """The activation of a state: the tensor itself, or a tuple's first element."""
    return x[0] if isinstance(x, tuple) else x


class Fork(nn.Module):
    """Starts a skip connection: ``x -> (x, x)``; on a tuple, ``(x, *rest) -> (x, *rest, x)``."""

    def forward(self, x: State) -> tuple[torch.Tensor, ...]:
        if isinstance(x, tuple):
            return (*x, x[0])
        return (x, x)


class OnFirst(nn.Module):
    """Applies ``module`` to the activation and carries the skip tensors along unchanged."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: State) -> State:
        if isinstance(x, tuple):
            return (self.module(x[0]), *x[1:])
        return self.module(x)

    def extra_repr(self) -> str:
        return "carries skip tensors"
