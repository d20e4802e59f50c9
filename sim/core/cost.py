"""Cost models: how long each task computes, how many bytes each copy moves and each stage keeps, what the runner adds.

One type, several sources: explicit numbers (teaching, the CLI), measurements of real partitions
(:mod:`sim.calibration.calibrate`), and FLOPs and bytes counted on the ``meta`` device divided by a hardware spec
(:mod:`sim.planning.counting.flops`). What the program that runs the schedule adds beyond the stage seconds (host time
per task, hand-offs, cores shared by its workers) reaches the simulator through :class:`RunnerCosts`, an
interface that a cost source implements (:mod:`sim.calibration.host` for this project's executor). The
simulator consumes a :class:`CostModel` and never changes it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar, Protocol

from gpipe.schedule import Op
from sim.core.collectives import StageCollectives

__all__ = ["IDEAL_RUNNER", "TASK_KINDS", "CostModel", "IdealRunner", "Pair", "RunnerCosts", "StageCost", "check_cost",
           "copied_stages"]


def check_cost(name: str, value: float, *, allow_zero: bool = True) -> None:
    """Raise ``ValueError`` unless ``value`` is a finite number ``>= 0`` (``> 0`` without ``allow_zero``)."""
    if not isinstance(value, (int, float)) or math.isnan(value) or math.isinf(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")


# Note [communication]: a task of a mixture-of-experts stage sends its tokens to their experts and back (an
# all-to-all), or crosses a slow link inside the stage: StageCost.communication seconds during which it waits on the
# network, not on the device's compute. One field, not one per direction: the gradient of an all-to-all moves as many
# bytes as the all-to-all, so F, R (a forward again) and B each spend it; W computes from what is already local.
# Alone, a task holds its device for compute + communication (its stream waits for the transfer). In an overlapped
# pair the two tasks run DualPipe's phases collapsed to one round -- a forward computes then communicates, a backward
# communicates then computes -- while the device's compute and its link are each shared equally by the tasks using
# it (sim.core.sharing.phased_pair_ends): one task's communication hides behind the other's compute, and a forward
# and a backward of c compute and x communication seconds each take 2 max(c, x) together instead of 2 (c + x).
# Communication scales with the micro-batch as compute does; shared cores do not stretch it (it uses none).


@dataclass(frozen=True)
class StageCost:
    """Costs of one stage, per micro-batch: compute seconds and bytes.

    Attributes:
        forward: seconds of ``F`` on the stage's device.
        backward: seconds of ``B`` (input and weight gradient; minus ``weight`` when W tasks split it).
        recompute: seconds of ``R``; ``None`` means the same as ``forward``.
        weight: seconds of ``W`` (zero-bubble schedules only).
        send_bytes: bytes of the activation sent to the next stage (the gradient coming back is as large).
        saved_bytes: bytes kept for backward per micro-batch without checkpointing.
        checkpoint_bytes: bytes kept per micro-batch with checkpointing (the stage input).
        parameter_bytes: bytes of the stage's parameters (and buffers).
        gradient_bytes: bytes of the parameter gradients.
        optimizer_bytes: bytes of the optimizer state (e.g. Adam's two moments).
        forward_checkpointed: seconds of ``F`` for a checkpointed micro-batch, whose forward runs
            under ``no_grad`` and records no graph (cheaper); ``None`` means the same as ``forward``.
            ``forward`` is then the grad-enabled ``F`` of a micro-batch that is not checkpointed.
        weight_bytes: where W tasks split the backward, bytes a micro-batch keeps from the end of its ``B``
            to the end of its ``W`` (what the weight gradient reads: each layer's input and output gradient);
            ``None``: all it held for ``B`` (Note [memory] in :mod:`sim.core.memory`).
        communication: seconds of each ``F``, ``R`` and ``B`` of the stage that wait on the network, not on the
            device's compute (Note [communication]); ``W`` has none.
        communication_bytes: bytes one rank sends in that communication, for its span's label only.
        collectives: the stage's data-parallel gathers and reductions, run as tasks on its device's communication
            stream (:mod:`sim.core.collectives`); ``None``: none.
    """

    forward: float
    backward: float
    recompute: float | None = None
    weight: float = 0.0
    send_bytes: int = 0
    saved_bytes: int = 0
    checkpoint_bytes: int = 0
    parameter_bytes: int = 0
    gradient_bytes: int = 0
    optimizer_bytes: int = 0
    forward_checkpointed: float | None = None
    weight_bytes: int | None = None
    communication: float = 0.0
    communication_bytes: int = 0
    collectives: StageCollectives | None = None

    def __post_init__(self) -> None:
        for name in ("forward", "backward", "weight", "send_bytes", "saved_bytes", "checkpoint_bytes",
                     "parameter_bytes", "gradient_bytes", "optimizer_bytes", "communication", "communication_bytes"):
            check_cost(name, getattr(self, name))
        for name in ("recompute", "forward_checkpointed", "weight_bytes"):
            if getattr(self, name) is not None:
                check_cost(name, getattr(self, name))

    def forward_seconds(self, checkpointed: bool) -> float:
        """Seconds of ``F`` for a micro-batch that is checkpointed (no-grad forward) or not."""
        if checkpointed and self.forward_checkpointed is not None:
            return self.forward_checkpointed
        return self.forward

    @property
    def recompute_seconds(self) -> float:
        return self.forward if self.recompute is None else self.recompute

    @property
    def model_state_bytes(self) -> int:
        return self.parameter_bytes + self.gradient_bytes + self.optimizer_bytes


#: Kinds of task for :attr:`RunnerCosts.pairs`: grad-enabled forward (an ``F`` not checkpointed, every ``R``),
#: checkpointed (no-grad) forward, backward (and ``W``).
TASK_KINDS = ("F", "Fc", "B")

#: ``(kind, stage, other kind, other stage, c)``: a task of ``kind`` on ``stage`` runs its stage seconds at
#: ``1 / (1 + c)`` of their speed while a task of ``other kind`` on ``other stage`` runs beside it.
Pair = tuple[str, int, str, int, float]


class RunnerCosts(Protocol):
    """What the program that runs the schedule adds to the stage seconds (all seconds, all >= 0).

    None of it scales with the micro-batch, and sharing cores stretches none of it (the docs page
    *The simulator's model of a device* says where each term goes). :data:`IDEAL_RUNNER` adds nothing.

    Attributes:
        handoff: latency of handing a result to a task on another device, after its copy.
        gap: a device's host time between two of its tasks: the next starts no earlier than ``gap``
            after the previous one's host work ended.
        launch: no task starts before it (the runner starting its workers).
        turnaround: with two phases, from the step's last forward to the backward phase's opening.
        contention: while ``k`` devices compute on shared cores each runs its stage seconds at
            ``1 / (1 + contention * (k - 1))`` of their speed; 0 for devices that share nothing.
        pairs: measured slowdowns per pair of tasks (:data:`Pair`), replacing ``contention`` for those.
    """

    @property
    def handoff(self) -> float: ...
    @property
    def gap(self) -> float: ...
    @property
    def launch(self) -> float: ...
    @property
    def turnaround(self) -> float: ...
    @property
    def contention(self) -> float: ...
    @property
    def pairs(self) -> tuple[Pair, ...]: ...

    def host_seconds(self, op: Op, stage: int, checkpointed: bool) -> float:
        """Host seconds the runner adds to task ``op`` of ``stage`` (of a checkpointed micro-batch or not)."""
        ...

    def first_seconds(self, stage: int) -> float:
        """Host seconds more for a device's first task (of each phase, with two), here of ``stage``."""
        ...

    def issue_seconds(self, op: Op, stage: int, checkpointed: bool) -> float:
        """On an asynchronous device, the host's seconds to launch the task's kernels (ignored elsewhere)."""
        ...

    def stage_seconds(self, op: Op, stage: int, checkpointed: bool) -> float | None:
        """The task's stage seconds as this runner runs them, where it measured them apart (they replace
        the :class:`StageCost`'s, and scale with the micro-batch as those do); ``None``: the StageCost's."""
        ...


@dataclass(frozen=True)
class IdealRunner:
    """A runner that adds nothing: an ideal pipeline, and the default of every :class:`CostModel`."""

    handoff = gap = launch = turnaround = contention = 0.0
    pairs: ClassVar[tuple[Pair, ...]] = ()

    def host_seconds(self, op: Op, stage: int, checkpointed: bool) -> float:
        return 0.0

    def first_seconds(self, stage: int) -> float:
        return 0.0

    def issue_seconds(self, op: Op, stage: int, checkpointed: bool) -> float:
        return 0.0

    def stage_seconds(self, op: Op, stage: int, checkpointed: bool) -> float | None:
        return None


IDEAL_RUNNER = IdealRunner()


@dataclass(frozen=True)
class CostModel:
    """Per-stage costs, how copies are priced, and what the runner adds.

    Attributes:
        stages: one :class:`StageCost` per stage.
        copy_seconds: a fixed time for every copy between devices; ``None`` prices copies by the link
            the simulator is given (latency + bytes / bandwidth).
        runner: what the program that runs the schedule adds (:class:`RunnerCosts`; nothing by default).
        microbatch_scale: optional per-micro-batch factor on compute times and bytes (an uneven last
            chunk is smaller); ``()`` means every micro-batch costs the same.
    """

    stages: tuple[StageCost, ...]
    copy_seconds: float | None = None
    runner: RunnerCosts = IDEAL_RUNNER
    microbatch_scale: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple(self.stages))
        object.__setattr__(self, "microbatch_scale", tuple(self.microbatch_scale))
        if not self.stages:
            raise ValueError("a cost model needs at least one stage")
        if self.copy_seconds is not None:
            check_cost("copy_seconds", self.copy_seconds)
        for k, s in enumerate(self.microbatch_scale):
            check_cost(f"microbatch_scale[{k}]", s)

    @property
    def n(self) -> int:
        return len(self.stages)

    def scale(self, microbatch: int) -> float:
        return self.microbatch_scale[microbatch] if self.microbatch_scale else 1.0

    @classmethod
    def uniform(cls, n: int, forward: float, backward: float, *, recompute: float | None = None,
                copy_seconds: float | None = 0.0, send_bytes: int = 0, saved_bytes: int = 0,
                checkpoint_bytes: int = 0, parameter_bytes: int = 0) -> CostModel:
        """Every stage costs the same (teaching, closed forms)."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"need at least one stage, got {n!r}")
        stage = StageCost(forward, backward, recompute, send_bytes=send_bytes, saved_bytes=saved_bytes,
                          checkpoint_bytes=checkpoint_bytes, parameter_bytes=parameter_bytes)
        return cls((stage,) * n, copy_seconds=copy_seconds)

    @classmethod
    def from_lists(cls, forward: Sequence[float], backward: Sequence[float], **kwargs: object) -> CostModel:
        """Per-stage forward and backward seconds; other :class:`StageCost` fields as equal-length lists."""
        if len(forward) != len(backward):
            raise ValueError(f"{len(forward)} forward times but {len(backward)} backward times")
        per_stage = {k: v for k, v in kwargs.items() if k in StageCost.__dataclass_fields__}
        rest = {k: v for k, v in kwargs.items() if k not in per_stage}
        stages = []
        for j in range(len(forward)):
            extra = {k: v[j] for k, v in per_stage.items()}  # type: ignore[index]
            stages.append(StageCost(float(forward[j]), float(backward[j]), **extra))  # type: ignore[arg-type]
        return cls(tuple(stages), **rest)  # type: ignore[arg-type]


@dataclass(frozen=True)
class _CopiedRunner:
    """A runner's costs read for slots (Note [stage slots] in :mod:`gpipe.schedule.schedule`): slot ``j`` is the
    model's stage ``j mod stages``; a measured pair holds between any copies of its two stages."""

    base: RunnerCosts
    stages: int
    copies: int

    @property
    def handoff(self) -> float:
        return self.base.handoff

    @property
    def gap(self) -> float:
        return self.base.gap

    @property
    def launch(self) -> float:
        return self.base.launch

    @property
    def turnaround(self) -> float:
        return self.base.turnaround

    @property
    def contention(self) -> float:
        return self.base.contention

    @property
    def pairs(self) -> tuple[Pair, ...]:
        s, k = self.stages, self.copies
        return tuple((a, x * s + j, b, y * s + i, c) for a, j, b, i, c in self.base.pairs
                     for x in range(k) for y in range(k))

    def host_seconds(self, op: Op, stage: int, checkpointed: bool) -> float:
        return self.base.host_seconds(op, stage % self.stages, checkpointed)

    def first_seconds(self, stage: int) -> float:
        return self.base.first_seconds(stage % self.stages)

    def issue_seconds(self, op: Op, stage: int, checkpointed: bool) -> float:
        return self.base.issue_seconds(op, stage % self.stages, checkpointed)

    def stage_seconds(self, op: Op, stage: int, checkpointed: bool) -> float | None:
        return self.base.stage_seconds(op, stage % self.stages, checkpointed)


def copied_stages(cost: CostModel, copies: int) -> CostModel:
    """The cost model of a schedule whose stages are ``copies`` copies of ``cost``'s (DualPipe's two directions,
    Note [stage slots] in :mod:`gpipe.schedule.schedule`): slot ``c * S + s`` costs what stage ``s`` does,
    parameters and optimizer state included, so a device holding two copies holds both's model state; a
    runner's per-stage costs are read through the same map. ``copies = 1`` returns ``cost`` itself.

    Raises:
        ValueError: ``copies`` is not a positive integer.
    """
    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
        raise ValueError(f"copies of the stages is a positive integer, got {copies!r}")
    if copies == 1:
        return cost
    runner = cost.runner if cost.runner is IDEAL_RUNNER else _CopiedRunner(cost.runner, cost.n, copies)
    return replace(cost, stages=cost.stages * copies, runner=runner)
