"""The immutable description of one pipeline: partitions on devices, skip layout, options, and what it learnt.

:class:`gpipe.GPipe` builds one :class:`Pipeline` when it is made, from the partitions and placement its arguments
decide (:class:`gpipe.frontend.PipelineSpec`); every step runs it by a schedule
(:class:`gpipe.interpreter.threads.ThreadRun`), which gets this description, never the ``GPipe`` itself::

    GPipe(module, balance, devices, ...)  --builds-->  Pipeline  --with a Schedule-->  ThreadRun  -->  Timeline

Note [what a run is given]: the schedule is not part of the description. Each step asks for its own
(``chunks`` micro-batches, or fewer for a small batch; ``forward()`` in eval mode and under ``no_grad`` runs
without checkpoints), so the checkpoint policy reaches a run inside its :class:`gpipe.schedule.Schedule`.

Note [learnt state]: ``draws``, ``writes_input`` and ``split_plans`` are the only fields whose contents change: runs
learn, per partition, which layers draw random numbers (Note [learning which layers draw] in :mod:`gpipe.autograd.rng`),
whether the partition writes its input in place (Note [entering a partition] in :mod:`gpipe.interpreter.worker`) and how
its backward splits (Note [plans across steps] in :mod:`gpipe.autograd.split_backward`). What they learnt belongs to
this pipeline: the description never swaps them for other objects.

Note [placed stages]: a worker is one schedule device and runs every stage the schedule places there, each on
its partition's device; the stages of one worker must share a torch device and CPU cores (one thread, one
device context, one pinning), which :meth:`Pipeline.workers` checks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from gpipe.autograd.rng import Draws
from gpipe.autograd.split_backward import StagePlans
from gpipe.schedule import Schedule
from gpipe.skip.layout import SkipLayout

__all__ = ["Pipeline"]


@dataclass(frozen=True)
class Pipeline:
    """What every run of one pipeline shares (build it with :meth:`of`).

    Attributes:
        partitions: one ``nn.Sequential`` per stage, on its device.
        devices: the device of each partition (several partitions may share one).
        skip_layout: the partition of each skip connection's stash and pop.
        cpu_affinity: the CPU cores each partition's worker runs on (``None`` for one left unpinned); ``None``
            for no pinning at all (Note [pinned workers] in :mod:`gpipe.interpreter.affinity`).
        switch_interval: seconds Python's interpreter lock may stay with one thread while two or more workers
            run; ``None`` leaves the interpreter's setting alone (Note [switch interval] in
            :mod:`gpipe.interpreter.gil`).
        copy_streams: per CUDA device of :attr:`devices`, the stream that copies onto it run on (Note
            [hand-offs] in :mod:`gpipe.transport.inprocess`).
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
        """A new pipeline of checked parts (:func:`gpipe.checks.check_devices`,
        :func:`gpipe.interpreter.affinity.check_affinity`, :func:`gpipe.interpreter.gil.check_switch_interval`): a copy
        stream per CUDA device, nothing learnt yet."""
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

