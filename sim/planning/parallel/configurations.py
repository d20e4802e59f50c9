"""The sweep's space: the configurations a request spans (:func:`configurations`), each a :class:`Configuration`,
and the schedule each runs (:func:`make_schedule`); :mod:`sim.planning.sweep` evaluates one.

A configuration is ``t x c x p x d`` GPUs (tensor- and context-parallel ranks, pipeline devices, replicas), a number
of micro-batches, a recompute policy, a schedule and its stages per device, a ZeRO stage (with FSDP's resharding
and hybrid sharding group), sequence parallelism on or off, and for a mixture of experts its expert-parallel and
expert tensor-parallel degrees, folded onto each stage's ``t x c x d`` GPUs (:mod:`sim.planning.parallel.experts`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gpipe.schedule import Schedule, ScheduleKind, schedule_kind
from sim.planning.parallel.experts import expert_data_group, folds
from sim.planning.parallel.recompute import schedule_checkpoint

__all__ = ["MAX_CHUNKS", "Configuration", "Space", "configurations", "make_schedule"]

MAX_CHUNKS = 128  # default sweep: powers of two up to this (a simulation grows with chunks x stages)


@dataclass(frozen=True)
class Configuration:
    """One point of a sweep (see the module docstring); ``gpus = tensor_parallel * context_parallel * stages *
    replicas``."""

    gpus: int
    stages: int
    replicas: int
    chunks: int
    checkpoint: str
    schedule: str
    virtual: int = 1
    tensor_parallel: int = 1
    zero: int = 0
    sequence_parallel: bool = False
    context_parallel: int = 1
    reshard: bool = True
    shard_group: int | None = None
    expert_parallel: int = 1
    expert_tensor_parallel: int = 1

    @property
    def expert_data_group(self) -> int:
        """Ranks that hold the same routed experts and reduce their gradients together (``edp``)."""
        return expert_data_group(self.tensor_parallel, self.context_parallel, self.replicas, self.expert_parallel,
                                 self.expert_tensor_parallel)

    @property
    def sharding_group(self) -> int:
        """Ranks a ZeRO shard spans: :attr:`data_group`, or under hybrid sharding ``shard_group`` replicas' ranks."""
        return self.data_group if self.shard_group is None else self.shard_group * self.context_parallel

    @property
    def data_group(self) -> int:
        """Ranks that hold the same weights and reduce their gradients together: the replicas times the
        context-parallel ranks (Megatron-Core's data-parallel group with context parallelism)."""
        return self.replicas * self.context_parallel

    @property
    def count_key(self) -> tuple[int, bool, int, int, int]:
        """What one GPU's count is a shard by: ``(tensor_parallel, sequence_parallel, context_parallel,
        expert_parallel, expert_tensor_parallel)``, the key of :attr:`Sweep.costs`."""
        return (self.tensor_parallel, self.sequence_parallel, self.context_parallel, self.expert_parallel,
                self.expert_tensor_parallel)


# Note [virtual stages]: a schedule registered with a layout (``ScheduleKind.place``: several stages per device)
# runs ``v`` stages on each of the pipeline's ``p`` devices, ``n = v * p`` stages placed by ``layout(n, p)``; the
# sweep tries each ``v`` of ``virtual`` whose ``n`` the model's layers cover and whose placement the layout
# accepts (a V-shape takes ``v = 2`` only). A schedule without a layout runs one stage per device (``v = 1``). A
# schedule of copies (DualPipe: Note [stage slots] in gpipe.schedule.schedule) runs ``v = copies`` slots on each
# device, copies of ``p`` stages of the model: its balance has ``p`` stages (Note [copies in the sweep] in
# sim.planning.sweep).
def _virtuals(kind: ScheduleKind, depth: int, layers: int, virtual: Sequence[int], why: dict[str, str]) -> list[int]:
    if kind.copies > 1:
        if depth > layers:
            why[kind.name] = f"{depth} stages need {depth} layers, the model has {layers}"
            return []
        try:
            kind.layout(kind.copies * depth, depth)
        except ValueError as exc:
            why[kind.name] = str(exc)
            return []
        return [kind.copies]
    if kind.place is None:
        return [1]
    out = []
    for v in virtual:
        if v * depth > layers:
            why[kind.name] = f"{v} stages on each of {depth} devices need {v * depth} layers, the model has {layers}"
            continue
        try:
            kind.layout(v * depth, depth)
        except ValueError as exc:
            why[kind.name] = str(exc)
            continue
        out.append(v)
    return out


class Space(Protocol):
    """What :func:`configurations` reads of a request: a :class:`PlanRequest`, or the CLI's options before the model
    is counted (:class:`sim.planning.sweep_size.SweepSpace`, which prices the sweep before it runs)."""

    @property
    def batch(self) -> int: ...
    @property
    def layers(self) -> int: ...
    @property
    def gpus(self) -> Sequence[int]: ...
    @property
    def degrees(self) -> Sequence[int]: ...
    @property
    def contexts(self) -> Sequence[int]: ...
    @property
    def splits(self) -> Sequence[bool]: ...
    @property
    def checkpoints(self) -> Sequence[str]: ...
    @property
    def schedule_names(self) -> Sequence[str]: ...
    @property
    def virtual(self) -> Sequence[int]: ...
    @property
    def zero(self) -> Sequence[int]: ...
    @property
    def chunks(self) -> Sequence[int] | None: ...
    @property
    def stages(self) -> Sequence[int] | None: ...
    @property
    def replicas(self) -> Sequence[int] | None: ...
    @property
    def balance(self) -> Sequence[int] | None: ...
    @property
    def reshard_after_forward(self) -> Sequence[bool]: ...
    @property
    def shard_group(self) -> int | None: ...
    @property
    def experts(self) -> Sequence[tuple[int, int]]: ...


def configurations(request: Space, why: dict[str, str]) -> list[Configuration]:
    """Every configuration of ``request``, under its constraints: ``t * c`` divides the GPU count, a pipeline has at
    most one device per layer, a replica at least one sample and a micro-batch at least one; sequence parallelism
    only with ``t > 1``, ZeRO only with replicas to shard over, and each ``(ep, etp)`` of ``request.experts`` where it
    folds onto a stage's GPUs, ``etp`` 1 or ``t`` (``why`` collects each schedule's refusals)."""
    batch, layers, chunks, stages, replicas = (request.batch, request.layers, request.chunks, request.stages,
                                               request.replicas)
    pinned = len(request.balance) if request.balance is not None else None
    out: list[Configuration] = []
    kinds = [schedule_kind(s) for s in request.schedule_names]
    for t, c, g in ((t, c, g) for t in request.degrees for c in request.contexts for g in request.gpus
                    if g % (t * c) == 0):
        pipelines = g // (t * c)  # devices per tensor- and context-parallel rank
        sps = [sp for sp in request.splits if t > 1 or not sp] or [False]
        for n in (s for s in range(1, min(pipelines, layers) + 1)
                  if pipelines % s == 0 and (stages is None or s in stages)):
            r = pipelines // n
            if r > batch or (replicas is not None and r not in replicas):
                continue
            zs = [z for z in dict.fromkeys(request.zero) if r > 1 or z == 0] or [0]
            # hybrid sharding (Note [hybrid sharding] in sim.planning.sweep): a group of at least the replicas is
            # plain sharding; one that does not divide them is no layout (skipped, as a degree dividing no count is)
            group = request.shard_group if request.shard_group is not None and request.shard_group < r else None
            if group is not None and r % group:
                continue
            zeros = [(z, reshard) for z in zs
                     for reshard in (dict.fromkeys(request.reshard_after_forward) if z == 3 else (True,))]
            per_replica = math.ceil(batch / r)
            ms = chunks if chunks is not None else [2**k for k in range(8) if 2**k <= min(per_replica, MAX_CHUNKS)]
            vs = [(k.name, [v for v in _virtuals(k, n, layers, request.virtual, why)
                            if pinned in (None, v * n // k.copies)]) for k in kinds]
            experts = [(ep, etp) for ep, etp in request.experts if etp in (1, t) and folds(t, c, r, ep, etp)]
            for m in ms:
                if m > per_replica:
                    continue
                out.extend(Configuration(g, n, r, m, ck, s, v, t, z, sp, c, reshard, group if z else None, ep, etp)
                           for ck in request.checkpoints for s, each in vs for v in each for sp in sps
                           for z, reshard in zeros for ep, etp in experts)
    return out


def make_schedule(p: Configuration) -> Schedule:
    """The configuration's schedule: ``v * p`` stages placed by the schedule's layout, or one stage per device."""
    kind = schedule_kind(p.schedule)
    checkpoint = schedule_checkpoint(p.checkpoint)  # Note [per-layer recompute] in sim.planning.parallel.recompute
    if kind.place is None:
        return kind(p.chunks, p.stages, checkpoint)
    return kind(p.chunks, p.stages * p.virtual, checkpoint, devices=p.stages)
