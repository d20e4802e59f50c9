"""GPipe's fill-drain schedule (Huang et al., 2019): every forward in clock cycles, then every backward in
reverse, and torchgpipe's ``clock_cycles(m, n)``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from gpipe.schedule.collector import collector_paused
from gpipe.schedule.placement import stage_placement
from gpipe.schedule.registry import register
from gpipe.schedule.schedule import Schedule
from gpipe.schedule.task import Checkpoint, Op, Task, checkpointed, unchecked_task

__all__ = ["clock_cycles", "gpipe"]


def clock_cycles(m: int, n: int) -> Iterator[list[tuple[int, int]]]:
    """GPipe's forward clock cycles, as torchgpipe's ``clock_cycles(m, n)``.

    At clock ``k`` every ``(i, j)`` with ``i + j == k`` runs (``i`` micro-batch, ``j`` stage)::

        m=3, n=3:   k=0  (0,0)
                    k=1  (1,0) (0,1)
                    k=2  (2,0) (1,1) (0,2)
                    k=3        (2,1) (1,2)
                    k=4              (2,2)
    """
    if not isinstance(m, int) or m < 1:
        raise ValueError(f"need at least one micro-batch (chunks), got {m!r}")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"need at least one stage, got {n!r}")
    for k in range(m + n - 1):
        yield [(k - j, j) for j in range(max(1 + k - m, 0), min(1 + k, n))]


@register("gpipe", "GPipe's fill-drain: every forward, then every backward in reverse order",
          constraints="any m >= 1 and n >= 1, any placement; forwards first, so forward() + backward() runs it")
def gpipe(m: int, n: int, checkpoint: Checkpoint = "except_last", placement: Sequence[int] | None = None) -> Schedule:
    """GPipe's fill-drain schedule.

    Forward in clock-cycle order; backward in the reverse order, so each stage runs its backwards in
    reverse micro-batch order; ``R(i, j)`` right before ``B(i, j)`` for every checkpointed micro-batch. For
    ``m=3, n=2, never``, ``.grid()`` prints eight unit steps (a test keeps this picture equal to it)::

        step   dev0  dev1
           0   F0@0     .
           1   F1@0  F0@1
           2   F2@0  F1@1
           3      .  F2@1
           4      .  B2@1
           5   B2@0  B1@1
           6   B1@0  B0@1
           7   B0@0     .

    Args:
        m: micro-batches (>= 1).
        n: stages (>= 1).
        checkpoint: ``always``, ``except_last`` or ``never``.
        placement: device of each stage; default one device per stage.
    """
    placement_t = stage_placement(n, placement)
    per_device: list[list[Task]] = [[] for _ in range(max(placement_t) + 1)]
    cycles = list(clock_cycles(m, n))
    ck = [checkpointed(checkpoint, i, m) for i in range(m)]
    F, R, B = Op.F, Op.R, Op.B
    with collector_paused():  # Note [gc] in gpipe.schedule.collector
        for cycle in cycles:
            for i, j in cycle:
                per_device[placement_t[j]].append(unchecked_task(F, i, j))
        for cycle in reversed(cycles):
            for i, j in reversed(cycle):
                if ck[i]:
                    per_device[placement_t[j]].append(unchecked_task(R, i, j))
                per_device[placement_t[j]].append(unchecked_task(B, i, j))
        return Schedule(m, n, checkpoint, placement_t, tuple(map(tuple, per_device)), name="gpipe")
