"""Which messages each rank sends each other rank in one step, in the order it sends them.

Note [one order per pair]: messages between two ranks travel on one tag and match in the order they were
posted (NCCL ignores tags altogether), so a receiver posts its receives in the order its sender sends. Every
rank knows the whole schedule and skip layout, so it derives that order itself: the sender's tasks in its list
order, and inside a task the activation or gradient (channel ``""``) first, then each skip key in the layout's
order (:func:`outgoing`). The transport holds a task's remote sends until the task ends and then sends them in
this order, whatever order the layers produced them in. After the last task the last stage's rank sends the
step's loss (:data:`LOSS`) to every other rank; a schedule of copies, whose routes end on several ranks, gathers
the micro-batches' losses on every rank instead (:class:`gpipe.distributed.DistributedGPipe`).
"""

from __future__ import annotations

from gpipe.schedule import Op, Schedule, Task
from gpipe.skip.layout import SkipLayout
from gpipe.transport.base import Key

__all__ = ["LOSS", "Route", "incoming", "loss_key", "outgoing"]

LOSS = "step-loss"  # the channel of the step's loss, from the last stage's rank to every other rank

Route = tuple[Key, int]
"""A message's key and the stage it goes to."""


def outgoing(task: Task, n: int, layout: SkipLayout, copies: int = 1) -> list[Route]:
    """Every message ``task`` sends to another stage, in the canonical order (Note [one order per pair]); ``copies``:
    of the stages, whose routes each end at every ``n // copies``-th (Note [stage slots] in
    :mod:`gpipe.schedule.schedule`)."""
    j, route = task.stage, n // copies
    routes: list[Route] = []
    if task.op is Op.F:
        if (j + 1) % route:
            routes.append(((task, ""), j + 1))
        routes += [((task, key), layout.popped_in[key]) for key, s in layout.stashed_in.items()
                   if s == j and layout.popped_in[key] != j]
    elif task.op is Op.B:
        if j % route:
            routes.append(((task, ""), j - 1))
        routes += [((task, key), s) for key, s in layout.stashed_in.items()
                   if layout.popped_in[key] == j and s != j]
    return routes


def loss_key(schedule: Schedule) -> Key:
    return Task(Op.F, schedule.m - 1, schedule.n - 1), LOSS


def incoming(schedule: Schedule, layout: SkipLayout, rank: int) -> dict[int, list[Route]]:
    """Per other rank, the messages it sends to ``rank`` in one step, in its order of sending."""
    streams: dict[int, list[Route]] = {}
    place = schedule.placement
    for sender, tasks in enumerate(schedule.tasks):
        if sender == rank:
            continue
        routes = [r for t in tasks for r in outgoing(t, schedule.n, layout, schedule.copies) if place[r[1]] == rank]
        if schedule.copies == 1 and sender == place[schedule.n - 1]:  # copies gather their losses: DistributedGPipe
            routes.append((loss_key(schedule), _any_stage(schedule, rank)))
        streams[sender] = routes
    return streams


def _any_stage(schedule: Schedule, rank: int) -> int:
    return schedule.placement.index(rank)

