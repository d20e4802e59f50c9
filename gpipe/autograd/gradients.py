"""Where a backward's parameter gradients go: into ``.grad``, into the parameters the caller named, or to autograd.

Note [gradients the caller asked for]: ``loss.backward()`` and ``step()`` accumulate into ``.grad``, as
autograd would (every leaf the graph reaches); ``backward(inputs=...)`` only into the parameters it
names; ``torch.autograd.grad`` (``collect``) leaves ``.grad`` alone: each task's parameter gradients are
summed per partition, and the pipeline's autograd node hands them to the engine, which returns them.

A split backward (``B`` then ``W``, Note [split backward] in :mod:`gpipe.autograd.split_backward`) sends its parameters'
gradients to the same places: ``W`` differentiates the parameters alone, so a tensor that requires grad inside a
layer without being a parameter gets no ``.grad`` there. What its ``B`` tasks learn of each partition's graphs
(Note [learnt split]) lives in the :class:`gpipe.autograd.split_backward.StagePlans` the caller gives, the pipeline's,
across steps (Note [plans across steps]); a run picks each partition's plans once, at its first ``B``, for the
parameters it differentiates (those that require grad, those the caller asked for), which are fixed for the run.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from gpipe.autograd.split_backward import SplitPlans, StagePlans, WeightGrads, backward_input

__all__ = ["Gradients"]


class Gradients:
    """One run's parameter gradients, per partition (Note [gradients the caller asked for]).

    Args:
        partitions: the pipeline's.
        learnt: per partition, the split plans of earlier runs (Note [plans across steps] in
        :mod:`gpipe.autograd.split_backward`);
            ``None``: this run's own, learnt afresh.
    """

    def __init__(self, partitions: Sequence[nn.Module], learnt: Sequence[StagePlans] | None = None) -> None:
        self.params = [[p for p in partition.parameters() if p.requires_grad] for partition in partitions]
        self.collect = False  # True: into param_grads for _Wait to return; False: into .grad
        self.wanted: list[list[bool]] | None = None  # per partition, the parameters to differentiate (None: all)
        self.param_grads: list[list[tuple[Tensor, bool] | None]] = [[None] * len(ps) for ps in self.params]
        self.differentiable: list[Tensor] = []  # forward(): the input leaves, then every parameter (_Wait's inputs)
        self.learnt = list(learnt) if learnt is not None else [StagePlans() for _ in partitions]
        self.plans: list[SplitPlans | None] = [None] * len(partitions)  # per partition, picked by its first B

    def asked(self, asked: Sequence[bool] | None) -> None:
        """Where the backward's parameter gradients go: ``asked`` says, per input leaf and parameter of
        :attr:`differentiable`, whether the caller's backward differentiates it; None under ``autograd.grad``."""
        if asked is None:
            self.collect = True
            return
        flags = list(asked[len(self.differentiable) - sum(len(ps) for ps in self.params):])
        if all(flags):
            return
        self.wanted = []
        for ps in self.params:
            self.wanted.append(flags[:len(ps)])
            flags = flags[len(ps):]

    def _wanted(self, j: int) -> list[Tensor]:
        return list(self.params[j]) if self.wanted is None else [
            p for p, want in zip(self.params[j], self.wanted[j], strict=True) if want]

    def differentiate(self, j: int, pairs: list[tuple[Tensor, Tensor]], leaves: list[Tensor]) -> list[Tensor | None]:
        """Backward through the graph of a task of partition ``j``: the gradients of ``leaves``; its parameters'
        as the caller asked (Note [gradients the caller asked for])."""
        wanted = leaves + self._wanted(j)
        if not pairs or (self.wanted is not None and not wanted):
            return [None] * len(leaves)
        outs, grads = [o for o, _ in pairs], [g for _, g in pairs]
        if not self.collect:
            torch.autograd.backward(outs, grads, inputs=None if self.wanted is None else wanted)
            return [t.grad for t in leaves]
        found: list[Tensor | None] = list(torch.autograd.grad(outs, wanted, grads, allow_unused=True))
        self._add(j, found[len(leaves):])
        return found[:len(leaves)]

    def input_grads(self, j: int, pairs: list[tuple[Tensor, Tensor]],
                    leaves: list[Tensor]) -> tuple[list[Tensor | None], WeightGrads | None]:
        """``B`` of a split backward of partition ``j``: the gradients of ``leaves`` alone, and what ``W`` needs
        for the parameters the caller asked for (Note [split backward] in :mod:`gpipe.autograd.split_backward`)."""
        if not pairs:
            return [None] * len(leaves), None
        outs, grads = [o for o, _ in pairs], [g for _, g in pairs]
        plans = self.plans[j]
        if plans is None:  # asked() came before any backward
            plans = self.plans[j] = self.learnt[j].get(self._wanted(j))
        return backward_input(outs, grads, leaves, plans.params, plans)

    def weight_grads(self, j: int, kept: WeightGrads | None) -> None:
        """``W`` of a split backward of partition ``j``: its parameters' gradients as the caller asked (Note
        [gradients the caller asked for]) from what ``B`` kept; frees it."""
        if kept is None:
            return
        if not self.collect:
            kept.accumulate()
            return
        self._add(j, kept.collect())  # collect: every parameter is wanted (asked(None))

    def _add(self, j: int, found: list[Tensor | None]) -> None:
        """Sum a ``collect`` backward's gradients of partition ``j``'s (wanted) parameters."""
        sums = self.param_grads[j]
        for k, grad in enumerate(found):
            held = sums[k]
            if grad is None:
                continue
            if held is None:
                sums[k] = (grad, False)  # not ours to add into: autograd may hand out a tensor it holds elsewhere
            else:
                total, owned = held
                sums[k] = (total.add_(grad) if owned else total + grad, True)

    def parameter_grads(self) -> list[Tensor | None]:
        """The summed parameter gradients of a ``collect`` backward, in :attr:`params` order; released here."""
        grads = [None if held is None else held[0] for sums in self.param_grads for held in sums]
        self.param_grads = [[None] * len(ps) for ps in self.params]
        return grads
