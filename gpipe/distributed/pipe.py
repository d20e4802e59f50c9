"""DistributedGPipe: one process per schedule device, each running its own stages' tasks (torchrun, gloo, NCCL).

::

    # torchrun --nproc-per-node 2 train.py
    pipe = DistributedGPipe(model, balance=[2, 3], chunks=4, schedule="1f1b")
    loss = pipe.step(x, y, loss_fn)   # x read on the first stage's rank, y on the last; the loss on every rank

DualPipe's two copies of the stages (``schedule="dualpipe"``) run as two partitions a rank, their gradients summed
with the mirror rank's (Note [mirrored stages] in :mod:`gpipe.distributed.mirrors`).

Rank ``d`` is schedule device ``d`` (with ``data_parallel=dp > 1``, each of ``dp`` replicas' pipelines runs on its
own ranks of a ``(pp, dp)`` device mesh: :mod:`gpipe.distributed.replicas`): it runs
:class:`gpipe.interpreter.worker.Worker` on ``schedule.tasks[d]`` (one stage, or several as the schedule's layout
places them) over :class:`gpipe.distributed.wire.Wire`, and holds
only those stages' layers (Note [materialised weights] in :mod:`gpipe.distributed.materialize`); the others are
empty placeholders. ``parameters()`` are this rank's, for its own optimizer. Everything else its arguments decide
(balance, schedule, placement, the schedule of each step) is decided as for :class:`gpipe.GPipe`, in
:mod:`gpipe.frontend` (Note [one front-end]).

Note [a step's start]: before anything is sent, the ranks exchange what each checked of its own inputs (one row of
integers each, Note [one exchange a step] in :mod:`gpipe.distributed.start`): the first stage's rank the
micro-batch rows and structure of ``x``, the last stage's the rows of ``y``, each rank whether its stages may draw
random numbers, and any error. Every rank then raises the same error (a shape mismatch between stages too: Note
[a dry run on fake tensors] in :mod:`gpipe.distributed.shapes`), or builds the same schedule; where a stage may
draw, the first stage's rank draws the step's seed (as one process would) and sends it to all, so checkpointed
draws are exact across processes (Note [random state] in :mod:`gpipe.autograd.rng`). With replicas, the exchange
takes in every rank of the world: a rejected input stops every replica, and their batches must agree in rows (Note
[a replica's batch] in :mod:`gpipe.distributed.replicas`).
"""

from __future__ import annotations

import copy
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor, nn

from gpipe.autograd import rng
from gpipe.autograd.gradients import Gradients
from gpipe.batchnorm import DeferredBatchNorm
from gpipe.distributed.clock import measure_offsets, merge
from gpipe.distributed.faults import Alarm, PipelineFailed, report
from gpipe.distributed.group import Ranks, join, rank_device
from gpipe.distributed.materialize import Init, materialize_layer
from gpipe.distributed.mirrors import Mirrors
from gpipe.distributed.reduction import DDP_BUCKET_BYTES, Bucket, Reduction, stage_buckets
from gpipe.distributed.replicas import Replicas, merge_replicas, replica_share
from gpipe.distributed.shapes import check_boundaries
from gpipe.distributed.sharded import Sharded, check_zero, meta_twin
from gpipe.distributed.start import Told, exchange, fingerprint, seed_from, structure_from
from gpipe.distributed.wire import Links, Wire
from gpipe.frontend import Arguments, FrontEnd
from gpipe.interpreter.pipeline import Pipeline
from gpipe.interpreter.recorder import Recorder
from gpipe.interpreter.worker import Step, Worker
from gpipe.loss import LossPlan, loss_plan, reduction_of
from gpipe.microbatch import as_tensors, scatter
from gpipe.schedule import Op, Schedule, Task
from gpipe.schedule.timeline import Timeline
from gpipe.transport.base import DRIVER, Message
from gpipe.transport.routes import loss_key
from gpipe.transport.structure import Structure, structure_of

__all__ = ["DistributedGPipe"]


class DistributedGPipe(FrontEnd):
    """This rank's part of a pipeline over the ranks of a process group (one schedule device per rank).

    Args:
        module: the model, an ``nn.Sequential``; every rank builds it alike, on ``meta`` for a model too large for
            one process (each rank materialises only its layers: Note [materialised weights]).
        balance: layers per stage; ``len(balance)`` stages on the group's ranks, one each, or by the schedule's
            layout (``"interleaved-1f1b"``, ``"looped-bfs"``, ``"dualpipe-v"``) several per rank.
        chunks, checkpoint, schedule, deferred_batch_norm, record: as :class:`gpipe.GPipe`'s; a given
            :class:`~gpipe.schedule.Schedule` runs its device ``d`` on rank ``d``, so it has a device per rank (Note
            [a given schedule] in :mod:`gpipe.frontend`).
        group: the process group; ``None``: the default one, started from torchrun's environment if need be.
        device: this rank's device; ``None``: ``cuda:LOCAL_RANK`` where CUDA is available, else the CPU.
        timeout: seconds any wait for another rank may last before the step fails on every rank.
        seed, init: how ``meta`` layers are initialised (Note [materialised weights]).
        lookahead: receives posted ahead per peer (Note [receives posted ahead] in :mod:`gpipe.distributed.wire`).
        check_shapes: before the first step of each input structure, run the whole model on fake tensors on every
            rank to refuse a shape mismatch between stages (Note [a dry run on fake tensors]); ``False`` for a
            model whose forwards must run only on real data.
        data_parallel: replicas of the pipeline, ``dp``: the world (the default group's, started from torchrun's
            environment if need be; not with ``group=``) is a ``(pp, dp)`` mesh; each replica reads its own batch
            (Note [a replica's batch]) and each stage's gradients are summed over its replicas in buckets during the
            backward (Note [buckets as DDP fills them] in :mod:`gpipe.distributed.reduction`). ZeRO-1 is torch's
            ``ZeroRedundancyOptimizer(pipe.parameters(), ..., process_group=pipe.replicas.group)``.
        bucket_bytes: the most bytes of gradients one reduction moves (DDP's default, 25 MiB).
        zero: ``3``: each stage sharded over its replicas by torch's FSDP2 (ZeRO-3: ``fully_shard`` on each layer
            with parameters, then the stage; :mod:`gpipe.distributed.sharded`), so ``parameters()`` are ``DTensor``
            shards and gradients are reduce-scattered after the stage's last ``B``; ``0``: replicated.
        reshard_after_forward: with ``zero=3``, gather each layer again for its backward (FSDP's default), or keep
            it gathered from the stage's first forward of a step to its last backward.

    Raises:
        ValueError: on every rank, for a bad balance, chunks, checkpoint mode or schedule, or a number of stages
            the schedule cannot place on the group's ranks (a given schedule: other than one device per rank); a
            ``data_parallel`` that does not divide the world, or given with ``group=``; ``zero=3`` without replicas
            or with a schedule that splits the backward (Note [split backward and FSDP]).
        ScheduleError: on every rank, for a given schedule that is not valid.
    """

    def __init__(self, module: nn.Sequential, balance: Sequence[int], *, chunks: int | None = None,
                 checkpoint: str | None = None, schedule: str | Schedule = "gpipe", deferred_batch_norm: bool = False,
                 record: bool = False, group: Any = None, device: torch.device | str | None = None,
                 timeout: float = 300.0, seed: int = 0, init: Init | None = None, lookahead: int = 2,
                 check_shapes: bool = True, data_parallel: int = 1, bucket_bytes: int = DDP_BUCKET_BYTES,
                 zero: int = 0, reshard_after_forward: bool = True) -> None:
        super().__init__()
        # Note [one front-end] in gpipe.frontend: every argument checked before the group is joined, then placed on
        # its ranks; this rank holds only its own stages' layers
        arguments = Arguments.check("DistributedGPipe", module, balance, chunks=chunks, checkpoint=checkpoint,
                                    schedule=schedule, deferred_batch_norm=deferred_batch_norm)
        self.kind = arguments.kind
        self.skip_layout = arguments.skip_layout
        self.record = record
        if not timeout > 0:
            raise ValueError(f"timeout is in seconds and positive, got {timeout!r}")
        for name, value in (("data_parallel", data_parallel), ("bucket_bytes", bucket_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        check_zero(zero, data_parallel, reshard_after_forward, arguments)
        if arguments.copies > 1 and data_parallel > 1:  # Note [mirrored stages] in gpipe.distributed.mirrors
            raise ValueError(f"schedule {arguments.schedule_name!r} runs {arguments.copies} copies of the stages, "
                             "which DistributedGPipe runs without data_parallel")
        if data_parallel > 1 and group is not None:
            raise ValueError("data_parallel > 1 lays the default group's world out as a (pp, dp) mesh: "
                             "leave group= out")
        self.replicas: Replicas | None = None
        if data_parallel == 1:
            self.ranks: Ranks = join(group, device, timeout)
        else:
            self.replicas = Replicas.start(data_parallel, rank_device(device), timeout)
            self.ranks = join(self.replicas.pipeline_group, device, timeout, pipelines=self.replicas.pipelines,
                              named_over=self.replicas.control)
        spec = self._take(arguments.on_ranks(self.ranks.world))
        self.placement = spec.placement
        stages, partitions = spec.stage_layers(), []
        starts = [sum(len(layers) for layers in stages[:s]) for s in range(len(stages))]  # each stage's first layer
        for j, rank_of in enumerate(self.placement):  # a partition per slot (Note [stage slots] in gpipe.schedule)
            s, mine = j % len(stages), rank_of == self.rank
            # a second copy: the same layers, materialised alike (Note [mirrored stages] in gpipe.distributed.mirrors)
            layers = copy.deepcopy(stages[s]) if mine and j >= len(stages) else stages[s]
            for index, layer in enumerate(layers.values() if mine else (), start=starts[s]):
                materialize_layer(layer, index, self.device, seed, init)
            partitions.append(nn.Sequential(layers if mine else OrderedDict()))
        self.partitions = nn.ModuleList(partitions)
        # the dry run's (Note [a step's start]); a layer to be sharded runs as its meta twin
        self._layers = [meta_twin(layer) if zero and self.placement[j] == self.rank else layer
                        for j, ls in enumerate(stages) for layer in ls.values()]
        self._checked: set[int] = set()  # fingerprints of input structures checked (Note [one exchange a step])
        self.check_shapes = check_shapes
        self.pipeline = Pipeline.of(partitions, [self.device] * len(partitions), self.skip_layout)
        self.sharded = None if self.replicas is None or not zero else Sharded(
            {j: partitions[j] for j in self.stages}, self.replicas.mesh["dp"],
            [ranks[self.rank] for ranks in self.replicas.pipelines], reshard_after_forward)
        self.buckets: dict[int, list[Bucket]] = {  # with zero=3 the Reduction sums the step's loss alone
            j: stage_buckets(j, partitions[j], bucket_bytes)
            for j in self.stages} if self.replicas is not None and self.sharded is None else {}
        alarm = Alarm(self.ranks.store, self.ranks.watcher, self.world_rank, timeout,
                      peers="" if self.replicas is None else self.replicas.peers)
        self.links = Links(self.ranks, alarm, lookahead)
        self.mirrors = Mirrors(self.schedule, self.rank, self.ranks.group) if arguments.copies > 1 else None
        self.timeline: Timeline | None = None
        self.failure: str | None = None

    @property
    def rank(self) -> int:
        return self.ranks.rank

    @property
    def world_rank(self) -> int:
        """This rank in the world: :attr:`rank` (this replica's schedule device) where there are no replicas."""
        return self.rank if self.replicas is None else self.replicas.rank

    @property
    def everyone(self) -> tuple[Any, int]:
        """A gloo group of every rank and its size: the pipeline's ranks, or with replicas the world."""
        if self.replicas is None:
            return self.ranks.control, self.ranks.world
        return self.replicas.control, self.replicas.world

    @property
    def device(self) -> torch.device:
        return self.ranks.device

    @property
    def stages(self) -> list[int]:
        """The stages this rank runs."""
        return self.spec.stages_on(self.rank)

    def close(self) -> None:
        """Stop this rank's helper threads (the pipeline cannot step afterwards)."""
        self.links.close()
        self.failure = self.failure or "this pipeline was closed"

    # -- a step -----------------------------------------------------------------------------------------

    def step(self, input: Any, target: Any, loss_fn: Callable[..., Tensor], *,
             loss_reduction: str | None = None) -> Tensor:
        """Forward and backward of one mini-batch on every rank, by the schedule (as :meth:`gpipe.GPipe.step`).

        Every rank calls it: ``input`` is read on the first stage's rank and ``target`` on the last stage's (the
        other ranks may pass ``None``); with DualPipe, whose two copies start and end on the first and the last rank,
        both read both (the same batch), each feeding its half (Note [mirrored stages] in
        :mod:`gpipe.distributed.mirrors`). The loss is the plain model's on the whole batch, as in
        :meth:`gpipe.GPipe.step` (``loss_reduction`` too; Note [an exact loss] in :mod:`gpipe.loss`). Gradients
        accumulate into this rank's parameters, and into an input that requires grad on the first stage's rank.

        Returns:
            The mini-batch's loss (detached), on every rank, on its device.

        Raises:
            ValueError, TypeError: bad input, on every rank before anything is sent (Note [a step's start]).
            PipelineFailed: a task failed on some rank, a rank died or a wait passed the timeout; the message
                names the rank, stage and task and holds the original traceback. The pipeline is unusable after.
        """
        if self.failure is not None:
            raise PipelineFailed(f"this pipeline failed in an earlier step, so its ranks are out of step: build a "
                                 f"new DistributedGPipe (the failure: {self.failure.splitlines()[0]})")
        schedule, batches, targets, rows, seed, plan = self._start(input, target, loss_fn, loss_reduction)
        try:
            return self._run(schedule, batches, targets, rows, seed, plan)
        except PipelineFailed as failed:
            self.failure = str(failed)
            raise

    def _start(self, input: Any, target: Any, loss_fn: Callable[..., Tensor],
               loss_reduction: str | None) -> tuple[Any, ...]:
        """Note [a step's start]: check, exchange, then the same schedule or the same error on every rank."""
        n, rank, copies = len(self.balance), self.rank, self.spec.arguments.copies
        first, last = self.placement[0], self.placement[n - 1]
        # the ranks of each copy's first and last stage (Note [stage slots] in gpipe.schedule): DualPipe's two ends
        starts = {self.placement[c * n] for c in range(copies)}
        ends = {self.placement[c * n + n - 1] for c in range(copies)}
        batches: list[tuple[Tensor, ...]] = []
        targets: list[tuple[Tensor, ...]] = []
        rows_here: list[int] | None = None
        structure: Structure | None = None
        is_tuple, target_rows_here, error, own = False, None, None, None
        plan: LossPlan | None = None  # on the last stage's rank, which computes the loss
        try:
            if not torch.is_grad_enabled():
                raise RuntimeError("pipe.step trains: call it with grad enabled (not under torch.no_grad())")
            reduction = reduction_of(loss_fn, loss_reduction)
            if rank in starts:
                is_tuple, tensors = as_tensors(input, "the input")
                batches = [tuple(t.to(self.device) for t in b) for b in scatter(tensors, self.chunks)]
                rows_here = [b[0].size(0) for b in batches]
                structure = structure_of(list(batches[0]), is_tuple)
            if rank in ends:
                _, whole = as_tensors(target, "the target")
                target_rows_here = whole[0].size(0)
                targets = [tuple(t.to(self.device) for t in b) for b in scatter(whole, self.chunks)]
                plan = loss_plan(loss_fn, reduction, whole, [b[0].size(0) for b in targets])
                if self.replicas is not None:
                    plan = replica_share(plan, reduction, whole, self.replicas.dp)
        except (TypeError, ValueError, RuntimeError) as rejected:
            own, error = rejected, f"{type(rejected).__name__}: {rejected}"
        mine = Told(rejected=error is not None, may_draw=any(p is None or p for p in self.pipeline.draws.plan()),
                    rows=rows_here, fingerprint=0 if structure is None else fingerprint(structure),
                    input_is_tuple=is_tuple, target_rows=target_rows_here)
        control, replicas = self.ranks.control, self.replicas
        told, texts = exchange(mine, error, self.chunks, *self.everyone)  # Note [one exchange a step]
        for r, text in enumerate(texts):
            if text is not None:
                if own is not None:
                    raise own
                raise ValueError(f"rank {r} rejected the step's input: {text}")
        if replicas is not None:  # Note [a replica's batch]: each replica's batch alike
            batches_rows = [told[ranks[first]].rows for ranks in replicas.pipelines]
            if any(other != batches_rows[0] for other in batches_rows):
                raise ValueError(f"the replicas' batches differ in micro-batch rows ({batches_rows}): give every "
                                 "replica a batch of the same size (as DistributedSampler does)")
            told = [told[g] for g in replicas.pipelines[replicas.replica]]
        rows, target_rows = told[first].rows, told[last].target_rows
        assert rows is not None and target_rows is not None
        for r, what, ref in [(r, "input", first) for r in sorted(starts) if told[r].rows != rows] + \
                [(r, "target", last) for r in sorted(ends) if told[r].target_rows != target_rows]:
            raise ValueError(f"ranks {sorted(starts | ends)} each read the input and the target of schedule "
                             f"{self.schedule_name!r}, whose copies start and end on them, but rank {r}'s {what} "
                             f"differs from rank {ref}'s: give them the same batch")
        if target_rows != sum(rows):
            raise ValueError(f"the target's batch size {target_rows} (rank {last}) differs from the input's "
                             f"{sum(rows)} (rank {first})")
        if self.check_shapes and told[first].fingerprint not in self._checked:  # Note [a dry run on fake tensors]
            check_boundaries(self._layers, self.balance, structure_from(first, structure, control))
            self._checked.add(told[first].fingerprint)
        schedule = self.schedule_for(len(rows), self.checkpoint if self.training else "never")
        seed = 0
        if any(t.may_draw for t in told):
            seed = seed_from(first, rng.step_seed() if rank == first else 0, control)
        self._input_is_tuple = told[first].input_is_tuple
        return schedule, batches, targets, rows, seed, plan

    def _run(self, schedule: Schedule, batches: list[tuple[Tensor, ...]], targets: list[tuple[Tensor, ...]],
             rows: list[int], seed: int, plan: LossPlan | None) -> Tensor:
        rank, n, alarm = self.rank, schedule.n, self.links.alarm
        pipeline = self.pipeline
        draw_plan = pipeline.draws.plan()
        drew: list[set[int]] = [set() for _ in range(n)]
        recorder = Recorder(pipeline if self.sharded is None else self.sharded.recorded(pipeline), schedule,
                            torch.get_num_threads(), [self.device] * schedule.num_devices) if self.record else None
        clock = (time.time(), time.perf_counter())
        wire = Wire(self.links, schedule, self.skip_layout, rows, record=recorder is not None)
        gradients = Gradients(list(self.partitions), pipeline.split_plans)  # plans learnt in earlier steps kept
        step = Step(pipeline, schedule, True, recorder, draw_plan, seed, drew, gradients, plan)
        worker = Worker(step, rank, self.device, wire)
        reduction = None if self.replicas is None else Reduction(
            self.replicas.group, [ranks[rank] for ranks in self.replicas.pipelines], schedule, rank, self.buckets,
            alarm, recorder)
        if self.sharded is not None:
            self.sharded.begin(schedule, rank, alarm, recorder)
        for i, batch in enumerate(batches):  # those whose route starts here (Note [stage slots] in gpipe.schedule)
            if self.placement[j := schedule.route(i)[0]] == rank:
                wire.send(j, (Task(Op.F, i, j), "input"), Message(batch, self._input_is_tuple))
        for i, target in enumerate(targets):
            if self.placement[j := schedule.route(i)[-1]] == rank:
                wire.send(j, (Task(Op.F, i, j), "target"), Message(target, len(target) > 1))
        checkpoints = any(schedule.is_checkpointed(i) for i in range(schedule.m))
        outside = rng.outside_state() if checkpoints else None
        where = "the start of the step"
        try:
            for k, task in enumerate(schedule.tasks[rank]):
                alarm.check()
                where = f"stage {task.stage}, task {task}"
                if reduction is not None:
                    reduction.before(k, task)
                if self.sharded is not None:
                    self.sharded.before(k, task)
                worker.run(task)
                wire.flush(task)
                if reduction is not None:
                    reduction.after(k, task)
            if self.mirrors is not None:
                where = "the sum of the mirrored stages' gradients"
                self.mirrors.reduce(self.partitions, alarm, recorder, schedule.tasks[rank][-1])
            where = "the end of the step"
            if schedule.copies > 1:
                loss = self._gathered_loss(wire, schedule, plan)
            elif self.placement[n - 1] == rank:
                assert plan is not None
                losses = [wire.receive(DRIVER, (Task(Op.F, i, n - 1), "loss")).tensors[0]
                          for i in range(schedule.m)]
                loss = plan.total(cast(list[Tensor], losses))
                if reduction is not None:  # Note [a replica's batch]
                    loss = reduction.total(loss, Task(Op.F, schedule.m - 1, n - 1))
                wire.send_loss(loss)
            else:
                got = wire.receive(self.stages[0], loss_key(schedule)).tensors[0]
                assert got is not None
                loss = got
            if any(t.requires_grad for b in batches for t in b):  # the input's gradient, as loss.backward() leaves it
                here = [(i, j) for i in range(len(batches)) if self.placement[j := schedule.route(i)[0]] == rank]
                pairs = [(t, g) for i, j in here
                         for t, g in zip(batches[i], wire.receive(DRIVER, (Task(Op.B, i, j), "input-grad")).tensors,
                                         strict=True)
                         if g is not None and t.requires_grad]
                torch.autograd.backward([t for t, _ in pairs], [cast(Tensor, g) for _, g in pairs])
            if reduction is not None:
                reduction.finish()
            wire.finish()
            if outside is not None:
                rng.check_outside(outside)
        except PipelineFailed:
            raise
        except BaseException as error:
            text = report(self.world_rank, where, error)
            alarm.fail(text)
            raise PipelineFailed(text) from error
        finally:
            worker.release()
            if reduction is not None:
                reduction.close()
            if self.sharded is not None:
                self.sharded.end()
        for partition in self.partitions:
            DeferredBatchNorm.commit_all(partition)
        pipeline.draws.learn(draw_plan, drew)
        if recorder is not None:
            timeline = recorder.timeline()
            timeline.meta.update(rank=rank, world_size=self.ranks.world,
                                 clock={"unix": clock[0], "perf_counter": clock[1], "perf_counter_t0": recorder.t0})
            self.timeline = timeline
            self._recorded = {"timeline": timeline.to_dict(), "t0": recorder.t0, "transfers": wire.transfers}
        return loss.detach()

    def _gathered_loss(self, wire: Wire, schedule: Schedule, plan: LossPlan | None) -> Tensor:
        """The step's loss where the copies' routes end on several ranks: each sends the scaled losses of its
        micro-batches to all, and every rank sums them in micro-batch order, as :meth:`LossPlan.total` does on one
        (Note [an exact loss] in :mod:`gpipe.loss`)."""
        mine = {i: wire.receive(DRIVER, (Task(Op.F, i, j), "loss")).tensors[0].detach().cpu()  # type: ignore[union-attr]
                for i in range(schedule.m) if self.placement[j := schedule.route(i)[-1]] == self.rank}
        parts: list[Any] = [None] * self.ranks.world
        dist.all_gather_object(parts, (mine, plan is not None and plan.undefined), group=self.ranks.control)
        losses = {i: loss for part, _ in parts for i, loss in part.items()}
        total = torch.stack([losses[i] for i in range(schedule.m)]).sum()
        return (total * float("nan") if any(undefined for _, undefined in parts) else total).to(self.device)

    def gather_timeline(self, rounds: int = 8) -> Timeline | None:
        """The last recorded step of every rank as one timeline on rank 0's clock (Note [one time base]).

        Every rank calls it after a step with ``record=True``; rank 0 gets the timeline, the others ``None``.
        Device ``d`` is rank ``d`` (with replicas: replica ``r``'s schedule device ``d`` is device ``r * pp + d``,
        :func:`gpipe.distributed.replicas.merge_replicas`); a transfer between ranks is a copy span on the receiving
        rank; ``meta["clock"]`` holds the offsets removed and the residual (seconds) within which two ranks' times
        compare.

        Raises:
            RuntimeError: on every rank, when some rank recorded no step (build with ``record=True`` and step).
        """
        part = getattr(self, "_recorded", None)
        replicas = self.replicas
        control, world = self.everyone
        parts: list[Any] = [None] * world
        dist.all_gather_object(parts, part, group=control)
        missing = [r for r, p in enumerate(parts) if p is None]
        if missing:
            raise RuntimeError(f"ranks {missing} recorded no step to gather: build DistributedGPipe(..., "
                               "record=True) and call step() on every rank first")
        offsets = measure_offsets(control, self.world_rank, world, rounds)
        if self.world_rank != 0:
            return None
        return merge(parts, offsets) if replicas is None else merge_replicas(parts, offsets, replicas.pipelines)
