"""The planner's memory replay in arrays equals a replay task by task, its saved bytes from the simulator's Memory.

Both apply the one saved-bytes rule (Note [saved bytes] in gpipe.schedule.saved): the planner in list order, the
simulator as tasks start and end. ``_task_by_task`` is the reference for what the planner adds to it (gradients,
working sets, rounding, copy streams, the task at the peak): every registered schedule, every checkpoint policy, a
split backward, uneven micro-batches, uneven stages and both copy-stream models give the same peak, part by part.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import pytest

from gpipe.schedule import CHECKPOINT_MODES, SCHEDULES, Checkpoint, Op, Schedule, schedule_kind
from sim.core.cost import StageCost
from sim.core.memory import Memory
from sim.core.tables import OPCODE, OPS
from sim.planning.parallel.memory import MemoryParts, copy_stream_bytes, device_memory, round_block, round_segment


def _task_by_task(schedule: Schedule, stages: Sequence[StageCost], working: Sequence[int], workspace: int,
                  scales: Sequence[float], backward_working: Sequence[int], copy_streams: str) -> list[MemoryParts]:
    accumulating = list(backward_working) if backward_working else list(working)
    devices, split = schedule.num_devices, schedule.splits_weight_gradient
    checkpointed = [int(schedule.is_checkpointed(i)) for i in range(schedule.m)]
    copies = [0] * devices
    if copy_streams == "per_microbatch":
        copies = copy_stream_bytes(schedule, stages, scales)
        stages = [replace(s, checkpoint_bytes=0) if j > 0 and schedule.placement[j - 1] != schedule.placement[j]
                  else s for j, s in enumerate(stages)]
    memory = Memory(stages, devices, checkpointed, list(scales) if scales else None, split)
    grad_op = Op.W if split else Op.B
    out = []
    for d in range(devices):
        mine = schedule.stages_on(d)
        params = sum(round_block(stages[j].parameter_bytes) for j in mine)
        optimizer = sum(round_block(stages[j].optimizer_bytes) for j in mine)
        best = MemoryParts(params, optimizer, 0, 0, 0, 0, round_segment(params + optimizer) - params - optimizer,
                           copies=copies[d])
        grads: set[int] = set()
        gradients = 0
        for k, task in enumerate(schedule.tasks[d]):
            op, i, j = OPCODE[task.op], task.microbatch, task.stage
            memory.start(d, op, i, j, float(k))
            held = memory.current[d]
            memory.after(d, op, i, j, float(k))
            saved = max(held, memory.current[d])  # the most the task holds, from its start to its end
            scale = scales[i] if scales else 1.0
            size = accumulating[j] if task.op is grad_op and j in grads else working[j]
            if task.op is grad_op and j not in grads:
                grads.add(j)
                gradients += round_block(stages[j].gradient_bytes)
            live = 0 if task.op is Op.W else round_block(size * scale)
            raw = params + optimizer + gradients + saved + live + workspace
            if raw > best.total - best.rounding - best.copies or not best.task:
                best = MemoryParts(params, optimizer, gradients, saved, live, workspace, round_segment(raw) - raw,
                                   str(task), copies[d])
        out.append(best)
    return out


def _random_stages(rng: random.Random, n: int, split: bool) -> list[StageCost]:
    out = []
    for _ in range(n):
        saved = rng.randrange(1, 10**7)
        weight = rng.choice([None, rng.randrange(0, saved + 1), saved * 2]) if split else None
        out.append(StageCost(1.0, 2.0, weight=1.0 if split else 0.0, send_bytes=rng.randrange(0, 10**6),
                             saved_bytes=saved, checkpoint_bytes=rng.randrange(0, 10**6),
                             weight_bytes=weight, parameter_bytes=rng.randrange(0, 10**8),
                             gradient_bytes=rng.randrange(0, 10**8), optimizer_bytes=rng.randrange(0, 10**8)))
    return out


def _shapes() -> list[tuple[str, int, int, int]]:
    out = []
    for name in SCHEDULES:
        kind = schedule_kind(name)
        for m, devices in ((4, 2), (8, 4), (6, 3), (8, 2)):
            out.append((name, m, devices, 2 if kind.place is not None else 1))
    return out


@pytest.mark.parametrize(("name", "m", "devices", "v"), _shapes())
@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
def test_array_replay_equals_the_task_by_task_replay(name: str, m: int, devices: int, v: int,
                                                     checkpoint: Checkpoint) -> None:
    kind = schedule_kind(name)
    try:
        schedule = kind(m, devices, checkpoint) if kind.place is None else \
            kind(m, devices * v, checkpoint, devices=devices)
    except ValueError:
        pytest.skip(f"{name} does not take m={m} on {devices} devices x {v}")
    rng = random.Random(hash((name, m, devices, v, checkpoint)) % 2**32)
    n = schedule.n
    for trial in range(3):
        stages = _random_stages(rng, n, schedule.splits_weight_gradient)
        working = [rng.randrange(0, 10**6) for _ in range(n)]
        backward = [rng.randrange(0, 10**6) for _ in range(n)] if trial else []
        scales = [1.0] * (m - 1) + [rng.choice([0.5, 1 / 3, 0.75])] if trial == 2 else []
        for streams in ("shared", "per_microbatch"):
            got = device_memory(schedule, stages, working, 8 * 2**20, scales, backward, streams)
            want = _task_by_task(schedule, stages, working, 8 * 2**20, scales, backward, streams)
            assert got == want, (name, checkpoint, trial, streams)


def test_the_simulators_op_codes_index_the_rules_arrays() -> None:
    """sim.core.memory indexes gpipe.schedule.saved's arrays by the simulator's op codes: both follow Op's order."""
    assert OPS == tuple(Op)
