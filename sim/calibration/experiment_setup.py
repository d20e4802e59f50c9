"""What one experiment runs and how it measures it: the settings :func:`sim.calibration.experiment.run` takes.

Its own module so that both the experiment and the :class:`sim.calibration.outcome.Outcome` it returns, which keeps the
setup, can name it without importing each other. The notes named here without a module (Note [median step],
Note [interleaved calibration], Note [pass repeats]) are in :mod:`sim.calibration.experiment`.

Note [devices and stages]: ``Setup.devices`` are what :class:`gpipe.GPipe` takes, one torch device per *schedule
device* (one worker each): as many as the partitions, or fewer for a schedule that places several stages on one
device (one registered with a layout places them by it, :meth:`Setup.placement`). The partition count is the
balance's length, else ``stages``, else one per device. So ``Setup(schedule=S, stages=4, devices=("cpu",) * 2)``
is four stages on two workers, as ``GPipe(model, balance, devices=["cpu"] * 2, schedule=S)`` runs them. A
:class:`~gpipe.schedule.Schedule` given as ``Setup.schedule`` is the step on both halves, as ``GPipe`` runs one (Note
[a given schedule] in :mod:`gpipe.frontend`): its ``n`` is the partition count unless a balance or ``stages`` says the
same, its placement places them (devices one per stage or one per schedule device), and ``chunks`` and ``checkpoint``
must be its ``m`` and policy.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpipe.frontend import given_schedule, stage_placement
from gpipe.schedule import CHECKPOINT_MODES, Checkpoint, Schedule, schedule_kind

__all__ = ["Setup"]


@dataclass(frozen=True)
class Setup:
    """What to run and how to measure it.

    Attributes:
        chunks: micro-batches per mini-batch (GPipe's ``chunks``).
        checkpoint: ``always``, ``except_last`` or ``never``.
        schedule: the name of a registered schedule (:data:`gpipe.schedule.SCHEDULES`) the executor runs and the
            simulator predicts (Note [one schedule]), or a :class:`~gpipe.schedule.Schedule` both run as it is (Note
            [devices and stages]).
        balance: layers per partition; ``None``: ``balance_by_time`` over :attr:`partitions` partitions.
        stages: the partitions when no balance is given; ``None``: one per device (Note [devices and stages]).
        devices: one torch device per schedule device, as :class:`gpipe.GPipe` takes them: one per partition, or
            fewer where the schedule places several stages on one (Note [devices and stages]); ``None``:
            :func:`sim.calibration.machine.default_devices` of one per partition (two without a balance or
            ``stages``).
        steps: recorded training steps; the measured timeline is the median one (Note [median step]).
        warmup_steps: unrecorded training steps first (allocator, thread pools, first-call costs).
        seed: seeds PyTorch before anything random (the caller seeds the model and input it builds).
        threads: intra-op threads per worker during the whole experiment (Note [threads] in
            :mod:`sim.calibration.machine`).
        warmup: untimed passes before the first calibration.
        repeats: timed passes of the first calibration, which the bytes, the balance check and the
            overhead measurements use; the stage seconds of the prediction are the means over the
            passes interleaved with the steps (Note [interleaved calibration]).
        pair_rounds: on shared cores, rounds of pair measurements spread evenly over the warm-up and
            recorded steps (at most one after each step); ``Overheads.pairs`` are their medians
            (Note [interleaved calibration]). None for a schedule that never runs two tasks at once.
        pass_repeats: timed runs of each task, in a row, in the profiling pass after each step
            (Note [pass repeats]); ``None``: ``chunks // 2``,
            at least one (Note [pass repeats]).
        balance_timeout: seconds ``balance_by_time`` may spend.
        pin: on CPU devices (Linux), pin partition ``j``'s worker, and everything that calibrates it,
            to one core of its own (Note [pinned workers] in :mod:`gpipe.interpreter.affinity`); ``False``:
            the operating system places the threads.
    """

    chunks: int = 4
    checkpoint: Checkpoint = "except_last"
    schedule: str | Schedule = "gpipe"
    balance: tuple[int, ...] | None = None
    stages: int | None = None
    devices: tuple[str, ...] | None = None
    steps: int = 15
    warmup_steps: int = 2
    seed: int = 0
    threads: int | None = 1
    warmup: int = 2
    repeats: int = 3
    pair_rounds: int = 7
    pass_repeats: int | None = None
    balance_timeout: float = 1.0
    pin: bool = True

    def __post_init__(self) -> None:
        if self.balance is not None:
            object.__setattr__(self, "balance", tuple(self.balance))
        if self.devices is not None:
            object.__setattr__(self, "devices", tuple(str(d) for d in self.devices))
        for name, low in (("chunks", 1), ("steps", 1), ("warmup_steps", 0), ("warmup", 0), ("repeats", 1),
                          ("pair_rounds", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.checkpoint not in CHECKPOINT_MODES:
            raise ValueError(f"checkpoint must be one of {', '.join(CHECKPOINT_MODES)}, got {self.checkpoint!r}")
        if not isinstance(self.schedule, Schedule):
            schedule_kind(self.schedule)  # a registered name, else a ValueError listing them
        if self.pass_repeats is not None and (isinstance(self.pass_repeats, bool)
                                              or not isinstance(self.pass_repeats, int) or self.pass_repeats < 1):
            raise ValueError(f"pass_repeats must be an integer >= 1 or None, got {self.pass_repeats!r}")
        if self.threads is not None and (isinstance(self.threads, bool) or self.threads < 1):
            raise ValueError(f"threads must be a positive integer or None, got {self.threads!r}")
        if self.stages is not None and (isinstance(self.stages, bool) or not isinstance(self.stages, int)
                                        or self.stages < 1):
            raise ValueError(f"stages must be an integer >= 1 or None, got {self.stages!r}")
        if self.balance is not None and self.stages is not None and len(self.balance) != self.stages:
            raise ValueError(f"balance has {len(self.balance)} partitions but stages={self.stages}: give one of them")
        if isinstance(self.schedule, Schedule):  # validated, its stages the partitions: as the executor checks it
            _, m, policy = given_schedule(self.schedule, self.partitions, None, None)
            if (self.chunks, self.checkpoint) != (m, policy):
                raise ValueError(f"chunks={self.chunks}, checkpoint={self.checkpoint!r}, but schedule "
                                 f"{self.schedule.name!r} runs m={m} micro-batches with checkpoint={policy!r}: give "
                                 f"chunks={m}, checkpoint={policy!r}")
        if self.devices is not None:
            if not self.devices:
                raise ValueError("devices is empty: give one torch device per schedule device, or None")
            if len(self.devices) > self.partitions:
                raise ValueError(f"{len(self.devices)} devices for {self.partitions} partitions: give at most one "
                                 "device per partition (or more stages)")
            self.placement()  # Note [devices and stages]: fewer devices only where the schedule places stages so
        if not self.balance_timeout >= 0:
            raise ValueError(f"balance_timeout must be >= 0 seconds, got {self.balance_timeout!r}")

    @property
    def repeats_per_pass(self) -> int:
        """Timed runs in each profiling pass after a step (Note [pass repeats])."""
        return self.pass_repeats if self.pass_repeats is not None else max(1, self.chunks // 2)

    @property
    def partitions(self) -> int:
        """The stages: the balance's, else ``stages``, else one per device, else two (Note [devices and stages])."""
        if self.balance is not None:
            return len(self.balance)
        if self.stages is not None:
            return self.stages
        if isinstance(self.schedule, Schedule):
            return self.schedule.n
        return len(self.devices) if self.devices is not None else 2

    def placement(self) -> tuple[int, ...]:
        """Each partition's schedule device, as :class:`gpipe.GPipe` places them on :attr:`devices`
        (:func:`gpipe.frontend.stage_placement`; Note [devices and stages]).

        Raises:
            ValueError: the schedule cannot place the partitions on the devices given (the message names the fix).
        """
        n = self.partitions
        p = len(self.devices) if self.devices is not None else n
        placement = stage_placement(self.schedule, n, p, self.chunks, self.checkpoint)  # the executor's decision
        workers = max(placement) + 1
        if p not in (n, workers):  # GPipe takes a device per stage, or one per schedule device
            if not isinstance(self.schedule, Schedule):
                schedule_kind(self.schedule).layout(n, p)  # raises for a schedule without a layout, naming the fix
            name = self.schedule.name if isinstance(self.schedule, Schedule) else self.schedule
            raise ValueError(f"schedule {name!r} runs {n} stages on {workers} devices: give {workers} devices (one "
                             f"per schedule device) or {n} (one per stage), not {p}")
        return placement
