"""What calibration measures of the executor's stages: each partition on its device (:func:`stage_costs`), and what
the executor adds around them on its workers (:func:`with_executor_costs`), with the simulator's switches for it
(:func:`executor_config`). :func:`sim.calibration.experiment.run` calls them in its calibrate step; the schedule
search's benchmark and the process executor's calibration call them too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import Tensor, nn

from gpipe import microbatch
from gpipe.interpreter.affinity import Cores
from gpipe.microbatch import as_tensors
from gpipe.profiling.profile import RecordedSeconds
from gpipe.schedule import Checkpoint
from sim.calibration.calibrate import calibrate, calibrate_executor_overheads
from sim.calibration.host import executor_costs
from sim.calibration.machine import shares_cores
from sim.calibration.pairs import measure_pairs
from sim.calibration.thread_costs import measure_stage_extras
from sim.core.config import SimConfig
from sim.core.cost import CostModel

__all__ = ["Batch", "executor_config", "rows", "rows_of", "stage_costs", "with_executor_costs"]

Batch = Tensor | tuple[Tensor, ...]


def with_executor_costs(cost: CostModel, parts: Sequence[nn.Module], sample: Batch, devices: Sequence[str], *,
                        steps: int = 12, affinity: Sequence[Cores | None] | None = None, pairs: bool = True,
                        checkpoint: Checkpoint = "except_last", two_phases: bool = False,
                        placement: Sequence[int] | None = None) -> tuple[CostModel, SimConfig]:
    """``cost`` with what the executor adds, and the simulator's switches for it.

    The executor's own overheads from probe pipelines, what its threads add around each partition's
    layers (:mod:`sim.calibration.thread_costs`, run with ``checkpoint``, the pipeline's policy), and, for workers
    sharing the CPU's cores and Python's lock (:func:`sim.calibration.machine.shares_cores`), what each pair of
    tasks costs. Partitions on one torch device hand tensors over and nothing is copied; the executor runs
    a step in one phase (``GPipe.step``, Note [loss in the last task]), or with ``two_phases`` as
    ``forward()`` + ``loss.backward()`` do (Note [two phases] in :mod:`sim.core.run`). ``affinity``: the
    executor's ``cpu_affinity``; every measurement pins its threads the same way. ``pairs=False`` leaves
    ``Overheads.pairs`` to the caller (:func:`run` measures a round of them after every step, Note
    [interleaved calibration]).

    ``devices`` and ``affinity`` are one per schedule device (worker), ``parts`` one per stage; ``placement``:
    each stage's device (``None``: one stage per device). What the executor costs between workers (hand-offs,
    contention, launch) is measured on the workers, what it adds to a task on that task's stage (Note [pinned per
    worker]); pairs only of stages on different workers, the only ones that run at once.
    """
    placement = tuple(range(len(parts))) if placement is None else tuple(placement)
    if len(placement) != len(parts) or sorted(set(placement)) != list(range(len(devices))):
        raise ValueError(f"placement {placement} does not put {len(parts)} stages on the {len(devices)} devices given")
    stage_affinity = None if affinity is None else [affinity[d] for d in placement]
    overheads = calibrate_executor_overheads(list(devices), steps=steps, affinity=affinity)
    executor = replace(executor_costs(cost), overheads=overheads)
    extras = measure_stage_extras(replace(cost, runner=executor), parts, sample, checkpoint=checkpoint,
                                  affinity=stage_affinity)
    overheads = replace(overheads, launch=extras[0].launch, turnaround=extras[-1].turnaround)
    executor = replace(executor, stages=tuple(replace(s, thread_start=e.thread_start, host_forward=e.host_forward,
                                                      host_nograd=e.host_nograd, host_backward=e.host_backward)
                                              for s, e in zip(executor.stages, extras, strict=True)))
    cost = replace(cost, runner=executor)
    if pairs and shares_cores(devices):
        overheads = replace(overheads, pairs=measure_pairs(parts, sample, affinity=stage_affinity,
                                                            recorded=_recorded_seconds(cost), placement=placement))
    return (replace(cost, runner=replace(executor, overheads=overheads), copy_seconds=None),
            executor_config(devices, two_phases=two_phases))


def _recorded_seconds(cost: CostModel) -> list[RecordedSeconds] | None:
    """The stages' recorded seconds, the baselines pairs are rebased against (Note [pair baselines] in
    :mod:`sim.calibration.pairs`); ``None`` unless every stage has all three."""
    found = []
    for s, e in zip(cost.stages, executor_costs(cost).stages, strict=True):
        if e.forward_recorded is None or e.backward_recorded is None or s.forward_checkpointed is None:
            return None
        found.append(RecordedSeconds(e.forward_recorded, e.backward_recorded, s.forward_checkpointed))
    return found


def executor_config(devices: Sequence[str], *, two_phases: bool = False) -> SimConfig:
    """The simulator's switches for :class:`gpipe.GPipe` on ``devices`` (one per schedule device).

    One phase, as ``GPipe.step`` runs a step (Note [loss in the last task]), or with ``two_phases`` as
    ``forward()`` + ``loss.backward()`` do (Note [two phases] in :mod:`sim.core.run`); CUDA devices
    asynchronous, and partitions on one CUDA device issuing to its one stream (Note [asynchronous devices] there);
    copies priced by the cost model; an overlapped pair's tasks in turn, as the workers run them.
    """
    parsed = [torch.device(d) for d in devices]
    cuda = ["" if d.type != "cuda" else str(d) if d.index is not None else f"cuda:{torch.cuda.current_device()}"
            for d in parsed]
    asynchronous = frozenset(k for k, d in enumerate(parsed) if d.type == "cuda")
    ids = {name: k for k, name in enumerate(dict.fromkeys(c for c in cuda if c))}
    shared = tuple(ids[c] if c else len(ids) + k for k, c in enumerate(cuda)) \
        if len(ids) < sum(1 for c in cuda if c) else None
    return SimConfig(link=None, backward_after_forward=two_phases, asynchronous=asynchronous, shared_streams=shared,
                     overlap_pairs=False)


def stage_costs(model: nn.Sequential, batch: Batch, balance: Sequence[int], chunks: int, devices: Sequence[str], *,
                warmup: int = 3, repeats: int = 9, affinity: Sequence[Cores | None] | None = None,
                split: bool = False) -> CostModel:
    """Calibrate each partition on its device at the first micro-batch's size (no overheads).

    The executor the experiment runs records its timeline, so each stage's forward and backward are
    also measured with the recorder's hooks (``ExecutorStage.forward_recorded``, ``backward_recorded``).

    An uneven split (:func:`gpipe.microbatch.sizes`: the first micro-batches one sample larger) becomes the cost
    model's ``microbatch_scale``: sample counts relative to the first.
    ``devices`` and ``affinity``: one per partition; ``split``: for a schedule with ``W`` tasks, each backward
    in two parts (``StageCost.backward`` and ``weight``; Note [split runs] in :mod:`gpipe.profiling.timing`).
    """
    sizes = microbatch.sizes(rows(batch), chunks)
    first = rows_of(batch, 0, sizes[0], torch.device(devices[0]))
    cost = calibrate(model, balance, first, devices=list(devices), warmup=warmup, repeats=repeats, recorded=True,
                     affinity=affinity, split=split)
    if len(set(sizes)) > 1:
        cost = replace(cost, microbatch_scale=tuple(s / sizes[0] for s in sizes))
    return cost


def rows(batch: Batch) -> int:
    """The samples of a mini-batch (0 for a 0-d tensor)."""
    first = as_tensors(batch, "the mini-batch")[1][0]
    return first.shape[0] if first.dim() else 0


def rows_of(batch: Batch, start: int, stop: int, device: torch.device) -> Batch:
    """Rows ``start:stop`` of every tensor of ``batch``, on ``device``."""
    if isinstance(batch, Tensor):
        return batch[start:stop].to(device)
    return tuple(t[start:stop].to(device) for t in batch)
