"""Replicas of the pipeline in ``gpipe-sim demo --processes N --replicas R``: the gradients' all-reduces priced,
placed and compared.

With ``R`` replicas the launcher spawns ``N * R`` ranks on loopback (``N`` per pipeline, the world a ``(pp, dp) =
(N, R)`` mesh: :mod:`gpipe.distributed.replicas`) and each stage's gradients are all-reduced over its ``R`` ranks in
the executor's buckets (Note [buckets as DDP fills them] in :mod:`gpipe.distributed.reduction`). The simulator
predicts them as collective tasks (:mod:`sim.core.collectives`): each stage's units are the executor's buckets, built
by the same function on the same parameters (:func:`gpipe.distributed.reduction.stage_buckets`), so the predicted
spans carry the measured spans' labels and bytes; each is priced as gloo's ring all-reduce over the dp group, whose
per-step latency and bandwidth a probe in the ranks fits (:func:`measure_allreduce`).

Note [the loss is left out]: the executor also all-reduces the step's loss over the last stage's dp group (4 bytes,
after the step's tasks: Note [a collective's span]); the simulator does not model it, so the measured timelines lose
that span (:func:`without_loss`) before their makespans and the comparison are taken.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from gpipe.distributed.faults import Waiter
from gpipe.distributed.reduction import DDP_BUCKET_BYTES, Bucket, stage_buckets
from gpipe.profiling.profile import profile_blocks
from gpipe.schedule.size import format_bytes
from gpipe.schedule.timeline import COLLECTIVE, MemorySample, Span, Timeline
from sim.calibration.rank_passes import stage_inputs
from sim.core.collectives import StageCollectives, Unit
from sim.core.cost import CostModel
from sim.core.link import LinkSpec
from sim.core.rings import allreduce_seconds

__all__ = ["ONE_PIPELINE", "CollectiveComparison", "Replication", "collectives_table", "compare_collectives",
           "measure_allreduce", "replicated", "unit_shares", "with_replicas", "without_loss"]

Batch = Tensor | tuple[Tensor, ...]


@dataclass(frozen=True)
class Replication:
    """How many replicas of the pipeline a multi-process run trains, and the most bytes one gradient bucket holds.

    Raises:
        ValueError: either is not an integer >= 1.
    """

    replicas: int = 1
    bucket_bytes: int = DDP_BUCKET_BYTES

    def __post_init__(self) -> None:
        for flag, value in (("--replicas", self.replicas), ("--bucket-bytes", self.bucket_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{flag} must be an integer >= 1, got {value!r}")


#: No replicas: one pipeline, as ``gpipe-sim demo --processes N`` runs it.
ONE_PIPELINE = Replication()


# Note [an all-reduce's price]: ProcessGroupGloo's all-reduce of a dense CPU tensor calls ``gloo::allreduce`` with no
# algorithm set, which runs gloo's ring (gloo/allreduce.cc, ``ring``): a reduce-scatter and an all-gather of ``R - 1``
# steps each, every step sending ``1 / R`` of the bytes to the next rank. So an all-reduce of ``b`` bytes over ``R``
# ranks takes ``2 (R - 1) latency + 2 (R - 1) / R * b / bandwidth`` (:func:`sim.core.rings.allreduce_seconds`, the
# ring the planner prices data parallelism with), and a probe fits the two:
# ``latency`` from an 8-byte all-reduce, ``bandwidth`` from the slope between ``payload`` and ``8 * payload`` bytes.
# Each size's seconds are the median of its rounds, not the fastest: a step runs each bucket once, and pays a typical
# round's scheduling delays. The probe runs idle (no compute beside it): a stage's last bucket, the one that can delay
# the step's end, is reduced after its backward has ended. It times what a span times: from issuing the all-reduce
# (``async_op=True``) to when a waiter thread sees ``wait()`` return (Note [a collective's span] in
# gpipe.distributed.reduction), and a round's seconds are the shortest of the group's ranks' (a rank that issued
# first waited for the others: Note [a collective's own seconds]).


def measure_allreduce(group: Any, replicas: int, payload: int = 1 << 20, rounds: int = 10) -> LinkSpec:
    """The per-step link of gloo's ring all-reduce over ``group`` (``replicas`` ranks, every one calling it), fitted
    from ``rounds`` all-reduces of each of three sizes after one untimed (Note [an all-reduce's price])."""
    seconds = {}
    waiter = Waiter("gpipe-allreduce-probe")
    try:
        for size in (8, payload, 8 * payload):
            buffer = torch.zeros(size // 4, dtype=torch.float32)
            times = []
            for k in range(rounds + 1):
                start = time.perf_counter()
                pending = waiter.add(dist.all_reduce(buffer, group=group, async_op=True))
                pending.done.wait()
                if pending.error is not None:
                    raise pending.error
                times += [pending.at - start] if k else []
            # each round's own seconds, the shortest of the group's (Note [a collective's own seconds])
            mine = torch.tensor(times, dtype=torch.float64)
            every = [torch.empty_like(mine) for _ in range(replicas)]
            dist.all_gather(every, mine, group=group)
            seconds[size] = statistics.median(torch.stack(every).min(dim=0).values.tolist())
    finally:
        waiter.close()
    steps = 2 * (replicas - 1)
    slope = seconds[8 * payload] - seconds[payload]
    moved = steps / replicas  # of the bytes, each rank sends this many times as many
    bandwidth = moved * 7 * payload / slope if slope > 0 else moved * 8 * payload / seconds[8 * payload]
    backend = dist.get_backend(group)
    return LinkSpec(f"{backend}-allreduce", seconds[8] / steps, bandwidth,
                    f"one step of {backend}'s ring all-reduce over {replicas} processes on this machine, fitted from "
                    f"all-reduces of 8 B to {format_bytes(8 * payload)}")


# Note [a bucket's share]: the simulator issues a unit's reduction when the gradient task has computed that unit's
# share of its seconds, units in reverse order (sim.core.collectives); the executor launches a bucket once the task
# has accumulated all its parameters' gradients, that is once the backward has passed the layer of its first
# parameter. So a bucket's units end where the stage's layers from that layer on have taken their seconds: each
# layer's backward (or weight gradient, where W splits it) profiled alone. Unit 0 ends the task (the simulator's
# shares sum to 1): it takes whatever the layers before its first parameter add.
def unit_shares(partition: nn.Sequential, buckets: Sequence[Bucket], layer_seconds: Sequence[float]) -> list[float]:
    """Each of ``partition``'s ``buckets``' share of its gradient task, in unit order (Note [a bucket's share]);
    ``layer_seconds``: each layer's gradient seconds."""
    at = {id(p): k for k, layer in enumerate(partition) for p in layer.parameters()}
    suffix = list(itertools.accumulate(reversed(layer_seconds)))[::-1] + [0.0]  # from layer k on
    total = suffix[0]
    ordered = sorted(buckets, key=lambda b: b.unit)
    if total <= 0:
        return [1.0 / len(ordered)] * len(ordered)
    done = [suffix[min(at[id(p)] for p in b.params)] / total for b in ordered] + [0.0]  # once unit u is reduced
    return [1.0 - done[1]] + [done[u] - done[u + 1] for u in range(1, len(ordered))]


def with_replicas(cost: CostModel, parts: Sequence[nn.Sequential], sample: Batch, replication: Replication,
                  link: LinkSpec, *, split: bool = False) -> CostModel:
    """``cost`` with each stage's gradient all-reduces as collective tasks: the executor's buckets of ``parts``, each
    priced over ``replication.replicas`` ranks on ``link`` (Note [an all-reduce's price]); ``sample``: the first
    micro-batch, to profile a stage's layers where it has several buckets (Note [a bucket's share]); ``split``: W
    tasks compute the weight gradients."""
    inputs: dict[int, Batch] = {}
    stages = []
    for j, (stage, part) in enumerate(zip(cost.stages, parts, strict=True)):
        buckets = stage_buckets(j, part, replication.bucket_bytes)
        if not buckets:
            stages.append(stage)
            continue
        shares = [1.0]
        if len(buckets) > 1:
            inputs = inputs or stage_inputs(parts, sample, range(len(parts)))
            profiles = profile_blocks(list(part), inputs[j], device="cpu", warmup=1, repeats=3, split=split)
            shares = unit_shares(part, buckets, [p.weight_seconds if split else p.backward_seconds for p in profiles])
        units = tuple(Unit(share, reduce=allreduce_seconds(b.nbytes, replication.replicas, link),
                           reduce_bytes=float(b.nbytes))
                      for share, b in zip(shares, sorted(buckets, key=lambda b: b.unit), strict=True))
        stages.append(replace(stage, collectives=StageCollectives(units)))
    return replace(cost, stages=tuple(stages))


def without_loss(timeline: Timeline) -> Timeline:
    """``timeline`` without the loss's all-reduce (Note [the loss is left out])."""
    spans = tuple(s for s in timeline.spans if not (s.stream == COLLECTIVE and s.label.startswith("all-reduce loss")))
    return replace(timeline, spans=spans) if len(spans) < len(timeline.spans) else timeline


# Note [one prediction for every replica]: the replicas are symmetric (the same schedule, stages and buckets; a
# collective starts when the group's ranks issue it: Note [one communication stream] in sim.core.collectives), so
# the simulator predicts one replica's pipeline and the prediction is copied onto every replica's devices in the
# measured timeline's layout (replica r's schedule device d is device r * pp + d: merge_replicas in
# gpipe.distributed.replicas), so the makespans and the per-device rows compare rank by rank. The comparison
# matches compute tasks by key, so a task's measured span is one replica's, set beside the same prediction.
def replicated(timeline: Timeline, replicas: int) -> Timeline:
    """``timeline`` (one pipeline's) on each of ``replicas`` pipelines' devices (Note [one prediction for every
    replica])."""
    if replicas == 1:
        return timeline
    pp = timeline.num_devices
    spans = [Span(r * pp + s.device, s.stream, s.task, s.start, s.end, s.label)
             for r in range(replicas) for s in timeline.spans]
    memory = [MemorySample(r * pp + s.device, s.time, s.bytes) for r in range(replicas) for s in timeline.memory]
    meta = {**timeline.meta, "replicas": replicas, "layout": f"replica r's schedule device d is device r * {pp} + d"}
    return Timeline(tuple(spans), tuple(memory), pp * replicas, timeline.source, meta)


# Note [a collective's own seconds]: a rank's span of a collective runs from when that rank issued it (Note [a
# collective's span] in gpipe.distributed.reduction), so a replica that ends its backward first waits in its span for
# the group's last one, whose compute ran longer: the replicas' skew, which a prediction of symmetric replicas has no
# part in. The last rank to issue waits for no one, so a collective's own seconds are the shortest of the group's
# spans of it (one label: its unit, bytes and task), and the error compares the prediction with those; each device's
# spans as recorded, the wait included, are reported beside them.
@dataclass(frozen=True)
class CollectiveComparison:
    """One device's collectives in a step: how many, and their summed seconds, predicted beside measured (own:
    Note [a collective's own seconds]; recorded: the device's spans, waits for its group included)."""

    device: int
    predicted_count: int
    measured_count: int
    predicted_seconds: float
    measured_seconds: float
    recorded_seconds: float

    @property
    def error(self) -> float | None:
        """``(predicted - measured) / measured`` of the summed own seconds; ``None`` where nothing was measured."""
        if self.measured_seconds <= 0:
            return None
        return (self.predicted_seconds - self.measured_seconds) / self.measured_seconds

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "predicted_count": self.predicted_count, "measured_count": self.measured_count,
                "predicted_seconds": self.predicted_seconds, "measured_seconds": self.measured_seconds,
                "recorded_seconds": self.recorded_seconds, "error": self.error}


def compare_collectives(predicted: Timeline, measured: Timeline, replicas: int) -> tuple[CollectiveComparison, ...]:
    """Per device of ``replicas`` pipelines (:func:`replicated`'s layout), the collective spans of ``predicted`` and
    ``measured`` counted and their seconds summed (Note [a collective's own seconds])."""
    devices = max(predicted.num_devices, measured.num_devices)
    pp = devices // replicas
    shortest: dict[tuple[int, str], float] = {}  # (schedule device, label) -> the group's shortest span
    for s in measured.collective_spans():
        key = (s.device % pp, s.label)
        shortest[key] = min(shortest.get(key, s.duration), s.duration)
    rows = []
    for d in range(devices):
        p, m = predicted.collective_spans(d), measured.collective_spans(d)
        rows.append(CollectiveComparison(d, len(p), len(m), sum(s.duration for s in p),
                                         sum(shortest[d % pp, s.label] for s in m), sum(s.duration for s in m)))
    return tuple(rows)


def collectives_table(rows: Sequence[CollectiveComparison]) -> str:
    """The collectives' rows of the printed report: one per device, then all of them."""
    total = CollectiveComparison(-1, *(sum(getattr(r, name) for r in rows) for name in (
        "predicted_count", "measured_count", "predicted_seconds", "measured_seconds", "recorded_seconds")))
    lines = [f"{'collectives':>11}{'count':>8}{'pred (ms)':>12}{'meas (ms)':>12}{'error':>10}{'recorded (ms)':>15}"]
    for r in [*rows, total]:
        name = "all" if r is total else f"device {r.device}"
        error = "" if r.error is None else f"{r.error:+.1%}"
        lines.append(f"{name:>11}{r.predicted_count:>4}/{r.measured_count:<3}{r.predicted_seconds * 1e3:>12.3f}"
                     f"{r.measured_seconds * 1e3:>12.3f}{error:>10}{r.recorded_seconds * 1e3:>15.3f}")
    return "\n".join(lines)
