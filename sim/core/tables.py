"""Per-task tables of a simulation, built once per kind of task rather than per task: what crosses devices, and costs.

A kind of task is ``[checkpointed][opcode][stage]``: Note [dependencies] in :mod:`gpipe.schedule.task` makes
every dependency one of the same micro-batch, depending on the micro-batch only through whether it is
checkpointed, so a table indexed so holds every task.
"""

from __future__ import annotations

from gpipe.schedule import Op, Schedule, Task
from sim.core.cost import CostModel

__all__ = ["B", "F", "OPCODE", "OPS", "R", "W", "Inputs", "Outputs", "TaskRow", "communication_table", "remote_tables",
           "task_table"]

#: Opcodes, indices of the tables' second level, and the ops they stand for.
F, B, R, W = 0, 1, 2, 3
OPS = (Op.F, Op.B, Op.R, Op.W)
OPCODE = {op: code for code, op in enumerate(OPS)}

Inputs = list[list[list[tuple[int, ...]]]]  # [c][op][j]: slot offsets waited for
Outputs = list[list[list[tuple[tuple[int, int], ...]]]]  # [c][op][j]: (device, slot offset) of each copy sent

#: ``(slot offsets waited for, (device, slot offset) of each copy sent, seconds at scale 1, host seconds)``.
TaskRow = tuple[tuple[int, ...], tuple[tuple[int, int], ...], float, float]


def remote_tables(schedule: Schedule, splits: bool) -> tuple[Inputs, Outputs, int]:
    """Which dependencies cross devices, per ``[checkpointed][opcode][stage]``.

    A copy of a producer's result to one device has a *slot*, an index into a flat array: slot =
    ``offset + i * stride`` for micro-batch ``i``, where ``stride = n * fanout`` and ``fanout`` is the
    largest number of devices one result goes to. Returns ``(inputs, outputs, fanout)``:

    - ``inputs[c][op][j]``: the slot offsets task ``(op, i, j)`` waits for, when micro-batch ``i`` is
      checkpointed (``c=1``) or not;
    - ``outputs[c][op][j]``: ``(device, slot offset)`` of each copy of that task's result.

    The tables ask :meth:`Schedule.dependencies` itself, once per class, on a representative micro-batch
    (that a dependency is of the same micro-batch is checked here).
    """
    m, n, place = schedule.m, schedule.n, schedule.placement
    found: dict[tuple[int, int, int], list[tuple[int, int]]] = {}  # (c, op, j) -> remote (op, stage) deps
    dsts: dict[tuple[int, int, int], list[int]] = {}  # (c, op, j) -> devices that need that result
    for c in (0, 1):
        i = next((k for k in range(m) if schedule.is_checkpointed(k) == bool(c)), None)
        if i is None:
            continue
        for op in [Op.F, Op.B] + ([Op.R] if c else []) + ([Op.W] if splits else []):
            for j in range(n):
                for dep in schedule.dependencies(Task(op, i, j)):
                    if dep.microbatch != i:
                        raise NotImplementedError(f"{Task(op, i, j)} depends on {dep}, of another micro-batch; "
                                                  "the simulator handles same-micro-batch dependencies only")
                    if place[dep.stage] != place[j]:
                        found.setdefault((c, OPCODE[op], j), []).append((OPCODE[dep.op], dep.stage))
                        to = dsts.setdefault((c, OPCODE[dep.op], dep.stage), [])
                        if place[j] not in to:
                            to.append(place[j])
    fanout = max([len(v) for v in dsts.values()] + [1])

    def offset(c: int, op: int, j: int, device: int) -> int:
        return (op * m * n + j) * fanout + dsts[(c, op, j)].index(device)

    inputs = [[[tuple(offset(c, dop, dj, place[j]) for dop, dj in found.get((c, op, j), ())) for j in range(n)]
               for op in range(4)] for c in (0, 1)]
    outputs = [[[tuple((dev, offset(c, op, j, dev)) for dev in dsts.get((c, op, j), ())) for j in range(n)]
                for op in range(4)] for c in (0, 1)]
    return inputs, outputs, fanout


def _stage_seconds(cost: CostModel, j: int, checkpointed: bool, op: int) -> float:
    """Seconds of one task at micro-batch scale 1: the runner's own measurement of them where it has one."""
    measured = cost.runner.stage_seconds(OPS[op], j, checkpointed)
    if measured is not None:
        return measured
    stage = cost.stages[j]
    if op == F:
        return stage.forward_seconds(checkpointed)
    if op == R:
        return stage.recompute_seconds
    return stage.backward if op == B else stage.weight


def communication_table(cost: CostModel) -> list[list[float]]:
    """``[op][j]``: the seconds of each kind of task that wait on the network, at micro-batch scale 1
    (Note [communication] in :mod:`sim.core.cost`: ``F``, ``R`` and ``B`` have the stage's, ``W`` none)."""
    return [[0.0 if op == W else stage.communication for stage in cost.stages] for op in range(4)]


def task_table(cost: CostModel, inputs: Inputs, outputs: Outputs) -> list[list[list[TaskRow]]]:
    """``table[c][op][j]``: the :data:`TaskRow` of every kind of task; its seconds hold the task's communication
    (Note [communication] in :mod:`sim.core.cost`), which a task alone waits for on its device."""
    # Note [host costs]: the runner's host seconds (RunnerCosts) do not scale with the micro-batch. The row's
    # seconds include them unless micro-batches scale; then the device process scales the stage seconds and
    # adds the host seconds. A runner's own stage seconds (a recording executor's) replace the StageCost's.
    runner, scaled = cost.runner, bool(cost.microbatch_scale)
    host = [[[runner.host_seconds(OPS[op], j, c == 1) for j in range(cost.n)] for op in range(4)] for c in (0, 1)]
    talk = communication_table(cost)
    return [[[(inputs[c][op][j], outputs[c][op][j],
               _stage_seconds(cost, j, c == 1, op) + talk[op][j] + (0.0 if scaled else host[c][op][j]),
               host[c][op][j])
              for j in range(cost.n)] for op in range(4)] for c in (0, 1)]
