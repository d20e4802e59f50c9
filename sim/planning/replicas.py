"""Data-parallel replicas of a pipeline: the ring all-reduce of each stage's gradients, overlapped with the backward.

Each stage's gradients are final when its last backward task (``B``, or ``W`` where the backward is split) ends;
from then its ring all-reduce runs on the device's link while the rest of the pipeline drains (Note [all-reduce])::

    ring seconds = 2 (r - 1) / r * gradient bytes / bandwidth + 2 (r - 1) * latency
    step seconds = max(makespan, every all-reduce's end) + the slowest device's optimizer step
"""

from __future__ import annotations

from collections.abc import Sequence

from gpipe.schedule import Op, Schedule
from gpipe.timeline import Timeline
from sim.core.link import LinkSpec

__all__ = ["allreduce_seconds", "step_seconds"]


def allreduce_seconds(nbytes: float, replicas: int, link: LinkSpec) -> float:
    """A ring all-reduce of ``nbytes`` across ``replicas`` copies over ``link``; 0 for one replica.

    Each of ``2 (r - 1)`` steps sends ``1 / r`` of the bytes to the next replica (reduce-scatter, then
    all-gather) and pays the link's latency once.
    """
    if replicas < 2:
        return 0.0
    return 2 * (replicas - 1) / replicas * nbytes / link.bandwidth + 2 * (replicas - 1) * link.latency


# Note [all-reduce]: a data-parallel wrapper accumulates gradients over the micro-batches without communicating and
# reduces a stage's gradients once, when the last backward of that stage has produced them (DistributedDataParallel
# under no_sync for all but the last micro-batch). So a stage's all-reduce starts at the end of its last B (its last
# W when split) and overlaps the backward still running on other stages; the all-reduces of one device share its
# link, one after the other, in the order their stages finish. The optimizer steps after all of it, as the
# executor's caller does after step() returns.
def step_seconds(schedule: Schedule, timeline: Timeline, gradient_bytes: Sequence[float],
                 update_seconds: Sequence[float], replicas: int, link: LinkSpec) -> tuple[float, float]:
    """The step's seconds and the all-reduce seconds the backward did not hide (Note [all-reduce]).

    Args:
        schedule: the schedule simulated.
        timeline: its simulated timeline.
        gradient_bytes: per stage, bytes of its parameter gradients.
        update_seconds: per device, its optimizer step.
        replicas: data-parallel copies of the pipeline.
        link: what the all-reduce runs over.

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
                free = max(free, ready[j]) + allreduce_seconds(gradient_bytes[j], replicas, link)
            end = max(end, free)
    return end - timeline.start + max(update_seconds, default=0.0), end - drained
