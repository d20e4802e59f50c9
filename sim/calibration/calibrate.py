"""Calibration: measure a real model's partitions and the executor's own primitives into a cost model.

Measuring apart from computing: this module runs things and reads clocks; :mod:`sim.core.engine` only
consumes the :class:`~sim.core.cost.CostModel` it returns. Three parts:

- :func:`calibrate` profiles each partition of a balanced ``nn.Sequential`` on its device with
  :func:`gpipe.profiling.profile.profile_blocks` (the profiler ``balance_by_time`` uses too) and fills one
  :class:`~sim.core.cost.StageCost` per partition, and what a recording executor adds to it
  (:class:`~sim.calibration.host.ExecutorStage`); :func:`calibrate` tabulates what each field is measured from.
- :func:`calibrate_executor_overheads` runs the executor itself on probe pipelines and reads its
  timelines (Note [executor overheads]); :func:`sim.calibration.pairs.measure_pairs` runs the real partitions two at a
  time (Note [pairs] there). Together they give :class:`~sim.calibration.host.Overheads`.
- :func:`calibrate_overheads` is the older, emulated measurement of the same costs, for when the
  executor is not at hand (Notes [task overhead], [hand-off], [contention] in :mod:`sim.calibration.primitives`).

The primitives these are built from, each timed on its own (saved tensors, hand-offs, core sharing),
are in :mod:`sim.calibration.primitives`; what the executor's threads add around each real partition (fresh-thread
starts included) is measured in :mod:`sim.calibration.thread_costs`.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from gpipe.checks import check_positive
from gpipe.interpreter.affinity import Cores, check_affinity
from gpipe.profiling.profile import BlockProfile, Device, TensorOrTensors, profile_blocks
from gpipe.schedule import Op, Task
from sim.calibration.host import ExecutorCosts, ExecutorStage, Overheads
from sim.calibration.primitives import (
    count_saved_tensors,
    measure_contention,
    measure_handoff,
    measure_saved_tensor_cost,
    measure_task_overhead,
)
from sim.core.cost import CostModel, StageCost

__all__ = [
    "calibrate",
    "calibrate_executor_overheads",
    "calibrate_overheads",
    "on_device",
    "partitions_of",
]


def partitions_of(module: nn.Sequential, balance: Sequence[int]) -> list[nn.Sequential]:
    """Cut ``module`` into one ``nn.Sequential`` per partition, sharing its layers (nothing is copied).

    Args:
        module: the model.
        balance: layers per partition.

    Returns:
        The partitions, in order.

    Raises:
        TypeError: ``module`` is not an ``nn.Sequential``.
        ValueError: ``balance`` has a non-positive entry or does not sum to ``len(module)``.
    """
    if not isinstance(module, nn.Sequential):
        raise TypeError(f"module must be an nn.Sequential, got {type(module).__name__}")
    balance = list(balance)
    if not balance or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in balance):
        raise ValueError(f"balance must be a non-empty list of positive integers, got {balance!r}")
    if sum(balance) != len(module):
        raise ValueError(f"balance {balance} sums to {sum(balance)}, but the module has {len(module)} layers")
    layers = list(module)
    parts, start = [], 0
    for size in balance:
        parts.append(nn.Sequential(*layers[start:start + size]))
        start += size
    return parts


# Note [recording]: a recording executor counts the bytes each grad-enabled forward saves through
# ``saved_tensors_hooks``: a Python call per saved tensor (and an unpack call per tensor in the backward), a large
# share of a small layer's forward, whose cost depends on what is saved. So ``calibrate(..., recorded=True)``
# profiles each stage's forward and backward with the recorder's own hooks (``forward_recorded``,
# ``backward_recorded``), which the simulator uses as they are; a stage calibrated without gets the per-tensor
# estimate (:func:`sim.calibration.primitives.count_saved_tensors` times
# :func:`sim.calibration.primitives.measure_saved_tensor_cost`).
def calibrate(module: nn.Sequential, balance: Sequence[int], sample_microbatch: TensorOrTensors, *,
              devices: Sequence[Device] | None = None, warmup: int = 2, repeats: int = 5,
              recorded: bool = False, affinity: Sequence[Cores | None] | None = None,
              split: bool = False) -> CostModel:
    """Profile each partition on its device into a cost model.

    What each field of a stage's :class:`~sim.core.cost.StageCost` and
    :class:`~sim.calibration.host.ExecutorStage` is measured from::

        forward               grad-enabled forward   F of a micro-batch that is not checkpointed
        forward_checkpointed  no-grad forward        F of a checkpointed micro-batch
        recompute             grad-enabled forward   R (a recompute records the graph)
        backward              backward alone         B (with ``split``: its input-gradient part)
        weight                weight-gradient part   W (with ``split``; else 0)
        send_bytes            output bytes           the activation sent to the next stage
        saved_bytes           saved-tensor hooks     kept for backward without checkpointing
        checkpoint_bytes      input bytes            kept with checkpointing (the stage input)
        parameter_bytes       parameters + buffers
        gradient_bytes        trainable parameters
        saved_tensors         saved-tensor hooks     how many tensors autograd saves (Note [recording])
        forward_recorded      recorded forward       F and R of a recording executor (``recorded=True``)
        backward_recorded     recorded backward      B of a recording executor (``recorded=True``)
        weight_recorded       recorded W part        W of a recording executor (``recorded`` and ``split``)
        issue_forward, ...    host clock (CUDA)      the host's share of F, R and B (gpipe.profiling.timing)

    Args:
        module: the model.
        balance: layers per partition (one stage each).
        sample_microbatch: an input of the micro-batch size the pipeline will run.
        devices: one device per partition; a partition not already there is profiled as a copy
            moved there (the model is never moved or changed). ``None``: where each partition is.
        warmup: untimed passes before timing.
        repeats: timed passes; every time is the median over them.
        recorded: also measure each partition's forward and backward with a recording executor's
            saved-tensor hooks (``forward_recorded``, ``backward_recorded``): for predicting a
            :class:`gpipe.GPipe` that records its timeline (Note [recording]).
        affinity: one set of CPU cores per partition (or ``None``), as the executor's
            ``cpu_affinity``: each partition is profiled on its cores.
        split: for a schedule with ``W`` tasks: each backward is timed in two parts as the executor runs
            them (Note [split runs] in :mod:`gpipe.profiling.timing`), ``backward`` the ``B`` and ``weight`` the
            ``W``; without it a stage's whole backward is ``backward`` and ``weight`` is 0.

    Returns:
        One :class:`~sim.core.cost.StageCost` per partition; copies priced by the simulator's link
        (``copy_seconds=None``); the runner an :class:`~sim.calibration.host.ExecutorCosts` with one
        :class:`~sim.calibration.host.ExecutorStage` per partition (saved tensors, recorded and issue
        seconds) and no overheads (see :func:`calibrate_overheads`).

    Raises:
        TypeError: ``module`` is not an ``nn.Sequential``.
        ValueError: a bad ``balance``, ``devices`` of the wrong length, or a bad ``warmup``/``repeats``.
    """
    parts = partitions_of(module, balance)
    if devices is not None and len(devices) != len(parts):
        raise ValueError(f"{len(devices)} devices for {len(parts)} partitions; give one device per partition")
    profiles = profile_blocks(parts, sample_microbatch, device=devices, warmup=warmup, repeats=repeats,
                              recorded=recorded, affinity=affinity, split=split)
    placed = parts if devices is None else [on_device(p, d) for p, d in zip(parts, devices, strict=True)]
    counts = count_saved_tensors(placed, sample_microbatch)
    cuda = [torch.device(d).type == "cuda" for d in devices] if devices is not None else [_on_cuda(p) for p in placed]
    issues = [_issue(p, recorded) if on_cuda else (0.0, 0.0, 0.0) for p, on_cuda in zip(profiles, cuda, strict=True)]
    stages = tuple(StageCost(
        forward=p.forward_seconds,
        backward=p.backward_seconds,
        weight=p.weight_seconds,
        recompute=p.recompute_seconds,
        forward_checkpointed=p.forward_nograd_seconds,
        send_bytes=p.output_bytes,
        saved_bytes=p.saved_bytes,
        checkpoint_bytes=p.input_bytes,
        parameter_bytes=p.parameter_bytes,
        gradient_bytes=p.gradient_bytes,
    ) for p in profiles)
    executor = tuple(ExecutorStage(
        saved_tensors=count,
        forward_recorded=p.forward_recorded_seconds,
        backward_recorded=p.backward_recorded_seconds,
        weight_recorded=p.weight_recorded_seconds if split else None,
        issue_forward=issue[0], issue_nograd=issue[1], issue_backward=issue[2],
    ) for p, count, issue in zip(profiles, counts, issues, strict=True))
    return CostModel(stages, runner=ExecutorCosts(stages=executor))


def _on_cuda(part: nn.Module) -> bool:
    return any(t.device.type == "cuda" for t in [*part.parameters(), *part.buffers()])


def _issue(profile: BlockProfile, recorded: bool) -> tuple[float, float, float]:
    """Note [issue seconds] in :mod:`gpipe.profiling.timing`: the host's share of a grad-enabled forward, a no-grad
    forward and a backward on a CUDA device, from the runs the stage's seconds come from (the recorded ones
    when ``recorded``)."""
    forward = profile.forward_recorded_issue_seconds if recorded else profile.forward_issue_seconds
    backward = profile.backward_recorded_issue_seconds if recorded else profile.backward_issue_seconds
    return forward or 0.0, profile.forward_nograd_issue_seconds or 0.0, backward or 0.0


def on_device(part: nn.Module, device: Device) -> nn.Module:
    """``part`` itself when it is on ``device``, else a copy moved there (as the profiler does).

    Args:
        part: a partition.
        device: where it will run.

    Returns:
        ``part``, or a deep copy of it on ``device``.
    """
    target = torch.device(device)
    if all(t.device == target or (target.index is None and t.device.type == target.type)
           for t in [*part.parameters(), *part.buffers()]):
        return part
    return copy.deepcopy(part).to(target)


def calibrate_overheads(*, workers: int = 2, repeats: int = 200, contention: bool = True,
                        threads_per_worker: int = 1) -> Overheads:
    """Measure the executor's own costs on this machine.

    Args:
        workers: how many workers compute at once (the number of CPU devices) for the contention test.
        repeats: samples for the task and hand-off medians.
        contention: measure core sharing; ``False`` gives 0 (devices that share nothing, GPUs).
        threads_per_worker: intra-op threads each worker uses.

    Returns:
        :class:`~sim.calibration.host.Overheads` with ``task`` and ``handoff`` in seconds and ``contention``.

    Raises:
        ValueError: ``repeats < 1``, ``workers < 2`` with ``contention``, or ``threads_per_worker < 1``.
    """
    return Overheads(
        task=measure_task_overhead(repeats),
        handoff=measure_handoff(repeats),
        contention=measure_contention(workers, threads_per_worker=threads_per_worker) if contention else 0.0,
    )


# Note [executor overheads]: two probe pipelines of layers that compute almost nothing (``x * w``) run a few
# recorded training steps in gpipe.GPipe; what their spans show beyond the profiled seconds of the probe layer is
# the executor's own cost. One worker, 8 micro-batches, except_last: task = median(span - profiled), F and B;
# recording = median(span - profiled) of F and R with grad, minus task and the hooks' per-tensor cost; gap = median
# time between two tasks of the worker. A worker per device, 1 micro-batch, never: handoff = F0@j end -> F0@j+1
# start, B0@j+1 end -> B0@j start; turnaround = F0@n-1 end -> B0@n-1 start (the user's loss is not in the measured
# timeline); launch = step start -> F0@0 start. With one micro-batch nothing runs at the same time, so the
# hand-offs are not mixed up with contention.
def calibrate_executor_overheads(devices: Sequence[Device], *, steps: int = 12, warmup_steps: int = 3,
                                 contention: bool | None = None, saved_tensor_repeats: int = 101,
                                 affinity: Sequence[Cores | None] | None = None) -> Overheads:
    """Measure the executor's own costs by running it (Note [executor overheads]).

    Args:
        devices: one torch device per partition of the pipeline to be modelled.
        steps: recorded training steps of each probe pipeline (after ``warmup_steps`` others).
        warmup_steps: unrecorded steps first.
        contention: measure core sharing among the workers on the CPU
            (:func:`sim.calibration.primitives.measure_contention`);
            ``None``: when at least two partitions are on the CPU.
        saved_tensor_repeats: samples of :func:`sim.calibration.primitives.measure_saved_tensor_cost`.
        affinity: one set of CPU cores per device (or ``None``), as the executor's ``cpu_affinity``:
            the probe pipelines' workers are pinned the same way.

    Returns:
        :class:`~sim.calibration.host.Overheads` with every field measured on this machine.

    Raises:
        ValueError: no devices, a non-positive ``steps``, or a bad ``affinity``.
    """
    from gpipe import GPipe  # the executor; imported here so the simulator never needs it

    if not devices:
        raise ValueError("need at least one device")
    check_positive("steps", steps)
    first = torch.device(devices[0])
    cores = check_affinity(affinity, len(devices)) or [None] * len(devices)
    per_saved, per_unpacked = measure_saved_tensor_cost(saved_tensor_repeats)
    sample = torch.randn(1, 4, device=first)

    def probe(stage_devices: list[torch.device], stage_cores: Sequence[Cores | None], chunks: int,
              checkpoint: str) -> list[Any]:
        model = nn.Sequential(*[_Scale() for _ in stage_devices])
        pipe = GPipe(model, balance=[1] * len(stage_devices), devices=stage_devices, chunks=chunks,
                     checkpoint=checkpoint, record=True, cpu_affinity=stage_cores)
        batch = torch.randn(chunks, 4, device=first)
        timelines = []
        for k in range(warmup_steps + steps):
            pipe(batch).pow(2).sum().backward()
            if k >= warmup_steps:
                timelines.append(pipe.timeline)
        return timelines

    # One worker alone: each task's own host time and the gap between two tasks, with nothing to wait for.
    (alone,) = profile_blocks([_Scale().to(first)], sample, warmup=10, repeats=51, affinity=cores[:1])
    packs = count_saved_tensors([_Scale().to(first)], sample)[0]
    base: list[float] = []
    recorded: list[float] = []
    gaps: list[float] = []
    for timeline in probe([first], cores[:1], 8, "except_last"):
        spans = timeline.compute_spans(0)
        for s in spans:
            if s.task.op is Op.B:
                base.append(s.duration - alone.backward_seconds - packs * per_unpacked)
            elif s.task.op is Op.F and s.task.microbatch < 7:  # checkpointed: no_grad, not recorded
                base.append(s.duration - alone.forward_nograd_seconds)
            else:  # the last F (not checkpointed) and every R: grad-enabled and recorded
                recorded.append(s.duration - alone.forward_seconds - packs * per_saved)
        gaps += [b.start - a.end for a, b in zip(spans, spans[1:], strict=False)]
    task = max(0.0, statistics.median(base))
    recording = max(0.0, statistics.median(recorded) - task)

    # One worker per device (at least two), one micro-batch: every wait is a hand-off, nothing computes
    # at the same time, and the first forward starts after the workers are launched.
    handoffs: list[float] = []
    turnarounds: list[float] = []
    launches: list[float] = []
    chain = [torch.device(d) for d in devices] if len(devices) > 1 else [first, first]
    chain_cores = cores if len(devices) > 1 else cores * 2
    last = len(chain) - 1
    for timeline in probe(chain, chain_cores, 1, "never"):
        forward = [timeline.span_of(Task(Op.F, 0, j)) for j in range(len(chain))]
        backward = [timeline.span_of(Task(Op.B, 0, j)) for j in range(len(chain))]
        handoffs += [b.start - a.end for a, b in zip(forward, forward[1:], strict=False)]
        handoffs += [a.start - b.end for a, b in zip(backward, backward[1:], strict=False)]
        turnarounds.append(backward[last].start - forward[last].end)
        launches.append(forward[0].start)
    if contention is None:
        contention = sum(1 for d in devices if torch.device(d).type == "cpu") >= 2
    return Overheads(
        task=task,
        handoff=max(0.0, statistics.median(handoffs)),
        contention=measure_contention(max(2, len(devices)), threads_per_worker=torch.get_num_threads())
        if contention else 0.0,
        gap=max(0.0, statistics.median(gaps)),
        turnaround=max(0.0, statistics.median(turnarounds)),
        launch=max(0.0, statistics.median(launches)),
        recording=recording,
        per_saved_tensor=per_saved,
        per_unpacked_tensor=per_unpacked,
    )


class _Scale(nn.Module):
    """The probe pipelines' layer: as little compute as a layer with a parameter can have."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight
