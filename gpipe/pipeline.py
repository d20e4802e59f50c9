"""The immutable description of one pipeline: partitions on devices, skip layout, options, and what it learnt.

:class:`gpipe.GPipe` builds one :class:`Pipeline` when it is made; every step runs it by a schedule
(:class:`gpipe.worker.Run`), which gets this description, never the ``GPipe`` itself::

    GPipe(module, balance, devices, ...)  --builds-->  Pipeline  --with a Schedule-->  Run  -->  Timeline

Note [what a run is given]: the schedule is not part of the description. Each step asks for its own
(``chunks`` micro-batches, or fewer for a small batch; ``forward()`` in eval mode and under ``no_grad`` runs
without checkpoints), so the checkpoint policy reaches a run inside its :class:`gpipe.schedule.Schedule`.

Note [learnt state]: ``draws`` and ``writes_input`` are the only fields whose contents change: runs learn,
per partition, which layers draw random numbers (Note [learning which layers draw] in :mod:`gpipe.rng`) and
whether the partition writes its input in place (Note [entering a partition] in :mod:`gpipe.worker`). What
they learnt belongs to this pipeline: the description never swaps them for other objects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from gpipe.rng import Draws
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
            for no pinning at all (Note [pinned workers] in :mod:`gpipe.affinity`).
        switch_interval: seconds Python's interpreter lock may stay with one thread while two or more workers
            run; ``None`` leaves the interpreter's setting alone (Note [switch interval] in :mod:`gpipe.gil`).
        copy_streams: per CUDA device of :attr:`devices`, the stream that copies onto it run on (Note
            [hand-offs] in :mod:`gpipe.handoff`).
        draws: which layers of each partition draw random numbers (Note [learnt state]).
        writes_input: per partition, whether it writes its input in place; ``None`` until a training
            task has learnt it (Note [learnt state]).
    """

    partitions: tuple[nn.Sequential, ...]
    devices: tuple[torch.device, ...]
    skip_layout: SkipLayout
    cpu_affinity: tuple[frozenset[int] | None, ...] | None
    switch_interval: float | None
    copy_streams: Mapping[torch.device, Any]
    draws: Draws
    writes_input: list[bool | None]

    @classmethod
    def of(cls, partitions: Sequence[nn.Sequential], devices: Sequence[torch.device], skip_layout: SkipLayout, *,
           cpu_affinity: Sequence[frozenset[int] | None] | None = None,
           switch_interval: float | None = None) -> Pipeline:
        """A new pipeline of checked parts (:func:`gpipe.checks.check_devices`, :func:`gpipe.affinity.check_affinity`,
        :func:`gpipe.gil.check_switch_interval`): a copy stream per CUDA device, nothing learnt yet."""
        streams = {d: torch.cuda.Stream(d) for d in dict.fromkeys(devices) if d.type == "cuda"}
        return cls(tuple(partitions), tuple(devices), skip_layout,
                   None if cpu_affinity is None else tuple(cpu_affinity), switch_interval, MappingProxyType(streams),
                   Draws(partitions), [None] * len(partitions))

    def copy_stream(self, device: torch.device) -> Any:
        """The stream copies onto ``device`` run on; ``None`` for a device that is not one of this pipeline's
        CUDA devices."""
        return self.copy_streams.get(device)
