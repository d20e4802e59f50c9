"""Skip connections between partitions: each stash's way to its pop, and the gradient's way back, as messages.

A stash and its pop in one partition stay inside the task. A skip that crosses partitions goes through a
portal (Kim et al. 2020, section 3.3): the stashing task keeps the stashed tensor with its graph, for its
backward, and sends its value to the popping stage (:mod:`gpipe.transport.base`, channel: the skip's key), which
receives it on its own device (as a fresh leaf when training); the popping task's backward sends that leaf's
gradient back to the stashing stage's backward. A recompute pops the leaf its forward popped. Each worker has
its own :class:`Portals`: what it keeps is its own tasks' (Note [no shared state between workers]).

Note [portals in the interpreter]: the portals sit with the worker, not in :mod:`gpipe.skip`. They send and
receive through a transport, whose routes (:mod:`gpipe.transport.routes`) read the skip layout: so the skip
declarations sit below the transport, and the portals above it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gpipe.schedule import Op, Task
from gpipe.skip.layout import SkipLayout
from gpipe.skip.skippable import SkipKey
from gpipe.transport.base import Message, Transport

__all__ = ["PortalTracker", "Portals"]


class Portals:
    """One worker's skip tensors that cross partitions, by (micro-batch, stage) of its tasks."""

    def __init__(self, layout: SkipLayout, train: bool, transport: Transport) -> None:
        self.layout = layout
        self.train = train
        self.transport = transport
        # the stashed tensors (with their graphs) of a stashing task, and the popped leaves of a popping one
        self.stash_graph: dict[tuple[int, int], dict[SkipKey, Tensor]] = {}
        self.popped: dict[tuple[int, int], dict[SkipKey, Tensor]] = {}

    def tracker(self, i: int, j: int, recompute: bool) -> PortalTracker:
        """The tracker of task ``(i, j)`` (:func:`gpipe.skip.skippable.use_tracker`)."""
        return PortalTracker(self, i, j, recompute)

    def gradients_in(self, i: int, j: int) -> tuple[list[Tensor], list[Tensor]]:
        """For the backward of ``(i, j)``: its stashed tensors that crossed and the gradients sent back for them
        (those without one left out)."""
        outputs, grads = [], []
        for key, stashed in self.stash_graph.pop((i, j), {}).items():
            producer = Task(Op.B, i, self.layout.popped_in[key])
            grad = self.transport.receive(j, (producer, key)).tensors[0]
            if grad is not None:
                outputs.append(stashed)
                grads.append(grad)
        return outputs, grads

    def send_gradients(self, task: Task, popped: dict[SkipKey, Tensor], grads: list[Tensor | None]) -> None:
        """Send the gradient of each leaf ``task`` popped back to the stage that stashed it."""
        for key, grad in zip(popped, grads, strict=True):
            self.transport.send(self.layout.stashed_in[key], (task, key), Message((grad,)))

    def release(self) -> None:
        self.stash_graph.clear()
        self.popped.clear()


class PortalTracker:
    """Routes the stashes and pops of one task: in the partition, or through a portal to another one."""

    def __init__(self, portals: Portals, i: int, j: int, recompute: bool) -> None:
        self.portals, self.i, self.j, self.recompute = portals, i, j, recompute
        self.local: dict[SkipKey, Tensor] = {}

    def save(self, key: SkipKey, tensor: Tensor) -> None:
        portals = self.portals
        if key not in portals.layout.popped_in:
            raise RuntimeError(f"stash of {key[1]!r} that no layer of this pipeline pops")
        popping = portals.layout.popped_in[key]
        if popping == self.j:
            self.local[key] = tensor
            return
        if portals.train and torch.is_grad_enabled():
            portals.stash_graph.setdefault((self.i, self.j), {})[key] = tensor
        if not self.recompute:
            value = tensor.detach() if portals.train else tensor
            portals.transport.send(popping, (Task(Op.F, self.i, self.j), key), Message((value,)))

    def load(self, key: SkipKey) -> Tensor:
        if key in self.local:
            return self.local.pop(key)
        portals = self.portals
        if self.recompute:
            return portals.popped[(self.i, self.j)][key]
        producer = Task(Op.F, self.i, portals.layout.stashed_in[key])
        value = portals.transport.receive(self.j, (producer, key)).tensors[0]
        assert value is not None
        if portals.train:
            value = value.detach().requires_grad_(value.is_floating_point())
            portals.popped.setdefault((self.i, self.j), {})[key] = value
        return value
