"""Pipeline schedules as immutable data: tasks, per-device task lists, generators and one validator.

This module is pure Python (no torch) and is the language that both the executor (:mod:`gpipe`) and the
simulator (:mod:`sim`) speak. A :class:`Schedule` says *what* runs *where* and *in which order*; it never
says *when*. The simulator predicts when, the executor measures when, and both answer with a
:class:`gpipe.timeline.Timeline`.

Vocabulary (after Huang et al., 2019, GPipe; Kim et al., 2020, torchgpipe)::

    m  micro-batches, indexed i = 0 .. m-1
    n  stages (partitions), indexed j = 0 .. n-1

    F(i, j)  forward of micro-batch i on stage j
    R(i, j)  recompute of a checkpointed forward, run right before its backward
    B(i, j)  backward of micro-batch i on stage j
    W(i, j)  weight gradient, for schedules that split the backward (zero-bubble)

A task prints as ``F2@1`` (forward of micro-batch 2 on stage 1) and :meth:`Task.parse` reads it back.

Note [dependencies]: copies are not tasks. ``F(i, j)`` needs the output of ``F(i, j-1)``; ``B(i, j)``
needs the gradient of ``B(i, j+1)`` (or, on the last stage, the loss of ``F(i, n-1)``), its own
``F(i, j)``, and ``R(i, j)`` when checkpointed; ``R(i, j)`` needs only ``F(i, j)`` (it keeps the stage
input), so it may run before the gradient arrives, as torchgpipe does; ``W(i, j)`` needs ``B(i, j)``.
The simulator and the executor derive the copies from these edges.

Note [fast frozen records]: a big simulation builds millions of tasks, spans and memory samples
(``gpipe(16384, 64)`` alone has 3.1 million tasks). :class:`Task` here, and
:class:`~gpipe.timeline.Span` and :class:`~gpipe.timeline.MemorySample`, are frozen dataclasses with
``__slots__``: an instance holds its fields and no ``__dict__`` (a task takes 56 bytes instead of 160,
a span 80 instead of 192, besides its floats), and its ``__init__`` stores each field through the
slot's own setter (``_set_op(self, op)``), which skips the frozen ``__setattr__``: about twice as fast
as the generated ``__init__``. They stay dataclasses (fields, ``replace``, ``repr``, equality,
ordering, hashing, pickling), and assigning a field still raises ``FrozenInstanceError``.

Note [linear validation]: :meth:`Schedule.validate` runs for every simulation, so it must cost less
than one. It numbers every task ``(op, i, j)`` as an integer and checks Note [dependencies] on those
numbers; the deadlock check lets each device run its list as far as it can and parks a device on the
first unfinished dependency of its head task, to be woken when that task finishes. Each task finishes
once and wakes its waiting devices once, so the check is linear in the tasks (the unit-step grid is
``steps x devices``). Only an invalid schedule pays for the grid, which its error message shows. A
schedule is immutable, so it remembers that it passed.
"""

from __future__ import annotations

import contextlib
import enum
import gc
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "CHECKPOINT_MODES",
    "Checkpoint",
    "Op",
    "Schedule",
    "ScheduleError",
    "Task",
    "checkpointed",
    "clock_cycles",
    "collector_paused",
    "gpipe",
    "one_f_one_b",
    "parse_tasks",
    "step_grid",
]

Checkpoint = Literal["always", "except_last", "never"]
CHECKPOINT_MODES: tuple[Checkpoint, ...] = ("always", "except_last", "never")


class Op(str, enum.Enum):
    """The kind of a task."""

    F = "F"  # forward
    B = "B"  # backward (input gradient, and weight gradient unless a W task splits it off)
    R = "R"  # recompute of a checkpointed forward
    W = "W"  # weight gradient

    def __str__(self) -> str:
        return self.value


_TASK_RE = re.compile(r"^\s*([FBRW])(\d+)@(\d+)\s*$")


@dataclass(frozen=True, order=True, init=False, slots=True)
class Task:
    """One unit of work on one stage: ``op`` of micro-batch ``microbatch`` on stage ``stage``."""

    op: Op
    microbatch: int
    stage: int

    def __init__(self, op: Op | str, microbatch: int, stage: int) -> None:
        # Note [fast frozen records]: fields go straight into their slots
        if op.__class__ is not Op:
            op = Op(op)
        if microbatch < 0 or stage < 0:
            raise ValueError(f"task indices must be >= 0, got microbatch={microbatch}, stage={stage}")
        _set_op(self, op)
        _set_microbatch(self, microbatch)
        _set_stage(self, stage)

    def __str__(self) -> str:
        return f"{self.op.value}{self.microbatch}@{self.stage}"

    def __repr__(self) -> str:
        return f"Task({str(self)!r})"

    @classmethod
    def parse(cls, text: str) -> Task:
        """Read a task back from its text form, e.g. ``Task.parse("R3@0")``."""
        match = _TASK_RE.match(text)
        if match is None:
            raise ValueError(f"not a task: {text!r} (expected e.g. 'F2@1': op, micro-batch, '@', stage)")
        op, i, j = match.groups()
        return cls(Op(op), int(i), int(j))


# Note [fast frozen records]: the slots' own setters, which bypass the frozen __setattr__
_set_op, _set_microbatch, _set_stage = (getattr(Task, name).__set__ for name in ("op", "microbatch", "stage"))
_new = object.__new__


def _task(op: Op, microbatch: int, stage: int) -> Task:
    """``Task(op, microbatch, stage)`` for a generator, whose op is an :class:`Op` and indices are in range:
    without the checks and the call through ``type``, a third faster (Note [fast frozen records])."""
    task = _new(Task)
    _set_op(task, op)
    _set_microbatch(task, microbatch)
    _set_stage(task, stage)
    return task


def checkpointed(policy: Checkpoint, microbatch: int, m: int) -> bool:
    """Whether micro-batch ``microbatch`` of ``m`` is checkpointed under ``policy``.

    ``except_last`` leaves the last micro-batch out: its backward follows its forward at once, so
    keeping its activations costs nothing extra and saves one recompute (torchgpipe's default).
    """
    if policy == "always":
        return True
    if policy == "except_last":
        return microbatch < m - 1
    if policy == "never":
        return False
    raise ValueError(f"unknown checkpoint mode {policy!r}; use one of {', '.join(CHECKPOINT_MODES)}")


class ScheduleError(ValueError):
    """An invalid schedule. The message shows the step x device grid with the failing step marked."""


@dataclass(frozen=True)
class Schedule:
    """Per-device ordered task lists, plus the shape they were generated for.

    Attributes:
        m: micro-batches.
        n: stages.
        checkpoint: the checkpoint policy; decides which micro-batches have an ``R`` task.
        placement: ``placement[j]`` is the device index of stage ``j`` (several stages may share one).
        tasks: ``tasks[d]`` is the ordered tuple of tasks device ``d`` runs.
        name: the generator's name, for display.
    """

    m: int
    n: int
    checkpoint: Checkpoint
    placement: tuple[int, ...]
    tasks: tuple[tuple[Task, ...], ...]
    name: str = "custom"

    def __post_init__(self) -> None:
        object.__setattr__(self, "placement", tuple(self.placement))
        object.__setattr__(self, "tasks", tuple(tuple(t) for t in self.tasks))

    # -- structure ---------------------------------------------------------------------------------

    @property
    def num_devices(self) -> int:
        return len(self.tasks)

    def device_of(self, stage: int) -> int:
        """The device index that runs ``stage``."""
        return self.placement[stage]

    def stages_on(self, device: int) -> tuple[int, ...]:
        """The stages placed on ``device``, in stage order."""
        return tuple(j for j, d in enumerate(self.placement) if d == device)

    def is_checkpointed(self, microbatch: int) -> bool:
        return checkpointed(self.checkpoint, microbatch, self.m)

    @property
    def splits_weight_gradient(self) -> bool:
        """True when the schedule has ``W`` tasks (backward split into input and weight gradient)."""
        return any(t.op is Op.W for ts in self.tasks for t in ts)

    def all_tasks(self) -> Iterator[Task]:
        for ts in self.tasks:
            yield from ts

    def dependencies(self, task: Task) -> tuple[Task, ...]:
        """The tasks whose results ``task`` needs (see Note [dependencies] in the module docstring)."""
        i, j = task.microbatch, task.stage
        if task.op is Op.F:
            return (Task(Op.F, i, j - 1),) if j > 0 else ()
        if task.op is Op.R:
            return (Task(Op.F, i, j),)
        if task.op is Op.B:
            deps = [Task(Op.F, i, j)]
            if self.is_checkpointed(i):
                deps.append(Task(Op.R, i, j))
            deps.append(Task(Op.B, i, j + 1) if j < self.n - 1 else Task(Op.F, i, self.n - 1))
            return tuple(dict.fromkeys(deps))
        return (Task(Op.B, i, j),)

    def overlaps(self) -> bool:
        """Whether two devices can ever run tasks at the same time.

        True when some two tasks on different devices are ordered neither by Note [dependencies] nor
        by their devices' lists. One micro-batch without checkpointing runs one task at a time; with
        checkpointing it does not: every ``R(0, j)`` may run as soon as its ``F(0, j)`` has, beside
        the forwards of later stages and the other recomputes (torchgpipe's early recompute). Each
        task's ancestors are one integer bitset, so this is quadratic in the tasks at worst.
        """
        self.validate()
        index = {t: k for k, t in enumerate(self.all_tasks())}
        device = [d for d, ts in enumerate(self.tasks) for _ in ts]
        below = [0] * len(index)  # below[k]: bit q set when task q must finish before task k starts
        done: set[int] = set()
        heads = [0] * self.num_devices
        while len(done) < len(index):  # the device lists in an order that respects every edge (valid: no deadlock)
            for d, ts in enumerate(self.tasks):
                while heads[d] < len(ts):
                    t = ts[heads[d]]
                    before = [index[u] for u in self.dependencies(t)]
                    if heads[d]:
                        before.append(index[ts[heads[d] - 1]])
                    if any(q not in done for q in before):
                        break
                    k = index[t]
                    for q in before:
                        below[k] |= below[q] | (1 << q)
                    done.add(k)
                    heads[d] += 1
        for k in range(len(index)):
            for q in range(k):
                if device[q] != device[k] and not (below[k] >> q) & 1 and not (below[q] >> k) & 1:
                    return True
        return False

    def expected_tasks(self) -> set[Task]:
        """The set of tasks a valid schedule of this shape runs, each exactly once."""
        ops = [Op.F, Op.B] + ([Op.W] if self.splits_weight_gradient else [])
        expected = {Task(op, i, j) for op in ops for i in range(self.m) for j in range(self.n)}
        expected |= {Task(Op.R, i, j) for i in range(self.m) if self.is_checkpointed(i) for j in range(self.n)}
        return expected

    # -- checking and printing ---------------------------------------------------------------------

    def validate(self) -> Schedule:
        """Check the schedule; return it unchanged, or raise :class:`ScheduleError`.

        Checks: positive shape; placement covers every stage with a real device; every task exactly
        once and on its stage's device; no deadlock (every device can run its list in order, each task
        after its dependencies). A deadlock's error shows the grid up to the stuck step and the cycle
        of waiting tasks.
        """
        if self.__dict__.get("_valid"):  # Note [linear validation]: immutable, so checked once
            return self
        m, n, placement, devices = self.m, self.n, self.placement, self.num_devices
        if m < 1:
            raise ScheduleError(f"a schedule needs at least one micro-batch, got m={m}")
        if n < 1:
            raise ScheduleError(f"a schedule needs at least one stage, got n={n}")
        checkpointed(self.checkpoint, 0, m)  # rejects an unknown policy
        if len(placement) != n:
            raise ScheduleError(f"placement has {len(placement)} entries for {n} stages")
        for j, d in enumerate(placement):
            if not 0 <= d < devices:
                raise ScheduleError(f"stage {j} is placed on device {d}, but there are {devices} devices")
        ck = [checkpointed(self.checkpoint, i, m) for i in range(m)]
        weights = _walk(self, ck) if type(self).dependencies is Schedule.dependencies else -1
        if weights >= 0:  # every task ran once, in range, on its device, of a kind this shape has
            if sum(map(len, self.tasks)) != m * n * (3 if weights else 2) + n * sum(ck):
                self._raise_wrong_tasks()
        else:  # something is wrong (or a subclass has its own edges): name the first problem, in task order
            self._check_tasks(ck)
            if not _runs_to_completion(self):
                steps, stuck = _run_unit_steps(self)
                assert stuck is not None, "the linear check and the unit-step run disagree"
                cycle = _waiting_cycle(self, stuck)
                grid = _format_grid(self, steps, stuck)
                raise ScheduleError(
                    f"schedule {self.name!r} deadlocks at step {len(steps)}: "
                    f"waiting cycle {' -> '.join(map(str, cycle))}\n{grid}"
                )
        object.__setattr__(self, "_valid", True)
        return self

    def _check_tasks(self, ck: Sequence[bool]) -> None:
        """Raise for the first task, in device and list order, that is out of range, repeated or on the
        wrong device; then for missing or unexpected tasks."""
        m, n, placement = self.m, self.n, self.placement
        seen: dict[Task, int] = {}
        for d, ts in enumerate(self.tasks):
            for t in ts:
                if t in seen:
                    raise ScheduleError(f"task {t} appears twice (devices {seen[t]} and {d})\n{self.grid()}")
                seen[t] = d
                if t.stage >= n or t.microbatch >= m:
                    raise ScheduleError(f"task {t} is outside m={m}, n={n}")
                if placement[t.stage] != d:
                    raise ScheduleError(
                        f"task {t} is on device {d}, but stage {t.stage} is placed on device {placement[t.stage]}"
                    )
        if seen.keys() != self.expected_tasks():
            self._raise_wrong_tasks()

    def _raise_wrong_tasks(self) -> None:
        """The message for a schedule whose tasks are not exactly :meth:`expected_tasks` (each once)."""
        expected = self.expected_tasks()
        seen = set(self.all_tasks())
        missing = sorted(expected - seen)
        extra = sorted(seen - expected)
        parts = []
        if missing:
            parts.append("missing " + ", ".join(map(str, missing[:12])) + (" ..." if len(missing) > 12 else ""))
        if extra:
            parts.append("unexpected " + ", ".join(map(str, extra[:12])) + (" ..." if len(extra) > 12 else ""))
        raise ScheduleError(f"schedule {self.name!r} has the wrong tasks: {'; '.join(parts)}")

    def grid(self) -> str:
        """The step x device grid: each task takes one step, each device runs as soon as it can.

        Idle steps print as ``.``; the picture shows the bubble. A deadlocking schedule prints up to
        the step where it stops, with the stuck tasks marked ``>``.
        """
        steps, stuck = _run_unit_steps(self)
        return _format_grid(self, steps, stuck)

    def __str__(self) -> str:
        head = f"{self.name} schedule: m={self.m}, n={self.n}, checkpoint={self.checkpoint}"
        return head + "\n" + self.grid()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Note [gc]: pause Python's cyclic garbage collector while a big schedule or timeline is built.

    A big schedule or simulation allocates millions of small objects that all stay alive (tasks,
    spans, events); the collector would rescan them again and again, which costs more than building
    them (three times as long for ``gpipe(16384, 64)``). Reference counting still frees everything;
    the collector is restored (if it was on) when the block ends. The generators here and
    :func:`sim.engine.simulate` run inside it.

    When the block leaves more than ``_YOUNG_LIMIT`` new objects, they go straight to the oldest
    generation (``gc.freeze()`` then ``gc.unfreeze()``, both documented to move objects between whole
    generations without looking at them): else the first collection after the block would traverse
    them all at once (1.7 s after simulating ``gpipe(16384, 64)``), only to find them alive. A program
    that froze objects itself keeps them frozen: then the block does not do this.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if gc.get_count()[0] > _YOUNG_LIMIT and not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()


_YOUNG_LIMIT = 100_000  # Note [gc]: new objects past which a paused block moves them to the oldest generation


# -- generators ------------------------------------------------------------------------------------


def clock_cycles(m: int, n: int) -> Iterator[list[tuple[int, int]]]:
    """GPipe's forward clock cycles, as torchgpipe's ``clock_cycles(m, n)``.

    At clock ``k`` every ``(i, j)`` with ``i + j == k`` runs (``i`` micro-batch, ``j`` stage)::

        m=3, n=3:   k=0  (0,0)
                    k=1  (1,0) (0,1)
                    k=2  (2,0) (1,1) (0,2)
                    k=3        (2,1) (1,2)
                    k=4              (2,2)
    """
    _check_shape(m, n)
    for k in range(m + n - 1):
        yield [(k - j, j) for j in range(max(1 + k - m, 0), min(1 + k, n))]


def gpipe(m: int, n: int, checkpoint: Checkpoint = "except_last", placement: Sequence[int] | None = None) -> Schedule:
    """GPipe's fill-drain schedule.

    Forward in clock-cycle order; backward in the reverse order, so each stage runs its backwards in
    reverse micro-batch order; ``R(i, j)`` right before ``B(i, j)`` for every checkpointed micro-batch::

        n=2, m=3, never:   dev0  F0 F1 F2 .  .  .  B2 B1 B0
                           dev1  .  F0 F1 F2 B2 B1 B0 .  .

    Args:
        m: micro-batches (>= 1).
        n: stages (>= 1).
        checkpoint: ``always``, ``except_last`` or ``never``.
        placement: device of each stage; default one device per stage.
    """
    placement_t = _placement(n, placement)
    per_device: list[list[Task]] = [[] for _ in range(max(placement_t) + 1)]
    cycles = list(clock_cycles(m, n))
    ck = [checkpointed(checkpoint, i, m) for i in range(m)]
    F, R, B = Op.F, Op.R, Op.B
    with collector_paused():  # Note [gc]
        for cycle in cycles:
            for i, j in cycle:
                per_device[placement_t[j]].append(_task(F, i, j))
        for cycle in reversed(cycles):
            for i, j in reversed(cycle):
                if ck[i]:
                    per_device[placement_t[j]].append(_task(R, i, j))
                per_device[placement_t[j]].append(_task(B, i, j))
        return Schedule(m, n, checkpoint, placement_t, tuple(map(tuple, per_device)), name="gpipe")


def one_f_one_b(
    m: int, n: int, checkpoint: Checkpoint = "never", placement: Sequence[int] | None = None
) -> Schedule:
    """1F1B (PipeDream-Flush, Narayanan et al., 2021): after a warm-up, alternate one forward, one backward.

    Stage ``j`` runs ``min(n - j - 1, m)`` warm-up forwards, then pairs of ``F`` and ``B``, then the
    remaining backwards, so it never holds activations of more than ``min(m, n - j)`` micro-batches::

        n=2, m=3:   dev0  F0 F1 .  B0 F2 B1 .  B2
                    dev1  .  F0 B0 F1 B1 F2 B2

    Several stages on one device are merged into one list by running them as soon as they can.
    """
    placement_t = _placement(n, placement)
    per_stage: list[list[Task]] = []
    with collector_paused():  # Note [gc]
        for j in range(n):
            warmup = min(n - j - 1, m)
            order: list[Task] = [_task(Op.F, i, j) for i in range(warmup)]
            for k in range(m - warmup):
                order.append(_task(Op.F, warmup + k, j))
                order.extend(_backward(checkpoint, k, j, m))
            for k in range(m - warmup, m):
                order.extend(_backward(checkpoint, k, j, m))
            per_stage.append(order)
        per_device = _merge_stages(m, n, checkpoint, placement_t, per_stage)
        return Schedule(m, n, checkpoint, placement_t, per_device, name="1f1b")


def _backward(checkpoint: Checkpoint, i: int, j: int, m: int) -> list[Task]:
    r = [_task(Op.R, i, j)] if checkpointed(checkpoint, i, m) else []
    return r + [_task(Op.B, i, j)]


def _merge_stages(
    m: int, n: int, checkpoint: Checkpoint, placement: tuple[int, ...], per_stage: list[list[Task]]
) -> tuple[tuple[Task, ...], ...]:
    """Merge per-stage orders into per-device orders: at each unit step a device runs the ready head
    task of its lowest-numbered stage that has one. One stage per device keeps each order as it is."""
    devices = max(placement) + 1
    if len(set(placement)) == n:
        out: list[tuple[Task, ...]] = [() for _ in range(devices)]
        for j, ts in enumerate(per_stage):
            out[placement[j]] = tuple(ts)
        return tuple(out)
    probe = Schedule(m, n, checkpoint, placement, ((),) * devices)
    done: set[Task] = set()
    heads = [0] * n
    merged: list[list[Task]] = [[] for _ in range(devices)]
    remaining = sum(len(ts) for ts in per_stage)
    while remaining:
        ran: list[Task] = []
        for d in range(devices):
            for j in (s for s in range(n) if placement[s] == d):
                if heads[j] < len(per_stage[j]):
                    t = per_stage[j][heads[j]]
                    # an R waits until its B could follow at once, so the two stay adjacent
                    gate = per_stage[j][heads[j] + 1] if t.op is Op.R else t
                    if all(dep in done or dep == t for dep in probe.dependencies(gate)):
                        ran.append(t)
                        heads[j] += 1
                        merged[d].append(t)
                        break
        if not ran:  # cannot happen for a valid per-stage order; keep what is left in stage order
            for j in range(n):
                merged[placement[j]].extend(per_stage[j][heads[j]:])
            break
        done.update(ran)
        remaining -= len(ran)
    return tuple(map(tuple, merged))


def _check_shape(m: int, n: int) -> None:
    if not isinstance(m, int) or m < 1:
        raise ValueError(f"need at least one micro-batch (chunks), got {m!r}")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"need at least one stage, got {n!r}")


def _placement(n: int, placement: Sequence[int] | None) -> tuple[int, ...]:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"need at least one stage, got {n!r}")
    if placement is None:
        return tuple(range(n))
    p = tuple(int(d) for d in placement)
    if len(p) != n:
        raise ValueError(f"placement has {len(p)} entries for {n} stages")
    if min(p) < 0:
        raise ValueError(f"placement has a negative device: {p}")
    if sorted(set(p)) != list(range(max(p) + 1)):
        raise ValueError(f"placement must use devices 0..{max(p)} without gaps, got {p}")
    return p


# -- unit-step execution, shared by the validator and the grid -------------------------------------


def step_grid(schedule: Schedule) -> list[list[Task | None]]:
    """``grid[s][d]``: the task device ``d`` runs at unit step ``s`` (``None`` when idle).

    Raises :class:`ScheduleError` for a deadlocking schedule.
    """
    steps, stuck = _run_unit_steps(schedule)
    if stuck is not None:
        schedule.validate()
    return steps


def _walk(schedule: Schedule, ck: Sequence[bool]) -> int:
    """Note [linear validation]: run every device's list in order, each task once its dependencies
    (Note [dependencies]) have run, parking a device on the first missing one.

    Returns the number of ``W`` tasks when every task ran, exactly once, within ``m`` and ``n``, on its
    stage's device, and an ``R`` only for a checkpointed micro-batch; -1 otherwise (a deadlock, or a
    problem :meth:`Schedule._check_tasks` names). Missing tasks are for the caller to count.
    """
    m, n, placement = schedule.m, schedule.n, schedule.placement
    mn = m * n
    f_op, b_op, r_op = Op.F, Op.B, Op.R
    last = n - 1
    done = bytearray(4 * mn)  # task (op, i, j) is number op * m * n + i * n + j, op = F 0, B 1, R 2, W 3
    awaited = bytearray(4 * mn)  # whether a device waits for the task (cheaper to test than the dict)
    waiting: dict[int, list[int]] = {}  # task number -> devices whose head task waits for it
    heads = [0] * schedule.num_devices
    ready = list(range(schedule.num_devices))
    weights = 0
    while ready:
        d = ready.pop()
        ts = schedule.tasks[d]
        k, end = heads[d], len(ts)
        while k < end:
            t = ts[k]
            o, i, j = t.op, t.microbatch, t.stage
            if i >= m or j >= n or placement[j] != d:
                return -1
            base = i * n + j
            if o is f_op:
                code, blocker = 0, (base - 1 if j and not done[base - 1] else -1)
            elif o is b_op:
                code = 1
                if not done[base]:
                    blocker = base  # its own forward
                elif ck[i] and not done[2 * mn + base]:
                    blocker = 2 * mn + base  # its recompute
                elif j < last and not done[mn + base + 1]:
                    blocker = mn + base + 1  # the gradient of the next stage
                else:  # on the last stage the loss needs F(i, n-1): its own forward, done
                    blocker = -1
            elif o is r_op:
                if not ck[i]:
                    return -1
                code, blocker = 2, (base if not done[base] else -1)
            else:
                code, blocker = 3, (mn + base if not done[mn + base] else -1)
                weights += 1
            if blocker >= 0:
                waiting.setdefault(blocker, []).append(d)
                awaited[blocker] = 1
                break
            key = code * mn + base
            if done[key]:
                return -1  # a second copy of a task
            done[key] = 1
            k += 1
            if awaited[key]:
                ready.extend(waiting.pop(key))
        heads[d] = k
    if any(heads[d] < len(ts) for d, ts in enumerate(schedule.tasks)):
        return -1
    return weights


def _runs_to_completion(schedule: Schedule) -> bool:
    """Whether every device can run its list in order under :meth:`Schedule.dependencies` (any subclass's),
    as :func:`_walk` does, on task objects."""
    done: set[Task] = set()
    waiting: dict[Task, list[int]] = {}
    heads = [0] * schedule.num_devices
    ready = list(range(schedule.num_devices))
    while ready:
        d = ready.pop()
        ts = schedule.tasks[d]
        while heads[d] < len(ts):
            t = ts[heads[d]]
            blocker = next((dep for dep in schedule.dependencies(t) if dep not in done), None)
            if blocker is not None:
                waiting.setdefault(blocker, []).append(d)
                break
            done.add(t)
            heads[d] += 1
            ready.extend(waiting.pop(t, ()))
    return all(heads[d] == len(ts) for d, ts in enumerate(schedule.tasks))


def _run_unit_steps(schedule: Schedule) -> tuple[list[list[Task | None]], list[int] | None]:
    """Run every task in one unit step, each device as soon as its head task's dependencies are done.

    Returns the steps and, on deadlock, the stuck head index of each device (``None`` if it finished).
    """
    devices = schedule.num_devices
    heads = [0] * devices
    done: set[Task] = set()
    steps: list[list[Task | None]] = []
    total = sum(len(ts) for ts in schedule.tasks)
    finished = 0
    while finished < total:
        row: list[Task | None] = [None] * devices
        for d in range(devices):
            ts = schedule.tasks[d]
            if heads[d] < len(ts):
                t = ts[heads[d]]
                if all(dep in done for dep in schedule.dependencies(t)):
                    row[d] = t
        if all(t is None for t in row):
            return steps, heads
        for d, ready in enumerate(row):
            if ready is not None:
                done.add(ready)
                heads[d] += 1
                finished += 1
        steps.append(row)
    return steps, None


def _waiting_cycle(schedule: Schedule, heads: list[int]) -> list[Task]:
    """Follow 'stuck head waits for a task held behind another device's stuck head' to a cycle."""
    position = {t: (d, k) for d, ts in enumerate(schedule.tasks) for k, t in enumerate(ts)}
    done = {t for d, ts in enumerate(schedule.tasks) for t in ts[: heads[d]]}
    start = next(d for d in range(schedule.num_devices) if heads[d] < len(schedule.tasks[d]))
    chain: list[Task] = []
    visited: dict[int, int] = {}
    d = start
    while d not in visited:
        visited[d] = len(chain)
        head = schedule.tasks[d][heads[d]]
        chain.append(head)
        blocker = next(dep for dep in schedule.dependencies(head) if dep not in done)
        d = position[blocker][0] if blocker in position else -1
        if d < 0:  # a dependency no device runs; validate() reports missing tasks before this
            return chain + [blocker]
    cycle = chain[visited[d]:]
    return cycle + [cycle[0]]


def _format_grid(schedule: Schedule, steps: list[list[Task | None]], stuck: list[int] | None) -> str:
    devices = schedule.num_devices
    rows: list[list[str]] = [[str(t) if t is not None else "." for t in row] for row in steps]
    if stuck is not None:
        marked = [
            ">" + str(schedule.tasks[d][stuck[d]]) if stuck[d] < len(schedule.tasks[d]) else "" for d in range(devices)
        ]
        rows.append(marked)
    width = max([len(c) for r in rows for c in r] + [5])
    header = "step  " + " ".join(f"{'dev' + str(d):>{width}}" for d in range(devices))
    lines = [header]
    for s, r in enumerate(rows):
        label = f"{s:>4}" + ("!" if stuck is not None and s == len(rows) - 1 else " ")
        lines.append(label + " " + " ".join(f"{c:>{width}}" for c in r))
    return "\n".join(lines)


def parse_tasks(text: str | Iterable[str]) -> tuple[Task, ...]:
    """Parse ``"F0@0 F1@0 B1@0"`` (or an iterable of such words) into tasks."""
    words = text.split() if isinstance(text, str) else list(text)
    return tuple(Task.parse(w) for w in words)

