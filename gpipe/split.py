"""A backward in two parts: ``B`` the stage inputs' gradients now, ``W`` the parameters' later, from what ``B`` kept.

Note [split backward]: ``B`` walks the graph from the stage's outputs once. A node that leads to an input runs in
``B``; an edge from such a node to a part of the graph that leads only to parameters (a Linear's weight behind its
``addmm``) is a weight edge, which ``B`` does not compute. ``B`` keeps, for each node with weight edges (an entry),
the gradient that flowed into it, and the graph. ``W`` starts from those entries with those gradients and asks
for the parameters alone, so the engine runs each entry again for its weight edges only (the weight's ``mm``) and
the weight side below it: no operator's input-gradient half runs twice, and ``B`` + ``W`` run what one backward
runs. Entries whose weight sides join (a parameter used by two operators) run in one call; the input side
between them then runs again in ``W``, and a hook hands each entry its kept gradient instead of what flows in, so
nothing counts twice. An output that leads to no input (the first stage's) is an entry with its own gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge

__all__ = ["WeightGrads", "backward_input"]

Key = tuple[Node, int]  # an edge into a node: the node and which of its inputs


@dataclass
class _Group:
    """Entries whose weight sides join, and the parameters below them (Note [split backward])."""

    entries: list[tuple[Node, tuple[Tensor | None, ...]]]  # nodes of the input side with their kept gradients
    roots: list[tuple[GradientEdge, Tensor]]  # outputs that lead to no input, with their gradients
    params: list[int]  # indices into the parameters


class WeightGrads:
    """What ``B`` kept for ``W``: the groups of a split backward and the parameters they reach."""

    def __init__(self, params: Sequence[Tensor], groups: list[_Group]) -> None:
        self.params = list(params)
        self.groups = groups

    def accumulate(self) -> None:
        """``W`` into ``.grad``, as ``loss.backward()`` would; frees what ``B`` kept."""
        for group in self._take():
            roots, grads = _roots(group)
            with _clamped(group):
                torch.autograd.backward(roots, grads, inputs=[self.params[k] for k in group.params],
                                        retain_graph=True)

    def collect(self) -> list[Tensor | None]:
        """``W`` as ``torch.autograd.grad`` would: each parameter's gradient (``None`` if unreached), in order;
        frees what ``B`` kept."""
        found: list[Tensor | None] = [None] * len(self.params)
        for group in self._take():
            roots, grads = _roots(group)
            with _clamped(group):
                got = torch.autograd.grad(roots, [self.params[k] for k in group.params], grads, retain_graph=True,
                                          allow_unused=True)
            for k, grad in zip(group.params, got, strict=True):
                found[k] = grad
        return found

    def _take(self) -> list[_Group]:
        groups, self.groups = self.groups, []
        return groups


def backward_input(outputs: Sequence[Tensor], grads: Sequence[Tensor], inputs: Sequence[Tensor],
                   params: Sequence[Tensor]) -> tuple[list[Tensor | None], WeightGrads]:
    """``B`` of a split backward (Note [split backward]): the gradients of ``inputs`` (leaves) from ``outputs``
    given their ``grads``, and what ``W`` needs for those of ``params``; the graph is kept only if ``W`` needs it.
    """
    roots = [get_gradient_edge(o) for o in outputs]
    if not inputs:  # nothing for B: W is the whole backward, from the outputs
        return [], WeightGrads(params, [_Group([], list(zip(roots, grads, strict=True)), list(range(len(params))))])
    into_input = {_key(get_gradient_edge(t)) for t in inputs}
    into_param = {_key(get_gradient_edge(p)): k for k, p in enumerate(params)}
    order = _post_order([e.node for e in roots])
    to_input: set[Node] = set()
    to_param: set[Node] = set()
    for node in order:  # children first
        for child, nr in node.next_functions:
            if child is None:
                continue
            if (child, nr) in into_input or child in to_input:
                to_input.add(node)
            if (child, nr) in into_param or child in to_param:
                to_param.add(node)
    # The weight side: nodes below an entry or a root that lead to parameters and not to inputs. Union-find joins
    # an entry with its weight side, and weight-side nodes with each other, into groups.
    parent: dict[Node, Node] = {}

    def find(node: Node) -> Node:
        while parent.setdefault(node, node) is not node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    entries: list[Node] = []
    for node in order:
        weighted = node not in to_input or any(
            child is not None and (child, nr) not in into_input and child not in to_input
            and ((child, nr) in into_param or child in to_param) for child, nr in node.next_functions)
        if not weighted:
            continue
        if node in to_input:
            entries.append(node)
        for child, nr in node.next_functions:
            if child is not None and child not in to_input and ((child, nr) in into_param or child in to_param):
                parent[find(child)] = find(node)
    kept: dict[Node, tuple[Tensor | None, ...]] = {}
    handles = [node.register_prehook(_keeper(kept, node)) for node in entries]
    try:
        found: list[Tensor | None] = [None] * len(inputs)
        if to_input:  # W reruns the entries, so their saved tensors stay
            found = list(torch.autograd.grad(outputs, inputs, grads, retain_graph=bool(entries), allow_unused=True))
    finally:
        for handle in handles:
            handle.remove()
    groups: dict[Node, _Group] = {}

    def group(node: Node) -> _Group:
        return groups.setdefault(find(node), _Group([], [], []))

    for node in entries:
        if node in kept:
            group(node).entries.append((node, kept[node]))
    for edge, grad in zip(roots, grads, strict=True):
        if edge.node not in to_input and (edge.node in to_param or _key(edge) in into_param):
            group(edge.node).roots.append((edge, grad))
    for key, k in into_param.items():
        if key[0] in parent:
            group(key[0]).params.append(k)
    return found, WeightGrads(params, [g for g in groups.values() if g.params and (g.entries or g.roots)])


def _key(edge: GradientEdge) -> Key:
    return edge.node, edge.output_nr


def _post_order(roots: list[Node]) -> list[Node]:
    """Every node below ``roots``, each after all of its children (iterative: a stage's graph can be deep)."""
    order: list[Node] = []
    seen: set[Node] = set()
    stack: list[tuple[Node, bool]] = [(node, False) for node in roots]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if node in seen:
            continue
        seen.add(node)
        stack.append((node, True))
        stack.extend((child, False) for child, _ in node.next_functions if child is not None and child not in seen)
    return order


def _keeper(kept: dict[Node, tuple[Tensor | None, ...]], node: Node):  # type: ignore[no-untyped-def]
    def keep(grad_outputs: tuple[Tensor | None, ...]) -> None:
        kept[node] = tuple(grad_outputs)
    return keep


def _roots(group: _Group) -> tuple[list[GradientEdge], list[Tensor]]:
    edges: list[GradientEdge] = []
    grads: list[Tensor] = []
    for node, kept in group.entries:
        for nr, grad in enumerate(kept):
            if grad is not None:
                edges.append(GradientEdge(node, nr))
                grads.append(grad)
    for edge, grad in group.roots:
        edges.append(edge)
        grads.append(grad)
    return edges, grads


class _clamped:  # noqa: N801 - a context manager
    """While ``W`` runs a group, each entry's pre-hook hands it the gradient ``B`` kept (Note [split backward])."""

    def __init__(self, group: _Group) -> None:
        self.group = group
        self.handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> None:
        for node, kept in self.group.entries:
            self.handles.append(node.register_prehook(lambda _, kept=kept: kept))  # type: ignore[misc]

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()
