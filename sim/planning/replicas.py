"""Data-parallel replicas of a pipeline: each stage's gradient collectives, overlapped with the draining pipeline.

Each stage's gradients are final when its last backward task (``B``, or ``W`` where the backward is split) ends;
from then its ring all-reduce runs on the device's link while the rest of the pipeline drains (Note [all-reduce]).
Sharded data parallelism replaces it by reduce-scatters and all-gathers (:mod:`sim.planning.zero`); each is priced
as a ring (:mod:`sim.planning.collectives`)::

    step seconds        = max(makespan, every collective's end) + the slowest device's optimizer step
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpipe.schedule import Op, Schedule
from gpipe.schedule.timeline import COMPUTE, Timeline
from sim.core.link import LinkSpec
from sim.planning.collectives import allgather_seconds, allreduce_seconds, reduce_scatter_seconds
from sim.planning.zero import Collective, Kind, When, check_zero, stage_traffic

__all__ = ["step_seconds"]


# Note [all-reduce]: a data-parallel wrapper accumulates gradients over the micro-batches without communicating and
# reduces a stage's gradients once, when the last backward of that stage has produced them (DistributedDataParallel
# under no_sync for all but the last micro-batch). So a stage's all-reduce starts at the end of its last B (its last
# W when split) and overlaps the backward still running on other stages; the collectives of one device share its
# link, one after the other, in the order they become ready. The optimizer steps after all of it, as the
# executor's caller does after step() returns. ZeRO moves the reduction (Note [zero traffic] in sim.planning.zero):
# stage 2 reduce-scatters after every gradient task, stages 1 and 2 all-gather the parameters after the step, and
# stage 3's collectives are inside its tasks (sim.planning.zero.stretched), so the timeline already holds them.
# Note [zero step]: from stage 1 each device updates only its 1/d shard of the optimizer state, so its optimizer
# step touches 1/d of the bytes and takes 1/d of the seconds.
def step_seconds(schedule: Schedule, timeline: Timeline, gradient_bytes: Sequence[float],
                 update_seconds: Sequence[float], replicas: int, link: LinkSpec,
                 allreduce: Callable[[float, int], float] | None = None, *, zero: int = 0,
                 parameter_bytes: Sequence[float] = (),
                 reduce_scatter: Callable[[float, int], float] | None = None,
                 allgather: Callable[[float, int], float] | None = None) -> tuple[float, float]:
    """The step's seconds and the data-parallel seconds it did not hide (Note [all-reduce]).

    Args:
        schedule: the schedule simulated.
        timeline: its simulated timeline (for ZeRO-3, of the costs :func:`sim.planning.zero.stretched` made).
        gradient_bytes: per stage, bytes of its (unsharded) parameter gradients.
        update_seconds: per device, its optimizer step over its stages' whole state (Note [zero step]).
        replicas: data-parallel copies of the pipeline.
        link: what the collectives run over.
        allreduce: ``(bytes, device) -> seconds`` of one stage's all-reduce on that device (a cluster's,
            :meth:`sim.planning.cluster.Cluster.allreduce_seconds`); ``None``: a ring on ``link``.
        zero: the ZeRO stage (:data:`sim.planning.zero.ZERO_STAGES`).
        parameter_bytes: per stage, bytes of its compute copy (:func:`sim.planning.zero.compute_copy_bytes`):
            what stages 1 and 2 gather after the step; needed from stage 1 on.
        reduce_scatter: as ``allreduce``, for a reduce-scatter (:meth:`~sim.planning.cluster.Cluster
            .reduce_scatter_seconds`).
        allgather: as ``allreduce``, for an all-gather (:meth:`~sim.planning.cluster.Cluster.allgather_seconds`).

    Returns:
        ``(step seconds, exposed seconds)``: the second is the collectives' end past the drained pipeline plus the
        gather after the optimizer step.

    Raises:
        ValueError: an unknown ZeRO stage, ``replicas < 1``, or no ``parameter_bytes`` per stage from stage 1 on.
    """
    check_zero(zero, replicas)
    if zero and replicas > 1 and len(parameter_bytes) != schedule.n:
        raise ValueError(f"ZeRO-{zero} needs parameter_bytes per stage ({schedule.n}), got {len(parameter_bytes)}")
    priced = {Kind.ALL_REDUCE: allreduce, Kind.REDUCE_SCATTER: reduce_scatter, Kind.ALL_GATHER: allgather}
    ring = {Kind.ALL_REDUCE: allreduce_seconds, Kind.REDUCE_SCATTER: reduce_scatter_seconds,
            Kind.ALL_GATHER: allgather_seconds}

    def seconds(c: Collective, device: int) -> float:
        price = priced[c.kind]
        return ring[c.kind](c.nbytes, replicas, link) if price is None else price(c.nbytes, device)

    drained = end = timeline.end
    gathers = [0.0] * schedule.num_devices
    if replicas > 1:
        last = Op.W if schedule.splits_weight_gradient else Op.B
        ready: list[list[float]] = [[] for _ in range(schedule.n)]
        for span in timeline.spans:  # in any order: each stage's ends are sorted or maxed below
            if span.stream == COMPUTE and span.task.op is last:
                ready[span.task.stage].append(span.end)
        for d in range(schedule.num_devices):
            queued: list[tuple[float, Collective]] = []
            for j in schedule.stages_on(d):
                for c in stage_traffic(gradient_bytes[j], parameter_bytes[j] if zero else 0.0, zero, replicas):
                    if c.when is When.LAST_GRADIENT:
                        queued.append((max([0.0, *ready[j]]), c))
                    elif c.when is When.EACH_GRADIENT:
                        queued.extend((t, c) for t in ready[j])
                    elif c.when is When.AFTER_STEP:
                        gathers[d] += seconds(c, d)
            free = 0.0
            for t, c in sorted(queued, key=lambda q: q[0]):
                free = max(free, t) + seconds(c, d)
            end = max(end, free)
    updates = [u / replicas for u in update_seconds] if zero else update_seconds
    update = max(updates, default=0.0)
    tail = max((u + g for u, g in zip(updates, gathers, strict=True)), default=0.0) if any(gathers) else update
    return end - timeline.start + tail, end - drained + (tail - update)
