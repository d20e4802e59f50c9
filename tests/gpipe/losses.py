"""The losses a step must reproduce exactly: every ``torch.nn`` loss module that takes ``(input, target)``, with
each option that changes how it averages, and callables that sum. Shared by the threads' and the ranks' tests.

Each case builds a model whose last layers give the output the loss expects, and a target for a batch of
:data:`BATCH` rows (four micro-batches of 3, 3, 2 and 2 rows: uneven on purpose). Class-index targets have
``ignore_index`` padding in rows 0 to 2 (the whole first micro-batch) and row 5.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

BATCH, CHUNKS, FEATURES, CLASSES = 10, 4, 6, 5
IGNORED = [0, 1, 2, 5]


@dataclass(frozen=True)
class LossCase:
    loss: Callable[[], Callable[..., Tensor]]
    head: Callable[[], list[nn.Module]]  # the model's last layers: features (N, 8) -> the loss's input
    target: Callable[[torch.Generator], Tensor]
    loss_reduction: str | None = None


def _classes(g: torch.Generator, ignore: int | None = -100, shape: tuple[int, ...] = (BATCH,)) -> Tensor:
    t = torch.randint(0, CLASSES, shape, generator=g)
    if ignore is not None:
        t[IGNORED] = ignore
    return t


def _probabilities(g: torch.Generator) -> Tensor:
    return torch.softmax(torch.randn(BATCH, CLASSES, generator=g, dtype=torch.float64), dim=1)


def _values(g: torch.Generator, width: int = CLASSES) -> Tensor:
    return torch.randn(BATCH, width, generator=g, dtype=torch.float64)


def _unit(g: torch.Generator) -> Tensor:
    return torch.rand(BATCH, CLASSES, generator=g, dtype=torch.float64)


def _signs(g: torch.Generator) -> Tensor:
    return torch.randint(0, 2, (BATCH, CLASSES), generator=g).double() * 2 - 1


def _labels(g: torch.Generator) -> Tensor:
    """MultiLabelMarginLoss's targets: class indices, each row ended by -1."""
    t = torch.full((BATCH, CLASSES), -1, dtype=torch.long)
    for r in range(BATCH):
        k = int(torch.randint(1, CLASSES, (1,), generator=g))
        t[r, :k] = torch.randperm(CLASSES, generator=g)[:k]
    return t


def _linear(out: int = CLASSES) -> list[nn.Module]:
    return [nn.Linear(8, out)]


def _weights() -> Tensor:
    return torch.tensor([0.5, 2.0, 1.0, 3.0, 0.25], dtype=torch.float64)


def _summed_mse(output: Tensor, target: Tensor) -> Tensor:
    return F.mse_loss(output, target, reduction="sum")


CASES: dict[str, LossCase] = {
    "cross-entropy": LossCase(nn.CrossEntropyLoss, _linear, functools.partial(_classes, ignore=None)),
    "cross-entropy-ignore": LossCase(nn.CrossEntropyLoss, _linear, _classes),
    "cross-entropy-ignore-7": LossCase(lambda: nn.CrossEntropyLoss(ignore_index=7), _linear,
                                       functools.partial(_classes, ignore=7)),
    "cross-entropy-weight-ignore": LossCase(lambda: nn.CrossEntropyLoss(weight=_weights()), _linear, _classes),
    "cross-entropy-smoothing-weight-ignore": LossCase(
        lambda: nn.CrossEntropyLoss(weight=_weights(), label_smoothing=0.2), _linear, _classes),
    "cross-entropy-sum-ignore": LossCase(lambda: nn.CrossEntropyLoss(reduction="sum"), _linear, _classes),
    "cross-entropy-probabilities": LossCase(lambda: nn.CrossEntropyLoss(label_smoothing=0.1), _linear,
                                            _probabilities),
    "cross-entropy-per-position": LossCase(  # (N, C, L) logits, (N, L) targets, some positions ignored
        lambda: nn.CrossEntropyLoss(weight=_weights()),
        lambda: [nn.Linear(8, CLASSES * 3), nn.Unflatten(1, (CLASSES, 3))],
        lambda g: torch.where(torch.rand(BATCH, 3, generator=g) < 0.3, -100,
                              torch.randint(0, CLASSES, (BATCH, 3), generator=g))),
    "nll-weight-ignore": LossCase(lambda: nn.NLLLoss(weight=_weights()),
                                  lambda: [*_linear(), nn.LogSoftmax(dim=1)], _classes),
    "nll-sum": LossCase(lambda: nn.NLLLoss(reduction="sum"), lambda: [*_linear(), nn.LogSoftmax(dim=1)], _classes),
    "mse": LossCase(nn.MSELoss, _linear, _values),
    "mse-sum": LossCase(lambda: nn.MSELoss(reduction="sum"), _linear, _values),
    "l1": LossCase(nn.L1Loss, _linear, _values),
    "smooth-l1": LossCase(lambda: nn.SmoothL1Loss(beta=0.5), _linear, _values),
    "huber-sum": LossCase(lambda: nn.HuberLoss(reduction="sum", delta=0.5), _linear, _values),
    "bce-weight": LossCase(lambda: nn.BCELoss(weight=_weights()), lambda: [*_linear(), nn.Sigmoid()], _unit),
    "bce-logits-pos-weight": LossCase(lambda: nn.BCEWithLogitsLoss(pos_weight=_weights()), _linear, _unit),
    "kl-batchmean": LossCase(lambda: nn.KLDivLoss(reduction="batchmean"),
                             lambda: [*_linear(), nn.LogSoftmax(dim=1)], _probabilities),
    "kl-mean-log-target": LossCase(lambda: nn.KLDivLoss(log_target=True),
                                   lambda: [*_linear(), nn.LogSoftmax(dim=1)], lambda g: _probabilities(g).log()),
    "poisson": LossCase(lambda: nn.PoissonNLLLoss(full=True), _linear, lambda g: _unit(g) * 4),
    "soft-margin": LossCase(nn.SoftMarginLoss, _linear, _signs),
    "hinge-embedding": LossCase(lambda: nn.HingeEmbeddingLoss(margin=0.5), _linear, _signs),
    "multi-label-soft-margin": LossCase(lambda: nn.MultiLabelSoftMarginLoss(weight=_weights()), _linear, _unit),
    "multi-margin": LossCase(lambda: nn.MultiMarginLoss(p=2, weight=_weights()), _linear,
                             functools.partial(_classes, ignore=None)),
    "multi-label-margin": LossCase(nn.MultiLabelMarginLoss, _linear, _labels),
    "callable-mean": LossCase(lambda: F.mse_loss, _linear, _values),
    "callable-sum": LossCase(lambda: _summed_mse, _linear, _values, loss_reduction="sum"),
    "partial-sum": LossCase(lambda: functools.partial(F.cross_entropy, reduction="sum"), _linear,
                            functools.partial(_classes, ignore=None), loss_reduction="sum"),
}


def model(case: LossCase) -> nn.Sequential:
    """Five layers in float64 (so that the comparison is tight): a body of two, then the case's head."""
    layers = [nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), *case.head()]
    return nn.Sequential(*layers).double()


def data(case: LossCase, seed: int = 0) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(BATCH, FEATURES, generator=g, dtype=torch.float64), case.target(g)
