"""The executor's costs beyond its kernels, as :class:`~sim.core.cost.RunnerCosts` the simulator consumes.

:class:`Overheads` are what the executor itself costs (measured by :mod:`sim.calibration.calibrate`),
:class:`ExecutorStage` what it adds to one stage's tasks (:mod:`sim.calibration.thread_costs`, the profiler), and
:class:`ExecutorCosts` puts them together for :attr:`sim.core.cost.CostModel.runner`; :func:`executor_costs`
reads them back from a cost model. The docs page *The simulator's model of a device* has each term's table.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gpipe.schedule import Op
from sim.core.cost import TASK_KINDS, CostModel, Pair, check_cost

__all__ = ["ExecutorCosts", "ExecutorStage", "Overheads", "executor_costs", "with_overheads"]


@dataclass(frozen=True)
class Overheads:
    """What the executor costs beyond the kernels, learned from calibration (all seconds, default 0).

    Attributes:
        task: host time added to every compute task (dispatch, bookkeeping, recording).
        handoff: latency of handing a result from one worker to another (queue put/get, wake-up):
            from the end of the producing task (or of its copy) to the earliest start of the consumer.
        contention: slowdown of compute while ``k`` devices compute at once on shared cores; the
            stage seconds of a task running with ``k - 1`` others take ``1 + contention * (k - 1)``
            times as long, its host seconds do not stretch (Note [host seconds share nothing] in
            :mod:`sim.core.device`). 0 for devices that do not share hardware (GPUs).
        gap: host time between two consecutive tasks of one worker, outside both (taking the next
            task's inputs, sending the previous one's results).
        launch: seconds from the start of a step to the earliest start of its first task (the
            executor cuts the mini-batch and starts its workers).
        turnaround: with ``SimConfig(backward_after_forward=True)``, seconds from the end of the
            step's last forward to the earliest start of its backward phase (the host joins the
            forward workers and starts the backward ones; the user's loss is not counted).
        recording: host seconds a recording executor adds to each grad-enabled forward (an ``F``
            that is not checkpointed, every ``R``): entering and leaving its saved-tensor hooks.
        per_saved_tensor: host seconds of the recorder's hook per tensor autograd saves.
        per_unpacked_tensor: host seconds per saved tensor the backward of a recorded graph takes
            back through the recorder's unpack hook (every ``B`` of a recording executor).
        pairs: measured contention of *pairs* of tasks (:data:`sim.core.cost.Pair`), replacing
            ``contention`` for the pairs listed. Kinds (:data:`sim.core.cost.TASK_KINDS`): ``"F"`` a
            grad-enabled forward (an ``F`` that is not checkpointed, and every ``R``), ``"Fc"`` a
            checkpointed (no-grad) forward, ``"B"`` a backward (and ``W``). On CPU devices the pairs
            differ a lot: two forwards of small layers serialise on Python's global interpreter lock,
            two backwards hardly meet.
    """

    task: float = 0.0
    handoff: float = 0.0
    contention: float = 0.0
    gap: float = 0.0
    turnaround: float = 0.0
    launch: float = 0.0
    recording: float = 0.0
    per_saved_tensor: float = 0.0
    per_unpacked_tensor: float = 0.0
    pairs: tuple[Pair, ...] = ()

    def __post_init__(self) -> None:
        for name in ("task", "handoff", "contention", "gap", "turnaround", "launch", "recording", "per_saved_tensor",
                     "per_unpacked_tensor"):
            check_cost(f"overheads.{name}", getattr(self, name))
        object.__setattr__(self, "pairs", tuple((str(a), int(j), str(b), int(k), float(c))
                                                for a, j, b, k, c in self.pairs))
        for a, j, b, k, c in self.pairs:
            if a not in TASK_KINDS or b not in TASK_KINDS:
                raise ValueError(f"overheads.pairs: task kinds are {', '.join(TASK_KINDS)}, got {a!r} and {b!r}")
            check_cost(f"overheads.pairs[{a}@{j}, {b}@{k}]", c)


@dataclass(frozen=True)
class ExecutorStage:
    """What the executor adds to one stage's tasks (all seconds but ``saved_tensors``, default 0).

    Attributes:
        saved_tensors: how many tensors a grad-enabled forward of the stage hands to autograd's
            saved-tensor hooks (parameters included); a recording executor pays
            ``Overheads.per_saved_tensor`` for each (and ``per_unpacked_tensor`` in the backward).
        thread_start: extra seconds of the stage's first task on a fresh worker thread (the math
            libraries set up their per-thread state on first use); paid by each device's first task,
            and again by the first task of the backward phase when the executor starts new threads
            for it (``SimConfig(backward_after_forward=True)``).
        forward_recorded: seconds of a grad-enabled forward (an ``F`` not checkpointed, an ``R``)
            while a recording executor's saved-tensor hooks count its bytes, measured on the stage
            itself (:func:`gpipe.profiling.profile.profile_blocks` with ``recorded=True``); when set, it
            replaces the stage's ``forward`` (or ``recompute``) seconds plus the ``saved_tensors``
            per-tensor overheads. Set it only to predict a recording executor; ``None``: the estimate.
        backward_recorded: as ``forward_recorded``, for ``B`` (the unpack hook of every saved tensor); of a
            schedule with ``W`` tasks, the input-gradient part alone (Note [split runs] in
            :mod:`gpipe.profiling.timing`).
        weight_recorded: as ``backward_recorded``, for ``W``: the weight-gradient part of a split backward,
            which replaces the stage's ``weight`` seconds; ``None``: the StageCost's.
        host_forward: host seconds the executor adds to each grad-enabled forward of this stage (an
            ``F`` not checkpointed, an ``R``) beyond ``Overheads.task`` and ``recording``: what its
            worker threads cost around the stage's own layers, measured on the stage
            (:func:`sim.calibration.thread_costs.measure_stage_extras`, Note [stage extras]).
        host_nograd: the same for a checkpointed (no-grad) ``F``.
        host_backward: the same for ``B`` (and ``W``).
        issue_forward: on an asynchronous device (CUDA; ``SimConfig.asynchronous``), the host seconds
            a grad-enabled forward takes to launch its kernels, from the call to its return
            (:mod:`gpipe.profiling.timing`, Note [issue seconds]): the host's share of the task, which its
            next task waits for while the stream runs the kernels' seconds. Ignored on a synchronous device.
        issue_nograd: the same for a checkpointed (no-grad) ``F``.
        issue_backward: the same for ``B`` (and ``W``).
        wire_forward: seconds each ``F`` of this stage spends on its messages to and from other processes: the
            activation it receives and the one it sends (Note [a message's CPU] in
            :mod:`sim.calibration.wire_cost`); an ``R`` sends and receives nothing.
        wire_backward: the same for each ``B`` and the gradients (a ``W`` sends and receives nothing).
    """

    saved_tensors: int = 0
    thread_start: float = 0.0
    forward_recorded: float | None = None
    backward_recorded: float | None = None
    weight_recorded: float | None = None
    host_forward: float = 0.0
    host_nograd: float = 0.0
    host_backward: float = 0.0
    issue_forward: float = 0.0
    issue_nograd: float = 0.0
    issue_backward: float = 0.0
    wire_forward: float = 0.0
    wire_backward: float = 0.0

    def __post_init__(self) -> None:
        for name in ("saved_tensors", "thread_start", "host_forward", "host_nograd", "host_backward",
                     "issue_forward", "issue_nograd", "issue_backward", "wire_forward", "wire_backward"):
            check_cost(name, getattr(self, name))
        for name in ("forward_recorded", "backward_recorded", "weight_recorded"):
            if getattr(self, name) is not None:
                check_cost(name, getattr(self, name))


_NOTHING = ExecutorStage()


@dataclass(frozen=True)
class ExecutorCosts:
    """The executor as the simulator's :class:`~sim.core.cost.RunnerCosts`: its overheads and, per stage, what
    it adds to that stage's tasks (``()``: nothing per stage).

    A task's host seconds (they do not scale with the micro-batch)::

        overheads.task
        + the stage's host_forward (F not checkpointed, R), host_nograd (checkpointed F), host_backward (B, W)
        + the stage's wire_forward (F) or wire_backward (B): its messages between processes
        + for a grad-enabled forward: overheads.recording
          + saved_tensors * overheads.per_saved_tensor (unless forward_recorded)
        + for a backward: saved_tensors * overheads.per_unpacked_tensor (unless backward_recorded)

    and a device's first task (of each phase) ``thread_start`` more.
    """

    overheads: Overheads = field(default_factory=Overheads)
    stages: tuple[ExecutorStage, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple(self.stages))

    @property
    def handoff(self) -> float:
        return self.overheads.handoff

    @property
    def gap(self) -> float:
        return self.overheads.gap

    @property
    def launch(self) -> float:
        return self.overheads.launch

    @property
    def turnaround(self) -> float:
        return self.overheads.turnaround

    @property
    def contention(self) -> float:
        return self.overheads.contention

    @property
    def pairs(self) -> tuple[Pair, ...]:
        return self.overheads.pairs

    def stage(self, j: int) -> ExecutorStage:
        """What the executor adds to stage ``j``'s tasks."""
        if not self.stages:
            return _NOTHING
        if not 0 <= j < len(self.stages):
            raise ValueError(f"the executor's costs have {len(self.stages)} stages, not stage {j}")
        return self.stages[j]

    def host_seconds(self, op: Op, stage: int, checkpointed: bool) -> float:
        o, s = self.overheads, self.stage(stage)
        seconds = o.task + (s.wire_forward if op is Op.F else s.wire_backward if op is Op.B else 0.0)
        if op is Op.R or (op is Op.F and not checkpointed):  # a grad-enabled forward: recorded through hooks
            seconds += o.recording + s.host_forward
            if s.forward_recorded is None:  # else the hooks are in the measured seconds (stage_seconds)
                seconds += s.saved_tensors * o.per_saved_tensor
        elif op is Op.F:
            seconds += s.host_nograd
        else:
            seconds += s.host_backward
            if op is Op.B and s.backward_recorded is None:  # every saved tensor comes back through the unpack hook
                seconds += s.saved_tensors * o.per_unpacked_tensor
        return seconds

    def first_seconds(self, stage: int) -> float:
        return self.stage(stage).thread_start

    def issue_seconds(self, op: Op, stage: int, checkpointed: bool) -> float:
        s = self.stage(stage)
        if op is Op.R or (op is Op.F and not checkpointed):
            return s.issue_forward
        return s.issue_nograd if op is Op.F else s.issue_backward

    def stage_seconds(self, op: Op, stage: int, checkpointed: bool) -> float | None:
        s = self.stage(stage)
        if op is Op.R or (op is Op.F and not checkpointed):
            return s.forward_recorded
        return s.backward_recorded if op is Op.B else s.weight_recorded if op is Op.W else None


def executor_costs(cost: CostModel) -> ExecutorCosts:
    """The executor's costs in ``cost`` (its ``runner``; none when the runner is another), with one
    :class:`ExecutorStage` per stage of ``cost`` (all zero where it had none)."""
    runner = cost.runner if isinstance(cost.runner, ExecutorCosts) else ExecutorCosts()
    return runner if runner.stages else replace(runner, stages=(_NOTHING,) * cost.n)


def with_overheads(cost: CostModel, overheads: Overheads) -> CostModel:
    """``cost`` with the executor's ``overheads`` (what it adds per stage kept, as :func:`executor_costs` reads it)."""
    return replace(cost, runner=replace(executor_costs(cost), overheads=overheads))
