"""1F1B (PipeDream-Flush, Narayanan et al., 2021): after a warm-up, each stage alternates one forward and one
backward, so it holds the activations of at most ``n - j`` micro-batches."""

from __future__ import annotations

from collections.abc import Sequence

from gpipe.schedule.collector import collector_paused
from gpipe.schedule.placement import merge_stages, stage_placement
from gpipe.schedule.registry import register
from gpipe.schedule.schedule import Schedule
from gpipe.schedule.task import Checkpoint, Op, Task, checkpointed, unchecked_task

__all__ = ["one_f_one_b"]


@register("1f1b", "PipeDream-Flush: after a warm-up, one forward then one backward, in turn",
          constraints="any m >= 1 and n >= 1, any placement; forwards and backwards interleave, so the executor "
                      "trains it with step() only")
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
    placement_t = stage_placement(n, placement)
    per_stage: list[list[Task]] = []
    with collector_paused():  # Note [gc] in gpipe.schedule.collector
        for j in range(n):
            warmup = min(n - j - 1, m)
            order: list[Task] = [unchecked_task(Op.F, i, j) for i in range(warmup)]
            for k in range(m - warmup):
                order.append(unchecked_task(Op.F, warmup + k, j))
                order.extend(_backward(checkpoint, k, j, m))
            for k in range(m - warmup, m):
                order.extend(_backward(checkpoint, k, j, m))
            per_stage.append(order)
        per_device = merge_stages(m, n, checkpoint, placement_t, per_stage)
        return Schedule(m, n, checkpoint, placement_t, per_device, name="1f1b")


def _backward(checkpoint: Checkpoint, i: int, j: int, m: int) -> list[Task]:
    """``B(i, j)``, after its ``R(i, j)`` when micro-batch ``i`` is checkpointed."""
    r = [unchecked_task(Op.R, i, j)] if checkpointed(checkpoint, i, m) else []
    return r + [unchecked_task(Op.B, i, j)]
