"""The second copies of a schedule's stages (DualPipe's two directions): made once, their weights synced from the
originals before a step, their gradients summed into the originals' after it.

Note [one model, two copies]: a schedule of copies (Note [stage slots] in :mod:`gpipe.schedule.schedule`) runs
stage ``s`` of the model in slot ``s`` for the micro-batches of copy 0 and in slot ``c * S + s`` for those of
copy ``c``, each slot a partition on its own device. The user's model is the original partitions: they alone
are submodules of the pipeline, so ``pipe.parameters()`` is the plain model's, and an optimizer on it steps
each weight once. Each other slot holds a deep copy of its stage (:class:`StageCopies`), outside the module
tree. Before a step's forwards its parameters and buffers take the originals' values (the optimizer moved
those); after the step's backward each copy's gradient is added to its original's ``.grad`` and dropped. The
loss of a micro-batch depends on one copy only, so the sum is the plain model's gradient, exactly as
DeepSeek's DualPipe sums the two directions' gradients of a stage. A layer whose buffers change in training
(batch norm's running statistics) would split its statistics between the copies, so such models are refused, as
are skip connections (:meth:`gpipe.frontend.Arguments.check`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["StageCopies"]


class StageCopies:
    """The partitions of every slot: each original, and a copy of it in each other copy's slot
    (Note [one model, two copies])."""

    def __init__(self, originals: Sequence[nn.Sequential], devices: Sequence[torch.device], copies: int) -> None:
        """``originals``: the model's stages, on ``devices[:S]``; ``devices``: each slot's device, ``copies x S``
        (:class:`gpipe.frontend.Arguments` refused what copies cannot run)."""
        stages = len(originals)
        self.originals = tuple(originals)
        self.others = tuple(copy.deepcopy(originals[j % stages]).to(devices[j])
                            for j in range(stages, copies * stages))

    @property
    def partitions(self) -> tuple[nn.Sequential, ...]:
        """Every slot's partition, in slot order: the originals, then each other copy's."""
        return self.originals + self.others

    def _pairs(self) -> list[tuple[nn.Sequential, nn.Sequential]]:
        stages = len(self.originals)
        return [(self.originals[k % stages], other) for k, other in enumerate(self.others)]

    @torch.no_grad()
    def sync(self) -> None:
        """Before a step: each copy's parameters and buffers take its original's values (and dtype), and its
        training mode."""
        for original, other in self._pairs():
            other.train(original.training)
            for mine, theirs in ((other.parameters(), original.parameters()), (other.buffers(), original.buffers())):
                for a, b in zip(mine, theirs, strict=True):
                    if a.dtype != b.dtype or a.shape != b.shape:
                        a.data = b.detach().to(a.device, copy=True)
                    else:
                        a.copy_(b)
                    if isinstance(a, nn.Parameter):
                        a.requires_grad_(b.requires_grad)

    @torch.no_grad()
    def reduce(self) -> None:
        """After a step's backward: each copy's gradient added to its original's ``.grad`` (moved to its device),
        and dropped from the copy."""
        for original, other in self._pairs():
            for a, b in zip(other.parameters(), original.parameters(), strict=True):
                if a.grad is None:
                    continue
                grad = a.grad.to(b.device)
                if b.grad is None:
                    b.grad = grad.clone() if grad.data_ptr() == a.grad.data_ptr() else grad
                else:
                    b.grad += grad
                a.grad = None

    def drop(self) -> None:
        """After a step that failed: the copies' partial gradients are dropped, the originals' left as they are."""
        for other in self.others:
            for a in other.parameters():
                a.grad = None
