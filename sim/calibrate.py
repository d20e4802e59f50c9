"""Calibration: measure a real model's partitions and the executor's own primitives into a cost model.

Measuring apart from computing: this module runs things and reads clocks; :mod:`sim.engine` only
consumes the :class:`~sim.cost.CostModel` it returns. Two halves:

- :func:`calibrate` profiles each partition of a balanced ``nn.Sequential`` on its device with
  :func:`gpipe.profile.profile_blocks` (the profiler ``balance_by_time`` uses too) and fills one
  :class:`~sim.cost.StageCost` per partition::

      forward               grad-enabled forward   F of a micro-batch that is not checkpointed
      forward_checkpointed  no-grad forward        F of a checkpointed micro-batch
      recompute             grad-enabled forward   R (a recompute records the graph)
      backward              backward alone         B
      send_bytes            output bytes           the activation sent to the next stage
      saved_bytes           saved-tensor hooks     kept for backward without checkpointing
      checkpoint_bytes      input bytes            kept with checkpointing (the stage input)
      parameter_bytes       parameters + buffers
      gradient_bytes        trainable parameters

- :func:`calibrate_overheads` measures what the executor adds around the kernels on this machine:
  the host time of a task's bookkeeping, the latency of handing a result from one worker thread to
  another, and how much two workers computing at once slow each other on shared cores.

Note [task overhead]: the executor's per-task path is emulated, not run: take the task's input from
the worker's queue, detach it into a leaf, enter the grad mode and the phase flag, call an empty
stage, stamp the span, and put the result on the next queue. Everything a real stage costs beyond
that is already in the profiled stage seconds (the profiler calls the partition the same way).

Note [hand-off]: the executor's workers pass results through ``queue.SimpleQueue`` (one per worker);
the hand-off latency is half the round trip of a ping-pong between two threads over two such queues,
which includes the wake-up of a worker blocked in ``get()``.

Note [contention]: a compute-bound matmul is timed on one thread, then on ``workers`` threads at once,
each intra-op pool limited to ``threads_per_worker`` threads (the executor's setting). With slowdown
``s = together / alone`` the simulator's processor-sharing model ``1 + contention * (k - 1)`` gives
``contention = (s - 1) / (workers - 1)``, clipped at 0. On GPUs that do not share hardware, pass
``contention=False``.
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn

from gpipe.phase import checkpointing
from gpipe.profile import Device, TensorOrTensors, profile_blocks
from gpipe.schedule import Op, Task
from gpipe.timeline import COMPUTE, Span
from sim.cost import CostModel, Overheads, StageCost

__all__ = [
    "calibrate",
    "calibrate_overheads",
    "measure_contention",
    "measure_handoff",
    "measure_task_overhead",
    "partitions_of",
]


def partitions_of(module: nn.Sequential, balance: Sequence[int]) -> list[nn.Sequential]:
    """Cut ``module`` into one ``nn.Sequential`` per partition, sharing its layers (nothing is copied).

    Args:
        module: the model.
        balance: layers per partition.

    Returns:
        The partitions, in order.

    Raises:
        TypeError: ``module`` is not an ``nn.Sequential``.
        ValueError: ``balance`` has a non-positive entry or does not sum to ``len(module)``.
    """
    if not isinstance(module, nn.Sequential):
        raise TypeError(f"module must be an nn.Sequential, got {type(module).__name__}")
    balance = list(balance)
    if not balance or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in balance):
        raise ValueError(f"balance must be a non-empty list of positive integers, got {balance!r}")
    if sum(balance) != len(module):
        raise ValueError(f"balance {balance} sums to {sum(balance)}, but the module has {len(module)} layers")
    layers = list(module)
    parts, start = [], 0
    for size in balance:
        parts.append(nn.Sequential(*layers[start:start + size]))
        start += size
    return parts


def calibrate(module: nn.Sequential, balance: Sequence[int], sample_microbatch: TensorOrTensors, *,
              devices: Sequence[Device] | None = None, warmup: int = 2, repeats: int = 5) -> CostModel:
    """Profile each partition on its device into a cost model (see the module docstring's table).

    Args:
        module: the model.
        balance: layers per partition (one stage each).
        sample_microbatch: an input of the micro-batch size the pipeline will run.
        devices: one device per partition; a partition not already there is profiled as a copy
            moved there (the model is never moved or changed). ``None``: where each partition is.
        warmup: untimed passes before timing.
        repeats: timed passes; every time is the median over them.

    Returns:
        One :class:`~sim.cost.StageCost` per partition; copies priced by the simulator's link
        (``copy_seconds=None``) and no overheads (see :func:`calibrate_overheads`).

    Raises:
        TypeError: ``module`` is not an ``nn.Sequential``.
        ValueError: a bad ``balance``, ``devices`` of the wrong length, or a bad ``warmup``/``repeats``.
    """
    parts = partitions_of(module, balance)
    if devices is not None and len(devices) != len(parts):
        raise ValueError(f"{len(devices)} devices for {len(parts)} partitions; give one device per partition")
    profiles = profile_blocks(parts, sample_microbatch, device=devices, warmup=warmup, repeats=repeats)
    stages = tuple(StageCost(
        forward=p.forward_seconds,
        backward=p.backward_seconds,
        recompute=p.recompute_seconds,
        forward_checkpointed=p.forward_nograd_seconds,
        send_bytes=p.output_bytes,
        saved_bytes=p.saved_bytes,
        checkpoint_bytes=p.input_bytes,
        parameter_bytes=p.parameter_bytes,
        gradient_bytes=p.gradient_bytes,
    ) for p in profiles)
    return CostModel(stages)


def calibrate_overheads(*, workers: int = 2, repeats: int = 200, contention: bool = True,
                        threads_per_worker: int = 1) -> Overheads:
    """Measure the executor's own costs on this machine.

    Args:
        workers: how many workers compute at once (the number of CPU devices) for the contention test.
        repeats: samples for the task and hand-off medians.
        contention: measure core sharing; ``False`` gives 0 (devices that share nothing, GPUs).
        threads_per_worker: intra-op threads each worker uses.

    Returns:
        :class:`~sim.cost.Overheads` with ``task`` and ``handoff`` in seconds and ``contention``.

    Raises:
        ValueError: ``repeats < 1``, ``workers < 2`` with ``contention``, or ``threads_per_worker < 1``.
    """
    return Overheads(
        task=measure_task_overhead(repeats),
        handoff=measure_handoff(repeats),
        contention=measure_contention(workers, threads_per_worker=threads_per_worker) if contention else 0.0,
    )


def measure_task_overhead(repeats: int = 200) -> float:
    """Median host seconds of one empty task through the executor's per-task path (Note [task overhead]).

    Args:
        repeats: tasks timed (after as many untimed).

    Returns:
        Seconds per task, >= 0.

    Raises:
        ValueError: ``repeats < 1``.
    """
    _positive("repeats", repeats)
    inbox: queue.SimpleQueue[torch.Tensor] = queue.SimpleQueue()
    outbox: queue.SimpleQueue[torch.Tensor] = queue.SimpleQueue()
    stage: Callable[[torch.Tensor], torch.Tensor] = nn.Identity()
    spans: list[Span] = []
    x = torch.zeros(1)
    samples = []
    for k in range(2 * repeats):
        inbox.put(x)
        tick = time.perf_counter()
        leaf = inbox.get().detach().requires_grad_(True)
        with torch.enable_grad(), checkpointing():
            start = time.perf_counter()
            y = stage(leaf)
            spans.append(Span(0, COMPUTE, Task(Op.F, k, 0), start, time.perf_counter()))
        outbox.put(y)
        samples.append(time.perf_counter() - tick)
        outbox.get()
    return max(0.0, statistics.median(samples[repeats:]))


def measure_handoff(repeats: int = 200) -> float:
    """Median one-way seconds to hand an object to another worker thread (Note [hand-off]).

    Args:
        repeats: round trips timed (after a tenth as many untimed, at least one).

    Returns:
        Seconds, >= 0.

    Raises:
        ValueError: ``repeats < 1``.
    """
    _positive("repeats", repeats)
    ping: queue.SimpleQueue[object] = queue.SimpleQueue()
    pong: queue.SimpleQueue[object] = queue.SimpleQueue()
    stop = object()

    def echo() -> None:
        while (item := ping.get()) is not stop:
            pong.put(item)

    thread = threading.Thread(target=echo, name="gpipe-sim-handoff", daemon=True)
    thread.start()
    warmup = max(1, repeats // 10)
    samples = []
    try:
        token = object()
        for _ in range(warmup + repeats):
            tick = time.perf_counter()
            ping.put(token)
            pong.get()
            samples.append(time.perf_counter() - tick)
    finally:
        ping.put(stop)
        thread.join()
    return max(0.0, statistics.median(samples[warmup:]) / 2)


def measure_contention(workers: int = 2, *, size: int = 192, inner: int = 20, repeats: int = 7,
                       threads_per_worker: int = 1) -> float:
    """How much ``workers`` threads computing at once slow each other (Note [contention]).

    Args:
        workers: threads computing together, >= 2.
        size: the matrices are ``size x size`` float32.
        inner: matmuls per timed run.
        repeats: timed pairs of runs, alone then together (after one untimed pair); the slowdown is
            the median over the pairs.
        threads_per_worker: intra-op threads during the measurement (restored afterwards).

    Returns:
        ``contention`` for :class:`~sim.cost.Overheads`: 0 when the threads do not slow each other,
        1 when they share one core's worth of compute.

    Raises:
        ValueError: ``workers < 2`` or a non-positive ``size``, ``inner``, ``repeats`` or
            ``threads_per_worker``.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 2:
        raise ValueError(f"contention needs at least 2 workers, got {workers!r}")
    for name, value in (("size", size), ("inner", inner), ("repeats", repeats),
                        ("threads_per_worker", threads_per_worker)):
        _positive(name, value)
    generator = torch.Generator().manual_seed(0)
    matrices = [torch.randn(size, size, generator=generator) for _ in range(workers)]

    def work(a: torch.Tensor) -> float:
        tick = time.perf_counter()
        for _ in range(inner):
            torch.mm(a, a)
        return time.perf_counter() - tick

    def together() -> list[float]:
        barrier = threading.Barrier(workers)
        times = [0.0] * workers

        def run(k: int) -> None:
            barrier.wait()
            times[k] = work(matrices[k])

        threads = [threading.Thread(target=run, args=(k,), name=f"gpipe-sim-contention-{k}")
                   for k in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return times

    previous = torch.get_num_threads()
    torch.set_num_threads(threads_per_worker)
    try:
        work(matrices[0])
        together()
        # Alone and together in pairs: a slow spell of a busy machine then spoils one ratio, not all.
        slowdowns = [statistics.median(together()) / max(work(matrices[0]), 1e-12) for _ in range(repeats)]
    finally:
        torch.set_num_threads(previous)
    return max(0.0, (statistics.median(slowdowns) - 1.0) / (workers - 1))


def _positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
