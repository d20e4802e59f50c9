"""A backward in two parts: ``B`` the stage inputs' gradients now, ``W`` the parameters' later, from what ``B`` kept.

Note [split backward]: a node of the stage's graph that leads to an input runs in ``B``; an edge from such a node to
a part of the graph that leads only to parameters (a Linear's weight behind its ``addmm``) is a weight edge, which
``B`` does not compute. A node with weight edges is an entry. ``B`` is one engine call for the inputs' gradients that
also returns the gradient flowing into each entry (captured at the entry's ``GradientEdge``, no hook). ``W`` starts
from the entries with those gradients and asks for the parameters alone, so the engine runs each entry again for
its weight edges only (the weight's ``mm``) and the weight side below it: no operator's input-gradient half runs
twice, and ``B`` + ``W`` run what one backward runs. Entries whose weight sides join (a parameter used by two
operators) run in one call; the input side between them then runs again in ``W``, and a hook hands each entry its
kept gradient instead of what flows in, so nothing counts twice. An output that leads to no input (the first
stage's) is an entry with its own gradient.

Note [learnt split]: which nodes are entries, which of their slots ``B`` captures and how they group depend only on
the graph's shape, which a static stage repeats every micro-batch. Each ``B`` walks its graph once from the outputs
(breadth first, in ``next_functions`` order) into that shape: each node's type, where each edge leads, and which
edges are the inputs and the parameters. A shape seen before reuses its plan (:class:`SplitPlans`); any other (a
data-dependent branch, an input shape that dispatches another operator, a parameter frozen) is learnt anew. The plan
is a function of the shape alone, so reusing it gives what learning again would. The walk is the only per-node
Python left in ``B``.

Note [plans across steps]: a shape names parameters by their place in :attr:`SplitPlans.params`, so a stage's plans
hold for one set of parameters; :class:`StagePlans` keeps a stage's plans across steps, one :class:`SplitPlans` per
set its steps differentiate (all that require grad; another after a weight is frozen or ``backward(inputs=...)``
names a few), keyed by the parameters' identities, which stay unique while the :class:`SplitPlans` holds them. Both
are bounded, the sets by :attr:`StagePlans.limit` and each set's shapes by :attr:`SplitPlans.limit`, so a graph that
changes every step re-learns without growing.

Note [one call per group]: ``W`` makes one engine call per group, or one for several groups where no root of one
reaches a parameter of another (branches side by side, as a layer's q, k and v projections). The engine runs every
node on a path from a root to a requested parameter, so one call from two entries of a chain would recompute the
upper one's input-gradient half to reach the lower one's weights; and each call first walks the whole graph below
its roots (the engine's own preparation), so a chain of ``L`` weighted layers costs ``L`` calls whose walks add up as
``L**2``: on small layers more than the weight gradients themselves (``benchmarks/split_cost.py``). The calls go to
the engine directly, as ``B``'s does: ``torch.autograd.backward``'s checks would add their cost to every call, for
gradients that autograd itself captured. The weight gradients stay the engine's work, done without Python's
interpreter lock: computed in Python from a Linear's saved input, ``W`` alone is cheaper, but each torch call from
Python releases and retakes the lock, as would the pre-hook per entry that ``B`` then needs (to see the gradient the
entry's own hooks leave), and with two workers of small layers trading the lock the steps lose more than ``W``
gains (``benchmarks/split_cost.py``; docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge
from torch.autograd.variable import Variable

__all__ = ["SplitPlans", "StagePlans", "WeightGrads", "backward_input"]

Edge = tuple[int, int]  # an edge into a node of the walk: its index and which of its inputs; -1: not in the graph
Shape = tuple[tuple[type, ...], tuple[tuple[int, ...], ...], tuple[Edge, ...], tuple[Edge, ...], tuple[Edge, ...]]

_ENGINE = Variable._execution_engine  # Note [one call per group]
_ACCUMULATE = torch._C._functions.AccumulateGrad  # type: ignore[attr-defined]  # a leaf's node; ``variable``: the leaf


@dataclass(frozen=True)
class _Call:
    """One engine call of ``W``: a group of Note [split backward], as indices into its ``B``."""

    captured: tuple[int, ...]  # the captures of B that root it: its entries' slots
    outputs: tuple[int, ...]  # the outputs that root it with their own gradients (they lead to no input)
    params: tuple[int, ...]  # the parameters it reaches
    clamps: tuple[tuple[int, tuple[tuple[int, int], ...]], ...]  # several entries: (node, ((slot, capture), ...))


@dataclass
class _Group:
    """While a plan is learnt: entries whose weight sides join (Note [split backward]), or several such groups that
    share a call (Note [one call per group])."""

    entries: list[int] = field(default_factory=list)  # nodes of the input side with weight edges
    outputs: list[int] = field(default_factory=list)  # outputs that lead to no input
    params: list[int] = field(default_factory=list)
    clamped: list[int] = field(default_factory=list)  # entries of a group of several, which W clamps
    bits: int = 0  # its parameters, one bit each
    below: int = 0  # the parameters below its roots

    def join(self, other: _Group) -> None:
        self.entries += other.entries
        self.outputs += other.outputs
        self.params += other.params
        self.clamped += other.clamped
        self.bits |= other.bits
        self.below |= other.below


@dataclass(frozen=True)
class _Plan:
    """What ``B`` and ``W`` do on graphs of one shape (Note [learnt split])."""

    captures: tuple[Edge, ...]  # the entries' slots whose gradient B returns beside the inputs'
    calls: tuple[_Call, ...]
    reaches_input: bool  # some output leads to an input: B has something to compute
    foreign: bool  # an entry is a Python autograd.Function's node, which its Python object does not keep alive
    clamped: bool  # a call has several entries (W then needs their nodes)
    rooted: bool  # a call starts from an output that leads to no input (W then needs it and its gradient)


class SplitPlans:
    """The plans of one stage's split backwards, by the shape of their graphs (Note [learnt split]).

    Args:
        params: the parameters every backward of the stage differentiates, in the order of their gradients.
        limit: shapes kept; the oldest is dropped beyond (a stage whose graph alternates keeps both).
    """

    def __init__(self, params: Sequence[Tensor], limit: int = 4) -> None:
        self.params = list(params)
        self.limit = limit
        self.plans: dict[Shape, _Plan] = {}
        self._ids = {id(p): k for k, p in enumerate(self.params)}
        self._accumulators: dict[Node, int] = {}  # the parameters' met so far, held: the same node every graph

    def walk(self, outputs: Sequence[Tensor], inputs: Sequence[Tensor]) -> tuple[Shape, list[Node]]:
        """The shape of the graph below ``outputs`` and its nodes, in the order the shape numbers them."""
        index: dict[Node, int] = {}
        nodes: list[Node] = []
        roots: list[Edge] = []
        for output in outputs:
            fn = output.grad_fn  # a leaf has none: its accumulator, then
            node, nr = (fn, output.output_nr) if fn is not None else get_gradient_edge(output)[:2]
            k = index.get(node)
            if k is None:
                k = index[node] = len(nodes)
                nodes.append(node)
            roots.append((k, nr))
        links: list[tuple[int, ...]] = []
        for node in nodes:  # breadth first: the list grows while it is read
            row: list[int] = []
            for child, nr in node.next_functions:
                if child is None:
                    row += (-1, nr)
                    continue
                k = index.get(child)
                if k is None:
                    k = index[child] = len(nodes)
                    nodes.append(child)
                row += (k, nr)
            links.append(tuple(row))
        into_input = []
        for t in inputs:
            edge = get_gradient_edge(t)
            into_input.append((index.get(edge.node, -1), edge.output_nr))
        accumulators = self._accumulators
        into_param = [(-1, 0)] * len(self.params)
        for node in nodes:
            if type(node) is _ACCUMULATE:
                k = accumulators.get(node)
                if k is None and (k := self._ids.get(id(node.variable))) is not None:  # type: ignore[attr-defined]
                    accumulators[node] = k
                if k is not None:
                    into_param[k] = (index[node], 0)
        return (tuple(map(type, nodes)), tuple(links), tuple(roots), tuple(into_input), tuple(into_param)), nodes

    def plan(self, shape: Shape) -> _Plan:
        """The plan of graphs of ``shape``: the one learnt before, or a new one."""
        plan = self.plans.get(shape)
        if plan is None:
            if len(self.plans) >= self.limit:
                del self.plans[next(iter(self.plans))]
            plan = self.plans[shape] = _learn(shape)
        return plan


class StagePlans:
    """One stage's :class:`SplitPlans` across steps, by the parameters they differentiate (Note [plans across steps]).

    Args:
        limit: parameter sets kept; the least recently asked for is dropped beyond.
    """

    def __init__(self, limit: int = 2) -> None:
        self.limit = limit
        self.sets: dict[tuple[int, ...], SplitPlans] = {}  # oldest first

    def get(self, params: Sequence[Tensor]) -> SplitPlans:
        """The plans of backwards that differentiate ``params`` (in this order): those learnt before, or new ones."""
        key = tuple(map(id, params))
        plans = self.sets.pop(key, None)
        if plans is None:
            if len(self.sets) >= self.limit:
                del self.sets[next(iter(self.sets))]
            plans = SplitPlans(params)
        self.sets[key] = plans
        return plans


class WeightGrads:
    """What ``B`` kept for ``W``: the engine calls of a split backward, their roots' gradients, the parameters.

    Attributes:
        groups: the calls ``W`` has still to make (empty once it ran).
    """

    def __init__(self, params: Sequence[Tensor], groups: Sequence[_Call], edges: Sequence[GradientEdge] = (),
                 kept: Sequence[Tensor | None] = (), outputs: Sequence[GradientEdge | Tensor] = (),
                 grads: Sequence[Tensor] = (), nodes: Sequence[Node] = (), owners: Sequence[object] = ()) -> None:
        self.params = list(params)
        self.groups = list(groups)
        self.edges, self.kept = edges, kept  # B's captures: the entries' slots and the gradients that reached them
        self.outputs, self.grads = outputs, grads  # the roots that lead to no input, with their own gradients
        self.nodes = nodes  # the walk's nodes, where a call has several entries to clamp
        self.owners = owners  # keeps a graph of Python-function entries alive until W (_Plan.foreign)

    def accumulate(self) -> None:
        """``W`` into ``.grad``, as ``loss.backward()`` would; frees what ``B`` kept."""
        for call in self._take():
            self._run(call, True)
        self._free()

    def collect(self) -> list[Tensor | None]:
        """``W`` as ``torch.autograd.grad`` would: each parameter's gradient (``None`` if unreached), in order;
        frees what ``B`` kept."""
        found: list[Tensor | None] = [None] * len(self.params)
        for call in self._take():
            for k, grad in zip(call.params, self._run(call, False), strict=True):
                found[k] = grad
        self._free()
        return found

    def _take(self) -> list[_Call]:
        groups, self.groups = self.groups, []
        return groups

    def _free(self) -> None:
        self.edges = self.kept = self.outputs = self.grads = self.nodes = self.owners = ()

    def _run(self, call: _Call, accumulate: bool) -> tuple[Tensor | None, ...]:
        """One engine call of ``W`` (Note [one call per group]): into ``.grad`` or returned. While a group of several
        entries runs, each entry's pre-hook hands it the gradient ``B`` kept (Note [split backward])."""
        kept = self.kept
        roots: list[GradientEdge | Tensor] = [self.edges[c] for c in call.captured if kept[c] is not None]
        grads = [g for c in call.captured if (g := kept[c]) is not None]
        for o in call.outputs:
            roots.append(self.outputs[o])
            grads.append(self.grads[o])
        params = tuple(self.params[k] for k in call.params)
        if not roots:
            return (None,) * len(params)
        handles = [self.nodes[k].register_prehook(_clamp(tuple((nr, kept[c]) for nr, c in slots)))
                   for k, slots in call.clamps]
        try:
            return _ENGINE.run_backward(tuple(roots), tuple(grads), True, False, params, True,  # type: ignore[no-any-return]
                                        accumulate)
        finally:
            for handle in handles:
                handle.remove()


def backward_input(outputs: Sequence[Tensor], grads: Sequence[Tensor], inputs: Sequence[Tensor],
                   params: Sequence[Tensor],
                   plans: SplitPlans | None = None) -> tuple[list[Tensor | None], WeightGrads]:
    """``B`` of a split backward (Note [split backward]): the gradients of ``inputs`` (leaves) from ``outputs``
    given their ``grads``, and what ``W`` needs for those of ``params``; the graph is kept only if ``W`` needs it.

    Args:
        plans: what earlier backwards of this stage learnt, for these ``params`` (Note [learnt split]); ``None``
            learns afresh.
    """
    if not inputs:  # nothing for B: W is the whole backward, from the outputs (if it has parameters to reach)
        whole = [_Call((), tuple(range(len(outputs))), tuple(range(len(params))), ())] if params else []
        return [], WeightGrads(params, whole, outputs=[get_gradient_edge(o) for o in outputs], grads=grads)
    if plans is None:
        plans = SplitPlans(params)
    shape, nodes = plans.walk(outputs, inputs)
    plan = plans.plan(shape)
    edges = [GradientEdge(nodes[k], nr) for k, nr in plan.captures]
    got: tuple[Tensor | None, ...] = (None,) * (len(inputs) + len(edges))
    if plan.reaches_input:  # Note [one call per group]: the engine itself, for gradients shaped like the outputs
        got = _ENGINE.run_backward(tuple(outputs), tuple(grads), bool(edges), False, (*inputs, *edges), True, False)
    kept = got[len(inputs):]
    owners = [get_gradient_edge(o) for o in outputs] if plan.foreign and plan.calls else []
    rooted = plan.rooted  # else W needs neither the outputs nor their gradients: B's activations can go
    return list(got[:len(inputs)]), WeightGrads(params, plan.calls, edges, kept, outputs if rooted else (),
                                                grads if rooted else (), nodes if plan.clamped else (), owners)


def _learn(shape: Shape) -> _Plan:
    """The plan of Note [split backward] for a graph of ``shape``: entries, their captured slots, the groups."""
    types, links, roots, inputs, params = shape
    into_input = {e for e in inputs if e[0] >= 0}
    into_param = {e: k for k, e in enumerate(params) if e[0] >= 0}
    children = [list(zip(row[::2], row[1::2], strict=True)) for row in links]
    order = _post_order(children, [k for k, _ in roots])
    to_input = [False] * len(types)
    reach = [0] * len(types)  # the parameters below each node, one bit each
    for node in order:  # children first
        for child, nr in children[node]:
            if child < 0:
                continue
            to_input[node] = to_input[node] or (child, nr) in into_input or to_input[child]
            k = into_param.get((child, nr))
            reach[node] |= reach[child] if k is None else 1 << k
    to_param = [bool(bits) for bits in reach]
    # The weight side: nodes below an entry or a root that lead to parameters and not to inputs. Union-find joins
    # an entry with its weight side, and weight-side nodes with each other, into groups.
    parent: dict[int, int] = {}

    def find(node: int) -> int:
        while parent.setdefault(node, node) != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    def weight_edge(child: int, nr: int) -> bool:
        return child >= 0 and not to_input[child] and ((child, nr) in into_param or to_param[child])

    entries: list[int] = []
    for node in order:
        weighted = not to_input[node] or any(
            weight_edge(child, nr) and (child, nr) not in into_input for child, nr in children[node])
        if not weighted:
            continue
        if to_input[node]:
            entries.append(node)
        for child, nr in children[node]:
            if weight_edge(child, nr):
                parent[find(child)] = find(node)
    slots: dict[int, set[int]] = {node: set() for node in entries}  # the slots of an entry that gradients reach
    for row in children:
        for child, nr in row:
            if child in slots:
                slots[child].add(nr)
    for node, nr in roots:
        if node in slots:
            slots[node].add(nr)
    groups: dict[int, _Group] = {}  # by the root of the union
    for node in entries:
        groups.setdefault(find(node), _Group()).entries.append(node)
    for o, (node, nr) in enumerate(roots):
        if not to_input[node] and (to_param[node] or (node, nr) in into_param):
            groups.setdefault(find(node), _Group()).outputs.append(o)
    for (node, _), k in into_param.items():
        if node in parent:
            groups.setdefault(find(node), _Group()).params.append(k)
    # Note [one call per group]: groups share a call where no root of one reaches a parameter of another; the engine
    # then runs nothing there that B ran
    shared: list[_Group] = []
    for group in groups.values():
        if not group.params or not (group.entries or group.outputs):
            continue
        group.bits = sum(1 << k for k in group.params)
        group.below = 0
        for node in group.entries:
            group.below |= reach[node]
        if len(group.entries) > 1:
            group.clamped = list(group.entries)
        for o in group.outputs:
            k = into_param.get(roots[o])
            group.below |= reach[roots[o][0]] if k is None else 1 << k
        for call in shared:
            if not group.below & call.bits and not call.below & group.bits:
                call.join(group)
                break
        else:
            shared.append(group)
    captures: list[Edge] = []
    calls: list[_Call] = []
    for call in shared:
        clamps: list[tuple[int, tuple[tuple[int, int], ...]]] = []
        captured: list[int] = []
        for node in call.entries:
            mine = []
            for nr in sorted(slots[node]):
                mine.append((nr, len(captures)))
                captured.append(len(captures))
                captures.append((node, nr))
            if node in call.clamped:
                clamps.append((node, tuple(mine)))
        calls.append(_Call(tuple(captured), tuple(call.outputs), tuple(call.params), tuple(clamps)))
    foreign = any(issubclass(types[node], torch._C._FunctionBase) for node, _ in captures)
    return _Plan(tuple(captures), tuple(calls), any(to_input[k] for k, _ in roots), foreign,
                 any(call.clamps for call in calls), any(call.outputs for call in calls))


def _post_order(children: list[list[tuple[int, int]]], roots: list[int]) -> list[int]:
    """Every node below ``roots``, each after all of its children (iterative: a stage's graph can be deep)."""
    order: list[int] = []
    seen: set[int] = set()
    stack: list[tuple[int, bool]] = [(node, False) for node in roots]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if node in seen:
            continue
        seen.add(node)
        stack.append((node, True))
        stack.extend((child, False) for child, _ in children[node] if child >= 0 and child not in seen)
    return order


def _clamp(kept: tuple[tuple[int, Tensor | None], ...]):  # type: ignore[no-untyped-def]
    def clamp(grads: tuple[Tensor | None, ...]) -> tuple[Tensor | None, ...]:
        out = list(grads)
        for nr, grad in kept:
            out[nr] = grad
        return tuple(out)
    return clamp
