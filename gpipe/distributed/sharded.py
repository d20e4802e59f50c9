"""A stage sharded over its replicas with torch's FSDP2 (ZeRO-3): one unit per layer, each collective a span.

::

    DistributedGPipe(model, balance, data_parallel=dp, zero=3)

    stage j's partition     fully_shard(partition)          the root: one FSDP state for the stage's units
      layer 0 (params)      fully_shard(layer 0)  unit 0    its parameters sharded over the dp group (DTensors),
      layer 1 (no params)   -                               all-gathered before each F and R (and B, resharded
      layer 2 (params)      fully_shard(layer 2)  unit 1    after the forward), its gradients reduce-scattered

Note [FSDP under a schedule]: the executor calls a stage's layers one by one, never the partition, so the root's
own forward hooks never run; its lazy initialisation (which makes the layers' states share one context, as the
partition's forward would) is called when it is built. Before each ``B`` the stage's units are told whether it is
the stage's last gradient task on this rank (``Schedule.gradient_positions``), as torch's pipelining stage does:
only that one reduce-scatters (``set_requires_gradient_sync``) and ends FSDP's backward (``set_is_last_backward``);
the others accumulate unsharded gradients (the planner's ZeRO-3 reduces after each gradient task instead:
``reduce_each`` in :mod:`sim.planning.parallel.zero`). Resharding after a backward follows
``reshard_after_forward``, so a unit is gathered before every ``F``, ``R`` and ``B`` (resharded, FSDP's default and
ZeRO-3) or once a step, before the stage's first ``F``, and freed after its last ``B`` (not resharded): the
simulator's ``Gather.EACH_TASK`` and ``Gather.ONCE`` (:mod:`sim.core.collectives`). Gradients are summed, not
averaged (a divide factor of 1): a mean loss is already scaled by ``1 / dp`` (Note [a replica's batch] in
:mod:`gpipe.distributed.replicas`). A parameter with no gradient on this rank reduces zeros, as DDP's buckets do
(``set_reduce_scatter_unused_params``).

Note [explicit prefetch]: unit ``u`` gathers unit ``u + 1`` as its forward starts and unit ``u - 1`` as its
backward starts (one unit prefetched, as the simulator issues them). FSDP's implicit backward prefetch walks its
record of forwards, which under a pipeline holds several micro-batches' forwards, so it would gather a unit that
another micro-batch uses next; an explicit list turns it off, and unit 0's names unit 0 (already gathered then: a
no-op).

Note [split backward and FSDP]: schedules that split the backward (``B`` then ``W``: zb-h1, zb-h2, zb-v,
dualpipe-v) are refused. ``W``'s engine calls start inside the stage's graph, below FSDP's hooks, so no
post-backward reduce-scatters what they accumulate; and the split learns which graph leaves are parameters from the
stage's parameters, FSDP's sharded ones, while the graph holds the gathered ones (:mod:`gpipe.autograd.split_backward`).
With the refusal lifted, zb-h1 on ``dp 2`` runs and leaves the plain model's loss after its first step. Running
them needs the split to take FSDP's gathered parameters, and the stage's last ``W`` to end FSDP's backward itself,
as torch's pipelining does (``perform_reduce_grad``).

Note [a sharded stage's model state]: the recorder tells a stage's model state from its saved activations by
storage, over the partition's parameters and buffers; a sharded stage's parameters are ``DTensor`` shards, which have
no storage of their own, so the recorder is given each partition as its local shards (:meth:`Sharded.recorded`):
this rank's model state.

Note [a gather's span]: FSDP runs each unit's collectives through the comm objects it is given
(``set_custom_all_gather``, ``set_custom_reduce_scatter``); ours launch torch's ``all_gather_single`` and
``reduce_scatter_single`` and wait for them as every wait for another rank is waited for (a waiter thread, the
alarm: Note [no rank left waiting] in :mod:`gpipe.distributed.faults`), so a failed replica stops this one within
seconds, naming the collective. Each is a span on the rank's ``COLLECTIVE`` stream in the simulator's labels
(``all-gather unit 0 (1.5 KiB)``, ``reduce-scatter unit 0 (1.5 KiB)``: the unit's unsharded parameters), its task
the task that ran it, from its launch to when the waiter saw it end, on the host clock: on gloo the collective,
without FSDP's copies in and out; on NCCL ``wait()`` returns once the stream waits for it, so there the end is when
it was queued, not done (as in Note [a collective's span] in :mod:`gpipe.distributed.reduction`).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
from torch.distributed.tensor import DTensor

from gpipe.distributed.faults import Alarm, Waiter
from gpipe.frontend import Arguments
from gpipe.interpreter.pipeline import Pipeline
from gpipe.interpreter.recorder import Recorder
from gpipe.schedule import Op, Schedule, ScheduleKind, Task
from gpipe.schedule.timeline import COLLECTIVE, collective_label

__all__ = ["ZERO_STAGES", "Sharded", "ShardUnit", "check_zero", "meta_twin", "stage_units"]

#: The ``zero`` stages ``DistributedGPipe`` runs: 0 (gradients all-reduced in DDP's buckets) and 3 (FSDP2). ZeRO-1
#: is torch's ``ZeroRedundancyOptimizer`` over ``pipe.parameters()``, chosen by the caller's optimizer.
ZERO_STAGES = (0, 3)


@dataclass(frozen=True)
class ShardUnit:
    """One FSDP unit of a stage: a layer with parameters, ``unit`` its place among them in forward order."""

    stage: int
    unit: int
    layer: nn.Module
    nbytes: int  # its parameters unsharded: what its all-gather gathers and its reduce-scatter reduces


def stage_units(stage: int, partition: nn.Sequential) -> list[ShardUnit]:
    """Stage ``stage``'s FSDP units in forward order: what the executor shards for it (Note [FSDP under a
    schedule]), and what a prediction of its gathers and reduce-scatters counts."""
    layers = [layer for layer in partition if any(True for _ in layer.parameters())]
    return [ShardUnit(stage, u, layer, sum(p.numel() * p.element_size() for p in layer.parameters()))
            for u, layer in enumerate(layers)]


def check_zero(zero: object, data_parallel: int, reshard_after_forward: object, arguments: Arguments) -> None:
    """Refuse a ``zero`` stage ``DistributedGPipe`` does not run, sharding without replicas, or a schedule that
    splits the backward (Note [split backward and FSDP]), before any rank joins a group.

    Raises:
        ValueError: in one line, naming the fix.
    """
    if isinstance(zero, bool) or zero not in ZERO_STAGES:
        raise ValueError(f"zero must be one of {ZERO_STAGES} (0: all-reduced gradients, 3: FSDP2's sharding; ZeRO-1 "
                         f"is torch's ZeroRedundancyOptimizer over pipe.parameters()), got {zero!r}")
    if not isinstance(reshard_after_forward, bool):
        raise ValueError(f"reshard_after_forward must be True or False, got {reshard_after_forward!r}")
    if zero != 3:
        return
    if data_parallel == 1:
        raise ValueError("zero=3 shards each stage over its replicas: give data_parallel >= 2")
    schedule = arguments.given or cast(ScheduleKind, arguments.kind)(arguments.chunks, arguments.stages)
    if schedule.splits_weight_gradient:
        raise ValueError(f"zero=3 cannot run schedule {schedule.name!r}: it splits the backward into B and W, and FSDP "
                         "does not reduce the weight gradients W makes (Note [split backward and FSDP] in "
                         "gpipe.distributed.sharded); use a schedule without W (gpipe, 1f1b, interleaved-1f1b, "
                         "looped-bfs)")


def meta_twin(layer: nn.Module) -> nn.Module:
    """A copy of ``layer`` whose parameters and buffers are on ``meta`` (no data copied): what the dry run of
    shapes runs in place of a sharded layer (Note [a dry run on fake tensors] in :mod:`gpipe.distributed.shapes`)."""
    memo: dict[int, Any] = {id(p): nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad)
                            for p in layer.parameters()}
    memo.update({id(b): torch.empty_like(b, device="meta") for b in layer.buffers()})
    return copy.deepcopy(layer, memo)


def _local_shards(partition: nn.Module) -> nn.Sequential:
    """``partition``'s parameters as this rank's shards (sharing their storage) and its buffers, in one module."""
    held = nn.Module()
    for k, p in enumerate(partition.parameters()):
        local = p.to_local() if isinstance(p, DTensor) else p
        held.register_parameter(f"p{k}", nn.Parameter(local, requires_grad=False))
    for k, b in enumerate(partition.buffers()):
        held.register_buffer(f"b{k}", b)
    return nn.Sequential(held)


class _Collectives:
    """This step's FSDP collectives on this rank, each bounded by the alarm and each a span (Note [a gather's
    span]); ``ranks``: the dp group's global ranks, for messages."""

    def __init__(self, ranks: list[int]) -> None:
        self.ranks = ranks
        self.alarm: Alarm | None = None
        self.waiter: Waiter | None = None
        self.recorder: Recorder | None = None
        self.d = 0
        self.task: Task | None = None

    def run(self, kind: str, unit: ShardUnit, issue: Callable[[], Any]) -> None:
        """Launch a collective (``issue``, with ``async_op=True``), wait for it as every wait for another rank is,
        and record its span.

        Raises:
            RuntimeError: outside a step (a sharded layer called directly).
            PipelineFailed: a rank failed, the collective was lost or passed the timeout.
        """
        if self.alarm is None or self.waiter is None:
            raise RuntimeError(f"FSDP ran the {kind} of stage {unit.stage}'s unit {unit.unit} outside a step: a "
                               "sharded stage's layers run in DistributedGPipe.step only")
        issued = time.perf_counter()
        work = issue()
        pending = self.waiter.add(work)
        self.alarm.wait(pending, f"the {kind} of stage {unit.stage}'s unit {unit.unit} with ranks {self.ranks}",
                        world=True)
        work.wait()  # done on gloo; on NCCL it orders the caller's stream (FSDP's) after the collective
        recorder, task = self.recorder, self.task
        if recorder is not None:
            assert task is not None  # collectives run in tasks, each announced by Sharded.before
            with recorder.lock:
                recorder.spans.append((self.d, COLLECTIVE, task, issued - recorder.t0, pending.at - recorder.t0,
                                       collective_label(kind, unit.unit, unit.nbytes)))


class _TimedAllGather(AllGather):
    """torch's all-gather for one unit, through :class:`_Collectives` (Note [a gather's span])."""

    def __init__(self, unit: ShardUnit, collectives: _Collectives) -> None:
        self.unit, self.collectives = unit, collectives

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: Tensor, input_tensor: Tensor, group: Any, async_op: bool = False) -> None:
        self.collectives.run("all-gather", self.unit, lambda: dist.all_gather_single(
            output_tensor, input_tensor, group=group, async_op=True))


class _TimedReduceScatter(ReduceScatter):
    """torch's reduce-scatter for one unit, through :class:`_Collectives` (Note [a gather's span])."""

    def __init__(self, unit: ShardUnit, collectives: _Collectives) -> None:
        self.unit, self.collectives = unit, collectives

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: Tensor, input_tensor: Tensor, group: Any, op: Any,
                 async_op: bool = False) -> None:
        self.collectives.run("reduce-scatter", self.unit, lambda: dist.reduce_scatter_single(
            output=output_tensor, input=input_tensor, group=group, op=op, async_op=True))


class Sharded:
    """This rank's stages sharded over their dp group with FSDP2 (Note [FSDP under a schedule]).

    Args:
        partitions: this rank's stages' partitions, by stage, each an ``nn.Sequential`` of its layers.
        mesh: the dp dimension of the mesh (``replicas.mesh["dp"]``); ``ranks``: its global ranks, for messages.
        reshard_after_forward: free a unit's gathered parameters after each forward and gather them again for the
            backward (FSDP's default, ZeRO-3), or keep them gathered until the stage's last backward of the step.
    """

    def __init__(self, partitions: Mapping[int, nn.Sequential], mesh: DeviceMesh, ranks: list[int],
                 reshard_after_forward: bool) -> None:
        self.reshard_after_forward = reshard_after_forward
        self.collectives = _Collectives(ranks)
        self.units = {j: stage_units(j, partition) for j, partition in partitions.items()}
        self.roots: dict[int, FSDPModule] = {}
        for j, partition in partitions.items():
            units = self.units[j]
            if not units:
                continue
            shards = []
            for unit in units:
                shard = cast(FSDPModule, fully_shard(unit.layer, mesh=mesh,
                                                     reshard_after_forward=reshard_after_forward))
                shard.set_gradient_divide_factor(1.0)
                shard.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM, which a factor picks else
                shard.set_reduce_scatter_unused_params(True)
                shard.set_custom_all_gather(_TimedAllGather(unit, self.collectives))
                shard.set_custom_reduce_scatter(_TimedReduceScatter(unit, self.collectives))
                shards.append(shard)
            for u, shard in enumerate(shards):  # Note [explicit prefetch]
                shard.set_modules_to_forward_prefetch(shards[u + 1:u + 2])
                shard.set_modules_to_backward_prefetch([shards[max(u - 1, 0)]])
            root = cast(FSDPModule, fully_shard(partition, mesh=mesh, reshard_after_forward=reshard_after_forward))
            fully_shard.state(partition)._lazy_init()  # type: ignore[attr-defined]  # Note [FSDP under a schedule]
            self.roots[j] = root
        self.held = {j: _local_shards(partition) for j, partition in partitions.items() if j in self.roots}
        self.last: dict[int, int] = {}

    def recorded(self, pipeline: Pipeline) -> Pipeline:
        """``pipeline`` as the recorder reads it: a sharded stage's partition as its local shards (Note [a sharded
        stage's model state])."""
        return dataclasses.replace(pipeline, partitions=tuple(self.held.get(j, p)
                                                              for j, p in enumerate(pipeline.partitions)))

    def begin(self, schedule: Schedule, d: int, alarm: Alarm, recorder: Recorder | None) -> None:
        """A step of ``schedule`` on schedule device ``d`` starts: its waits are bounded by ``alarm``, its spans go to
        ``recorder``."""
        tasks = schedule.tasks[d]
        self.last = {tasks[k].stage: k for k in schedule.gradient_positions[d]}
        c = self.collectives
        c.alarm, c.waiter, c.recorder, c.d, c.task = alarm, Waiter(f"gpipe-sharded-{d}"), recorder, d, None

    def before(self, k: int, task: Task) -> None:
        """Task ``k`` of this rank's list is to run: a ``B`` learns whether it reduces (Note [FSDP under a
        schedule])."""
        self.collectives.task = task
        root = self.roots.get(task.stage)
        if root is None or task.op is not Op.B:
            return
        last = self.last[task.stage] == k
        root.set_requires_gradient_sync(last)
        root.set_is_last_backward(last)
        root.set_reshard_after_backward(last or self.reshard_after_forward)

    def end(self) -> None:
        """The step has ended (or failed): stop its waiter thread."""
        c = self.collectives
        if c.waiter is not None:
            c.waiter.close()
        c.alarm, c.waiter, c.recorder, c.task = None, None, None, None
