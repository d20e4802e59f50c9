"""torch.distributed.pipelining beside our schedules: which of its classes runs each registered schedule's order, how
the speed benchmarks cut the workload for it, and its steps timed on spawned gloo processes.

Note [schedule pairs]: which class of torch.distributed.pipelining runs the same order as a registered schedule is
the table ``TORCH_SCHEDULES``; a schedule without a counterpart there gets no pipelining row, said in the output.
ZB-H1 pairs with ``ScheduleInterleavedZeroBubble`` with one stage per rank (its order reaches ZB-H1's bubble).

Note [pipelining]: each process builds the same model from the same seed and keeps the stages its device holds
(``sim.calibration.calibrate.partitions_of``, the cut GPipe uses), each wrapped by hand in a ``PipelineStage`` (the
manual front end; tracing with ``pipeline()`` yields the same stages for an ``nn.Sequential``), and runs the
schedule with ``m`` micro-batches and the same MSE loss (per micro-batch, averaged: equal to the whole batch's for
equal chunks). A step is timed on rank 0 between two barriers, so it ends when the slower rank ends.
"""

from __future__ import annotations

import datetime
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from gpipe.distributed.loopback import free_port, init_loopback_group
from gpipe.schedule import schedule_kind
from sim.calibration.calibrate import partitions_of

from .machine import THREADS, set_threads
from .workload import Workload

__all__ = ["DEVICES", "SINGLE_STAGE", "TORCH_SCHEDULES", "balance_of", "layout", "run_pipelining", "torch_step"]

DEVICES = 2  # CPU devices in-process, gloo ranks across processes
# Note [schedule pairs]
TORCH_SCHEDULES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
    "looped-bfs": "ScheduleLoopedBFS",
    "zb-h1": "ScheduleInterleavedZeroBubble",
    "zb-v": "ScheduleZBVZeroBubble",
    "dualpipe-v": "ScheduleDualPipeV",
}
SINGLE_STAGE = {"ScheduleGPipe", "Schedule1F1B"}  # torch's classes that take one stage per rank, not a list

Plans = dict[str, tuple[list[int], list[int]]]  # schedule name -> (placement of each stage, balance)


def layout(name: str, virtual: int) -> tuple[int, ...]:
    """Where each stage goes on the two devices: one stage each, or ``2 * virtual`` by the schedule's layout."""
    kind = schedule_kind(name)
    if kind.place is None:
        return kind.layout(DEVICES, DEVICES)
    return kind.layout(DEVICES * virtual, DEVICES)


def balance_of(workload: Workload, stages: int) -> list[int]:
    """Whole (Linear + ReLU) pairs per stage, the first stages the larger ones; two modules per pair."""
    if workload.layers < stages:
        raise SystemExit(f"--layers {workload.layers} cannot fill {stages} stages: give at least {stages}")
    base, extra = divmod(workload.layers, stages)
    return [2 * (base + (1 if s < extra else 0)) for s in range(stages)]


def torch_step(name: str, workload: Workload, placement: list[int], balance: list[int], rank: int, x: torch.Tensor,
               y: torch.Tensor) -> Callable[[], None]:
    """One step of torch's schedule paired with ``name`` on this rank's stages (Note [pipelining]): its gradients
    zeroed, the batch fed on the first stage's rank and the target given on the last's."""
    from torch.distributed import pipelining

    cls = getattr(pipelining, TORCH_SCHEDULES[name])
    parts = partitions_of(workload.model(), balance)
    mine = [s for s, d in enumerate(placement) if d == rank]
    stages = [pipelining.PipelineStage(parts[s], s, len(placement), torch.device("cpu")) for s in mine]
    kwargs: dict[str, Any] = {"n_microbatches": workload.m, "loss_fn": F.mse_loss}
    schedule = cls(stages[0], **kwargs) if TORCH_SCHEDULES[name] in SINGLE_STAGE else cls(stages, **kwargs)
    first, last = 0 in mine, len(placement) - 1 in mine

    def step() -> None:
        for s in mine:
            parts[s].zero_grad(set_to_none=True)
        schedule.step(*((x,) if first else ()), **({"target": y, "losses": []} if last else {}))

    return step


def _rank(rank: int, world: int, port: int, workload: Workload, plans: Plans, warmup: int, repeats: int,
          threads: int, out: str) -> None:
    """One rank: for each schedule, the stages its layout puts here, timed between barriers; rank 0 writes."""
    import torch.distributed as dist

    set_threads(threads)
    init_loopback_group(rank, world, port, datetime.timedelta(minutes=30))
    try:
        x, y = workload.data()
        result: dict[str, Any] = {}
        for name, (placement, balance) in plans.items():
            step = torch_step(name, workload, placement, balance, rank, x, y)
            for _ in range(warmup):
                step()
            samples = []
            for _ in range(repeats):
                dist.barrier()
                start = time.perf_counter()
                step()
                dist.barrier()  # the step ends when the slower rank is done
                samples.append(time.perf_counter() - start)
            result[name] = samples
        if rank == 0:
            Path(out).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def run_pipelining(workload: Workload, plans: Plans, warmup: int, repeats: int,
                   threads: int = THREADS) -> dict[str, list[float]]:
    """Every planned schedule on two spawned gloo processes, ``threads`` intra-op threads each; seconds per step."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "pipelining.json")
        mp.spawn(_rank, args=(DEVICES, free_port(), workload, plans, warmup, repeats, threads, out), nprocs=DEVICES,
                 join=True)
        return {k: list(v) for k, v in json.loads(Path(out).read_text()).items()}
