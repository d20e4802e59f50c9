"""What a device keeps for backward: the bytes each task holds and frees (Note [saved bytes]).

The one home of the rule. The simulator applies it as each task starts and ends (:mod:`sim.core.memory`). The
planner's memory replay (:mod:`sim.planning.parallel.memory`) and the search's
:func:`~gpipe.schedule.search_timing.peak_memory` apply it in list order, through :func:`held_while_running`.

Note [saved bytes]: micro-batch ``i`` keeps ``saved[j]`` on stage ``j``'s device from the end of ``F(i, j)``. A
checkpointed one keeps ``checkpoint[j]`` (the stage input) instead and adds ``saved[j]`` as ``R(i, j)`` starts.
The end of ``B(i, j)`` frees all of it. Where the schedule has ``W`` tasks, ``B(i, j)`` keeps ``weight[j]`` of it
(what ``W`` reads; all when ``None``) and the end of ``W(i, j)`` frees that. Bytes scale with the micro-batch,
rounded half to even.

Note [numpy on use]: the rule works in numpy arrays (the planner replays thousands of lists), imported when first
asked, as plotting is: importing the schedule language stays pure Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpipe.schedule.task import Op, Task

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Held", "held_bytes", "held_while_running", "task_arrays"]

#: Op codes, the first index of :class:`Held`'s arrays: each op's position in :class:`Op` (F, B, R, W).
_CODE = {op: code for code, op in enumerate(Op)}
_F, _B, _R, _W = (_CODE[op] for op in (Op.F, Op.B, Op.R, Op.W))


@dataclass(frozen=True, eq=False)
class Held:
    """Note [saved bytes] for one schedule: the change each task makes to its device's bytes, as it starts and as
    it ends, indexed ``[op code, micro-batch, stage]`` (op codes: positions in :class:`Op`).

    Attributes:
        at_start: bytes added as the task starts, shape ``(4, m, n)`` (an ``R``'s hold).
        at_end: bytes added as the task ends (an ``F``'s hold), negative for what it frees (``B``, ``W``).
    """

    at_start: np.ndarray
    at_end: np.ndarray

    @property
    def tracked(self) -> bool:
        """Whether any task holds anything."""
        return bool(self.at_start.any() or self.at_end.any())


def held_bytes(checkpointed: Sequence[int], splits: bool, saved: Sequence[float],
               checkpoint: Sequence[float] = (), weight: Sequence[float | None] = (),
               scales: Sequence[float] = ()) -> Held:
    """Note [saved bytes] for ``m = len(checkpointed)`` micro-batches on ``n = len(saved)`` stages.

    Args:
        checkpointed: per micro-batch, whether it is checkpointed (:meth:`Schedule.is_checkpointed`).
        splits: whether the schedule has ``W`` tasks.
        saved: per stage, what one micro-batch keeps for backward (bytes, or any unit).
        checkpoint: per stage, what a checkpointed ``F`` keeps instead; ``()``: nothing.
        weight: per stage, what a split ``B`` keeps for its ``W``, ``None`` for all; ``()``: all on every stage.
        scales: per micro-batch factor on every amount, each rounded to a whole byte; ``()``: none, unrounded.

    Returns:
        The :class:`Held` arrays, integers where the amounts are.
    """
    import numpy as np  # Note [numpy on use]

    m, n = len(checkpointed), len(saved)
    ck = np.asarray(checkpointed, dtype=bool)[:, None]
    full = np.asarray(saved)
    kept_input = np.asarray(checkpoint) if len(checkpoint) else np.zeros_like(full)
    forward = np.where(ck, kept_input[None, :], full[None, :])
    recompute = np.where(ck, full[None, :], np.zeros_like(full)[None, :])
    if len(scales):
        scale = np.asarray(scales, dtype=np.float64)[:, None]
        forward = np.round(forward * scale).astype(np.int64)
        recompute = np.round(recompute * scale).astype(np.int64)
    held = forward + recompute  # what (i, j) holds when its B ends
    at_start = np.zeros((4, m, n), dtype=held.dtype)
    at_end = np.zeros((4, m, n), dtype=held.dtype)
    at_start[_R] = recompute
    at_end[_F] = forward
    if not splits:
        at_end[_B] = -held
        return Held(at_start, at_end)
    kept = held
    if any(w is not None for w in weight):
        limit = np.array([np.inf if w is None else w for w in weight], dtype=np.float64)[None, :]
        if len(scales):
            limit = np.round(limit * scale)
        kept = np.where(np.isinf(limit), held, np.minimum(held, limit)).astype(held.dtype)
    at_end[_B] = kept - held
    at_end[_W] = -kept
    return Held(at_start, at_end)


def held_while_running(tasks: tuple[Task, ...], held: Held) -> np.ndarray:
    """Per task of one device's list, run in order: the most its device holds from the task's start to its end
    (after an ``F``'s or an ``R``'s hold, before a ``B``'s or a ``W``'s free).

    Raises:
        IndexError: a task outside ``held``'s micro-batches and stages.
    """
    import numpy as np  # Note [numpy on use]

    code, i, j = task_arrays(tasks)
    start, end = held.at_start[code, i, j], held.at_end[code, i, j]
    running = np.cumsum(start + end)
    before = np.zeros_like(running)  # what the tasks before each left held
    before[1:] = running[:-1]
    return before + start + np.maximum(end, 0)


# Note [task arrays kept]: a sweep asks the same task lists again and again (once per sharding and policy), so
# each list's arrays are kept, by identity and with the list, for the last ``_ARRAYS_KEPT`` lists.
_ARRAYS: dict[int, tuple[tuple[Task, ...], tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
_ARRAYS_KEPT = 256


def task_arrays(tasks: tuple[Task, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Op code (its position in :class:`Op`), micro-batch and stage of each task (Note [task arrays kept])."""
    import numpy as np  # Note [numpy on use]

    hit = _ARRAYS.get(id(tasks))
    if hit is not None and hit[0] is tasks:
        return hit[1]
    n = len(tasks)
    arrays = (np.fromiter((_CODE[t.op] for t in tasks), dtype=np.int64, count=n),
              np.fromiter((t.microbatch for t in tasks), dtype=np.int64, count=n),
              np.fromiter((t.stage for t in tasks), dtype=np.int64, count=n))
    if len(_ARRAYS) >= _ARRAYS_KEPT:
        _ARRAYS.pop(next(iter(_ARRAYS)))
    _ARRAYS[id(tasks)] = (tasks, arrays)
    return arrays
