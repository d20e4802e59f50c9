"""DeepSeek's DualPipe schedules: DualPipe, two directions through two copies of the model (DeepSeek-V3 report,
arXiv 2412.19437, section 3.2.1 and Figure 5), and DualPipeV, the same "cut in half" to one direction, as DeepSeek's
DualPipe repository credits Sea AI Lab with (2025): ``2p`` stages in a V on ``p`` devices. Both split every
backward into ``B`` and ``W`` and, in the steady phase, run a forward of one micro-batch beside a backward of
another as an overlapped pair (Note [overlapped pairs] in :mod:`gpipe.schedule.schedule`).

Note [one order, two shapes]: each device of DualPipe holds two slots (Note [stage slots] in
:mod:`gpipe.schedule.schedule`), stage ``d`` of the copy fed at device 0 and stage ``p-1-d`` of the copy fed at
device ``p-1``, and runs the eight phases of DualPipeV on them with the counts halved: DeepSeek's DualPipe folds
the line of ``p`` devices at its middle, so device ``d`` is at ``h = min(d, p-1-d)`` of ``ceil(p/2)`` and runs
``m/2`` micro-batches each way, its "first" slot (DualPipeV's stage ``d``) the direction that reaches it first. So one
function, :func:`_order`, writes both schedules' lists from ``(h, half, count)``; the middle devices take the
place of DualPipeV's turn, where a backward's gradient arrives right after its forward.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpipe.schedule.collector import collector_paused
from gpipe.schedule.placement import v_shape
from gpipe.schedule.registry import register
from gpipe.schedule.schedule import Schedule
from gpipe.schedule.task import Checkpoint, Op, Task, checkpointed, unchecked_task

__all__ = ["dualpipe", "dualpipe_v"]


class _Device:
    """One device's list as it is built: what comes next of each stage, the ``W`` tasks held back."""

    def __init__(self, m: int, checkpoint: Checkpoint, first: dict[int, int] | None = None) -> None:
        """``first``: a stage's first micro-batch where it is not 0 (DualPipe's second copy runs the second half)."""
        self.m, self.checkpoint, self.first = m, checkpoint, first or {}
        self.tasks: list[Task] = []
        self.pairs: list[tuple[Task, Task]] = []
        self.forwards: dict[int, int] = {}  # stage -> its next forward's micro-batch
        self.backwards: dict[int, int] = {}  # stage -> its next backward's micro-batch
        self.held: list[Task] = []  # W tasks of split backwards, oldest first

    def _next(self, counts: dict[int, int], j: int) -> int:
        i = counts.get(j, self.first.get(j, 0))
        counts[j] = i + 1
        return i

    def forward(self, j: int) -> Task:
        task = unchecked_task(Op.F, self._next(self.forwards, j), j)
        self.tasks.append(task)
        return task

    def backward(self, j: int, hold: bool = False) -> Task:
        """``B`` of stage ``j``'s next micro-batch (after its ``R``); its ``W`` right after, or held back."""
        i = self._next(self.backwards, j)
        if checkpointed(self.checkpoint, i, self.m):
            self.tasks.append(unchecked_task(Op.R, i, j))
        task = unchecked_task(Op.B, i, j)
        self.tasks.append(task)
        (self.held if hold else self.tasks).append(unchecked_task(Op.W, i, j))
        return task

    def overlapped(self, forward: int, backward: int) -> None:
        """A forward of stage ``forward`` beside a backward of stage ``backward``: one pair, its ``R`` before it
        (a recompute needs only its own forward), its ``W`` after it."""
        i = self._next(self.backwards, backward)
        if checkpointed(self.checkpoint, i, self.m):
            self.tasks.append(unchecked_task(Op.R, i, backward))
        first = self.forward(forward)
        second = unchecked_task(Op.B, i, backward)
        self.tasks += [second, unchecked_task(Op.W, i, backward)]
        self.pairs.append((first, second))

    def weight(self) -> None:
        """The oldest held-back ``W``, if any."""
        if self.held:
            self.tasks.append(self.held.pop(0))


@register("dualpipe-v", "DeepSeek's DualPipeV: 2p stages in a V, each steady step a forward beside a backward",
          constraints="n = 2p stages in a V on p devices (stages d and 2p-1-d on device d), m >= n; every "
                      "backward split into B and W; forwards and backwards interleave, so step() only",
          layout=v_shape)
def dualpipe_v(m: int, n: int, checkpoint: Checkpoint = "never", placement: Sequence[int] | None = None) -> Schedule:
    """DualPipeV: device ``d`` holds stage ``a = d`` (going down) and ``b = 2p - 1 - d`` (coming back).

    Phases of device ``d`` of ``p`` (``F a`` is stage ``a``'s next forward, ``F a+B b`` an overlapped pair;
    a ``B`` is followed by its ``W`` unless it is held back for a later ``W`` slot)::

        1  warm-up      2(p-d-1) x  F a
        2  both stages      d+1  x  F a, F b
        3  first B        p-d-1  x  B b, F b
        4  steady     m-2p+d+1  x  F a+B b, F b+B a   (device p-1's first F a, B b not overlapped)
        5  drain b        p-d-1  x  B b, F b+B a
        6  both B's         d+1  x  B b, B a           (W held back from the middle on)
        7  zero-bubble    p-d-1  x  W, B a (held back)
        8  cool-down        d+1  x  W

    With checkpointing, ``R`` comes right before its ``B`` (before the pair of an overlapped one).

    Raises:
        ValueError: ``n`` odd, ``m < n``, or a placement other than the V (:func:`v_shape`); each names the fix.
    """
    if not isinstance(n, int) or n < 2 or n % 2:
        raise ValueError(f"dualpipe-v runs 2 stages per device in a V: give an even number of stages n >= 2, got {n!r}")
    p = n // 2
    if not isinstance(m, int) or m < n:
        raise ValueError(f"dualpipe-v needs at least as many micro-batches as stages (m >= n = {n}) to reach its "
                         f"steady phase; got m={m!r}: raise chunks to {n} or more, or use 1f1b")
    checkpointed(checkpoint, 0, m)  # rejects an unknown policy, naming the known ones
    v = v_shape(n, p)
    if placement is not None and tuple(placement) != v:
        raise ValueError(f"dualpipe-v places its stages in a V, {v}; got placement {tuple(placement)}: leave the "
                         f"placement out, or give devices=p to place them by the schedule's layout")
    lists: list[tuple[Task, ...]] = []
    pairs: list[tuple[Task, Task]] = []
    with collector_paused():  # Note [gc] in gpipe.schedule.collector
        for d in range(p):
            dev = _order(_Device(m, checkpoint), d, 2 * p - 1 - d, d, p, m)
            lists.append(tuple(dev.tasks))
            pairs += dev.pairs
        return Schedule(m, n, checkpoint, v, tuple(lists), name="dualpipe-v", pairs=tuple(pairs))


def _order(dev: _Device, a: int, b: int, d: int, p: int, m: int) -> _Device:
    """The list of device ``d`` of ``p`` in DualPipeV's phases (see :func:`dualpipe_v`) over its stages ``a`` (the
    first to reach it) and ``b``, ``m`` micro-batches each (Note [one order, two shapes])."""
    for _ in range(2 * (p - d - 1)):
        dev.forward(a)
    for _ in range(d + 1):
        dev.forward(a)
        dev.forward(b)
    for _ in range(p - d - 1):
        dev.backward(b)
        dev.forward(b)
    for k in range(m - 2 * p + d + 1):
        if k == 0 and d == p - 1:  # the turn of the V: its backward's gradient arrives right after its forward
            dev.forward(a)
            dev.backward(b)
        else:
            dev.overlapped(a, b)
        dev.overlapped(b, a)
    for _ in range(p - d - 1):
        dev.backward(b)
        dev.overlapped(b, a)
    hold = False
    for k in range(d + 1):  # from the middle on, W is held back to fill the cool-down
        hold = hold or (k == (d + 1) // 2 and d % 2 == 1)
        dev.backward(b, hold)
        hold = hold or (k == (d + 1) // 2 and d % 2 == 0)
        dev.backward(a, hold)
    for _ in range(p - d - 1):
        dev.weight()
        dev.backward(a, hold=True)
    for _ in range(d + 1):
        dev.weight()
    return dev


@register("dualpipe", "DeepSeek-V3's DualPipe: two copies of p stages fed from both ends, forwards beside backwards",
          constraints="n = 2p slots, two copies of p stages (device d holds stage d and a copy of stage p-1-d), "
                      "m >= 2 and n - 1, half the micro-batches each way; B and W split; step() only",
          layout=v_shape, copies=2)
def dualpipe(m: int, n: int, checkpoint: Checkpoint = "never", placement: Sequence[int] | None = None) -> Schedule:
    """DualPipe on ``p = n / 2`` devices: slot ``s < p`` is stage ``s`` of the copy micro-batches ``0 .. m/2-1``
    travel down from device 0, slot ``p + s`` stage ``s`` of the copy ``m/2 .. m-1`` travel up from device
    ``p-1`` (Note [stage slots] in :mod:`gpipe.schedule.schedule`): device ``d`` holds slots ``d`` and
    ``2p-1-d``, the V of :func:`v_shape`. Device ``d`` runs DualPipeV's eight phases at ``h = min(d, p-1-d)``
    of ``ceil(p/2)`` over ``m/2`` micro-batches each way (Note [one order, two shapes]); a device of the
    first half meets the down direction first, one of the second half the up direction. An odd ``p`` has one
    middle device holding both copies of the middle stage.

    Note [odd micro-batch counts]: DeepSeek's DualPipe takes an even ``m``. An odd ``m`` runs the lists of
    ``m + 1`` without the last micro-batch, which would have travelled up (and its pairs' other tasks alone): a
    micro-batch's tasks are awaited by no other's, so what is left is as valid, and the down direction carries
    one micro-batch more, the first ``ceil(m/2)`` as :meth:`Schedule.copy_of` says.

    Raises:
        ValueError: ``n`` odd, ``m < 2`` or ``m < n - 1``, or a placement other than the V; each names the fix.
    """
    if not isinstance(n, int) or n < 2 or n % 2:
        raise ValueError(f"dualpipe runs two copies of p stages on p devices: give an even number of slots "
                         f"n = 2p >= 2, got {n!r}")
    p = n // 2
    if not isinstance(m, int) or m < max(2, n - 1):
        raise ValueError(f"dualpipe feeds half the micro-batches from each end and needs p = {p} of the first half "
                         f"to reach its steady phase: give m >= {max(2, n - 1)} (2 and n - 1), got m={m!r}")
    checkpointed(checkpoint, 0, m)  # rejects an unknown policy, naming the known ones
    v = v_shape(n, p)
    if placement is not None and tuple(placement) != v:
        raise ValueError(f"dualpipe places stage d and a copy of stage p-1-d on device d, {v}; got placement "
                         f"{tuple(placement)}: leave the placement out, or give devices=p")
    half, fold = (m + 1) // 2, (p + 1) // 2  # Note [odd micro-batch counts]: m + 1 when m is odd
    lists: list[tuple[Task, ...]] = []
    pairs: list[tuple[Task, Task]] = []
    with collector_paused():  # Note [gc] in gpipe.schedule.collector
        for d in range(p):
            down, up = d, 2 * p - 1 - d  # the slots device d holds, one of each copy
            first, second = (down, up) if d < fold else (up, down)
            dev = _order(_Device(m, checkpoint, {up: half}), first, second, min(d, p - 1 - d), fold, half)
            lists.append(tuple(t for t in dev.tasks if t.microbatch < m))
            pairs += [(a, b) for a, b in dev.pairs if a.microbatch < m and b.microbatch < m]
        return Schedule(m, n, checkpoint, v, tuple(lists), name="dualpipe", pairs=tuple(pairs), copies=2)
