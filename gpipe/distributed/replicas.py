"""Replicas of a pipeline on a 2-D device mesh ``(pp, dp)``: the mesh, each replica's share of the loss, one timeline.

::

    mesh = init_device_mesh(device_type, (pp, dp), mesh_dim_names=("pp", "dp"))

                 dp ->
          pp   mesh[0, 0]  mesh[0, 1]     replica r runs schedule device d on rank mesh[d, r]; a row (one stage's
          |    mesh[1, 0]  mesh[1, 1]     ranks) is a dp group, which reduces that stage's gradients
          v                               (:mod:`gpipe.distributed.reduction`); a column is a pipeline

Note [a replica's batch]: as with ``DistributedDataParallel``, each replica reads its own local batch (``x`` on its
first stage's rank, ``y`` on its last's), and every replica's batch has the same rows. The step is the plain model's
on the global batch, the replicas' batches concatenated: a mean loss is scaled by ``1 / dp`` on each replica and the
gradients are summed over the dp group (DDP's average, in one place), a summed loss is summed; the step's loss is
summed over the last stage's dp group (a collective and a span like the gradients'). A mean over counted class
indices (cross entropy with ``ignore_index`` or class weights) divides by the whole batch's count, which no replica
knows: it is refused, with the way around.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from gpipe.distributed.clock import merge
from gpipe.distributed.group import start_default_group
from gpipe.loss import LossPlan
from gpipe.schedule.timeline import MemorySample, Span, Timeline

__all__ = ["MESH_DIMS", "Replicas", "merge_replicas", "replica_share"]

#: The mesh's dimension names, outermost first: torch's row-major mesh puts a stage's dp ranks side by side.
MESH_DIMS = ("pp", "dp")


@dataclass(frozen=True)
class Replicas:
    """This rank's place on the mesh.

    Attributes:
        mesh: the ``(pp, dp)`` device mesh (:data:`MESH_DIMS`).
        replica: this rank's replica (its ``dp`` coordinate); ``device``: its schedule device (``pp`` coordinate).
        group: the dp group: this stage's ranks of every replica, on which its gradients are reduced.
        control: a gloo group of the whole world, for the step's start and the timeline.
        pipelines: every replica's global ranks, schedule device by device.
    """

    mesh: DeviceMesh
    replica: int
    device: int
    group: Any
    control: Any
    pipelines: list[list[int]]

    @property
    def pp(self) -> int:
        return len(self.pipelines[0])

    @property
    def dp(self) -> int:
        return len(self.pipelines)

    @property
    def world(self) -> int:
        return self.pp * self.dp

    @property
    def rank(self) -> int:
        """This rank in the world."""
        return self.pipelines[self.replica][self.device]

    @property
    def peers(self) -> str:
        """How this replica's pipeline numbers its ranks, for the messages that name them (``Alarm(peers=)``)."""
        return f" (in this replica's pipeline, rank d is world rank {self.pipelines[self.replica]}[d])"

    @property
    def pipeline_group(self) -> Any:
        """This replica's pipeline: the group its stages send activations and gradients on."""
        return self.mesh.get_group("pp")

    @classmethod
    def start(cls, dp: int, device: torch.device, timeout: float) -> Replicas:
        """The mesh of the default group's world (started from torchrun's environment if need be) in ``dp``
        replicas.

        Raises:
            ValueError: ``dp`` does not divide the world; no group and no torchrun environment.
        """
        start_default_group(device, timeout)
        world = dist.get_world_size()
        if world % dp:
            raise ValueError(f"data_parallel={dp} does not divide the {world} ranks into replicas of one pipeline")
        # Note [a group per pipeline] in gpipe.distributed.group: the mesh makes new groups, except where one
        # dimension is the whole world (pp 1), whose group torch takes to be the default one
        mesh = init_device_mesh(device.type, (world // dp, dp), mesh_dim_names=MESH_DIMS)
        ranks = mesh.mesh  # (pp, dp) global ranks
        control = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        d, r = (int(c) for c in mesh.get_coordinate() or (0, 0))
        return cls(mesh, r, d, mesh.get_group("dp"), control, [ranks[:, c].tolist() for c in range(dp)])


def replica_share(plan: LossPlan, reduction: str, target: Sequence[Tensor], dp: int) -> LossPlan:
    """The loss plan of one of ``dp`` replicas whose local loss ``plan`` is (Note [a replica's batch]).

    Raises:
        ValueError: a mean over counted class indices, which only the whole batch can divide.
    """
    if reduction == "sum":
        return plan
    if reduction == "class-weighted" and not target[0].is_floating_point():
        raise ValueError("a cross entropy or NLL mean over class indices divides by the whole batch's counted "
                         "targets, which no replica knows: with data_parallel > 1 give the loss reduction='sum' and "
                         "divide it by the global count in loss_fn")
    return LossPlan(plan.fn, tuple(s / dp for s in plan.scales), plan.undefined)


def merge_replicas(parts: Sequence[dict[str, Any]], offsets: Sequence[tuple[float, float]],
                   pipelines: Sequence[Sequence[int]]) -> Timeline:
    """Every replica's pipeline in one timeline on global rank 0's clock: replica ``r``'s schedule device ``d`` is
    device ``r * pp + d``, so replica 0's devices are the schedule's (what the simulator predicts).

    ``parts`` and ``offsets`` are indexed by global rank (:func:`gpipe.distributed.clock.merge`'s, world-wide).
    """
    origin = min(part["t0"] - offsets[g][0] for g, part in enumerate(parts))
    pp = len(pipelines[0])
    spans: list[Span] = []
    memory: list[MemorySample] = []
    meta: dict[str, Any] = {}
    devices: list[Any] = []
    state: list[int] = []
    for r, ranks in enumerate(pipelines):
        one = merge([parts[g] for g in ranks], [offsets[g] for g in ranks], origin=origin)
        spans += [Span(r * pp + s.device, s.stream, s.task, s.start, s.end, s.label) for s in one.spans]
        memory += [MemorySample(r * pp + s.device, s.time, s.bytes) for s in one.memory]
        devices += one.meta["devices"]
        state += one.meta["model_state_bytes"]
        meta = meta or dict(one.meta)
    meta.update(world_size=len(parts), replicas=len(pipelines), devices=devices, model_state_bytes=state,
                layout=f"replica r's schedule device d is device r * {pp} + d", ranks=[list(p) for p in pipelines])
    meta["clock"] = dict(meta["clock"], offsets=[o for o, _ in offsets], residual=max(e for _, e in offsets))
    memory.sort(key=lambda s: (s.device, s.time))
    return Timeline(tuple(spans), tuple(memory), len(parts), "measured", meta)
