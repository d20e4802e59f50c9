"""Data-parallel replicas of a pipeline: each stage's gradient collectives, overlapped with the draining pipeline.

Each stage's gradients are final when its last backward task (``B``, or ``W`` where the backward is split) ends;
from then its ring all-reduce runs on the device's link while the rest of the pipeline drains (Note [all-reduce]).
Sharded data parallelism replaces it by reduce-scatters and all-gathers (:mod:`sim.planning.zero`)::

    ring reduce-scatter = ring all-gather = (r - 1) / r * bytes / bandwidth + (r - 1) * latency
    ring all-reduce     = reduce-scatter + all-gather
    step seconds        = max(makespan, every collective's end) + the slowest device's optimizer step
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpipe.schedule import Op, Schedule
from gpipe.timeline import COMPUTE, Timeline
from sim.core.link import LinkSpec
from sim.planning.zero import Collective, Kind, When, check_zero, stage_traffic

__all__ = ["allgather_seconds", "allreduce_seconds", "hierarchical_allgather_seconds",
           "hierarchical_allreduce_seconds", "hierarchical_reduce_scatter_seconds", "reduce_scatter_seconds",
           "step_seconds"]


def reduce_scatter_seconds(nbytes: float, replicas: int, link: LinkSpec) -> float:
    """A ring reduce-scatter of ``nbytes`` across ``replicas`` over ``link``, each keeping a summed ``1 / r``.

    Each of ``r - 1`` steps sends ``1 / r`` of the bytes to the next replica and pays the link's latency once;
    0 for one replica.
    """
    if replicas < 2:
        return 0.0
    return (replicas - 1) / replicas * nbytes / link.bandwidth + (replicas - 1) * link.latency


def allgather_seconds(nbytes: float, replicas: int, link: LinkSpec) -> float:
    """A ring all-gather of ``nbytes`` (the whole gathered tensor) across ``replicas``: a reduce-scatter's steps."""
    return reduce_scatter_seconds(nbytes, replicas, link)


def allreduce_seconds(nbytes: float, replicas: int, link: LinkSpec) -> float:
    """A ring all-reduce of ``nbytes`` across ``replicas`` copies over ``link``: reduce-scatter, then all-gather.

    ``2 (r - 1) / r * bytes / bandwidth + 2 (r - 1) * latency``; 0 for one replica.
    """
    return reduce_scatter_seconds(nbytes, replicas, link) + allgather_seconds(nbytes, replicas, link)


def hierarchical_reduce_scatter_seconds(nbytes: float, inside: int, nodes: int, link: LinkSpec,
                                        nic: LinkSpec) -> float:
    """A reduce-scatter of ``nbytes`` over ``inside`` GPUs in each of ``nodes`` nodes, in two phases::

        reduce-scatter in the node     (g - 1) / g * bytes / link bandwidth + (g - 1) * link latency
        reduce-scatter across nodes    ring of the 1/g share among the GPUs at the same position, on ``nic``

    ``g = inside``; ``nic``: one GPU's share of its node's network (:attr:`sim.planning.cluster.Cluster.nic`).
    """
    return reduce_scatter_seconds(nbytes, inside, link) + reduce_scatter_seconds(nbytes / inside, nodes, nic)


def hierarchical_allgather_seconds(nbytes: float, inside: int, nodes: int, link: LinkSpec, nic: LinkSpec) -> float:
    """An all-gather of ``nbytes`` over ``inside`` GPUs in ``nodes`` nodes: the reduce-scatter's phases reversed
    (across nodes the ``1/g`` share, then in the node)."""
    return allgather_seconds(nbytes / inside, nodes, nic) + allgather_seconds(nbytes, inside, link)


def hierarchical_allreduce_seconds(nbytes: float, inside: int, nodes: int, link: LinkSpec, nic: LinkSpec) -> float:
    """An all-reduce of ``nbytes`` over ``inside`` GPUs in each of ``nodes`` nodes, in three phases::

        reduce-scatter in the node   (g - 1) / g * bytes / link bandwidth + (g - 1) * link latency
        all-reduce across nodes      ring of the 1/g share among the GPUs at the same position, on ``nic``
        all-gather in the node       as the reduce-scatter

    the hierarchical reduce-scatter followed by the hierarchical all-gather.
    """
    return (hierarchical_reduce_scatter_seconds(nbytes, inside, nodes, link, nic)
            + hierarchical_allgather_seconds(nbytes, inside, nodes, link, nic))


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
