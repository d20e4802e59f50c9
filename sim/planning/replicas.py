"""Data-parallel replicas of a pipeline: the ring all-reduce of each stage's gradients, overlapped with the backward.

Each stage's gradients are final when its last backward task (``B``, or ``W`` where the backward is split) ends;
from then its ring all-reduce runs on the device's link while the rest of the pipeline drains (Note [all-reduce])::

    ring seconds = 2 (r - 1) / r * gradient bytes / bandwidth + 2 (r - 1) * latency
    step seconds = max(makespan, every all-reduce's end) + the slowest device's optimizer step
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpipe.schedule import Op, Schedule
from gpipe.timeline import Timeline
from sim.core.link import LinkSpec

__all__ = ["allreduce_seconds", "hierarchical_allreduce_seconds", "step_seconds"]


def allreduce_seconds(nbytes: float, replicas: int, link: LinkSpec) -> float:
    """A ring all-reduce of ``nbytes`` across ``replicas`` copies over ``link``; 0 for one replica.

    Each of ``2 (r - 1)`` steps sends ``1 / r`` of the bytes to the next replica (reduce-scatter, then
    all-gather) and pays the link's latency once.
    """
    if replicas < 2:
        return 0.0
    return 2 * (replicas - 1) / replicas * nbytes / link.bandwidth + 2 * (replicas - 1) * link.latency


def hierarchical_allreduce_seconds(nbytes: float, inside: int, nodes: int, link: LinkSpec, nic: LinkSpec) -> float:
    """An all-reduce of ``nbytes`` over ``inside`` GPUs in each of ``nodes`` nodes, in three phases::

        reduce-scatter in the node   (g - 1) / g * bytes / link bandwidth + (g - 1) * link latency
        all-reduce across nodes      ring of the 1/g share among the GPUs at the same position, on ``nic``
        all-gather in the node       as the reduce-scatter

    ``g = inside``; ``nic``: one GPU's share of its node's network (:attr:`sim.planning.cluster.Cluster.nic`).
    """
    scatter = (inside - 1) / inside * nbytes / link.bandwidth + (inside - 1) * link.latency if inside > 1 else 0.0
    return 2 * scatter + allreduce_seconds(nbytes / inside, nodes, nic)


# Note [all-reduce]: a data-parallel wrapper accumulates gradients over the micro-batches without communicating and
# reduces a stage's gradients once, when the last backward of that stage has produced them (DistributedDataParallel
# under no_sync for all but the last micro-batch). So a stage's all-reduce starts at the end of its last B (its last
# W when split) and overlaps the backward still running on other stages; the all-reduces of one device share its
# link, one after the other, in the order their stages finish. The optimizer steps after all of it, as the
# executor's caller does after step() returns.
def step_seconds(schedule: Schedule, timeline: Timeline, gradient_bytes: Sequence[float],
                 update_seconds: Sequence[float], replicas: int, link: LinkSpec,
                 allreduce: Callable[[float, int], float] | None = None) -> tuple[float, float]:
    """The step's seconds and the all-reduce seconds the backward did not hide (Note [all-reduce]).

    Args:
        schedule: the schedule simulated.
        timeline: its simulated timeline.
        gradient_bytes: per stage, bytes of its parameter gradients.
        update_seconds: per device, its optimizer step.
        replicas: data-parallel copies of the pipeline.
        link: what the all-reduce runs over.
        allreduce: ``(bytes, device) -> seconds`` of one stage's all-reduce on that device (a cluster's,
            :meth:`sim.planning.cluster.Cluster.allreduce_seconds`); ``None``: a ring on ``link``.

    Returns:
        ``(step seconds, exposed all-reduce seconds)``.
    """
    drained = end = timeline.end
    if replicas > 1:
        last = Op.W if schedule.splits_weight_gradient else Op.B
        ready = [0.0] * schedule.n
        for span in timeline.compute_spans():
            if span.task.op is last and span.end > ready[span.task.stage]:
                ready[span.task.stage] = span.end
        for d in range(schedule.num_devices):
            free = 0.0
            for j in sorted(schedule.stages_on(d), key=lambda s: ready[s]):
                seconds = allreduce_seconds(gradient_bytes[j], replicas, link) if allreduce is None \
                    else allreduce(gradient_bytes[j], d)
                free = max(free, ready[j]) + seconds
            end = max(end, free)
    return end - timeline.start + max(update_seconds, default=0.0), end - drained
