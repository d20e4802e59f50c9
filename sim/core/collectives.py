"""Collective tasks: a stage's data-parallel gathers and reductions, run on each device's communication stream.

A stage whose :class:`~sim.core.cost.StageCost` has :class:`StageCollectives` computes each task unit by unit (an
FSDP unit, a gradient bucket: a layer in the planner), and its collectives run as tasks of their own on the device's
communication stream, one at a time in the order they are issued, beside the compute stream::

    all-gather of unit u      issued when unit u-1 starts computing (one unit prefetched; unit 0 of a task when the
                              device's previous task starts its last unit, or when that task ended)
    unit u computes           after its all-gather has ended and unit u-1 has computed
    reduction of unit u       issued when unit u of a gradient task has computed (each one, or the stage's last)

The simulator receives each collective's seconds, priced by whoever built the costs (a ring, a hierarchical
collective on a cluster's links: :mod:`sim.core.rings`); it decides when they run and what waits for
them. The timeline holds one span per collective on stream :data:`gpipe.schedule.timeline.COLLECTIVE`, named after the
compute task it serves, so the Perfetto trace and the Gantt chart show them. A task's all-to-all is drawn there too
(Note [communication spans] in :mod:`sim.core.overlap`), but priced inside its task: it waits for none of this
module's collectives, and they wait for none of it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpipe.schedule import Op, Schedule, Task
from gpipe.schedule.timeline import COLLECTIVE, COMPUTE, Span, Timeline, collective_label

__all__ = ["CommStream", "Gather", "StageCollectives", "Unit", "add_collectives"]


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
        values = (self.share, self.gather, self.reduce, self.replicate, self.gather_bytes, self.reduce_bytes)
        if all(type(v) is float and 0.0 <= v < math.inf for v in values):  # the usual case, checked cheaply
            return
        for name, value in zip(("share", "gather", "reduce", "replicate", "gather_bytes", "reduce_bytes"), values,
                               strict=True):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
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


# Note [one communication stream]: a device's gathers and reductions share one stream and run one at a time in the
# order they are issued. NCCL runs FSDP's all-gathers and reduce-scatters on two streams, but both cross the same
# links, so two at once take as long as the two in turn; the order only decides which waits, and issue order is
# what the device's program asks for. The group's other members run the same tasks at the same times (replicas are
# symmetric), so a collective starts when this device issues it and its stream is free.
class CommStream:
    """Device ``d``'s communication stream: when each collective runs, and the compute it holds back."""

    def __init__(self, schedule: Schedule, stages: Sequence[StageCollectives | None], d: int,
                 reductions_only: bool = False) -> None:
        """``reductions_only``: no stage gathers, so only gradient tasks have collectives (a shorter setup)."""
        self.d, self.stages, self.tasks = d, stages, schedule.tasks[d]
        self.free = 0.0  # when the stream finishes what it was given
        self.spans: list[Span] = []
        tasks = self.tasks
        gradient = Op.W if schedule.splits_weight_gradient else Op.B
        gradients = schedule.gradient_positions[d]
        last_gradient = {tasks[k].stage: k for k in gradients if stages[tasks[k].stage] is not None}
        first_forward: dict[int, int] = {}
        if not reductions_only:
            for k, t in enumerate(tasks):
                if t.op is Op.F and t.stage not in first_forward:
                    first_forward[t.stage] = k
        # each of this device's stages' units in forward and in backward order, shared by its tasks
        orders: dict[int, tuple[list[int], list[int]]] = {}
        # per task: its units in the order it computes them, whether it gathers, reduces, replicates; None: no work
        self.plan: list[tuple[StageCollectives, list[int], bool, bool, bool] | None] = [None] * len(tasks)
        for k in (k for k in gradients if tasks[k].stage in last_gradient) if reductions_only else range(len(tasks)):
            t = tasks[k]
            c = stages[t.stage]
            if c is None:
                continue
            gathers = c.gather is not Gather.NEVER and c.gathers(t.op, first_forward.get(t.stage) == k)
            last = last_gradient.get(t.stage) == k
            reduces = t.op is gradient and (c.reduce_each or last)
            if gathers or reduces:
                if t.stage not in orders:
                    forward = list(range(len(c.units)))
                    orders[t.stage] = (forward, forward[::-1])
                self.plan[k] = (c, orders[t.stage][t.op in (Op.B, Op.W)], gathers, reduces, last)
        self.prefetched: dict[int, float] = {}  # task index -> end of its first unit's gather, issued early
        self.previous_end = 0.0  # when the device's previous task ended

    def _run(self, issue: float, seconds: float, task: Task, label: str) -> float:
        start = issue if issue > self.free else self.free
        end = self.free = start + seconds
        self.spans.append(Span(self.d, COLLECTIVE, task, start, end, label))
        return end

    def _gather(self, k: int, c: StageCollectives, unit: int, issue: float) -> float:
        u = c.units[unit]
        return self._run(issue, u.gather, self.tasks[k], collective_label("all-gather", unit, u.gather_bytes))

    def _reduce(self, k: int, c: StageCollectives, unit: int, end: float, last: bool) -> None:
        u = c.units[unit]
        if u.reduce:
            self._run(end, u.reduce, self.tasks[k], collective_label(c.reduce_kind, unit, u.reduce_bytes))
        if last and u.replicate:
            self._run(end, u.replicate, self.tasks[k], f"all-reduce across replicas unit {unit}")

    def task(self, k: int, t: float, seconds: float) -> tuple[float, float]:
        """Task ``k`` of the device, ready to compute at ``t`` for ``seconds``: its start and end, with the
        collectives it waits for and issues on the stream."""
        plan = self.plan[k]
        if plan is None:
            end = t + seconds
            if k + 1 < len(self.plan) and self.plan[k + 1] is not None:
                self._prefetch(k + 1, t)
            self.previous_end = end
            return t, end
        c, order, gathers, reduces, last = plan
        start = end = t
        gathered = 0.0
        if gathers:
            early = self.prefetched.pop(k, None)
            gathered = early if early is not None else self._gather(k, c, order[0], self.previous_end)
        final = len(order) - 1
        for n, unit in enumerate(order):
            begin = end if end > gathered else gathered
            if n == 0:
                start = begin
            if gathers and n < final:  # prefetch the next unit as this one starts
                gathered = self._gather(k, c, order[n + 1], begin)
            if n == final:  # prefetch the device's next task's first unit
                self._prefetch(k + 1, begin)
            end = begin + seconds * c.units[unit].share
            if reduces:
                self._reduce(k, c, unit, end, last)
        self.previous_end = end
        return start, end

    def _prefetch(self, k: int, issue: float) -> None:
        plan = self.plan[k] if k < len(self.plan) else None
        if plan is not None and plan[2]:
            self.prefetched[k] = self._gather(k, plan[0], plan[1][0], issue)

    def pair(self, ks: tuple[int, int], t: float) -> float:
        """An overlapped pair of tasks ``ks`` ready at ``t``: when it can start, every unit of both gathered first.

        Note [pairs gather first]: the two tasks share the device unit by unit in no order the simulator follows,
        so their gathers run before the pair and their reductions after it (:meth:`after_pair`); a pair's units are
        not overlapped with its own collectives, only with the other tasks'."""
        ready = t
        for k in ks:
            plan = self.plan[k]
            if plan is None or not plan[2]:
                continue
            c, order = plan[0], plan[1]
            first = self.prefetched.pop(k, None)
            ready = max(ready, first if first is not None else self._gather(k, c, order[0], self.previous_end))
            for unit in order[1:]:
                ready = max(ready, self._gather(k, c, unit, self.previous_end))
        return ready

    def after_pair(self, k: int, end: float) -> None:
        """Task ``k`` of a pair ended at ``end``: issue its reductions."""
        self.previous_end = max(self.previous_end, end)
        plan = self.plan[k]
        if plan is not None and plan[3]:
            for unit in plan[1]:
                self._reduce(k, plan[0], unit, end, plan[4])

    @property
    def gathers(self) -> bool:
        """Whether any of the device's tasks waits for a gather (else its collectives never hold compute back)."""
        return any(plan is not None and plan[2] for plan in self.plan)


# Note [collectives after the fact]: where no stage gathers (DDP, ZeRO-1 and -2), no compute waits for a collective,
# so the compute timeline is the one without collectives, and each device's stream can be run afterwards over its
# compute spans in task order: the same CommStream, the same issue times (a unit's reduction at its share of its
# task's span). A planner sweep simulates the compute once and adds each data-parallel layout's collectives to it.
def add_collectives(timeline: Timeline, schedule: Schedule, stages: Sequence[StageCollectives | None],
                    pairs: bool = True) -> Timeline:
    """``timeline`` (simulated without collectives) with the collectives of ``stages`` on each device's stream;
    ``pairs``: the schedule's overlapped pairs ran together (``SimConfig.overlap_pairs``).

    Raises:
        ValueError: a stage gathers (its compute would wait: simulate it with the collectives instead).
    """
    if any(c is not None and c.gather is not Gather.NEVER for c in stages):
        raise ValueError("a stage that gathers its parameters delays its compute: simulate it with its collectives")
    added: list[Span] = []
    offset = 0
    for d in range(schedule.num_devices):
        stream = CommStream(schedule, stages, d, reductions_only=True)
        tasks = stream.tasks
        # only the tasks that reduce issue anything: without gathers nothing else reaches the stream
        due = [k for k in schedule.gradient_positions[d] if stream.plan[k] is not None]
        starts = schedule.pair_starts[d] if pairs and schedule.pairs else frozenset()
        for k in due:
            pair = k if k in starts else k - 1 if k - 1 in starts else None
            if pair is not None:  # an overlapped pair: each reduces after it (Note [pairs gather first])
                stream.after_pair(k, max(_span(timeline, offset + pair, d, tasks[pair]).end,
                                         _span(timeline, offset + pair + 1, d, tasks[pair + 1]).end))
            else:
                s = _span(timeline, offset + k, d, tasks[k])
                stream.task(k, s.start, s.end - s.start)
        added.extend(stream.spans)
        offset += len(tasks)
    return timeline.with_spans(added)


def _span(timeline: Timeline, at: int, device: int, task: Task) -> Span:
    """``task``'s compute span on ``device``, expected at ``at`` among the timeline's spans: a simulated timeline lists
    a device's compute spans in task order, device by device (Note [span order] in :mod:`sim.core.run`), a pair's two
    in the order they end; any other timeline is searched."""
    spans = timeline.spans
    for i in (at, at - 1, at + 1):
        if 0 <= i < len(spans) and spans[i].task == task and spans[i].stream == COMPUTE and spans[i].device == device:
            return spans[i]
    return timeline.compute_spans_by_task(device)[task]
