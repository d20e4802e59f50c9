"""How much longer a stage's tasks take in the executor than the profiler's runs of the same work.

Note [executor factors]: the profiler (:func:`gpipe.profile.time_recorded`) times a stage's forward
and backward back to back on a warm thread. The executor runs the same work on worker threads that
it starts for each phase, that wait on queues between tasks (their cores go idle), and that wrap each
call in bookkeeping. On the machine the first fidelity runs used, that cost little beyond what
:class:`sim.cost.Overheads` and ``StageCost.thread_start`` model; on a faster host (the same two
vCPUs, tasks 2.5 times shorter) 64 x (Linear(64, 64), ReLU) ran its executor tasks 17-25% longer
than the profiler's runs when they followed each other on one thread, and 35-70% longer with one
micro-batch (a fresh thread's first forward and backward), which put every row of that model
15-26% under while the convolutions stayed within 2.5%.

So each stage is also run *alone*, in the executor itself: a one-device :class:`gpipe.GPipe` of the
partition, the experiment's micro-batches and checkpoint policy, fed the stage's real input (the
earlier stages' output, requiring grad as the pipeline's leaves do), with one profiling pass after
every step. From each task's span the engine's own additive terms are taken off (its host seconds,
and ``thread_start`` where the engine adds it: Note [host costs] in :mod:`sim.engine`); what
remains, over the profiled seconds of that kind of task at that micro-batch's size, is one sample.
A factor is the median over steps of each step's sum of remains over its sum of profiled seconds,
per kind: grad-enabled forwards (``F`` not checkpointed, ``R``), no-grad forwards (checkpointed
``F``) and backwards. The engine multiplies a stage's seconds by them. A stage alone has nothing to
hand over and shares its core with nobody, so the factors hold none of what the pipeline adds (hand-
offs, the other stage's load); those stay the simulator's to predict.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import torch
from torch import nn

from gpipe.affinity import Cores, check_affinity
from gpipe.checks import check_positive
from gpipe.microbatch import scatter
from gpipe.profile import TensorOrTensors, _preserved, time_recorded
from gpipe.schedule import Checkpoint, Op, gpipe
from sim.cost import CostModel
from sim.engine import _host_seconds
from sim.machine import collected_after

__all__ = ["FACTOR_KINDS", "measure_executor_factors"]

#: The kinds a factor is kept for: ``StageCost.factor_forward``, ``factor_nograd``, ``factor_backward``.
FACTOR_KINDS = ("forward", "nograd", "backward")
_OPS = {Op.F: 0, Op.B: 1, Op.R: 2}  # sim.engine's opcodes (_F, _B, _R)


def measure_executor_factors(cost: CostModel, parts: Sequence[nn.Module], inputs: Sequence[TensorOrTensors],
                             chunks: int, checkpoint: Checkpoint, *, steps: int = 8, warmup_steps: int = 2,
                             affinity: Sequence[Cores | None] | None = None) -> list[tuple[float, float, float]]:
    """Per stage, ``(forward, nograd, backward)`` factors of the executor over the profiler (Note [executor factors]).

    Args:
        cost: the cost model whose host terms (``overheads``, ``thread_start``) the engine adds to
            every task; they are taken off the measured spans.
        parts: the partitions, in order, on their devices.
        inputs: each partition's input for the whole mini-batch (the earlier partitions' output).
        chunks: micro-batches, as the pipeline runs them.
        checkpoint: the pipeline's checkpoint policy.
        steps: recorded training steps of each stage alone (after ``warmup_steps`` others), each
            followed by one profiling pass.
        warmup_steps: unrecorded steps first.
        affinity: one set of CPU cores per partition (or ``None``): each stage's worker, and its
            profiling, is pinned there as the pipeline's is.

    Returns:
        One ``(forward, nograd, backward)`` per partition; a kind the schedule never runs is 1.0.

    Raises:
        ValueError: partitions and inputs of different lengths, ``steps < 1`` or a bad ``affinity``.
    """
    from gpipe import GPipe  # the executor; imported here so the simulator never needs it

    if len(parts) != len(inputs) or len(parts) != len(cost.stages):
        raise ValueError(f"{len(parts)} partitions, {len(inputs)} inputs and {len(cost.stages)} stage costs")
    check_positive("steps", steps)
    cores = check_affinity(affinity, len(parts)) or [None] * len(parts)
    schedule = gpipe(chunks, 1, checkpoint)
    tasks = schedule.tasks[0]
    forwards = sum(1 for t in tasks if t.op is Op.F)  # the backward phase starts fresh threads (two phases)
    factors: list[tuple[float, float, float]] = []
    for j, (part, batch, stage, where) in enumerate(zip(parts, inputs, cost.stages, cores, strict=True)):
        device = next((t.device for t in part.parameters()), torch.device("cpu"))
        tensors = tuple(t.detach().requires_grad_(j > 0 and t.is_floating_point())  # as gpipe.worker's leaves
                        for t in (batch if isinstance(batch, tuple) else (batch,)))
        pieces = scatter(tensors, chunks)
        micro = [piece if isinstance(batch, tuple) else piece[0] for piece in pieces]
        scale = [piece[0].shape[0] / pieces[0][0].shape[0] for piece in pieces]  # sample counts, as cost.scale
        samples: list[list[float]] = [[], [], []]
        pipe = GPipe(nn.Sequential(*part.children()), balance=[len(part)], devices=[device], chunks=chunks,
                     checkpoint=checkpoint, record=True, cpu_affinity=[where])
        try:
            with _preserved(part):
                for k in range(warmup_steps + steps):
                    with collected_after():  # as the experiment's steps (Note [collect after the step])
                        _loss(pipe(tensors if isinstance(batch, tuple) else tensors[0])).backward()
                    timeline = pipe.timeline
                    for p in part.parameters():
                        p.grad = None
                    (profile,) = time_recorded([part], micro[0], device=device, warmup=1,
                                               repeats=max(1, chunks // 2), affinity=[where])
                    if k < warmup_steps or timeline is None:
                        continue
                    profiled = (profile.forward, profile.forward_nograd, profile.backward)  # FACTOR_KINDS
                    rest = [0.0, 0.0, 0.0]
                    base = [0.0, 0.0, 0.0]
                    for position, task in enumerate(tasks):
                        ckpt = schedule.is_checkpointed(task.microbatch)
                        span = timeline.span_of(task)
                        seconds = span.end - span.start - _host_seconds(cost, ckpt, _OPS[task.op], stage)
                        if position in (0, forwards):  # sim.engine: a fresh thread's first task, each phase
                            seconds -= stage.thread_start
                        kind = 2 if task.op is Op.B else (1 if task.op is Op.F and ckpt else 0)
                        rest[kind] += seconds
                        base[kind] += profiled[kind] * scale[task.microbatch]
                    for kind in range(3):
                        if base[kind] > 0:
                            samples[kind].append(rest[kind] / base[kind])
        finally:
            for hook in pipe._hooks:
                hook.remove()
        forward, nograd, backward = (max(0.0, statistics.median(s)) if s else 1.0 for s in samples)
        factors.append((forward, nograd, backward))
    return factors


def _loss(output: TensorOrTensors) -> torch.Tensor:
    tensors = list(output) if isinstance(output, tuple) else [output]
    terms = [t.float().pow(2).mean() for t in tensors if t.is_floating_point() and t.requires_grad]
    if not terms:
        raise TypeError("the stage's output has no floating-point tensor that requires grad")
    return torch.stack([t.to(terms[0].device) for t in terms]).sum()
