"""The immutable description of one pipeline: partitions on devices, skip layout, options, and what it learnt.

:class:`gpipe.GPipe` builds one :class:`Pipeline` when it is made; every step runs it by a schedule
(:class:`gpipe.worker.Run`), which gets this description, never the ``GPipe`` itself::

    GPipe(module, balance, devices, ...)  --builds-->  Pipeline  --with a Schedule-->  Run  -->  Timeline

Note [what a run is given]: the schedule is not part of the description. Each step asks for its own
(``chunks`` micro-batches, or fewer for a small batch; ``forward()`` in eval mode and under ``no_grad`` runs
without checkpoints), so the checkpoint policy reaches a run inside its :class:`gpipe.schedule.Schedule`.

Note [learnt state]: ``draws``, ``writes_input`` and ``split_plans`` are the only fields whose contents change: runs
learn, per partition, which layers draw random numbers (Note [learning which layers draw] in :mod:`gpipe.rng`),
whether the partition writes its input in place (Note [entering a partition] in :mod:`gpipe.interpreter`) and how
its backward splits (Note [plans across steps] in :mod:`gpipe.split`). What they learnt belongs to this pipeline:
the description never swaps them for other objects.

Note [placed stages]: a worker is one schedule device and runs every stage the schedule places there, each on
its partition's device; the stages of one worker must share a torch device and CPU cores (one thread, one
device context, one pinning), which :meth:`Pipeline.workers` checks.

Note [a given schedule]: a :class:`Schedule` given in place of a name is the step itself: its stages are the
partitions, its placement places them, its ``m`` and policy are ``chunks`` and ``checkpoint``, which default to them
and, given, must agree (one source for each decision). It is validated when the pipeline is built, so a deadlock is a
ScheduleError then, not a hang; a batch of fewer than ``m`` micro-batches is refused, as it has no other shape. Eval
mode runs it without its ``R`` tasks (only its own ``B`` waits for one, so the lists stay valid), and inference
GPipe's forwards on its placement, for any batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, cast

import torch
from torch import nn

from gpipe.checks import check_chunks
from gpipe.rng import Draws
from gpipe.schedule import CHECKPOINT_MODES, Checkpoint, Op, Schedule
from gpipe.skip.layout import SkipLayout
from gpipe.split import StagePlans

__all__ = ["Pipeline", "given_schedule", "step_schedule"]


@dataclass(frozen=True)
class Pipeline:
    """What every run of one pipeline shares (build it with :meth:`of`).

    Attributes:
        partitions: one ``nn.Sequential`` per stage, on its device.
        devices: the device of each partition (several partitions may share one).
        skip_layout: the partition of each skip connection's stash and pop.
        cpu_affinity: the CPU cores each partition's worker runs on (``None`` for one left unpinned); ``None``
            for no pinning at all (Note [pinned workers] in :mod:`gpipe.affinity`).
        switch_interval: seconds Python's interpreter lock may stay with one thread while two or more workers
            run; ``None`` leaves the interpreter's setting alone (Note [switch interval] in :mod:`gpipe.gil`).
        copy_streams: per CUDA device of :attr:`devices`, the stream that copies onto it run on (Note
            [hand-offs] in :mod:`gpipe.handoff`).
        draws: which layers of each partition draw random numbers (Note [learnt state]).
        writes_input: per partition, whether it writes its input in place; ``None`` until a training
            task has learnt it (Note [learnt state]).
        split_plans: per partition, how its split backwards split, by graph shape (Note [learnt state]).
    """

    partitions: tuple[nn.Sequential, ...]
    devices: tuple[torch.device, ...]
    skip_layout: SkipLayout
    cpu_affinity: tuple[frozenset[int] | None, ...] | None
    switch_interval: float | None
    copy_streams: Mapping[torch.device, Any]
    draws: Draws
    writes_input: list[bool | None]
    split_plans: tuple[StagePlans, ...]

    @classmethod
    def of(cls, partitions: Sequence[nn.Sequential], devices: Sequence[torch.device], skip_layout: SkipLayout, *,
           cpu_affinity: Sequence[frozenset[int] | None] | None = None,
           switch_interval: float | None = None) -> Pipeline:
        """A new pipeline of checked parts (:func:`gpipe.checks.check_devices`, :func:`gpipe.affinity.check_affinity`,
        :func:`gpipe.gil.check_switch_interval`): a copy stream per CUDA device, nothing learnt yet."""
        streams = {d: torch.cuda.Stream(d) for d in dict.fromkeys(devices) if d.type == "cuda"}
        return cls(tuple(partitions), tuple(devices), skip_layout,
                   None if cpu_affinity is None else tuple(cpu_affinity), switch_interval, MappingProxyType(streams),
                   Draws(partitions), [None] * len(partitions), tuple(StagePlans() for _ in partitions))

    def workers(self, schedule: Schedule) -> tuple[list[torch.device], list[frozenset[int] | None] | None]:
        """The torch device and CPU cores of each of ``schedule``'s devices (Note [placed stages]).

        Raises:
            ValueError: the schedule's stages differ from the partitions, or two stages placed on one schedule
                device have different torch devices or cores.
        """
        if schedule.n != len(self.partitions):
            raise ValueError(f"schedule {schedule.name!r} has {schedule.n} stages for {len(self.partitions)} "
                             "partitions")
        devices: list[torch.device | None] = [None] * schedule.num_devices
        cores: list[frozenset[int] | None] = [None] * schedule.num_devices
        affinity = self.cpu_affinity or (None,) * len(self.partitions)
        for j, d in enumerate(schedule.placement):
            if devices[d] is None:
                devices[d], cores[d] = self.devices[j], affinity[j]
                continue
            k = schedule.placement.index(d)
            for what, mine, theirs in (("devices", self.devices[j], devices[d]), ("CPU cores", affinity[j], cores[d])):
                if mine != theirs:
                    raise ValueError(f"schedule {schedule.name!r} places stages {k} and {j} on one worker (device "
                                     f"{d}), but their partitions have different {what}: {theirs} and {mine}; give "
                                     "the stages of one schedule device the same device and cores")
        placed = [dev for dev in devices if dev is not None]
        if len(placed) != len(devices):
            raise ValueError(f"schedule {schedule.name!r} has a device without stages: placement {schedule.placement}")
        return placed, None if self.cpu_affinity is None else cores

    def copy_stream(self, device: torch.device) -> Any:
        """The stream copies onto ``device`` run on; ``None`` for a device that is not one of this pipeline's
        CUDA devices."""
        return self.copy_streams.get(device)


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
    if schedule.n != stages:
        raise ValueError(f"schedule {name!r} has {schedule.n} stages, but the balance makes {stages} partitions: give "
                         f"a balance of {schedule.n} partitions, or a schedule of {stages} stages")
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
    return Schedule(given.m, given.n, "never", given.placement, tasks, name=given.name, pairs=pairs).validate()
