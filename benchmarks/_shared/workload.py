"""The speed benchmarks' workload: ``layers`` x (Linear(width) + ReLU), an MSE loss, and one training step of it.

``executor_speed.py``, ``schedule_speed.py``, ``distributed_speed.py`` and ``split_cost.py`` time this step (or
:func:`pipe_step`, GPipe's other entry point) and check every pipeline against the plain model first
(:func:`gradients_match`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["Workload", "gradients_match", "pipe_step", "train_step"]


@dataclass(frozen=True)
class Workload:
    """The model and batch every configuration runs."""

    layers: int  # (Linear + ReLU) pairs
    width: int  # features in and out of every Linear
    batch: int
    chunks: int
    seed: int = 0

    @property
    def balance(self) -> list[int]:
        """Two partitions of whole (Linear + ReLU) pairs, the first one the larger when ``layers`` is odd."""
        return [2 * (self.layers - self.layers // 2), 2 * (self.layers // 2)]

    @property
    def m(self) -> int:
        return min(self.chunks, self.batch)

    def model(self) -> nn.Sequential:
        torch.manual_seed(self.seed)
        body: list[nn.Module] = []
        for _ in range(self.layers):
            body += [nn.Linear(self.width, self.width), nn.ReLU()]
        return nn.Sequential(*body)

    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed + 1)
        x = torch.randn(self.batch, self.width, generator=generator)  # (B, width)
        y = torch.randn(self.batch, self.width, generator=generator)  # (B, width)
        return x, y


def train_step(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One step: zero the gradients, forward, MSE loss, backward; returns the loss (detached)."""
    module.zero_grad(set_to_none=True)
    loss = F.mse_loss(module(x), y)
    loss.backward()
    return loss.detach()


def pipe_step(pipe: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The same step through GPipe's other entry point: zero the gradients, ``pipe.step`` (MSE inside)."""
    pipe.zero_grad(set_to_none=True)
    return pipe.step(x, y, F.mse_loss)


def gradients_match(reference: nn.Module, other: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    step: Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor] = train_step) -> bool:
    """One step of each from the same weights: equal loss and parameter gradients (the pipeline is transparent)."""
    a, b = train_step(reference, x, y), step(other, x, y)
    ok = torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    pa, pb = list(reference.parameters()), list(other.parameters())
    ok = ok and len(pa) == len(pb)
    for p, q in zip(pa, pb, strict=False):
        ok = ok and p.grad is not None and q.grad is not None and torch.allclose(p.grad, q.grad.to(p.device),
                                                                                 rtol=1e-4, atol=1e-6)
    return bool(ok)
