"""The bytes each stage keeps for backward, read from a recorded step: the memory side of a cost model.

A measured timeline's ``meta["held_bytes"]`` (:mod:`gpipe.interpreter.recorder`) gives the bytes each ``F`` and ``R``
task added to its device's count. A grad-enabled forward (an ``F`` not checkpointed, every ``R``) adds what
autograd saves, a cost model's ``saved_bytes``; a checkpointed ``F`` adds its input, ``checkpoint_bytes``
(Note [memory] in :mod:`sim.core.memory`). :func:`held_stage_bytes` reads them per stage and
:func:`with_held_bytes` puts them into a cost model, so the simulator predicts a step's memory from what that
step measured, and any gap between the two is in when bytes are held and freed, not in how many.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gpipe.schedule import Op, Task, checkpointed
from gpipe.schedule.timeline import Timeline
from sim.core.cost import CostModel

__all__ = ["HeldBytes", "held_stage_bytes", "with_held_bytes"]


@dataclass(frozen=True)
class HeldBytes:
    """What one stage keeps per micro-batch: ``saved`` by a grad-enabled forward, ``checkpoint`` by a
    checkpointed one (0 where the step ran no such task)."""

    saved: int = 0
    checkpoint: int = 0


def held_stage_bytes(timeline: Timeline) -> tuple[HeldBytes, ...]:
    """Each stage's :class:`HeldBytes`, from a recorded training step.

    Raises:
        ValueError: the timeline holds no per-task bytes (record a training step: ``GPipe(..., record=True)``
            and ``step()`` or ``backward()``), or two micro-batches of one stage kept different bytes (give
            every micro-batch the same size: a batch that ``chunks`` divides).
    """
    meta = timeline.meta
    if "held_bytes" not in meta or "n" not in meta:
        raise ValueError("this timeline has no bytes per task: record a training step (GPipe(..., record=True), "
                         "then step() or forward() + backward()) and pass its pipe.timeline")
    m, n, policy = int(meta["m"]), int(meta["n"]), meta["checkpoint"]
    seen: dict[tuple[int, str], dict[int, list[str]]] = {}  # (stage, "saved" or "checkpoint") -> bytes -> tasks
    for text, nbytes in meta["held_bytes"].items():
        task = Task.parse(text)
        kind = "checkpoint" if task.op is Op.F and checkpointed(policy, task.microbatch, m) else "saved"
        seen.setdefault((task.stage, kind), {}).setdefault(int(nbytes), []).append(text)
    for (j, kind), values in sorted(seen.items()):
        if len(values) > 1:
            shown = "; ".join(f"{b} bytes: {' '.join(ts)}" for b, ts in sorted(values.items()))
            raise ValueError(f"stage {j}'s micro-batches kept different {kind} bytes ({shown}); give every "
                             "micro-batch the same size (a batch that chunks divides)")

    def one(j: int, kind: str) -> int:
        return next(iter(seen.get((j, kind), {0: []})))

    return tuple(HeldBytes(one(j, "saved"), one(j, "checkpoint")) for j in range(n))


def with_held_bytes(cost: CostModel, timeline: Timeline) -> CostModel:
    """``cost`` with each stage's ``saved_bytes`` and ``checkpoint_bytes`` replaced by the recorded step's.

    Raises:
        ValueError: as :func:`held_stage_bytes`, or a cost model of another number of stages.
    """
    held = held_stage_bytes(timeline)
    if len(held) != cost.n:
        raise ValueError(f"the cost model has {cost.n} stages but the recorded step {len(held)}: give a cost "
                         "model of the recorded pipeline's stages")
    stages = tuple(dataclasses.replace(s, saved_bytes=h.saved, checkpoint_bytes=h.checkpoint)
                   for s, h in zip(cost.stages, held, strict=True))
    return dataclasses.replace(cost, stages=stages)
