"""Tasks: one kind of work (``F``, ``R``, ``B``, ``W``) of one micro-batch on one stage, its text form, and
what it waits for.

A task prints as ``F2@1`` (forward of micro-batch 2 on stage 1) and :meth:`Task.parse` reads it back.

Note [dependencies]: copies are not tasks. ``F(i, j)`` needs the output of ``F(i, j-1)``; ``B(i, j)``
needs the gradient of ``B(i, j+1)`` (or, on the last stage, the loss of ``F(i, n-1)``: its own forward), its
own ``F(i, j)``, and ``R(i, j)`` when checkpointed; ``R(i, j)`` needs only ``F(i, j)`` (it keeps the stage
input), so it may run before the gradient arrives, as torchgpipe does; ``W(i, j)`` needs ``B(i, j)``.
The simulator and the executor derive the copies from these edges.

Note [fast frozen records]: a big simulation builds millions of tasks, spans and memory samples
(``gpipe(16384, 64)`` alone has 3.1 million tasks). :class:`Task` here, and
:class:`~gpipe.schedule.timeline.Span` and :class:`~gpipe.schedule.timeline.MemorySample`, are frozen dataclasses with
``__slots__``: an instance holds its fields and no ``__dict__`` (a task takes 56 bytes instead of 160,
a span 80 instead of 192, besides its floats), and its ``__init__`` stores each field through the
slot's own setter (``_set_op(self, op)``), which skips the frozen ``__setattr__``: about twice as fast
as the generated ``__init__``. They stay dataclasses (fields, ``replace``, ``repr``, equality,
ordering, hashing, pickling), and assigning a field still raises ``FrozenInstanceError``.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "CHECKPOINT_MODES",
    "INDEX",
    "Checkpoint",
    "Op",
    "Task",
    "checkpointed",
    "dependencies",
    "parse_tasks",
    "unchecked_task",
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


#: An index (a micro-batch, a stage, a count) in every text form of a schedule, ours (``F2@1``) and torch
#: pipelining's (``1F2``): ASCII digits. Python's ``\d``, ``str.isdigit`` and ``int()`` also take other scripts'
#: digits (``"٣"`` is 3), which would read a word that torch, or a person, reads otherwise.
INDEX = "[0-9]+"

_TASK_RE = re.compile(rf"^\s*([FBRW])({INDEX})@({INDEX})\s*$")


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


def unchecked_task(op: Op, microbatch: int, stage: int) -> Task:
    """``Task(op, microbatch, stage)`` for a generator, whose op is an :class:`Op` and indices are in range:
    without the checks and the call through ``type``, a third faster (Note [fast frozen records])."""
    task = _new(Task)
    _set_op(task, op)
    _set_microbatch(task, microbatch)
    _set_stage(task, stage)
    return task


def parse_tasks(text: str | Iterable[str]) -> tuple[Task, ...]:
    """Parse ``"F0@0 F1@0 B1@0"`` (or an iterable of such words) into tasks."""
    words = text.split() if isinstance(text, str) else list(text)
    return tuple(Task.parse(w) for w in words)


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


def dependencies(task: Task, n: int, has_recompute: bool, copies: int = 1) -> tuple[Task, ...]:
    """The tasks whose results ``task`` needs (Note [dependencies]), with ``n`` stages; ``has_recompute``:
    whether ``task``'s micro-batch is checkpointed (so its ``B`` waits for its ``R`` too); ``copies``: how many
    copies of the model the ``n`` stages hold (Note [stage slots] in :mod:`gpipe.schedule.schedule`), so a
    micro-batch's route starts and ends at each ``n // copies``-th stage."""
    i, j = task.microbatch, task.stage
    route = n // copies
    if task.op is Op.F:
        return (Task(Op.F, i, j - 1),) if j % route else ()
    if task.op is Op.R:
        return (Task(Op.F, i, j),)
    if task.op is Op.B:
        deps = [Task(Op.F, i, j)]
        if has_recompute:
            deps.append(Task(Op.R, i, j))
        if (j + 1) % route:
            deps.append(Task(Op.B, i, j + 1))
        return tuple(deps)
    return (Task(Op.B, i, j),)
