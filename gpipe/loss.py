"""A step's loss from its micro-batches' losses: scaled so that their sum is the plain model's loss on the batch.

Note [an exact loss]: a pipeline computes the loss per micro-batch, but the loss it must train on is the plain
model's on the whole mini-batch. A loss is a sum over the batch divided by a normaliser ``N``; the micro-batches
share the sum, so micro-batch ``i`` contributes ``sum_i / N`` (equivalently ``mean_i · N_i / N``) and the
contributions add up to the plain loss, gradients included. ``N`` must be known before the first forward ends
(1F1B runs a micro-batch's backward before the others' forwards), so it comes from the targets alone:

- ``reduction="sum"`` (a loss module's, or ``loss_reduction="sum"`` for any callable): ``N = 1``.
- A mean over rows or over elements, where each row has as many elements (``MSELoss``, ``BCELoss``, ``L1Loss``,
  ``KLDivLoss`` with ``"mean"`` or ``"batchmean"``, cross entropy on probability targets, ...): ``N_i / N`` is the
  micro-batch's share of the rows, whatever the row's width.
- ``CrossEntropyLoss`` and ``NLLLoss`` on class indices: ``N`` is the summed class weight of the targets that count
  (those not equal to ``ignore_index``; their number without class weights). Micro-batch ``i`` runs the loss with
  ``reduction="sum"`` and is divided by ``N``, so padding and class weights weigh as in the plain model, and a
  micro-batch whose targets are all ignored adds zero instead of NaN. When no target counts (``N = 0``) the plain
  loss is NaN and its gradients zero; so are the step's.

Any other callable is taken as a mean over rows unless ``loss_reduction="sum"`` says it sums.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, cast

import torch
from torch import Tensor, nn

__all__ = ["LOSS_REDUCTIONS", "NO_GRAD", "LossPlan", "loss_plan", "reduction_of"]

LossReduction = Literal["mean", "sum"]
LOSS_REDUCTIONS: tuple[str, ...] = ("mean", "sum")

#: A step's error when its loss has no gradient, as ``loss.backward()`` raises it (the first words are torch's).
NO_GRAD = ("element 0 of tensors does not require grad and does not have a grad_fn: loss_fn's result does not "
           "require grad (it was detached or computed under torch.no_grad(), or no parameter and no input that it "
           "depends on requires grad), so the step has no gradient to compute")

#: Losses whose mean divides by the class weight of the counted targets (Note [an exact loss]).
_CLASS_WEIGHTED = (nn.CrossEntropyLoss, nn.NLLLoss)


@dataclass(frozen=True)
class LossPlan:
    """What the last stage computes on each micro-batch: ``fn(output, target) * scales[i]``.

    Attributes:
        fn: the loss to call on one micro-batch (the user's, or a copy of it that sums).
        scales: each micro-batch's factor (Note [an exact loss]).
        undefined: the plain model's loss is NaN (a weighted mean over no counted target); gradients are zero.
    """

    fn: Callable[..., Tensor]
    scales: tuple[float, ...]
    undefined: bool = False

    def total(self, losses: Sequence[Tensor]) -> Tensor:
        """The step's loss from the micro-batches' scaled losses."""
        loss = torch.stack(list(losses)).sum()
        return loss * float("nan") if self.undefined else loss


def reduction_of(loss_fn: Callable[..., Tensor], loss_reduction: str | None = None) -> str:
    """How ``loss_fn``'s micro-batch losses combine: ``"mean"``, ``"sum"``, or ``"class-weighted"`` (a cross
    entropy or NLL loss module averaging over class indices: Note [an exact loss]).

    A loss module's ``reduction`` attribute decides; ``loss_reduction`` (``"mean"`` or ``"sum"``) is for other
    callables and, given for a module, must agree with it.

    Raises:
        ValueError: an unknown ``loss_reduction``, one that contradicts the module's, or a module that does not
            reduce (``reduction="none"``: a step needs one number).
    """
    if loss_reduction is not None and loss_reduction not in LOSS_REDUCTIONS:
        raise ValueError(f"loss_reduction must be one of {', '.join(map(repr, LOSS_REDUCTIONS))}, got "
                         f"{loss_reduction!r}")
    own = getattr(loss_fn, "reduction", None) if isinstance(loss_fn, nn.Module) else None
    if not isinstance(own, str):
        return loss_reduction or "mean"
    if own == "none":
        raise ValueError(f"{type(loss_fn).__name__}(reduction='none') returns a loss per element; a step needs one "
                         "number: use reduction='mean' or 'sum'")
    kind = "sum" if own == "sum" else "mean"  # "mean", and KLDivLoss's "batchmean": both average over rows
    if loss_reduction is not None and loss_reduction != kind:
        raise ValueError(f"loss_reduction={loss_reduction!r} contradicts {type(loss_fn).__name__}(reduction="
                         f"{own!r}); leave loss_reduction out for a loss module: its reduction decides")
    if kind == "mean" and _class_weighted(loss_fn):
        return "class-weighted"
    return kind


def loss_plan(loss_fn: Callable[..., Tensor], reduction: str, target: Sequence[Tensor],
              rows: Sequence[int]) -> LossPlan:
    """The plan of a step whose whole target is ``target`` and whose micro-batches have ``rows`` rows each.

    Args:
        loss_fn: the user's loss.
        reduction: :func:`reduction_of`'s answer for it.
        target: the mini-batch's target tensors (before the split).
        rows: the rows of each micro-batch.
    """
    if reduction == "sum":
        return LossPlan(loss_fn, (1.0,) * len(rows))
    if reduction == "class-weighted" and not target[0].is_floating_point():
        counted = _counted_weight(cast(nn.Module, loss_fn), target[0])
        summed = copy.copy(loss_fn)  # shares the class weights; only its reduction differs
        setattr(summed, "reduction", "sum")  # noqa: B010 - a loss module's plain attribute
        return LossPlan(summed, (1.0 / counted if counted else 0.0,) * len(rows), undefined=not counted)
    total = sum(rows)
    return LossPlan(loss_fn, tuple(r / total for r in rows))


def _class_weighted(loss_fn: Callable[..., Tensor]) -> bool:
    """A cross entropy or NLL module whose ``forward`` is torch's own (a subclass may compute something else)."""
    return any(isinstance(loss_fn, kind) and type(loss_fn).forward is kind.forward for kind in _CLASS_WEIGHTED)


def _counted_weight(loss_fn: nn.Module, target: Tensor) -> float:
    """The normaliser of a mean cross entropy or NLL loss on class indices ``target``: the summed class weight of
    the targets not equal to ``ignore_index`` (their count without class weights)."""
    kept = target[target != loss_fn.ignore_index]  # type: ignore[operator]
    weight = cast(Tensor | None, loss_fn.weight)
    if weight is None:
        return float(kept.numel())
    if kept.numel() and (int(kept.min()) < 0 or int(kept.max()) >= weight.numel()):
        raise ValueError(f"a target class index is out of range for {type(loss_fn).__name__}'s {weight.numel()} "
                         f"class weights (targets range {int(kept.min())} to {int(kept.max())})")
    return float(weight.to(kept.device)[kept].sum(dtype=torch.float64))
