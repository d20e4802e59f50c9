"""DualPipe across processes: each rank holds its stages of both copies, and after the backward each stage's gradients
are summed over every slot that runs it, on this rank and on its mirror rank.

Note [mirrored stages]: a schedule of copies (Note [stage slots] in :mod:`gpipe.schedule.schedule`) places each of the
model's stages in several slots; DualPipe puts stage ``d`` and a copy of stage ``p-1-d`` on rank ``d``, so ranks
``d`` and ``p-1-d`` hold the same two stages, one slot each of each. Every slot is a real partition of its rank,
built from the same layers (materialised alike: Note [materialised weights] in :mod:`gpipe.distributed.materialize`),
so ``parameters()`` holds both and the rank's optimizer steps both. After the step's last task a rank sums the
gradients of its slots of each stage, then all-reduces them, flat in stage order, over the group of the ranks that
hold the same stages (DeepSeek's DualPipe does so for its two directions), and writes the sum into every slot: each
copy of a stage then steps by the plain model's gradient, and the copies stay equal. A rank whose stages no other
rank holds (the middle of an odd ``p``) sums locally only. The all-reduce is a collective span of the recorded
timeline (:func:`gpipe.schedule.timeline.collective_label`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from gpipe.distributed.faults import Alarm, Waiter
from gpipe.interpreter.recorder import Recorder
from gpipe.schedule import Schedule, Task
from gpipe.schedule.timeline import COLLECTIVE, collective_label

__all__ = ["Mirrors"]


class Mirrors:
    """This rank's slots by the model's stage, and the group of the ranks that hold the same stages
    (Note [mirrored stages])."""

    def __init__(self, schedule: Schedule, rank: int, group: Any) -> None:
        """``schedule``: any step's (the placement and copies are the pipeline's); ``group``: the pipeline's group.

        Raises:
            ValueError: the ranks that share a stage do not all hold the same stages (no one group sums them).
        """
        world = schedule.num_devices
        held = [frozenset(schedule.model_stage(j) for j in schedule.stages_on(d)) for d in range(world)]
        self.rank = rank
        self.slots = {s: [j for j in schedule.stages_on(rank) if schedule.model_stage(j) == s]
                      for s in sorted(held[rank])}  # this rank's slots of each of its stages
        self.peers = [d for d in range(world) if held[d] & held[rank]]
        for d in self.peers:
            if held[d] != held[rank]:
                raise ValueError(f"ranks {rank} and {d} share a stage but hold stages {sorted(held[rank])} and "
                                 f"{sorted(held[d])}: a schedule of copies runs on DistributedGPipe when the ranks "
                                 "that share a stage hold the same stages (DualPipe's mirror ranks)")
        self.group = None
        global_ranks = dist.get_process_group_ranks(group)
        groups = sorted({tuple(d for d in range(world) if held[d] == held[r]) for r in range(world)})
        for members in groups:  # each made by its members alone (a local synchronization), in one order
            if len(members) > 1 and rank in members:
                self.group = dist.new_group([global_ranks[d] for d in members], use_local_synchronization=True)

    def reduce(self, partitions: nn.ModuleList | Sequence[nn.Module], alarm: Alarm, recorder: Recorder | None,
               after: Task) -> None:
        """Sum each stage's gradients over its slots here and on the mirror ranks, into every slot; ``after``: the
        rank's last task, which the all-reduce's span follows."""
        per_stage = [[list(partitions[j].parameters()) for j in slots] for slots in self.slots.values()]
        sums: list[Tensor] = []
        for copies in per_stage:
            for params in zip(*copies, strict=True):
                grads = [p.grad for p in params if p.grad is not None]
                if grads:
                    sums.append(torch.stack(grads).sum(0) if len(grads) > 1 else grads[0].clone())
                else:
                    sums.append(torch.zeros_like(params[0]))
        if not sums:
            return
        if self.group is not None:
            flat = torch.cat([g.reshape(-1) for g in sums])
            issued = time.perf_counter() - recorder.t0 if recorder is not None else 0.0
            waiter = Waiter(f"gpipe-mirrors-{self.rank}")
            try:
                pending = waiter.add(dist.all_reduce(flat, group=self.group, async_op=True))
                alarm.wait(pending, f"the all-reduce of the mirrored stages' gradients with ranks {self.peers}")
            finally:
                waiter.close()
            if recorder is not None:
                end = max(pending.at - recorder.t0, issued)
                label = collective_label("all-reduce", "mirrored stages", flat.numel() * flat.element_size())
                with recorder.lock:  # Note [a collective's span] in gpipe.distributed.reduction
                    recorder.spans.append((self.rank, COLLECTIVE, after, issued, end, label))
            offset = 0
            for k, g in enumerate(sums):
                sums[k] = flat[offset:offset + g.numel()].view_as(g)
                offset += g.numel()
        total = iter(sums)
        for copies in per_stage:
            for params in zip(*copies, strict=True):
                summed = next(total)
                if all(p.grad is None for p in params) and not summed.any():
                    continue  # no slot of it had a gradient here nor on the mirror ranks: left as backward leaves it
                for p in params:
                    p.grad = summed.clone()
