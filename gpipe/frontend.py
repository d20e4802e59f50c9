"""The front-end: one construction of a pipeline from its arguments, for GPipe and DistributedGPipe alike.

:class:`gpipe.GPipe` (threads) and :class:`gpipe.distributed.DistributedGPipe` (processes) both build through it::

    Arguments.check(owner, module, balance, chunks=, checkpoint=, schedule=, deferred_batch_norm=)
        |   every argument checked; no device, process or layer touched yet
        +-- .on_devices(p)      GPipe: the number of devices given (or None)
        +-- .on_ranks(world)    DistributedGPipe: the group's size, once joined
        v
    PipelineSpec    placement; schedule(m), built once per shape; stage_layers()
        |
        v
    FrontEnd        the module both executors are: the spec, balance, chunks, checkpoint; schedule_for(m)

Note [one front-end]: what a pipeline is (its layers cut by the balance, ``chunks``, the checkpoint policy, the
schedule, a registered name with its options or a given :class:`Schedule`, where each stage goes, and the schedule
of each step) is decided here, once, for both executors; they differ only in how tensors cross between stages
(threads or processes) and in which stages' layers each one holds. It comes in two steps because the device count is
the one input the two learn differently: ``GPipe`` from ``devices``, ``DistributedGPipe`` from the process group,
which it joins only once its arguments are known to be good. So a bad argument is refused, with the same message
from both, before any device, process or layer is touched.

Note [a device count]: ``GPipe`` takes a device per stage, or one per schedule device where those are fewer, so a
schedule registered with a layout places the stages by it only when given fewer devices than stages; otherwise each
generated schedule keeps its generator's own placement (one stage per device, or the V of ``"zb-v"``). A
``DistributedGPipe`` rank is one schedule device, so the layout always places the stages on the group's ranks, and a
count it cannot use is refused.

Note [a given schedule]: a :class:`Schedule` given in place of a name is the step itself: its stages (each copy's, Note
[stage slots] in :mod:`gpipe.schedule.schedule`) are the partitions, its placement places them, its ``m`` and policy are
``chunks`` and ``checkpoint``, which default to them and, given, must agree (one source for each decision). It is
validated when the pipeline is built, so a deadlock is a ScheduleError then, not a hang; a batch of fewer than ``m``
micro-batches is refused, as it has no other shape. Eval mode runs it without its ``R`` tasks (only its own ``B`` waits
for one, so the lists stay valid), and inference GPipe's forwards on its placement, for any batch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from gpipe.batchnorm import DeferredBatchNorm
from gpipe.checks import check_balance, check_chunks, check_unique
from gpipe.schedule import CHECKPOINT_MODES, Checkpoint, Op, Schedule, ScheduleKind, schedule_kind
from gpipe.skip.layout import SkipLayout

__all__ = ["Arguments", "FrontEnd", "PipelineSpec", "forwards_first", "given_schedule", "rank_counts",
           "stage_placement", "step_schedule"]


@dataclass(frozen=True)
class Arguments:
    """A pipeline's arguments, checked, before its devices are counted (build it with :meth:`check`).

    Attributes:
        module: the model; its children are the layers that ``balance`` counts.
        balance: layers per stage.
        chunks: micro-batches per mini-batch (a given schedule's ``m``).
        checkpoint: the checkpoint policy (a given schedule's).
        schedule_name: the registered name, options included, or the given schedule's name.
        given: the schedule given in place of a name (Note [a given schedule]); ``None`` for a name.
        kind: the registered schedule a name picks, its options bound; ``None`` for a given schedule.
        skip_layout: the stage of each skip connection's stash and pop.
        deferred_batch_norm: whether :meth:`PipelineSpec.stage_layers` replaces batch norm by
            :class:`gpipe.DeferredBatchNorm`.
    """

    module: nn.Sequential
    balance: tuple[int, ...]
    chunks: int
    checkpoint: Checkpoint
    schedule_name: str
    given: Schedule | None
    kind: ScheduleKind | None
    skip_layout: SkipLayout
    deferred_batch_norm: bool

    @classmethod
    def check(cls, owner: str, module: nn.Sequential, balance: Sequence[int] | None, *, chunks: int | None,
              checkpoint: str | None, schedule: str | Schedule, deferred_batch_norm: bool) -> Arguments:
        """The arguments of ``owner`` (``"GPipe"``, ``"DistributedGPipe"``: the name its errors give), checked.

        Raises:
            TypeError: ``module`` is not an ``nn.Sequential``; ``balance`` is not a list.
            ValueError: duplicate layers; a bad balance, ``chunks``, checkpoint mode or schedule name; a given
                schedule whose stages, ``m`` or policy disagree with the balance, ``chunks`` or ``checkpoint``.
            RuntimeError: invalid skip connections (see :func:`gpipe.skip.verify_skippables`).
            ScheduleError: a given schedule is not valid (a deadlock shows its grid).
            ValueError: a schedule of copies of the stages with skip connections or batch norm (Note [one model,
                two copies] in :mod:`gpipe.interpreter.copies`).
        """
        if not isinstance(module, nn.Sequential):
            raise TypeError(f"{owner} partitions an nn.Sequential, got {type(module).__name__}: wrap the layers in "
                            "nn.Sequential(...) (one child per layer)")
        check_unique(module)
        stages = check_balance(balance, len(module))
        # Note [a given schedule]: a Schedule decides chunks and checkpoint; a name takes them
        given, chunks, policy = given_schedule(schedule, len(stages), chunks, checkpoint)
        name = cast(str, schedule) if given is None else given.name
        kind = schedule_kind(name) if given is None else None  # a registered name (SCHEDULES), else a ValueError
        layout = SkipLayout.of(list(module), stages)
        copies = given.copies if given is not None else cast(ScheduleKind, kind).copies
        if copies > 1:
            _refuse_for_copies(name, copies, module, stages, layout)
        return cls(module, tuple(stages), chunks, policy, name, given, kind, layout, deferred_batch_norm)

    @property
    def stages(self) -> int:
        """The number of stages (one partition each)."""
        return len(self.balance)

    @property
    def copies(self) -> int:
        """The copies of the stages the schedule runs (DualPipe's two directions; Note [stage slots] in
        :mod:`gpipe.schedule.schedule`): each stage's partition, and ``copies - 1`` copies of it."""
        return self.given.copies if self.given is not None else cast(ScheduleKind, self.kind).copies

    @property
    def slots(self) -> int:
        """The schedule's stages, ``copies x stages``: one partition each (Note [stage slots])."""
        return self.copies * self.stages

    def on_devices(self, devices: int | None) -> PipelineSpec:
        """The pipeline on ``devices`` devices as :class:`gpipe.GPipe` places it (Note [a device count]): a given
        schedule on its own placement, a name by its layout for fewer devices than stages; ``None``: not counted."""
        if self.given is not None:
            return PipelineSpec(self, self.given.placement, self.given.placement)
        assert self.kind is not None
        layout, placement = _placed(self.kind, self.slots, devices, self.chunks, self.checkpoint)
        return PipelineSpec(self, layout, placement)

    def on_ranks(self, world: int) -> PipelineSpec:
        """The pipeline on the ``world`` ranks of a process group, one schedule device each, as
        :class:`gpipe.distributed.DistributedGPipe` places it (Note [a device count]).

        Raises:
            ValueError: a given schedule of other than ``world`` devices, or a name whose layout cannot place the
                stages on ``world`` devices (the message names the fix).
        """
        n = self.slots
        if self.given is not None:
            if self.given.num_devices != world:
                p = self.given.num_devices
                raise ValueError(f"schedule {self.schedule_name!r} runs on {p} devices, a rank each, but the group has "
                                 f"{world} ranks: launch {p} processes (e.g. torchrun --nproc-per-node {p}), or "
                                 f"give a schedule of {world} devices")
            return PipelineSpec(self, self.given.placement, self.given.placement)
        assert self.kind is not None
        try:
            placement = self.kind.layout(n, world)
        except ValueError as error:
            counts = [p for p in rank_counts(self.kind, n) if p > 1] or rank_counts(self.kind, n)
            fix = f"launch {_either(counts)} processes (e.g. torchrun --nproc-per-node {counts[-1]}) or change the " \
                "balance" if counts else "change the balance"
            raise ValueError(f"balance {list(self.balance)} makes {n} stages, which schedule {self.schedule_name!r} "
                             f"cannot place on {world} ranks: {error} ({fix})") from None
        return PipelineSpec(self, placement, placement)


@dataclass(frozen=True)
class PipelineSpec:
    """A pipeline's arguments placed: where each stage goes and the schedule of each step (Note [one front-end]).

    Attributes:
        arguments: the checked arguments.
        layout: the placement each generated schedule is given; ``None``: its generator's own (Note [a device
            count]).
        placement: each stage's schedule device.
    """

    arguments: Arguments
    layout: tuple[int, ...] | None
    placement: tuple[int, ...]
    _schedules: dict[tuple[int, str, str | None], Schedule] = field(default_factory=dict, init=False, repr=False,
                                                                    compare=False)

    def schedule(self, m: int, checkpoint: str | None = None, name: str | None = None) -> Schedule:
        """The schedule a step of ``m`` micro-batches runs under ``checkpoint`` (default: the pipeline's), one stage
        per partition (of each copy the schedule runs, :attr:`Arguments.slots`): the registered ``name``'s, by
        default the pipeline's; a given schedule for its own ``m`` only (Note [a given schedule]). Built and
        validated once per ``(m, checkpoint, name)``.

        Raises:
            ValueError: ``m`` differs from a given schedule's ``m``; a ``checkpoint`` a given schedule cannot run.
            ScheduleError: the generator built a schedule that is not valid.
        """
        args = self.arguments
        mode = args.checkpoint if checkpoint is None else checkpoint
        kind = None if name is None and args.given is not None else args.schedule_name if name is None else name
        key = (m, mode, kind)  # kind None: the given schedule
        if key not in self._schedules:
            if kind is None:
                assert args.given is not None
                schedule = step_schedule(args.given, m, mode)
            else:
                generator = args.kind if kind == args.schedule_name and args.kind is not None else schedule_kind(kind)
                n = generator.copies * args.stages
                schedule = generator(m, n, cast(Checkpoint, mode), self.layout).validate()
            self._schedules[key] = schedule
        return self._schedules[key]

    def stages_on(self, device: int) -> list[int]:
        """The stages placed on schedule device ``device`` (a rank of ``DistributedGPipe``)."""
        return [j for j, d in enumerate(self.placement) if d == device]

    def stage_layers(self) -> list[OrderedDict[str, nn.Module]]:
        """Each stage's layers by name, batch norm replaced by :class:`gpipe.DeferredBatchNorm` where asked.

        The replacement changes the module in place (as ``nn.SyncBatchNorm``'s conversion does), so an executor
        asks for the layers once every argument of its own is checked too.
        """
        args = self.arguments
        module = DeferredBatchNorm.convert_deferred_batch_norm(args.module, args.chunks) \
            if args.deferred_batch_norm else args.module
        named, layers, k = list(module.named_children()), [], 0
        for size in args.balance:
            layers.append(OrderedDict(named[k:k + size]))
            k += size
        return layers



class FrontEnd(nn.Module):
    """The module :class:`gpipe.GPipe` and :class:`gpipe.distributed.DistributedGPipe` both are: a placed
    :class:`PipelineSpec` and the schedule of each step, asked the same way of either (Note [one front-end]). Each
    executor adds its transport and the stages it holds.

    Attributes:
        spec: the arguments, checked and placed.
        balance: layers per stage.
        chunks: micro-batches per mini-batch.
        checkpoint: the checkpoint policy of a training step.
        schedule_name: the registered name (options included), or a given schedule's name.
    """

    spec: PipelineSpec

    def _take(self, spec: PipelineSpec) -> PipelineSpec:
        """Keep ``spec`` and what a user reads of it; an executor's ``__init__`` calls it once."""
        self.spec = spec
        self.balance = list(spec.arguments.balance)
        self.chunks = spec.arguments.chunks
        self.checkpoint = spec.arguments.checkpoint
        self.schedule_name = spec.arguments.schedule_name
        return spec

    def schedule_for(self, m: int, checkpoint: str | None = None, name: str | None = None) -> Schedule:
        """The schedule a step of ``m`` micro-batches runs (one stage per partition; device ``d`` is rank ``d`` of a
        ``DistributedGPipe``): the registered ``name``'s, by default this pipeline's; a given schedule for its own
        ``m`` only (Note [a given schedule]).

        Raises:
            ValueError: ``m`` differs from a given schedule's ``m``.
        """
        return self.spec.schedule(m, self.checkpoint if checkpoint is None else checkpoint, name)

    @property
    def schedule(self) -> Schedule:
        """The schedule of a full training step: ``chunks`` micro-batches, this pipeline's checkpoint mode."""
        return self.schedule_for(self.chunks)


def rank_counts(kind: ScheduleKind, stages: int) -> list[int]:
    """The numbers of ranks (one schedule device each) on which ``kind``'s layout places ``stages`` stages, as
    :class:`gpipe.distributed.DistributedGPipe` places them (Note [a device count]); the hint of a refusal."""
    counts = []
    for p in range(1, stages + 1):
        try:
            kind.layout(stages, p)
        except ValueError:
            continue
        counts.append(p)
    return counts


def stage_placement(schedule: str | Schedule, stages: int, devices: int | None, chunks: int,
                    checkpoint: Checkpoint) -> tuple[int, ...]:
    """Each stage's schedule device when :class:`gpipe.GPipe` runs ``stages`` stages by ``schedule`` (a registered
    name, or a :class:`Schedule` run as it is) on ``devices`` devices (Note [a device count]), without a model.

    Raises:
        ValueError: an unknown schedule name; a layout that cannot place ``stages`` on fewer ``devices``.
    """
    if isinstance(schedule, Schedule):
        return schedule.placement
    return _placed(schedule_kind(schedule), stages, devices, chunks, checkpoint)[1]


def _placed(kind: ScheduleKind, stages: int, devices: int | None, chunks: int,
            checkpoint: Checkpoint) -> tuple[tuple[int, ...] | None, tuple[int, ...]]:
    """``(layout, placement)`` of ``stages`` stages on ``devices`` devices by ``kind`` (Note [a device count])."""
    layout = kind.layout(stages, devices) if kind.place is not None and devices is not None and devices < stages \
        else None
    return layout, kind(chunks, stages, checkpoint, layout).placement


def given_schedule(schedule: str | Schedule, stages: int, chunks: int | None,
                   checkpoint: str | None) -> tuple[Schedule | None, int, Checkpoint]:
    """``(given, chunks, checkpoint)`` a pipeline runs: for a name, ``None`` and the arguments checked (defaults 1
    and ``"except_last"``); for a :class:`Schedule`, the schedule validated and its ``m`` and policy (Note [a given
    schedule]).

    Raises:
        ValueError: a bad ``chunks`` or policy; a schedule of other than ``stages`` stages, or whose ``m`` or policy
            differs from a ``chunks`` or ``checkpoint`` given.
        ScheduleError: the schedule is not valid (a deadlock shows its grid).
    """
    if chunks is not None or not isinstance(schedule, Schedule):
        chunks = check_chunks(1 if chunks is None else chunks, stages)  # a size this machine can build
    if checkpoint is not None and checkpoint not in CHECKPOINT_MODES:
        raise ValueError(f"unknown checkpoint mode {checkpoint!r}; use one of {', '.join(CHECKPOINT_MODES)}")
    if not isinstance(schedule, Schedule):
        assert chunks is not None
        return None, chunks, "except_last" if checkpoint is None else cast(Checkpoint, checkpoint)
    schedule.validate()
    name = schedule.name
    if schedule.stages != stages:
        raise ValueError(f"schedule {name!r} has {schedule.stages} stages, but the balance makes {stages} partitions: "
                         f"give a balance of {schedule.stages} partitions, or a schedule of {stages} stages")
    if chunks is not None and chunks != schedule.m:
        raise ValueError(f"chunks={chunks}, but schedule {name!r} runs m={schedule.m} micro-batches: leave chunks out "
                         f"(it defaults to the schedule's m) or give chunks={schedule.m}")
    if checkpoint is not None and checkpoint != schedule.checkpoint:
        raise ValueError(f"checkpoint={checkpoint!r}, but schedule {name!r} was built for checkpoint="
                         f"{schedule.checkpoint!r} (its recomputes are tasks of its lists): leave checkpoint out (it "
                         "defaults to the schedule's) or build the schedule with the policy you want")
    return schedule, schedule.m, schedule.checkpoint


def step_schedule(given: Schedule, m: int, checkpoint: str) -> Schedule:
    """What a training step of ``m`` micro-batches under ``checkpoint`` runs by the ``given`` schedule: itself, or
    itself without its ``R`` tasks where ``checkpoint`` is ``"never"`` (eval mode; Note [a given schedule]).

    Raises:
        ValueError: ``m`` is not the schedule's (a batch smaller than its ``m`` samples), or ``checkpoint`` is
            neither its policy nor ``"never"``.
    """
    if m != given.m:
        raise ValueError(f"this batch splits into {m} micro-batches, but schedule {given.name!r} is fixed to "
                         f"m={given.m}: give batches of at least {given.m} samples (drop a last small one, e.g. "
                         "DataLoader(..., drop_last=True)), or build the pipeline with a registered schedule's name, "
                         "which fits any batch")
    if checkpoint == given.checkpoint:
        return given
    if checkpoint != "never":
        raise ValueError(f"schedule {given.name!r} was built for checkpoint={given.checkpoint!r}; a step runs it so, "
                         f"or without its recomputes (checkpoint='never'), not with checkpoint={checkpoint!r}")
    tasks = tuple(tuple(t for t in ts if t.op is not Op.R) for ts in given.tasks)
    pairs = tuple((a, b) for a, b in given.pairs if Op.R not in (a.op, b.op))
    return Schedule(given.m, given.n, "never", given.placement, tasks, name=given.name, pairs=pairs,
                    copies=given.copies).validate()


def forwards_first(schedule: Schedule) -> Schedule:
    """``schedule`` with each device's forwards first, in their order, then its other tasks in theirs, without pairs:
    what ``forward()`` runs without grad on a schedule of copies (Note [inference on copies]).

    Note [inference on copies]: inference runs GPipe's forwards on a pipeline's placement, but GPipe's generator
    sends every micro-batch through every stage, and a schedule of copies (DualPipe; Note [stage slots] in
    :mod:`gpipe.schedule.schedule`) sends each through its own copy's. Its own lists, forwards moved first, are
    a forwards-first schedule of the same routes: a forward waits only for forwards, which keep their order, and
    every other task finds its forwards done, so it is as free of deadlock as the schedule it came from.
    """
    tasks = tuple(tuple(t for t in ts if t.op is Op.F) + tuple(t for t in ts if t.op is not Op.F)
                  for ts in schedule.tasks)
    return Schedule(schedule.m, schedule.n, schedule.checkpoint, schedule.placement, tasks, name=schedule.name,
                    copies=schedule.copies).validate()


def _refuse_for_copies(name: str, copies: int, module: nn.Sequential, balance: Sequence[int],
                       layout: SkipLayout) -> None:
    """Refuse what a schedule of copies of the stages cannot run (Note [one model, two copies] in
    :mod:`gpipe.interpreter.copies`): skip connections, and batch norm, whose running statistics would split."""
    if layout.stashed_in:
        raise ValueError(f"schedule {name!r} runs {copies} copies of the stages, and skip connections between copies "
                         "are not supported: use a schedule of one copy")
    layers, k = list(module), 0
    for s, size in enumerate(balance):
        norm = next((m for layer in layers[k:k + size] for m in layer.modules() if isinstance(m, _BatchNorm)), None)
        if norm is not None:
            raise ValueError(f"stage {s} has a {type(norm).__name__} layer, whose running statistics a schedule of "
                             f"{copies} copies of the stages would split between them; use a schedule of one copy, "
                             "or a norm without running statistics (LayerNorm, GroupNorm)")
        k += size


def _either(counts: Sequence[int]) -> str:
    """``[2, 4]`` as ``"2 or 4"``."""
    return str(counts[0]) if len(counts) == 1 else ", ".join(map(str, counts[:-1])) + " or " + str(counts[-1])
