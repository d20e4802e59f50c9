"""What the schedule search is given: per-stage costs (:class:`StageCosts`), and the problem they make with a
placement, a micro-batch count and a memory limit (:class:`Problem`: every task numbered, with its seconds, its
dependencies and its memory).

Note [search tasks]: the search numbers task ``(op, i, s)`` as ``(op * m + i) * n + s`` with ``op`` 0 for
``F``, 1 for ``B`` and 2 for ``W``, so the greedy heuristic and the solver work on lists and integers. It
splits the backward (``W`` tasks) whenever some stage has weight-gradient seconds: ``W`` right after its ``B``
runs and holds memory as the whole backward would, so splitting loses nothing and lets ``W`` fill bubbles.
With every ``weight`` zero it splits nothing and ``B`` is the whole backward.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpipe.schedule.placement import stage_placement
from gpipe.schedule.task import Op, Task

__all__ = ["SEARCH_OPS", "Problem", "StageCosts", "memory_limits"]

#: The ops the search places, in the order of their codes (Note [search tasks]).
SEARCH_OPS = (Op.F, Op.B, Op.W)


def _number(what: str, value: object) -> float:
    """``value`` as a finite float ``>= 0``, or a ``ValueError`` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite number >= 0, got {value!r}")
    return float(value)


def _per_stage(name: str, values: object, n: int | None) -> tuple[float, ...]:
    """``values`` as a tuple of finite floats ``>= 0``, ``n`` of them when ``n`` is given."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ValueError(f"StageCosts.{name} is one number per stage (a tuple), got {values!r}")
    if not values:
        raise ValueError(f"StageCosts.{name} is empty: give one number per stage")
    if n is not None and len(values) != n:
        raise ValueError(f"StageCosts.{name} has {len(values)} entries but forward has {n} stages: give one per stage")
    return tuple(_number(f"StageCosts.{name}[{s}]", x) for s, x in enumerate(values))


@dataclass(frozen=True)
class StageCosts:
    """Seconds of each task of one micro-batch, per stage, and what one micro-batch keeps in memory.

    Attributes:
        forward: seconds of ``F`` per stage (one per stage: ``len(forward)`` is the number of stages ``n``).
        backward: seconds of ``B``, the input gradient, per stage.
        weight: seconds of ``W``, the weight gradient, per stage; all zero: the search splits nothing (no ``W``
            tasks, ``B`` is the whole backward); a schedule without ``W`` runs ``backward + weight`` as its ``B``.
        copy: seconds of one copy between two devices (an activation forward, a gradient back); a dependency
            within a device costs nothing.
        activation: one micro-batch's activation per stage, in any unit (bytes, or micro-batches); ``None``:
            ``1/v`` for a stage of a device that holds ``v`` stages, so a device holding one micro-batch of its
            whole share holds 1.

    Raises:
        ValueError: a field that is empty, not one number per stage, negative, NaN or infinite, or a stage whose
            forward and backward are both zero; the message names the field.
    """

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    weight: tuple[float, ...]
    copy: float = 0.0
    activation: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        forward = _per_stage("forward", self.forward, None)
        n = len(forward)
        object.__setattr__(self, "forward", forward)
        object.__setattr__(self, "backward", _per_stage("backward", self.backward, n))
        object.__setattr__(self, "weight", _per_stage("weight", self.weight, n))
        object.__setattr__(self, "copy", _number("StageCosts.copy", self.copy))
        if self.activation is not None:
            object.__setattr__(self, "activation", _per_stage("activation", self.activation, n))
        for s, (f, b) in enumerate(zip(self.forward, self.backward, strict=True)):
            if f + b <= 0:
                raise ValueError(f"StageCosts: stage {s} has forward and backward both 0; give it some seconds")

    @classmethod
    def uniform(cls, n: int, forward: float, backward: float, weight: float = 0.0, copy: float = 0.0) -> StageCosts:
        """``n`` stages that cost the same.

        Raises:
            ValueError: ``n < 1``, or a cost that is negative, NaN or infinite.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"StageCosts.uniform needs at least one stage, got n={n!r}")
        return cls((forward,) * n, (backward,) * n, (weight,) * n, copy)

    @property
    def n(self) -> int:
        """The number of stages."""
        return len(self.forward)

    @property
    def splits(self) -> bool:
        """Whether the search splits the backward into ``B`` and ``W`` (Note [search tasks])."""
        return any(self.weight)

    def activations(self, placement: Sequence[int]) -> tuple[float, ...]:
        """Each stage's activation of one micro-batch: :attr:`activation`, or ``1/v`` on a device of ``v`` stages."""
        if self.activation is not None:
            return self.activation
        count: dict[int, int] = {}
        for d in placement:
            count[d] = count.get(d, 0) + 1
        return tuple(1 / count[d] for d in placement)

    def seconds(self, op: Op, stage: int, splits: bool) -> float:
        """Seconds of task ``op`` on ``stage`` in a schedule that has ``W`` tasks (``splits``) or not."""
        if op is Op.F or op is Op.R:
            return self.forward[stage]
        if op is Op.B:
            return self.backward[stage] + (0.0 if splits else self.weight[stage])
        return self.weight[stage]


def memory_limits(limit: float | Sequence[float] | None, devices: int) -> tuple[float, ...] | None:
    """``limit`` as one number per device (``None`` stays ``None``: no limit).

    Raises:
        ValueError: not a number or one per device, or a value that is NaN, infinite or not positive.
    """
    if limit is None:
        return None
    values = [limit] * devices if isinstance(limit, (int, float)) and not isinstance(limit, bool) else limit
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) != devices:
        raise ValueError(f"memory_limit is one number, or one per device ({devices}), or None; got {limit!r}")
    out = []
    for d, x in enumerate(values):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
            raise ValueError(f"memory_limit of device {d} must be a finite number > 0, got {x!r}")
        out.append(float(x))
    return tuple(out)


@dataclass(frozen=True)
class Problem:
    """The search's problem: ``m`` micro-batches over the stages of ``costs`` placed by ``placement``, numbered
    (Note [search tasks]), with each task's device, seconds, dependencies and successors.

    Attributes:
        m: micro-batches.
        placement: the device of each stage (checked: no gaps).
        costs: the per-stage costs.
        limits: the memory limit per device, ``None`` for none.
    """

    m: int
    placement: tuple[int, ...]
    costs: StageCosts
    limits: tuple[float, ...] | None
    n: int = field(init=False)
    devices: int = field(init=False)
    splits: bool = field(init=False)
    activation: tuple[float, ...] = field(init=False)
    size: int = field(init=False)
    device: tuple[int, ...] = field(init=False, repr=False)
    seconds: tuple[float, ...] = field(init=False, repr=False)
    deps: tuple[tuple[tuple[int, float], ...], ...] = field(init=False, repr=False)
    succs: tuple[tuple[tuple[int, float], ...], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        m, n, costs = self.m, len(self.placement), self.costs
        place = self.placement
        splits = costs.splits
        ops = 3 if splits else 2
        size = ops * m * n
        seconds: list[float] = [0.0] * size
        device: list[int] = [0] * size
        deps: list[list[tuple[int, float]]] = [[] for _ in range(size)]
        succs: list[list[tuple[int, float]]] = [[] for _ in range(size)]
        for code in range(ops):
            op = SEARCH_OPS[code]
            for i in range(m):
                for s in range(n):
                    k = (code * m + i) * n + s
                    seconds[k], device[k] = costs.seconds(op, s, splits), place[s]
        for i in range(m):
            for s in range(n):
                f, b = i * n + s, (m + i) * n + s
                edges = [(f - 1, f)] if s else []  # F(i, s-1) -> F(i, s)
                edges.append((f, b))  # F(i, s) -> B(i, s)
                edges.append((b + 1, b) if s < n - 1 else (i * n + n - 1, b))  # B(i, s+1) or the loss -> B(i, s)
                if splits:
                    edges.append((b, (2 * m + i) * n + s))  # B(i, s) -> W(i, s)
                for a, z in dict.fromkeys(edges):
                    delay = costs.copy if device[a] != device[z] else 0.0
                    deps[z].append((a, delay))
                    succs[a].append((z, delay))
        for name, value in (("n", n), ("devices", max(place) + 1), ("splits", splits), ("size", size),
                            ("activation", costs.activations(place)), ("device", tuple(device)),
                            ("seconds", tuple(seconds)), ("deps", tuple(map(tuple, deps))),
                            ("succs", tuple(map(tuple, succs)))):
            object.__setattr__(self, name, value)

    @classmethod
    def build(cls, m: int, placement: Sequence[int], costs: StageCosts,
              memory_limit: float | Sequence[float] | None = None) -> Problem:
        """The problem, its arguments checked.

        Raises:
            ValueError: ``m < 1``, ``costs`` not a :class:`StageCosts`, a placement with gaps or not one device per
                stage, or a bad memory limit (the message names the argument and the fix).
        """
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"m is the number of micro-batches, an int >= 1; got {m!r}")
        if not isinstance(costs, StageCosts):
            raise ValueError(f"costs must be a StageCosts, got {type(costs).__name__}")
        if isinstance(placement, (str, bytes)) or not isinstance(placement, Sequence):
            raise ValueError(f"placement is the device of each stage (a sequence of ints), got {placement!r}")
        if len(placement) != costs.n:
            raise ValueError(f"placement has {len(placement)} entries but costs have {costs.n} stages: give the "
                             f"device of each stage")
        try:
            place = stage_placement(costs.n, [operator.index(d) for d in placement if not isinstance(d, bool)])
        except TypeError:
            raise ValueError(f"placement holds device indices (ints), got {tuple(placement)!r}") from None
        return cls(m, place, costs, memory_limits(memory_limit, max(place) + 1))

    def op(self, k: int) -> int:
        """The op code of task ``k`` (Note [search tasks])."""
        return k // (self.m * self.n)

    def microbatch(self, k: int) -> int:
        return k // self.n % self.m

    def stage(self, k: int) -> int:
        return k % self.n

    def number(self, task: Task) -> int:
        """Task ``task``'s number (``F``, ``B`` or ``W``; Note [search tasks])."""
        code = SEARCH_OPS.index(task.op)
        return (code * self.m + task.microbatch) * self.n + task.stage

    def task(self, k: int) -> Task:
        return Task(SEARCH_OPS[self.op(k)], self.microbatch(k), self.stage(k))

    def releases(self, k: int) -> int:
        """The task whose end frees what ``F`` task ``k`` holds: its ``W``, or its ``B`` without ``W`` tasks."""
        return k + (2 if self.splits else 1) * self.m * self.n
