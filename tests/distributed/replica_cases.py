"""What each rank runs in the replica tests: DistributedGPipe with ``data_parallel`` against one plain model.

Every case is ``case(rank, world, ...) -> str`` (see :mod:`tests.distributed.ranks`); ``"ok"`` means every check on
that rank held.
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor

from gpipe.distributed import DistributedGPipe
from gpipe.schedule import Checkpoint, Op, Task
from gpipe.schedule.timeline import COLLECTIVE
from tests.distributed.cases import Boom, chain

ROWS = 4  # each replica's batch


def _batches(dp: int, steps: int) -> list[tuple[Tensor, Tensor]]:
    """The global batches, alike on every rank (seeded)."""
    torch.manual_seed(1)
    return [(torch.randn(dp * ROWS, 6), torch.randn(dp * ROWS, 3)) for _ in range(steps)]


def trains(rank: int, world: int, schedule: str, checkpoint: Checkpoint, dp: int, balance: list[int],
           zero: int = 0, bucket_bytes: int = 100, steps: int = 3, reshard_after_forward: bool = True) -> str:
    """``steps`` SGD steps of ``dp`` replicas equal those of the plain model on the global batch: every step's loss
    on every rank, then this rank's parameters; each replica's collectives are spans with their bytes. ``zero``: 1,
    torch's ZeroRedundancyOptimizer; 3, the stages sharded by FSDP2 (``reshard_after_forward`` passed on)."""
    torch.manual_seed(0)
    module = chain(sum(balance))
    reference = copy.deepcopy(module)
    pipe = DistributedGPipe(module, balance, chunks=2, schedule=schedule, checkpoint=checkpoint, record=True,
                            timeout=30, data_parallel=dp, bucket_bytes=bucket_bytes, zero=3 if zero == 3 else 0,
                            reshard_after_forward=reshard_after_forward)
    assert pipe.replicas is not None
    r = pipe.replicas.replica
    optimizer: Any = ZeroRedundancyOptimizer(pipe.parameters(), torch.optim.SGD, process_group=pipe.replicas.group,
                                             lr=0.1) if zero == 1 else torch.optim.SGD(pipe.parameters(), lr=0.1)
    plain = torch.optim.SGD(reference.parameters(), lr=0.1)
    local = slice(r * ROWS, (r + 1) * ROWS)
    for x, y in _batches(dp, steps):
        optimizer.zero_grad()
        loss = pipe.step(x[local] if pipe.rank == pipe.placement[0] else None,
                         y[local] if pipe.rank == pipe.placement[-1] else None, nn.functional.mse_loss)
        optimizer.step()
        plain.zero_grad()
        expected = nn.functional.mse_loss(reference(x), y)
        expected.backward()
        plain.step()
        torch.testing.assert_close(loss, expected.detach())
    whole = dict(reference.named_parameters())
    for name, p in pipe.named_parameters():
        assert isinstance(p, DTensor) == (zero == 3), name
        torch.testing.assert_close(p.full_tensor() if isinstance(p, DTensor) else p, whole[name.split(".", 2)[2]],
                                   msg=lambda m, name=name: f"{name}: {m}")
    assert pipe.timeline is not None
    if zero == 3:
        _sharded_spans(pipe, reshard_after_forward)
        pipe.close()
        return "ok"
    spans = [s for s in pipe.timeline.spans if s.stream == COLLECTIVE]
    units = [b for j in pipe.stages for b in pipe.buckets[j]]
    last = pipe.rank == pipe.placement[-1]
    assert len(spans) == len(units) + last, (spans, units)
    for s, b in zip(spans, units, strict=False):
        assert s.label == f"all-reduce unit {b.unit} ({b.nbytes} B)" and b.nbytes > 0, (s.label, b.nbytes)
        assert s.task.stage == b.stage and 0 <= s.start <= s.end
    task_ends = {c.task: c.end for c in pipe.timeline.compute_spans()}
    # the first bucket launched inside the gradient task, as DDP overlaps it with the rest of that backward
    assert spans[0].start < task_ends[spans[0].task], (spans[0], task_ends[spans[0].task])
    pipe.close()
    return "ok"


def _sharded_spans(pipe: DistributedGPipe, reshard_after_forward: bool) -> None:
    """The last step's collectives with FSDP2: each unit gathered before each of its stage's F, R and B (or once a
    step, not resharded), reduce-scattered once, in the stage's last B; the loss's all-reduce on the last stage."""
    assert pipe.sharded is not None and pipe.timeline is not None
    schedule = pipe.schedule_for(2)
    tasks = schedule.tasks[pipe.rank]
    last = {tasks[k].stage: tasks[k] for k in schedule.gradient_positions[pipe.rank]}
    expected: Counter[tuple[str, Task]] = Counter()
    for j in pipe.stages:
        mine = [t for t in tasks if t.stage == j]
        gathers = mine if reshard_after_forward else mine[:1]
        for unit in pipe.sharded.units[j]:
            size = f"({unit.nbytes} B)"
            expected.update((f"all-gather unit {unit.unit} {size}", t) for t in gathers)
            expected[(f"reduce-scatter unit {unit.unit} {size}", last[j])] += 1
    if pipe.rank == pipe.placement[-1]:
        expected[("all-reduce loss (4 B)", Task(Op.F, schedule.m - 1, schedule.n - 1))] += 1
    spans = [s for s in pipe.timeline.spans if s.stream == COLLECTIVE]
    assert Counter((s.label, s.task) for s in spans) == expected, spans
    assert all(0 <= s.start <= s.end for s in spans), spans


def gathered(rank: int, world: int, dp: int) -> str:
    """The gathered timeline puts replica r's schedule device d at r * pp + d, each with its collectives."""
    pp = world // dp
    pipe = DistributedGPipe(chain(2 * pp), [2] * pp, chunks=2, record=True, timeout=30, data_parallel=dp)
    x, y = _batches(1, 1)[0]
    pipe.step(x, y, nn.functional.mse_loss)
    timeline = pipe.gather_timeline()
    pipe.close()
    if rank != 0:
        assert timeline is None
        return "ok"
    assert timeline is not None and timeline.num_devices == world and timeline.meta["replicas"] == dp
    plan = pipe.schedule_for(2)
    for device in range(world):
        assert timeline.task_order(device) == list(plan.tasks[device % pp]), device
        labels = [s.label for s in timeline.spans if s.device == device and s.stream == COLLECTIVE]
        assert labels and all(re.fullmatch(r"all-reduce (unit \d+|loss) \(\d+ B\)", t) for t in labels), labels
    return "ok"


def fails(rank: int, world: int, dp: int, victim: int, zero: int = 0) -> str:
    """A backward that raises on global rank ``victim`` (a last stage's): every rank of every replica raises, naming
    it, the other replica's ranks from their wait for the gradients' reduction (``zero=3``: for a unit's gather)."""
    pp = world // dp
    torch.manual_seed(0)
    pipe = DistributedGPipe(nn.Sequential(*[nn.Linear(6, 6) for _ in range(pp)], nn.Identity()), [1] * (pp - 1) + [2],
                            chunks=2, timeout=30, data_parallel=dp, zero=zero)
    if pipe.world_rank == victim:  # only this replica's copy of the last layer raises
        last = pipe.partitions[pipe.stages[-1]]
        last[len(last) - 1] = Boom("B")
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    try:
        pipe.step(x, y, nn.functional.mse_loss)
    except Exception as error:  # noqa: BLE001
        dist.barrier()  # the victim's connections stay open until every rank has its report (else: "lost rank ...")
        pipe.close()
        return f"{type(error).__name__}: {error}".splitlines()[0]
    return "no error"
