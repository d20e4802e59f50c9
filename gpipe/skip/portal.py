"""Skip connections between partitions in one run: each stash's way to its pop, and the gradient's way back.

A stash and its pop in one partition stay inside the task. A skip that crosses partitions goes through a
portal (Kim et al. 2020, section 3.3): the stashing task keeps the stashed tensor with its graph, for its
backward, and leaves its value for the popping task, which receives it on its own device (as a fresh leaf when
training); the popping task's backward leaves that leaf's gradient for the stashing task's backward. A recompute pops
the leaf its forward popped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from gpipe.schedule import Op, Task
from gpipe.skip.layout import SkipLayout
from gpipe.skip.skippable import SkipKey

__all__ = ["Arrive", "PortalTracker", "Portals"]

#: Brings tensors to a device: ``arrive(d, tensors, producer, label)`` (:meth:`gpipe.worker.Run._arrive`).
Arrive = Callable[[int, Sequence[Tensor | None], Task, str], tuple[Any, ...]]


class Portals:
    """The skip tensors crossing partitions in one run, by micro-batch (and partition, or skip)."""

    def __init__(self, layout: SkipLayout, train: bool) -> None:
        self.layout = layout
        self.train = train
        # the stashed tensor (with its graph) in the stashing partition, its value for the pop, the popped leaf in
        # the popping partition, and its gradient on the way back
        self.stash_graph: dict[tuple[int, int], dict[SkipKey, Tensor]] = {}
        self.portal: dict[tuple[int, SkipKey], Tensor] = {}
        self.popped: dict[tuple[int, int], dict[SkipKey, Tensor]] = {}
        self.portal_grad: dict[tuple[int, SkipKey], Tensor | None] = {}

    def tracker(self, d: int, i: int, j: int, recompute: bool, arrive: Arrive) -> PortalTracker:
        """The tracker of task ``(i, j)`` on device ``d`` (:func:`gpipe.skip.skippable.use_tracker`)."""
        return PortalTracker(self, d, i, j, recompute, arrive)

    def release(self) -> None:
        self.stash_graph.clear()
        self.portal.clear()
        self.popped.clear()
        self.portal_grad.clear()


class PortalTracker:
    """Routes the stashes and pops of one task: in the partition, or through a portal to another one."""

    def __init__(self, portals: Portals, d: int, i: int, j: int, recompute: bool, arrive: Arrive) -> None:
        self.portals, self.d, self.i, self.j, self.recompute, self.arrive = portals, d, i, j, recompute, arrive
        self.local: dict[SkipKey, Tensor] = {}

    def save(self, key: SkipKey, tensor: Tensor) -> None:
        portals = self.portals
        if key not in portals.layout.popped_in:
            raise RuntimeError(f"stash of {key[1]!r} that no layer of this pipeline pops")
        if portals.layout.popped_in[key] == self.j:
            self.local[key] = tensor
            return
        if portals.train and torch.is_grad_enabled():
            portals.stash_graph.setdefault((self.i, self.j), {})[key] = tensor
        if not self.recompute:
            portals.portal[(self.i, key)] = tensor.detach() if portals.train else tensor

    def load(self, key: SkipKey) -> Tensor:
        if key in self.local:
            return self.local.pop(key)
        portals = self.portals
        if self.recompute:
            return portals.popped[(self.i, self.j)][key]
        value = portals.portal.pop((self.i, key))
        producer = Task(Op.F, self.i, portals.layout.stashed_in[key])
        value = self.arrive(self.d, (value,), producer, "skip")[0]
        if portals.train:
            value = value.detach().requires_grad_(value.is_floating_point())
            portals.popped.setdefault((self.i, self.j), {})[key] = value
        return value
