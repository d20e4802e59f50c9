"""Cost models: how long each task takes and how many bytes each copy moves and each stage keeps.

One type, several sources: explicit numbers (teaching, the CLI), measurements of real partitions
(:mod:`sim.calibration.calibrate`), and FLOPs and bytes counted on the ``meta`` device divided by a hardware spec
(:mod:`sim.planning.flops`). The simulator consumes a :class:`CostModel` and never changes it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

__all__ = ["TASK_KINDS", "CostModel", "Overheads", "StageCost"]


def _check(name: str, value: float, *, allow_zero: bool = True) -> None:
    if not isinstance(value, (int, float)) or math.isnan(value) or math.isinf(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")


@dataclass(frozen=True)
class StageCost:
    """Costs of one stage, per micro-batch.

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
        saved_tensors: how many tensors a grad-enabled forward of the stage hands to autograd's
            saved-tensor hooks (parameters included); an executor that records pays
            ``Overheads.per_saved_tensor`` for each (see :mod:`sim.core.engine`, Note [host costs]).
        thread_start: extra seconds of the stage's first task on a fresh worker thread (the math
            libraries set up their per-thread state on first use); paid by each device's first task,
            and again by the first task of the backward phase when the executor starts new threads
            for it (``SimConfig(backward_after_forward=True)``).
        forward_recorded: seconds of a grad-enabled forward (an ``F`` not checkpointed, an ``R``)
            while a recording executor's saved-tensor hooks count its bytes, measured on the stage
            itself (:func:`gpipe.profile.profile_blocks` with ``recorded=True``); when set, it
            replaces ``forward`` (or ``recompute``) plus ``saved_tensors`` per-tensor overheads.
            Set it only to predict a recording executor; ``None``: the per-tensor estimate.
        backward_recorded: as ``forward_recorded``, for ``B`` (the unpack hook of every saved tensor).
        host_forward: host seconds the executor adds to each grad-enabled forward of this stage (an
            ``F`` not checkpointed, an ``R``) beyond ``Overheads.task`` and ``recording``: what its
            worker threads cost around the stage's own layers, measured on the stage
            (:func:`sim.calibration.extras.measure_stage_extras`, Note [stage extras]).
        host_nograd: the same for a checkpointed (no-grad) ``F``.
        host_backward: the same for ``B`` (and ``W``).
        issue_forward: on an asynchronous device (CUDA; ``SimConfig.asynchronous``), the host seconds
            a grad-enabled forward takes to launch its kernels, from the call to its return
            (:mod:`gpipe.profile_timing`, Note [issue seconds]): the host's share of the task, which its next
            task waits for while the stream runs the kernels' seconds (``forward``). Ignored on a
            synchronous device, where the host's work is the task.
        issue_nograd: the same for a checkpointed (no-grad) ``F``.
        issue_backward: the same for ``B`` (and ``W``).
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
    saved_tensors: int = 0
    thread_start: float = 0.0
    forward_recorded: float | None = None
    backward_recorded: float | None = None
    host_forward: float = 0.0
    host_nograd: float = 0.0
    host_backward: float = 0.0
    issue_forward: float = 0.0
    issue_nograd: float = 0.0
    issue_backward: float = 0.0

    def __post_init__(self) -> None:
        for name in ("forward", "backward", "weight", "send_bytes", "saved_bytes", "checkpoint_bytes",
                     "parameter_bytes", "gradient_bytes", "optimizer_bytes", "saved_tensors", "thread_start",
                     "host_forward", "host_nograd", "host_backward", "issue_forward", "issue_nograd",
                     "issue_backward"):
            _check(name, getattr(self, name))
        if self.recompute is not None:
            _check("recompute", self.recompute)
        for name in ("forward_checkpointed", "forward_recorded", "backward_recorded"):
            if getattr(self, name) is not None:
                _check(name, getattr(self, name))

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


#: Kinds of task for :attr:`Overheads.pairs`: grad-enabled forward, checkpointed forward, backward.
TASK_KINDS = ("F", "Fc", "B")


@dataclass(frozen=True)
class Overheads:
    """What the executor costs beyond the kernels, learned from calibration (all seconds, default 0).

    Attributes:
        task: host time added to every compute task (dispatch, bookkeeping, recording).
        handoff: latency of handing a result from one worker to another (queue put/get, wake-up):
            from the end of the producing task (or of its copy) to the earliest start of the consumer.
        contention: slowdown of compute while ``k`` devices compute at once on shared cores; the
            stage seconds of a task running with ``k - 1`` others take ``1 + contention * (k - 1)``
            times as long, its host seconds do not stretch (sim.core.engine, Note [host seconds share
            nothing]). 0 for devices that do not share hardware (GPUs).
        gap: host time between two consecutive tasks of one worker, outside both (taking the next
            task's inputs, sending the previous one's results): a device's next task starts no
            earlier than ``gap`` after its previous task ended.
        launch: seconds from the start of a step to the earliest start of its first task (the
            executor cuts the mini-batch and starts its workers): no task starts before it.
        turnaround: with ``SimConfig(backward_after_forward=True)``, seconds from the end of the
            step's last forward to the earliest start of its backward phase (the host joins the
            forward workers and starts the backward ones; the user's loss is not counted).
        recording: host seconds a recording executor adds to each grad-enabled forward (an ``F``
            that is not checkpointed, every ``R``): entering and leaving its saved-tensor hooks.
        per_saved_tensor: host seconds of the recorder's hook per tensor autograd saves.
        per_unpacked_tensor: host seconds per saved tensor the backward of a recorded graph takes
            back through the recorder's unpack hook (every ``B`` of a recording executor).
        pairs: measured contention of *pairs* of tasks, replacing ``contention`` for the pairs
            listed: ``(kind, stage, other kind, other stage, c)`` says a task of ``kind`` on
            ``stage`` runs its stage seconds at ``1 / (1 + c)`` of their speed while a task of
            ``other kind`` on ``other stage`` runs beside it. Kinds: ``"F"`` a grad-enabled
            forward (an ``F`` that is not checkpointed, and every ``R``), ``"Fc"`` a checkpointed
            (no-grad) forward, ``"B"`` a backward (and ``W``). On CPU devices the pairs differ a
            lot: two forwards of small layers serialise on Python's global interpreter lock, two
            backwards hardly meet.
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
    pairs: tuple[tuple[str, int, str, int, float], ...] = ()

    def __post_init__(self) -> None:
        for name in ("task", "handoff", "contention", "gap", "turnaround", "launch", "recording", "per_saved_tensor",
                     "per_unpacked_tensor"):
            _check(f"overheads.{name}", getattr(self, name))
        object.__setattr__(self, "pairs", tuple((str(a), int(j), str(b), int(k), float(c))
                                                for a, j, b, k, c in self.pairs))
        for a, j, b, k, c in self.pairs:
            if a not in TASK_KINDS or b not in TASK_KINDS:
                raise ValueError(f"overheads.pairs: task kinds are {', '.join(TASK_KINDS)}, got {a!r} and {b!r}")
            _check(f"overheads.pairs[{a}@{j}, {b}@{k}]", c)


@dataclass(frozen=True)
class CostModel:
    """Per-stage costs plus how copies are priced.

    Attributes:
        stages: one :class:`StageCost` per stage.
        copy_seconds: a fixed time for every copy between devices; ``None`` prices copies by the link
            the simulator is given (latency + bytes / bandwidth).
        overheads: the executor's own costs (zero for an ideal pipeline).
        microbatch_scale: optional per-micro-batch factor on compute times and bytes (an uneven last
            chunk is smaller); ``()`` means every micro-batch costs the same.
    """

    stages: tuple[StageCost, ...]
    copy_seconds: float | None = None
    overheads: Overheads = field(default_factory=Overheads)
    microbatch_scale: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple(self.stages))
        object.__setattr__(self, "microbatch_scale", tuple(self.microbatch_scale))
        if not self.stages:
            raise ValueError("a cost model needs at least one stage")
        if self.copy_seconds is not None:
            _check("copy_seconds", self.copy_seconds)
        for k, s in enumerate(self.microbatch_scale):
            _check(f"microbatch_scale[{k}]", s)

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

    def with_overheads(self, overheads: Overheads) -> CostModel:
        return replace(self, overheads=overheads)
