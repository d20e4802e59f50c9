"""Calibration: measure a real model's partitions and the executor's own primitives into a cost model.

Measuring apart from computing: this module runs things and reads clocks; :mod:`sim.engine` only
consumes the :class:`~sim.cost.CostModel` it returns. Three parts:

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
      saved_tensors         saved-tensor hooks     how many tensors autograd saves (Note [recording])
      forward_recorded      recorded forward       F and R of a recording executor (``recorded=True``)
      backward_recorded     recorded backward      B of a recording executor (``recorded=True``)

- :func:`calibrate_executor_overheads` runs the executor itself on probe pipelines and reads its
  timelines (Note [executor overheads]); :func:`measure_pairs` runs the real partitions two at a time
  (Note [pairs]). Together they give :class:`~sim.cost.Overheads`.
- :func:`calibrate_overheads` is the older, emulated measurement of the same costs, for when the
  executor is not at hand (Notes [task overhead], [hand-off], [contention]).

Note [executor overheads]: two probe pipelines of layers that compute almost nothing (``x * w``)
run a few recorded training steps in :class:`gpipe.GPipe`; what their spans show beyond the
profiled seconds of the probe layer is the executor's own cost:

    one worker, 8 micro-batches, except_last     task       = median(span - profiled), F and B
                                                 recording  = median(span - profiled) of F and R with
                                                              grad, minus task and the hooks' per-tensor cost
                                                 gap        = median time between two tasks of the worker
    a worker per device, 1 micro-batch, never    handoff    = F0@j end -> F0@j+1 start, B0@j+1 end -> B0@j start
                                                 turnaround = F0@n-1 end -> B0@n-1 start (the user's loss is
                                                              not in the measured timeline)
                                                 launch     = step start -> F0@0 start

With one micro-batch nothing runs at the same time, so the hand-offs are not mixed up with contention.

Note [recording]: a recording executor counts the bytes each grad-enabled forward saves through
``torch.autograd.graph.saved_tensors_hooks``, a Python call per saved tensor (and an unpack call per
tensor in the backward). For a model of small layers this is a large share of a forward, and what a
hook call costs depends on what is saved: on 64 x (Linear(64, 64), ReLU) it was 2.5 times what a chain
of multiplications says. So ``calibrate(..., recorded=True)`` profiles each stage's forward and
backward with the recorder's own hooks (``forward_recorded``, ``backward_recorded``), which the
simulator then uses as they are. The per-tensor estimate remains for stages calibrated without:
:func:`count_saved_tensors` counts the tensors per stage (deterministic) and
:func:`measure_saved_tensor_cost` times both hooks per tensor on a chain of multiplications.

Note [pairs]: how much two workers slow each other depends on *what* they run. Convolutions on two
cores hardly meet; forwards of small layers take turns on Python's global interpreter lock, and a
backward that unpacks saved tensors through Python hooks needs the lock for each one. So the
contention is measured on the real partitions, per pair of task kinds that GPipe's two phases can run
at once (:data:`PHASE_PAIRS`): both run back to back on two threads for a window; each one's rate is
its time alone over its time together, averaged over the two ways round (the thread that holds the
lock first tends to keep it, so one order alone would say "one starves" rather than "they share");
``c = 1 / rate - 1``. The second thread is long-lived and warmed up first: a fresh thread pays
one-off costs on its first calls, which are not contention.

Note [task overhead]: (emulated) take the task's input from a queue, detach it into a leaf, enter
the grad mode and the phase flag, call an empty stage, stamp the span, put the result on a queue.

Note [hand-off]: (emulated) half the round trip of a ping-pong between two threads over two
``queue.SimpleQueue``, which includes the wake-up of a worker blocked in ``get()``.

Note [contention]: a compute-bound matmul is timed on one thread, then on ``workers`` threads at once
(each warmed up first), each intra-op pool limited to ``threads_per_worker`` threads. With slowdown
``s = together / alone`` the simulator's processor-sharing model ``1 + contention * (k - 1)`` gives
``contention = (s - 1) / (workers - 1)``, clipped at 0. On GPUs that do not share hardware, pass
``contention=False``.
"""

from __future__ import annotations

import contextlib
import copy
import queue
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from gpipe.affinity import Cores, check_affinity, pinned
from gpipe.phase import checkpointing
from gpipe.profile import (
    Device,
    SavedBytes,
    TensorOrTensors,
    _preserved,
    _storage_key,
    profile_blocks,
)
from gpipe.schedule import Op, Task
from gpipe.timeline import COMPUTE, Span
from sim.cost import CostModel, Overheads, StageCost

__all__ = [
    "calibrate",
    "calibrate_executor_overheads",
    "calibrate_overheads",
    "count_saved_tensors",
    "measure_contention",
    "measure_handoff",
    "measure_pairs",
    "measure_saved_tensor_cost",
    "measure_thread_start",
    "on_device",
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
              devices: Sequence[Device] | None = None, warmup: int = 2, repeats: int = 5,
              recorded: bool = False, affinity: Sequence[Cores | None] | None = None) -> CostModel:
    """Profile each partition on its device into a cost model (see the module docstring's table).

    Args:
        module: the model.
        balance: layers per partition (one stage each).
        sample_microbatch: an input of the micro-batch size the pipeline will run.
        devices: one device per partition; a partition not already there is profiled as a copy
            moved there (the model is never moved or changed). ``None``: where each partition is.
        warmup: untimed passes before timing.
        repeats: timed passes; every time is the median over them.
        recorded: also measure each partition's forward and backward with a recording executor's
            saved-tensor hooks (``forward_recorded``, ``backward_recorded``): for predicting a
            :class:`gpipe.GPipe` that records its timeline (Note [recording]).
        affinity: one set of CPU cores per partition (or ``None``), as the executor's
            ``cpu_affinity``: each partition is profiled on its cores.

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
    profiles = profile_blocks(parts, sample_microbatch, device=devices, warmup=warmup, repeats=repeats,
                              recorded=recorded, affinity=affinity)
    placed = parts if devices is None else [on_device(p, d) for p, d in zip(parts, devices, strict=True)]
    counts = count_saved_tensors(placed, sample_microbatch)
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
        saved_tensors=count,
        forward_recorded=p.forward_recorded_seconds,
        backward_recorded=p.backward_recorded_seconds,
    ) for p, count in zip(profiles, counts, strict=True))
    return CostModel(stages)


def on_device(part: nn.Module, device: Device) -> nn.Module:
    """``part`` itself when it is on ``device``, else a copy moved there (as the profiler does).

    Args:
        part: a partition.
        device: where it will run.

    Returns:
        ``part``, or a deep copy of it on ``device``.
    """
    target = torch.device(device)
    if all(t.device == target or (target.index is None and t.device.type == target.type)
           for t in [*part.parameters(), *part.buffers()]):
        return part
    return copy.deepcopy(part).to(target)


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


def calibrate_executor_overheads(devices: Sequence[Device], *, steps: int = 12, warmup_steps: int = 3,
                                 contention: bool | None = None, saved_tensor_repeats: int = 101,
                                 affinity: Sequence[Cores | None] | None = None) -> Overheads:
    """Measure the executor's own costs by running it (Note [executor overheads]).

    Args:
        devices: one torch device per partition of the pipeline to be modelled.
        steps: recorded training steps of each probe pipeline (after ``warmup_steps`` others).
        warmup_steps: unrecorded steps first.
        contention: measure core sharing among the workers on the CPU (:func:`measure_contention`);
            ``None``: when at least two partitions are on the CPU.
        saved_tensor_repeats: samples of :func:`measure_saved_tensor_cost`.
        affinity: one set of CPU cores per device (or ``None``), as the executor's ``cpu_affinity``:
            the probe pipelines' workers are pinned the same way.

    Returns:
        :class:`~sim.cost.Overheads` with every field measured on this machine.

    Raises:
        ValueError: no devices, a non-positive ``steps``, or a bad ``affinity``.
    """
    from gpipe import GPipe  # the executor; imported here so the simulator never needs it

    if not devices:
        raise ValueError("need at least one device")
    _positive("steps", steps)
    first = torch.device(devices[0])
    cores = check_affinity(affinity, len(devices)) or [None] * len(devices)
    per_saved, per_unpacked = measure_saved_tensor_cost(saved_tensor_repeats)
    sample = torch.randn(1, 4, device=first)

    def probe(stage_devices: list[torch.device], stage_cores: Sequence[Cores | None], chunks: int,
              checkpoint: str) -> list[Any]:
        model = nn.Sequential(*[_Scale() for _ in stage_devices])
        pipe = GPipe(model, balance=[1] * len(stage_devices), devices=stage_devices, chunks=chunks,
                     checkpoint=checkpoint, record=True, cpu_affinity=stage_cores)
        batch = torch.randn(chunks, 4, device=first)
        timelines = []
        for k in range(warmup_steps + steps):
            pipe(batch).pow(2).sum().backward()
            if k >= warmup_steps:
                timelines.append(pipe.timeline)
        return timelines

    # One worker alone: each task's own host time and the gap between two tasks, with nothing to wait for.
    (alone,) = profile_blocks([_Scale().to(first)], sample, warmup=10, repeats=51, affinity=cores[:1])
    packs = count_saved_tensors([_Scale().to(first)], sample)[0]
    base: list[float] = []
    recorded: list[float] = []
    gaps: list[float] = []
    for timeline in probe([first], cores[:1], 8, "except_last"):
        spans = timeline.compute_spans(0)
        for s in spans:
            if s.task.op is Op.B:
                base.append(s.duration - alone.backward_seconds - packs * per_unpacked)
            elif s.task.op is Op.F and s.task.microbatch < 7:  # checkpointed: no_grad, not recorded
                base.append(s.duration - alone.forward_nograd_seconds)
            else:  # the last F (not checkpointed) and every R: grad-enabled and recorded
                recorded.append(s.duration - alone.forward_seconds - packs * per_saved)
        gaps += [b.start - a.end for a, b in zip(spans, spans[1:], strict=False)]
    task = max(0.0, statistics.median(base))
    recording = max(0.0, statistics.median(recorded) - task)

    # One worker per device (at least two), one micro-batch: every wait is a hand-off, nothing computes
    # at the same time, and the first forward starts after the workers are launched.
    handoffs: list[float] = []
    turnarounds: list[float] = []
    launches: list[float] = []
    chain = [torch.device(d) for d in devices] if len(devices) > 1 else [first, first]
    chain_cores = cores if len(devices) > 1 else cores * 2
    last = len(chain) - 1
    for timeline in probe(chain, chain_cores, 1, "never"):
        forward = [timeline.span_of(Task(Op.F, 0, j)) for j in range(len(chain))]
        backward = [timeline.span_of(Task(Op.B, 0, j)) for j in range(len(chain))]
        handoffs += [b.start - a.end for a, b in zip(forward, forward[1:], strict=False)]
        handoffs += [a.start - b.end for a, b in zip(backward, backward[1:], strict=False)]
        turnarounds.append(backward[last].start - forward[last].end)
        launches.append(forward[0].start)
    if contention is None:
        contention = sum(1 for d in devices if torch.device(d).type == "cpu") >= 2
    return Overheads(
        task=task,
        handoff=max(0.0, statistics.median(handoffs)),
        contention=measure_contention(max(2, len(devices)), threads_per_worker=torch.get_num_threads())
        if contention else 0.0,
        gap=max(0.0, statistics.median(gaps)),
        turnaround=max(0.0, statistics.median(turnarounds)),
        launch=max(0.0, statistics.median(launches)),
        recording=recording,
        per_saved_tensor=per_saved,
        per_unpacked_tensor=per_unpacked,
    )


def measure_thread_start(parts: Sequence[nn.Module], sample: TensorOrTensors, *, threads: int = 3,
                         affinity: Sequence[Cores | None] | None = None) -> list[float]:
    """Extra seconds of each partition's first task on a fresh thread (:attr:`sim.cost.StageCost.thread_start`).

    On each of ``threads`` fresh threads, one partition after the other runs a grad-enabled forward
    twice and a backward twice; the extra time of the first of each pair over the second, averaged over
    forward and backward, and the median over the threads.

    Args:
        parts: the partitions, in order, on their devices.
        sample: the first partition's input (one micro-batch).
        threads: fresh threads per partition.
        affinity: one set of CPU cores per partition (or ``None``): the fresh threads are pinned
            there, as the executor's pinned workers are.

    Returns:
        Seconds per partition, >= 0.

    Raises:
        ValueError: ``threads < 1`` or a bad ``affinity``.
    """
    _positive("threads", threads)
    cores = check_affinity(affinity, len(parts)) or [None] * len(parts)
    extra: list[list[float]] = [[] for _ in parts]
    with contextlib.ExitStack() as stack:
        for part in parts:
            stack.enter_context(_preserved(part))
        stack.enter_context(torch.random.fork_rng(devices=[]))
        runners = _pair_runners(parts, sample)
        for k, runner in enumerate(runners):
            graphs = runner["B"]
            assert isinstance(graphs, _Graphs)
            for _ in range(threads):
                graphs.build(2)
                times: list[float] = []

                cuda = {t.device for t in parts[k].parameters() if t.device.type == "cuda"}

                def job(runner: dict[str, Callable[[], Any]] = runner, times: list[float] = times,
                        cuda: set[torch.device] = cuda, where: Cores | None = cores[k]) -> None:
                    with pinned(where):  # a pinned worker is pinned before its first task
                        for kind in ("F", "F", "B", "B"):
                            for device in cuda:
                                torch.cuda.synchronize(device)
                            tick = time.perf_counter()
                            runner[kind]()
                            for device in cuda:  # the kernels' time too, not only their launch
                                torch.cuda.synchronize(device)
                            times.append(time.perf_counter() - tick)

                thread = threading.Thread(target=job, name="gpipe-sim-fresh", daemon=True)
                thread.start()
                thread.join()
                extra[k].append(((times[0] - times[1]) + (times[2] - times[3])) / 2)
    return [max(0.0, statistics.median(e)) for e in extra]


class _Scale(nn.Module):
    """The probe pipelines' layer: as little compute as a layer with a parameter can have."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def count_saved_tensors(parts: Sequence[nn.Module], sample: TensorOrTensors) -> list[int]:
    """How many tensors each part's grad-enabled forward hands to autograd's saved-tensor hooks.

    The sample flows through the parts in order, as in :func:`gpipe.profile.profile_blocks`
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
            return t.detach()  # gpipe.profile, Note [no cycle through the hook]

        with _preserved(part), torch.enable_grad(), torch.random.fork_rng(devices=[]), \
                torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
            output = part(leaves[0] if atomic else leaves)
        counts.append(count)
        atomic = isinstance(output, torch.Tensor)
        inputs = (output,) if atomic else tuple(output)
        inputs = tuple(t.detach() for t in inputs)
    return counts


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


#: The pairs of task kinds that can run at the same time in GPipe's two phases (Note [two phases] in
#: sim.engine): forwards beside forwards, then recomputes (grad-enabled forwards) and backwards.
PHASE_PAIRS = (("F", "F"), ("F", "Fc"), ("Fc", "F"), ("Fc", "Fc"), ("F", "B"), ("B", "F"), ("B", "B"))


def measure_pairs(parts: Sequence[nn.Module], sample: TensorOrTensors, *, window: float = 0.03,
                  max_window: float = 0.15, repeats: int = 2,
                  kinds: Sequence[tuple[str, str]] = PHASE_PAIRS,
                  affinity: Sequence[Cores | None] | None = None) -> tuple[tuple[str, int, str, int, float], ...]:
    """How much the tasks of two stages slow each other when they run at the same time (Note [pairs]).

    Args:
        parts: the partitions, in order, on their devices (the CPU: sharing devices are the point).
        sample: the first partition's input (one micro-batch).
        window: the shortest time each pair runs together, seconds; a pair whose tasks are slow runs
            for 2.5 times its slower task, up to ``max_window``.
        max_window: the longest time one pair runs together, seconds.
        repeats: rounds of every measurement; each slowdown is the median over the rounds.
        kinds: the pairs of task kinds to measure, for every pair of stages.
        affinity: one set of CPU cores per stage (or ``None``): each stage's task runs on a thread
            pinned there, as :class:`gpipe.GPipe` with ``cpu_affinity`` runs it.

    Returns:
        ``(kind, stage, other kind, other stage, c)`` for :attr:`sim.cost.Overheads.pairs`, both ways.

    Raises:
        ValueError: ``repeats < 1``, a non-positive window, or a bad ``affinity``.
    """
    _positive("repeats", repeats)
    cores = check_affinity(affinity, len(parts)) or [None] * len(parts)
    if not window > 0 or not max_window >= window:
        raise ValueError(f"need 0 < window <= max_window, got {window!r} and {max_window!r}")
    with contextlib.ExitStack() as stack:
        for part in parts:
            stack.enter_context(_preserved(part))
        stack.enter_context(torch.random.fork_rng(devices=[]))
        runners = _pair_runners(parts, sample)
        needed = {(a, j) for a, b in kinds for j in range(len(parts))} | \
            {(b, k) for a, b in kinds for k in range(len(parts))}
        alone: dict[tuple[str, int], list[float]] = {key: [] for key in needed}
        slow: dict[tuple[str, int, str, int], list[float]] = {}
        helper = _Helper()
        stack.callback(helper.close)
        for kind, j in sorted(needed):  # warm both threads up on every task first
            for _ in range(2):
                fn = runners[j][kind]
                if isinstance(fn, _Graphs):
                    fn.build(2)
                fn()
                helper.call(fn)
        for _ in range(repeats):
            for key in sorted(needed):
                with pinned(cores[key[1]]):
                    alone[key].append(_loop_alone(runners[key[1]][key[0]], window))
            for j in range(len(parts)):
                for k in range(j + 1, len(parts)):
                    for a, b in kinds:
                        ta, tb = statistics.median(alone[(a, j)]), statistics.median(alone[(b, k)])
                        span = min(max(window, 2.5 * max(ta, tb)), max_window)
                        # both ways round: the thread that holds Python's lock first tends to keep it
                        xa, xb = _loop_together(helper, runners[j][a], runners[k][b], span, (ta, tb),
                                                (cores[j], cores[k]))
                        yb, ya = _loop_together(helper, runners[k][b], runners[j][a], span, (tb, ta),
                                                (cores[k], cores[j]))
                        rate_a = (ta / xa + ta / ya) / 2 if ta > 0 else 1.0
                        rate_b = (tb / xb + tb / yb) / 2 if tb > 0 else 1.0
                        slow.setdefault((a, j, b, k), []).append(1.0 / max(rate_a, 1e-3))
                        slow.setdefault((b, k, a, j), []).append(1.0 / max(rate_b, 1e-3))
    return tuple((a, j, b, k, max(0.0, statistics.median(v) - 1.0)) for (a, j, b, k), v in sorted(slow.items()))


class _Graphs:
    """Backward runs for the pair measurements: graphs built ahead, so only the backward is timed."""

    def __init__(self, part: nn.Module, leaves: tuple[torch.Tensor, ...], atomic: bool) -> None:
        self.part, self.leaves, self.atomic = part, leaves, atomic
        self.ready: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []

    def build(self, count: int) -> None:
        while len(self.ready) < count:
            fresh = tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in self.leaves)
            # saved through the recorder's hooks, as the executor saves them: the backward unpacks each
            with torch.enable_grad(), SavedBytes(self.part).hooks():
                out = self.part(fresh[0] if self.atomic else fresh)
            outs = [t for t in ((out,) if isinstance(out, torch.Tensor) else tuple(out)) if t.requires_grad]
            self.ready.append((outs, [torch.ones_like(t) for t in outs]))

    def __call__(self) -> None:
        outs, grads = self.ready.pop()
        if outs:
            torch.autograd.backward(outs, grads)
        for p in self.part.parameters():
            p.grad = None


def _pair_runners(parts: Sequence[nn.Module], sample: TensorOrTensors) -> list[dict[str, Callable[[], Any]]]:
    """Per stage, a thunk per task kind that runs it as the executor does (recording hooks included)."""
    runners: list[dict[str, Callable[[], Any]]] = []
    atomic = not isinstance(sample, tuple)
    inputs = sample if isinstance(sample, tuple) else (sample,)
    for k, part in enumerate(parts):
        device = next((t.device for t in part.parameters()), inputs[0].device)
        leaves = tuple(t.detach().to(device).requires_grad_(t.requires_grad or (k > 0 and t.is_floating_point()))
                       for t in inputs)
        state = {_storage_key(t) for t in [*part.parameters(), *part.buffers()]}

        def forward(part: nn.Module = part, leaves: tuple[torch.Tensor, ...] = leaves, atomic: bool = atomic,
                    state: set[tuple[str, int]] = state) -> Any:
            counter = SavedBytes(state)
            fresh = tuple(t.detach().requires_grad_(t.requires_grad) for t in leaves)
            with torch.enable_grad(), counter.hooks():
                out = part(fresh[0] if atomic else fresh)
            _ = counter.nbytes
            return out

        def forward_checkpointed(part: nn.Module = part, leaves: tuple[torch.Tensor, ...] = leaves,
                                 atomic: bool = atomic) -> Any:
            with torch.no_grad(), checkpointing():
                return part(leaves[0] if atomic else leaves)

        graphs = _Graphs(part, leaves, atomic)
        runners.append({"F": forward, "Fc": forward_checkpointed, "B": graphs})
        out = forward_checkpointed()
        atomic = isinstance(out, torch.Tensor)
        inputs = tuple(t.detach() for t in ((out,) if atomic else out))
    return runners


def _timed_loop(fn: Callable[[], Any], until: float, times: list[tuple[float, float]]) -> None:
    while True:
        if isinstance(fn, _Graphs) and not fn.ready:
            fn.build(2)  # untimed; rare, when the estimate of how many runs fit was short
        start = time.perf_counter()
        if start >= until and times:
            return
        fn()
        times.append((start, time.perf_counter()))


def _loop_alone(fn: Callable[[], Any], window: float) -> float:
    """Mean seconds of ``fn`` run back to back for ``window`` seconds on this thread alone."""
    if isinstance(fn, _Graphs):
        fn.build(2)
    fn()  # a first call pays for allocations
    times: list[tuple[float, float]] = []
    _timed_loop(fn, time.perf_counter() + window, times)
    return statistics.mean(end - start for start, end in times)


class _Helper:
    """A second thread that runs what it is given, kept for a whole measurement.

    A fresh thread pays one-off costs on its first calls (thread-local state of the math libraries,
    a new allocator arena), which would read as contention; one long-lived, warmed-up thread does not.
    """

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[Callable[[], Any] | None] = queue.SimpleQueue()
        self.done: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name="gpipe-sim-pair", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while (job := self.jobs.get()) is not None:
            try:
                self.done.put((True, job()))
            except BaseException as error:  # handed back to the caller
                self.done.put((False, error))

    def submit(self, job: Callable[[], Any]) -> None:
        self.jobs.put(job)

    def result(self) -> Any:
        ok, value = self.done.get()
        if not ok:
            raise value
        return value

    def call(self, job: Callable[[], Any]) -> Any:
        self.submit(job)
        return self.result()

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()


def _loop_together(helper: _Helper, a: Callable[[], Any], b: Callable[[], Any], window: float,
                   alone: tuple[float, float], cores: tuple[Cores | None, Cores | None] = (None, None)
                   ) -> tuple[float, float]:
    """Mean seconds of ``a`` (this thread) and ``b`` (the helper) while both run back to back for ``window`` s.

    Only the runs that lie wholly inside the time both loops ran count (at least one run each).
    ``alone`` (each one's seconds alone) sizes how many backward graphs to build ahead; ``cores``
    pins each loop's thread.
    """
    for fn, seconds in zip((a, b), alone, strict=True):
        if isinstance(fn, _Graphs):
            fn.build(min(int(window / max(seconds, 1e-6)) + 3, 1000))
    times_a: list[tuple[float, float]] = []
    times_b: list[tuple[float, float]] = []
    barrier = threading.Barrier(2)
    until = [0.0]

    def other() -> None:
        with pinned(cores[1]):
            barrier.wait()
            _timed_loop(b, until[0], times_b)

    helper.submit(other)
    with pinned(cores[0]):
        until[0] = time.perf_counter() + window
        barrier.wait()
        _timed_loop(a, until[0], times_a)
    helper.result()
    lo = max(times_a[0][0], times_b[0][0])
    hi = min(times_a[-1][1], times_b[-1][1])

    def mean(times: list[tuple[float, float]]) -> float:
        inside = [end - start for start, end in times if start >= lo and end <= hi]
        return statistics.mean(inside) if inside else times[0][1] - times[0][0]

    return mean(times_a), mean(times_b)


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
    _positive("repeats", repeats)
    _positive("ops", ops)
    weight = torch.ones((), requires_grad=True)
    model_state = {_storage_key(weight)}

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


def _positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
