"""Data-parallel replicas of a pipeline: the step their collectives and optimizer make of a simulated timeline.

Each stage's gradient reductions and parameter gathers are tasks on its device's communication stream in the
simulation (:func:`sim.planning.parallel.zero.stage_collectives`, :mod:`sim.core.collectives`): the timeline already
holds them, overlapped with the compute they overlap. What remains after the last of them::

    step seconds = the timeline's end (collectives included) + the slowest device's optimizer step
                   (+ the all-gather of the updated parameters after it, ZeRO stages 1 and 2)
"""

from __future__ import annotations

from collections.abc import Sequence

from gpipe.schedule.timeline import COLLECTIVE, Timeline
from sim.planning.parallel.zero import check_zero

__all__ = ["step_seconds"]


# Note [all-reduce]: a data-parallel wrapper accumulates gradients over the micro-batches without communicating and
# reduces a stage's gradients as its last backward makes them, bucket by bucket (DistributedDataParallel under
# no_sync for all but the last micro-batch), overlapping the backward still running here and on other stages. The
# optimizer steps after every collective has ended, as the executor's caller does after step() returns; so does the
# gather of the updated parameters of ZeRO stages 1 and 2.
# Note [zero step]: from stage 1 each device updates only its 1/d shard of the optimizer state, so its optimizer
# step touches 1/d of the bytes and takes 1/d of the seconds.
def step_seconds(timeline: Timeline, update_seconds: Sequence[float], replicas: int, zero: int = 0,
                 after_step: Sequence[float] = (), drained: float | None = None) -> tuple[float, float]:
    """The step's seconds and the data-parallel seconds it did not hide (Note [all-reduce]).

    Args:
        timeline: the simulated timeline, its stages' collectives on it.
        update_seconds: per device, its optimizer step over its stages' whole state (Note [zero step]).
        replicas: data-parallel copies of the pipeline (the group a shard of the optimizer state spans).
        zero: the ZeRO stage (:data:`sim.planning.parallel.zero.ZERO_STAGES`).
        after_step: per device, seconds of the all-gather after its optimizer step (ZeRO stages 1 and 2); empty:
            none.
        drained: when the last compute or copy ended, where the caller knows it (the timeline before its
            collectives were added); ``None``: found among the timeline's spans.

    Returns:
        ``(step seconds, exposed seconds)``: the second is the collectives' end past the last compute or copy plus
        the gather after the optimizer step.

    Raises:
        ValueError: an unknown ZeRO stage or ``replicas < 1``.
    """
    check_zero(zero, replicas)
    if drained is None:
        drained = max((s.end for s in timeline.spans if s.stream != COLLECTIVE), default=timeline.start)
    end = timeline.end
    updates = [u / replicas for u in update_seconds] if zero else list(update_seconds)
    update = max(updates, default=0.0)
    gathers = list(after_step) or [0.0] * len(updates)
    tail = max((u + g for u, g in zip(updates, gathers, strict=True)), default=0.0)
    return end - timeline.start + tail, end - drained + (tail - update)
