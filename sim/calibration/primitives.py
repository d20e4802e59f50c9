"""The executor's primitives, measured one at a time on this machine: what calibration is built from.

:mod:`sim.calibration.calibrate` turns a model and the executor into a :class:`~sim.core.cost.CostModel`; the
functions here each time one thing the executor does, apart from any model:

- each stage's own extras on the executor's threads are measured by running it alone in the
  executor (:mod:`sim.calibration.thread_costs`, Note [stage extras]);
- :func:`count_saved_tensors` and :func:`measure_saved_tensor_cost`: how many tensors autograd saves
  per partition, and what the recorder's hooks cost per tensor (Note [recording] in
  :mod:`sim.calibration.calibrate`);
- :func:`measure_task_overhead`, :func:`measure_handoff` and :func:`measure_contention`: the emulated
  per-task cost, hand-off and core sharing (Notes [task overhead], [hand-off], [contention]) that
  :func:`sim.calibration.calibrate.calibrate_overheads` puts together when the executor is not at hand.
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn

from gpipe.autograd.phase import checkpointing
from gpipe.autograd.saved import SavedBytes, storage_key
from gpipe.checks import check_positive
from gpipe.profiling.profile import TensorOrTensors, preserved
from gpipe.schedule import Op, Task
from gpipe.schedule.timeline import COMPUTE, Span

__all__ = [
    "count_saved_tensors",
    "measure_contention",
    "measure_handoff",
    "measure_saved_tensor_cost",
    "measure_task_overhead",
]


def count_saved_tensors(parts: Sequence[nn.Module], sample: TensorOrTensors) -> list[int]:
    """How many tensors each part's grad-enabled forward hands to autograd's saved-tensor hooks.

    The sample flows through the parts in order, as in :func:`gpipe.profiling.profile.profile_blocks`
    (a part after the first gets an input that requires grad, as the executor gives it).

    Args:
        parts: the partitions, in order, already on their devices.
        sample: the first part's input.

    Returns:
        One count per part.
    """
    counts = []
    inputs = sample if isinstance(sample, tuple) else (sample,)
    atomic = not isinstance(sample, tuple)
    for k, part in enumerate(parts):
        device = next((t.device for t in part.parameters()), inputs[0].device)
        leaves = tuple(t.detach().to(device).requires_grad_(t.requires_grad or (k > 0 and t.is_floating_point()))
                       for t in inputs)
        count = 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            nonlocal count
            count += 1
            return t.detach()  # gpipe.autograd.saved, Note [no cycle through the hook]

        # copies, not leaves, so that an in-place first layer may change them (Note [entering a partition] in
        # gpipe.interpreter.worker); a copy saves nothing for backward, so the count stays the part's own
        fresh = tuple(t.clone() for t in leaves)
        with preserved(part), torch.enable_grad(), torch.random.fork_rng(devices=[]), \
                torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
            output = part(fresh[0] if atomic else fresh)
        counts.append(count)
        atomic = isinstance(output, torch.Tensor)
        inputs = (output,) if atomic else tuple(output)
        inputs = tuple(t.detach() for t in inputs)
    return counts


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def measure_saved_tensor_cost(repeats: int = 101, *, ops: int = 32) -> tuple[float, float]:
    """Host seconds the executor's recorder adds per tensor autograd saves (Note [recording]).

    A chain of ``ops`` multiplications (each saves two tensors) runs forward and backward, with and
    without hooks that do what :mod:`gpipe.pipe`'s recorder does for every saved tensor (a pack that
    counts its bytes, an unpack that returns it); the differences of the medians, per saved tensor.

    Args:
        repeats: timed pairs of runs.
        ops: multiplications per run.

    Returns:
        ``(pack, unpack)``: seconds per saved tensor in the forward and in the backward, >= 0.

    Raises:
        ValueError: a non-positive ``repeats`` or ``ops``.
    """
    check_positive("repeats", repeats)
    check_positive("ops", ops)
    weight = torch.ones((), requires_grad=True)
    model_state = {storage_key(weight)}

    def chain(hooked: bool) -> tuple[float, float]:
        x = torch.randn(4, 4, requires_grad=True)
        counter = SavedBytes(model_state)
        tick = time.perf_counter()
        with torch.enable_grad():
            if hooked:
                with counter.hooks():
                    for _ in range(ops):
                        x = x * weight
            else:
                for _ in range(ops):
                    x = x * weight
        _ = counter.nbytes
        forward = time.perf_counter() - tick
        grad = torch.ones_like(x)
        tick = time.perf_counter()
        torch.autograd.backward([x], [grad])
        backward = time.perf_counter() - tick
        weight.grad = None
        return forward, backward

    for _ in range(5):
        chain(True), chain(False)
    plain, hooked = [], []
    for _ in range(repeats):
        plain.append(chain(False))
        hooked.append(chain(True))
    per = 2 * ops
    return tuple(max(0.0, (statistics.median(h[k] for h in hooked) - statistics.median(p[k] for p in plain)) / per)
                 for k in (0, 1))  # type: ignore[return-value]


# Note [task overhead]: (emulated) take the task's input from a queue, detach it into a leaf, enter
# the grad mode and the phase flag, call an empty stage, stamp the span, put the result on a queue.
def measure_task_overhead(repeats: int = 200) -> float:
    """Median host seconds of one empty task through the executor's per-task path (Note [task overhead]).

    Args:
        repeats: tasks timed (after as many untimed).

    Returns:
        Seconds per task, >= 0.

    Raises:
        ValueError: ``repeats < 1``.
    """
    check_positive("repeats", repeats)
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


# Note [hand-off]: (emulated) half the round trip of a ping-pong between two threads over two
# ``queue.SimpleQueue``, which includes the wake-up of a worker blocked in ``get()``.
def measure_handoff(repeats: int = 200) -> float:
    """Median one-way seconds to hand an object to another worker thread (Note [hand-off]).

    Args:
        repeats: round trips timed (after a tenth as many untimed, at least one).

    Returns:
        Seconds, >= 0.

    Raises:
        ValueError: ``repeats < 1``.
    """
    check_positive("repeats", repeats)
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


# Note [contention]: a compute-bound matmul is timed on one thread, then on ``workers`` threads at once
# (each warmed up first), each intra-op pool limited to ``threads_per_worker`` threads. With slowdown
# ``s = together / alone`` the simulator's processor-sharing model ``1 + contention * (k - 1)`` gives
# ``contention = (s - 1) / (workers - 1)``, clipped at 0. On GPUs that do not share hardware, pass
# ``contention=False``.
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
        ``contention`` for :class:`~sim.calibration.host.Overheads`: 0 when the threads do not slow each other,
        1 when they share one core's worth of compute.

    Raises:
        ValueError: ``workers < 2`` or a non-positive ``size``, ``inner``, ``repeats`` or
            ``threads_per_worker``.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 2:
        raise ValueError(f"contention needs at least 2 workers, got {workers!r}")
    for name, value in (("size", size), ("inner", inner), ("repeats", repeats),
                        ("threads_per_worker", threads_per_worker)):
        check_positive(name, value)
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
            work(matrices[k])  # a fresh thread's first calls pay one-off costs: not contention
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
