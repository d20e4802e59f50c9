"""Collective tasks: a stage's data-parallel gathers and reductions, run on each device's communication stream.

A stage whose :class:`~sim.core.cost.StageCost` has :class:`StageCollectives` computes each task unit by unit (an
FSDP unit, a gradient bucket: a layer in the planner), and its collectives run as tasks of their own on the device's
communication stream, one at a time in the order they are issued, beside the compute stream::

    all-gather of unit u      issued when unit u-1 starts computing (one unit prefetched; unit 0 of a task when the
                              device's previous task starts its last unit, or when that task ended)
    unit u computes           after its all-gather has ended and unit u-1 has computed
    reduction of unit u       issued when unit u of a gradient task has computed (each one, or the stage's last)

The simulator receives each collective's seconds, priced by whoever built the costs (a ring, a hierarchical
collective on a cluster's links: :mod:`sim.planning.collectives`); it decides when they run and what waits for them.
The timeline holds one span per collective on stream :data:`gpipe.schedule.timeline.COLLECTIVE`, named after the
compute task it serves, so the Perfetto trace and the Gantt chart show them.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from gpipe.schedule import Op, Schedule, Task
from gpipe.schedule.timeline import COLLECTIVE, Span

__all__ = ["Gather", "StageCollectives", "Unit", "CommStream"]


class Gather(str, enum.Enum):
    """When a stage gathers its units' parameters."""

    NEVER = "never"
    #: before every F and R, and before every B when resharded after the forward (FSDP's FULL_SHARD, ZeRO-3)
    EACH_TASK = "each task"
    #: once a step, before the stage's first F; kept until the step ends (FSDP's ``reshard_after_forward=False``
    #: under a pipeline, which re-gathering for every micro-batch would make pointless)
    ONCE = "once a step"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Unit:
    """One unit of a stage: its share of every task's compute and its collectives' seconds.

    Attributes:
        share: fraction of each task's seconds this unit computes (a stage's shares sum to 1).
        gather: seconds of its all-gather (0 when the stage gathers nothing).
        reduce: seconds of its gradient reduction (an all-reduce or a reduce-scatter; 0: none).
        replicate: seconds of the all-reduce of its reduced shard across replica groups (hybrid sharding), after
            the stage's last gradient task; 0: none.
        gather_bytes: bytes its all-gather gathers (for the span's label).
        reduce_bytes: bytes its reduction reduces (for the span's label).
    """

    share: float
    gather: float = 0.0
    reduce: float = 0.0
    replicate: float = 0.0
    gather_bytes: float = 0.0
    reduce_bytes: float = 0.0

    def __post_init__(self) -> None:
        for name in ("share", "gather", "reduce", "replicate", "gather_bytes", "reduce_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                raise ValueError(f"Unit.{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class StageCollectives:
    """What a stage's data-parallel group runs besides its compute (see the module's table).

    Attributes:
        units: the stage's units in forward order; a backward computes them in reverse.
        gather: when the units' parameters are gathered.
        gather_backward: with :attr:`Gather.EACH_TASK`, gather again before each ``B`` (resharded after the
            forward); ``W`` never gathers (it reads activations and output gradients only).
        reduce_each: reduce after every gradient task (``W`` where the backward is split, else ``B``); otherwise
            after the stage's last one on its device, as DDP under ``no_sync`` and Megatron's buckets do.
        reduce_kind: ``"all-reduce"`` or ``"reduce-scatter"``, for the spans' labels.
    """

    units: tuple[Unit, ...]
    gather: Gather = Gather.NEVER
    gather_backward: bool = False
    reduce_each: bool = False
    reduce_kind: str = "all-reduce"

    def __post_init__(self) -> None:
        object.__setattr__(self, "units", tuple(self.units))
        if not self.units:
            raise ValueError("StageCollectives needs at least one unit")
        total = sum(u.share for u in self.units)
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"the units' shares of a stage must sum to 1, got {total}")
        if self.reduce_kind not in ("all-reduce", "reduce-scatter"):
            raise ValueError(f"reduce_kind is 'all-reduce' or 'reduce-scatter', got {self.reduce_kind!r}")

    def gathers(self, op: Op, first: bool) -> bool:
        """Whether a task ``op`` gathers its units; ``first``: it is the stage's first ``F`` on its device."""
        if self.gather is Gather.EACH_TASK:
            return op in (Op.F, Op.R) or (op is Op.B and self.gather_backward)
        return self.gather is Gather.ONCE and op is Op.F and first


def _bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


# Note [one communication stream]: a device's gathers and reductions share one stream and run one at a time in the
# order they are issued. NCCL runs FSDP's all-gathers and reduce-scatters on two streams, but both cross the same
# links, so two at once take as long as the two in turn; the order only decides which waits, and issue order is
# what the device's program asks for. The group's other members run the same tasks at the same times (replicas are
# symmetric), so a collective starts when this device issues it and its stream is free.
class CommStream:
    """Device ``d``'s communication stream: when each collective runs, and the compute it holds back."""

    def __init__(self, schedule: Schedule, stages: Sequence[StageCollectives | None], d: int) -> None:
        self.d, self.stages, self.tasks = d, stages, schedule.tasks[d]
        self.free = 0.0  # when the stream finishes what it was given
        self.spans: list[Span] = []
        gradient = Op.W if any(t.op is Op.W for t in self.tasks) else Op.B
        self.last_gradient: dict[int, int] = {}  # stage -> index of its last gradient task on this device
        self.first_forward: dict[int, int] = {}
        for k, t in enumerate(self.tasks):
            if t.op is gradient:
                self.last_gradient[t.stage] = k
            if t.op is Op.F:
                self.first_forward.setdefault(t.stage, k)
        self.gradient = gradient
        self.prefetched: dict[int, float] = {}  # task index -> end of its first unit's gather, issued early
        self.previous_end = 0.0  # when the device's previous task ended

    def _run(self, issue: float, seconds: float, task: Task, label: str) -> float:
        start = issue if issue > self.free else self.free
        end = self.free = start + seconds
        self.spans.append(Span(self.d, COLLECTIVE, task, start, end, label))
        return end

    def _order(self, k: int) -> tuple[StageCollectives | None, list[int], bool]:
        """Task ``k``'s stage collectives, its units in the order it computes them, and whether it gathers them."""
        task = self.tasks[k]
        c = self.stages[task.stage]
        if c is None:
            return None, [], False
        backward = task.op in (Op.B, Op.W)
        order = list(range(len(c.units)))[::-1] if backward else list(range(len(c.units)))
        return c, order, c.gathers(task.op, self.first_forward.get(task.stage) == k)

    def _gather(self, k: int, unit: int, issue: float) -> float:
        task = self.tasks[k]
        c = self.stages[task.stage]
        assert c is not None
        u = c.units[unit]
        return self._run(issue, u.gather, task, f"all-gather unit {unit} ({_bytes(u.gather_bytes)})")

    def task(self, k: int, t: float, seconds: float) -> tuple[float, float]:
        """Task ``k`` of the device, ready to compute at ``t`` for ``seconds``: its start and end, with the
        collectives it waits for and issues on the stream."""
        c, order, gathers = self._order(k)
        if c is None:
            self.previous_end = t + seconds
            return t, t + seconds
        task = self.tasks[k]
        reduces = task.op is self.gradient and (c.reduce_each or self.last_gradient.get(task.stage) == k)
        last = self.last_gradient.get(task.stage) == k
        start = end = t
        gathered = 0.0
        if gathers:
            early = self.prefetched.pop(k, None)
            gathered = early if early is not None else self._gather(k, order[0], self.previous_end)
        for n, unit in enumerate(order):
            begin = end if end > gathered else gathered
            if n == 0:
                start = begin
            if gathers and n + 1 < len(order):  # prefetch the next unit as this one starts
                gathered = self._gather(k, order[n + 1], begin)
            if n + 1 == len(order):  # prefetch the device's next task's first unit
                self._prefetch(k + 1, begin)
            end = begin + seconds * c.units[unit].share
            u = c.units[unit]
            if reduces and u.reduce:
                self._run(end, u.reduce, task, f"{c.reduce_kind} unit {unit} ({_bytes(u.reduce_bytes)})")
            if last and u.replicate:
                self._run(end, u.replicate, task, f"all-reduce across replicas unit {unit}")
        self.previous_end = end
        return start, end

    def _prefetch(self, k: int, issue: float) -> None:
        if k >= len(self.tasks):
            return
        _, order, gathers = self._order(k)
        if gathers:
            self.prefetched[k] = self._gather(k, order[0], issue)

    def pair(self, ks: tuple[int, int], t: float) -> float:
        """An overlapped pair of tasks ``ks`` ready at ``t``: when it can start, every unit of both gathered first.

        Note [pairs gather first]: the two tasks share the device unit by unit in no order the simulator follows,
        so their gathers run before the pair and their reductions after it (:meth:`after_pair`); a pair's units are
        not overlapped with its own collectives, only with the other tasks'."""
        ready = t
        for k in ks:
            c, order, gathers = self._order(k)
            if c is None or not gathers:
                continue
            first = self.prefetched.pop(k, None)
            ready = max(ready, first if first is not None else self._gather(k, order[0], self.previous_end))
            for unit in order[1:]:
                ready = max(ready, self._gather(k, unit, self.previous_end))
        return ready

    def after_pair(self, k: int, end: float) -> None:
        """Task ``k`` of a pair ended at ``end``: issue its reductions."""
        c, order, _ = self._order(k)
        self.previous_end = max(self.previous_end, end)
        if c is None:
            return
        task = self.tasks[k]
        last = self.last_gradient.get(task.stage) == k
        if task.op is not self.gradient or not (c.reduce_each or last):
            return
        for unit in order:
            u = c.units[unit]
            if u.reduce:
                self._run(end, u.reduce, task, f"{c.reduce_kind} unit {unit} ({_bytes(u.reduce_bytes)})")
            if last and u.replicate:
                self._run(end, u.replicate, task, f"all-reduce across replicas unit {unit}")
