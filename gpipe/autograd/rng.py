"""Random draws under pipelining: every draw of a task is a function of the task, so recompute is exact.

Note [random state]: a checkpointed forward and its recompute must draw the same numbers, or the gradient is of
another function. Saving and restoring the generator (torchgpipe) fails where workers share one generator (every
CPU worker; partitions on one GPU): what a worker draws depends on what the others drew. Here every ATen
operator tagged ``nondeterministic_seeded`` that a task runs, whoever calls it (a module, ``F.dropout``,
``torch.rand_like``, a custom ``autograd.Function``), is intercepted below autograd by a ``TorchDispatchMode``
on the worker's thread and runs with its generator re-seeded from ``(step seed, micro-batch, stage, layer, k)``
for the layer's k-th draw, then restored under one lock. So a forward and its recompute draw alike whatever the
other threads do, and the step seed, drawn from the default generator, makes a run reproducible from
``torch.manual_seed``.

Note [learning which layers draw]: the dispatch mode costs a Python call per operator (twice the time
of a forward of many small layers), so it runs only around the layers (a partition's children) that
draw. A partition's first step with a set of ``training`` flags runs every layer under it and notes
which drew; from then on the others run bare, and the task checks, under the same lock, that the
default generators of the process and of its device are unchanged afterwards (a few microseconds). A
draw that appears later (one that depends on the data) is caught there, before any backward uses it:
the step raises and the layers are learnt again. A layer with ``gpipe_stochastic = True`` (or holding
one) is always seeded.

Python's ``random`` and NumPy's global generator are outside torch's dispatch: a step that
checkpoints refuses them (:func:`check_outside`) rather than recomputing other numbers.
"""

from __future__ import annotations

import contextlib
import random
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["Draws", "TaskDraws", "UnseededDraw", "check_outside", "is_stochastic", "mix_seed", "outside_state",
           "step_seed"]

_lock = threading.RLock()  # guards the default generators' states: a draw's re-seeding, a task's check
_MASK = (1 << 64) - 1
_SEEDED = torch.Tag.nondeterministic_seeded


class UnseededDraw(RuntimeError):
    """A task drew random numbers where the executor could not make the draw a function of the task."""


def is_stochastic(layer: nn.Module) -> bool:
    """True for a layer its user marked as drawing random numbers (``layer.gpipe_stochastic = True``)."""
    return bool(getattr(layer, "gpipe_stochastic", False))


def step_seed() -> int:
    """A step's seed: one draw from the default CPU generator, as a plain model's dropout would make."""
    with _lock:
        return int(torch.randint(0, 2**62, (), generator=torch.default_generator).item())


def _mix(*values: int) -> int:
    """SplitMix64 over ``values``: a seed that changes with every bit of each, stable across Python builds."""
    state = 0x9E3779B97F4A7C15
    for value in values:
        state = (state ^ (value & _MASK)) * 0xBF58476D1CE4E5B9 & _MASK
        state = (state ^ (state >> 31)) * 0x94D049BB133111EB & _MASK
        state ^= state >> 29
    return state & ((1 << 63) - 1)


def mix_seed(*values: int) -> int:
    """A 63-bit seed mixed from ``values`` (SplitMix64): the seed of a task's draw, or of a layer's initial weights
    (:mod:`gpipe.distributed.materialize`)."""
    return _mix(*values)


def _generators(args: Any, kwargs: dict[str, Any]) -> list[torch.Generator]:
    """The generators an operator may draw from: its ``generator`` argument, else its devices' defaults."""
    explicit = kwargs.get("generator")
    if isinstance(explicit, torch.Generator):
        return [explicit]
    devices = {leaf.device for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)}
    device = kwargs.get("device")
    if device is not None:
        devices.add(torch.device(device))
    if not devices:
        devices.add(torch.get_default_device())
    generators = []
    for d in devices:
        if d.type == "cpu":
            generators.append(torch.default_generator)
        elif d.type == "cuda":
            generators.append(torch.cuda.default_generators[d.index if d.index is not None
                                                            else torch.cuda.current_device()])
        elif d.type != "meta":
            raise UnseededDraw(f"a random operator on a {d.type} device: the executor seeds draws on CPU and CUDA "
                               "devices only")
    return generators


class TaskDraws(TorchDispatchMode):
    """While active on a thread, each random operator draws from a seed of this task, layer and draw count.

    Args:
        seed: the step's seed (:func:`step_seed`).
        microbatch, stage: the task's micro-batch and stage.
        layer: the index of the partition's layer (child) that runs under this mode.

    ``drew`` says afterwards whether any operator drew.
    """

    def __init__(self, seed: int, microbatch: int, stage: int, layer: int) -> None:
        super().__init__()
        self.base = (seed, microbatch, stage, layer)
        self.count = 0
        self.drew = False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if _SEEDED not in func.tags:
            return func(*args, **kwargs)
        seed = _mix(*self.base, self.count)
        self.count += 1
        self.drew = True
        generators = _generators(args, kwargs)
        with _lock:
            saved = [(g, g.get_state()) for g in generators]
            try:
                for g in generators:
                    g.manual_seed(seed)
                return func(*args, **kwargs)
            finally:  # a CUDA kernel took its seed and offset at launch: restoring now is safe
                for g, state in saved:
                    g.set_state(state)


class _Watch:
    """Around a task with bare layers: the default generators they could draw from are left as they were."""

    def __init__(self, device: torch.device) -> None:
        self.generators = [torch.default_generator]
        if device.type == "cuda":
            self.generators.append(torch.cuda.default_generators[device.index or 0])
        self.before: list[torch.Tensor] = []

    def __enter__(self) -> None:
        with _lock:
            self.before = [g.get_state() for g in self.generators]

    def __exit__(self, kind: Any, *exc: Any) -> None:
        if kind is not None:
            return
        with _lock:
            after = [g.get_state() for g in self.generators]
        if not all(torch.equal(a, b) for a, b in zip(self.before, after, strict=True)):
            raise UnseededDraw("random numbers were drawn outside the executor's seeding while this task ran: by a "
                               "layer whose earlier steps drew none (a draw that depends on the data?), by a "
                               "partition beside it, or by another thread of this process. This step stops before "
                               "any backward uses the draw (its gradients are incomplete: zero them). The next step "
                               "learns the layers again; to keep a layer seeded always, set "
                               "layer.gpipe_stochastic = True")


#: For one partition in one step: the layers to run under :class:`TaskDraws`, or None to learn them all.
Plan = frozenset[int] | None


class Draws:
    """Which layers of each partition draw, learnt per set of ``training`` flags (Note [learning ...])."""

    def __init__(self, partitions: Sequence[nn.Sequential]) -> None:
        self.partitions = list(partitions)
        self.marked = [frozenset(k for k, layer in enumerate(p) if any(is_stochastic(m) for m in layer.modules()))
                       for p in self.partitions]
        self.known: list[dict[tuple[bool, ...], frozenset[int]]] = [{} for _ in self.partitions]

    def _flags(self, j: int) -> tuple[bool, ...]:
        return tuple(m.training for m in self.partitions[j].modules())

    def plan(self) -> list[Plan]:
        """For each partition, the layers to seed this step (None: every layer, learning which draw)."""
        plans: list[Plan] = []
        for j in range(len(self.partitions)):
            drawing = self.known[j].get(self._flags(j))
            plans.append(None if drawing is None else drawing | self.marked[j])
        return plans

    def learn(self, plans: Sequence[Plan], drew: Sequence[set[int]]) -> None:
        """After a phase that ended well: the layers each learning partition saw drawing."""
        for j, plan in enumerate(plans):
            if plan is None:
                flags = self._flags(j)
                self.known[j][flags] = self.known[j].get(flags, frozenset()) | frozenset(drew[j])

    def forget(self) -> None:
        """After an unseeded draw: learn every partition again."""
        for known in self.known:
            known.clear()

    def forward(self, j: int, plan: Plan, layers: Sequence[Callable[[Any], Any]], arg: Any, seed: int,
                microbatch: int, device: torch.device, drew: list[set[int]]) -> Any:
        """Partition ``j``'s ``layers`` (its children, and the loss where it has one) in task ``(microbatch, j)``.

        The planned layers run under :class:`TaskDraws` (each that draws is added to ``drew[j]``), the others
        bare, watched.
        """
        seeded = range(len(layers)) if plan is None else plan
        watch = _Watch(device) if len(seeded) < len(layers) else contextlib.nullcontext()
        try:
            with watch:
                for k, layer in enumerate(layers):
                    if k not in seeded:
                        arg = layer(arg)
                        continue
                    mode = TaskDraws(seed, microbatch, j, k)
                    with mode:
                        arg = layer(arg)
                    if mode.drew:
                        drew[j].add(k)
        except UnseededDraw:
            self.forget()
            raise
        return arg


def outside_state() -> tuple[Any, ...]:
    """The states of Python's ``random`` and NumPy's global generator (when NumPy is loaded)."""
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return (random.getstate(), None)
    kind, keys, position, has_gauss, gauss = numpy.random.get_state()
    return (random.getstate(), (kind, keys.tobytes(), position, has_gauss, gauss))


def check_outside(before: tuple[Any, ...]) -> None:
    """After a phase that checkpoints: Python's ``random`` and NumPy's global generator as :func:`outside_state` saw.

    Raises:
        UnseededDraw: a task drew from either; its recompute would draw other numbers.
    """
    if outside_state() != before:
        raise UnseededDraw("a task drew from Python's random module or NumPy's global generator, which the executor "
                           "cannot replay in a recompute (checkpointing would give a wrong gradient): draw with "
                           "torch's random functions (torch.rand, torch.randn, torch.bernoulli, ...) inside the "
                           "model, or use checkpoint='never'")
