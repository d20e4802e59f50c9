"""What the executor's worker threads cost around each stage's layers, measured on the stage itself.

:func:`measure_stage_extras` runs each partition alone in the executor (a one-device :class:`gpipe.GPipe` of
:data:`CHUNKS` micro-batches of :data:`ROWS` samples, the pipeline's checkpoint policy) and holds every task against
the profiling pass that follows each step. The result, one :class:`StageExtras` per stage, gives
:class:`sim.calibration.host.ExecutorStage` its ``host_forward``, ``host_nograd``, ``host_backward`` and
``thread_start``, and :class:`sim.calibration.host.Overheads` its ``launch`` and ``turnaround``
(:func:`sim.calibration.executor_costs.with_executor_costs` puts them into the cost model). Why these are measured
stage by stage: Note [stage extras]; why the launch and turnaround come from here: Note [launch and turnaround].
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from gpipe.checks import check_positive
from gpipe.interpreter.affinity import Cores, check_affinity
from gpipe.profiling.profile import TensorOrTensors, preserved, time_recorded
from gpipe.schedule import Checkpoint, Op, gpipe
from sim.calibration.machine import collected_after
from sim.core.cost import CostModel

__all__ = ["StageExtras", "measure_stage_extras"]

#: Micro-batches of the stage-alone runs, and samples in each (fewer where the sample has fewer).
CHUNKS, ROWS = 4, 2


@dataclass(frozen=True)
class StageExtras:
    """Seconds the executor adds to one stage's tasks (Note [stage extras]), named as in
    :class:`sim.calibration.host.ExecutorStage` and :class:`sim.calibration.host.Overheads`."""

    thread_start: float
    host_forward: float
    host_nograd: float
    host_backward: float
    launch: float
    turnaround: float



# Note [stage extras]: the profiler (:func:`gpipe.profiling.profile.time_recorded`) times a stage's forward and backward
# back to back on one warm thread; the executor runs the same work on worker threads that it starts fresh, parks between
# phases and that wait on queues between tasks, and wraps every call in its bookkeeping. What that adds is host time
# (Python slower on a thread just started or woken, cold interpreter caches, the wrapping): it grows with the layers a
# stage calls, not its samples, so neither one probe layer's task overhead nor a factor on the stage's seconds; left
# out, it makes the prediction of millisecond tasks too fast (benchmarks/fidelity.py; docs/benchmarks.md). So each
# stage runs alone in the executor, with few samples (host time, no page faults) and the pipeline's checkpoint policy
# (first tasks of the pipeline's kind). A task's extra is its span less its kind's profiled seconds and the runner's
# host seconds (ExecutorCosts.host_seconds); ``host_*``: the medians over steps of the mean extra of the tasks not
# first in their phase; ``thread_start``: the median of what the two first tasks (first forward, first of the backward
# phase) take beyond the extra of their kind.
def measure_stage_extras(cost: CostModel, parts: Sequence[nn.Module], sample: TensorOrTensors, *,
                         checkpoint: Checkpoint = "except_last", steps: int = 10, warmup_steps: int = 2,
                         affinity: Sequence[Cores | None] | None = None) -> list[StageExtras]:
    """Run each stage alone in the executor and time what its worker adds (Note [stage extras]).

    Args:
        cost: the cost model whose runner's host seconds the simulator adds to every task; they are
            taken off the measured spans.
        parts: the partitions, in order, on their devices.
        sample: the first partition's input (a micro-batch); its first two samples are used.
        checkpoint: the pipeline's checkpoint policy; the stage-alone runs use it too.
        steps: recorded training steps of each stage alone (after ``warmup_steps`` others), each
            followed by one profiling pass.
        warmup_steps: unrecorded steps first.
        affinity: one set of CPU cores per partition (or ``None``): each stage's worker, and its
            profiling, is pinned there as the pipeline's is.

    Returns:
        One :class:`StageExtras` per partition, every field >= 0; a kind of task the policy never
        runs (a no-grad forward without checkpointing) gets 0, and so does every kind of a stage with
        nothing to train alone (no parameters, and an input that cannot require grad). A stage without
        parameters whose input is floating-point runs with its input requiring grad.

    Raises:
        ValueError: partitions and stage costs of different lengths, ``steps < 1`` or a bad ``affinity``.
    """
    from gpipe import GPipe  # the executor; imported here so the simulator never needs it

    if len(parts) != len(cost.stages):
        raise ValueError(f"{len(parts)} partitions and {len(cost.stages)} stage costs")
    check_positive("steps", steps)
    cores = check_affinity(affinity, len(parts)) or [None] * len(parts)
    schedule = gpipe(CHUNKS, 1, checkpoint)
    tasks = schedule.tasks[0]
    backward = sum(1 for t in tasks if t.op is Op.F)  # the first task of the backward phase, on a fresh thread
    firsts = {0, backward}
    extras: list[StageExtras] = []
    current: TensorOrTensors = sample
    for j, (part, where) in enumerate(zip(parts, cores, strict=True)):
        single = isinstance(current, torch.Tensor)  # a stage gets a tuple as one argument (gpipe.interpreter.threads)
        device = next((t.device for t in part.parameters()), _tensors(current)[0].device)
        # requiring grad as in the pipeline (after the first stage, or as the sample does); a stage without
        # parameters to train trains its input, or the executor would not train it alone
        trains = any(p.requires_grad for p in part.parameters())
        micro = tuple(t[:ROWS].detach().to(device).requires_grad_(t.is_floating_point() and (
            j > 0 or t.requires_grad or not trains)) for t in _tensors(current))
        # nothing to train (no parameters, an integer input): the executor does not train the stage alone, and
        # its extras stay 0
        runs = warmup_steps + steps if trains or any(t.requires_grad for t in micro) else 0
        batch = tuple(torch.cat([t] * CHUNKS) for t in micro)
        # Note [launch and turnaround]: the same runs also time the executor's ``launch`` (a step's start to its first
        # task) and ``turnaround`` (the last forward's end to the first task of the backward phase, the loss between).
        # The probe pipelines of calibrate_executor_overheads measure them too, but step after step on a warm main
        # thread; in the experiment a profiling pass runs between two steps, as it does here, and a launch after a
        # pass is longer than one after a step. with_executor_costs takes the launch of the first stage's runs and the
        # turnaround of the last stage's.
        samples: dict[str, list[float]] = {"F": [], "Fc": [], "B": [], "first": [], "launch": [], "turnaround": []}
        layers = list(part.children()) if isinstance(part, nn.Sequential) else [part]
        pipe = GPipe(nn.Sequential(*layers), balance=[len(layers)], devices=[device], chunks=CHUNKS,
                     checkpoint=checkpoint, record=True, cpu_affinity=[where])
        with preserved(part):
            for k in range(runs):
                with collected_after():  # as the experiment's steps (Note [collect after the step])
                    _loss(pipe(batch[0] if single else batch)).backward()
                timeline = pipe.timeline
                for p in part.parameters():
                    p.grad = None
                (profile,) = time_recorded([part], micro[0] if single else micro, device=device, warmup=1,
                                           repeats=2, affinity=[where])
                if k < warmup_steps or timeline is None:
                    continue
                profiled = {"F": profile.forward, "Fc": profile.forward_nograd, "B": profile.backward}
                rest: dict[str, list[float]] = {"F": [], "Fc": [], "B": []}
                spans = [timeline.span_of(t) for t in tasks]
                samples["launch"].append(spans[0].start)
                samples["turnaround"].append(spans[backward].start - spans[backward - 1].end)
                first: list[tuple[str, float]] = []
                for position, task in enumerate(tasks):
                    ckpt = schedule.is_checkpointed(task.microbatch)
                    kind = "B" if task.op is Op.B else ("Fc" if task.op is Op.F and ckpt else "F")
                    span = spans[position]
                    extra = span.end - span.start - profiled[kind] - cost.runner.host_seconds(task.op, j, ckpt)
                    if position in firsts:
                        first.append((kind, extra))
                    else:
                        rest[kind].append(extra)
                means = {kind: statistics.fmean(v) for kind, v in rest.items() if v}
                for kind, v in means.items():
                    samples[kind].append(v)
                samples["first"].append(statistics.fmean(e - means.get(kind, 0.0) for kind, e in first))
        extras.append(StageExtras(*(max(0.0, statistics.median(samples[k])) if samples[k] else 0.0
                                    for k in ("first", "F", "Fc", "B", "launch", "turnaround"))))
        with torch.no_grad():  # the next stage's input
            output = part(micro[0] if single else micro)
        current = output if isinstance(output, torch.Tensor) else tuple(output)
    return extras


def _tensors(value: TensorOrTensors) -> tuple[torch.Tensor, ...]:
    return (value,) if isinstance(value, torch.Tensor) else tuple(value)


def _loss(output: TensorOrTensors) -> torch.Tensor:
    """A scalar to run the backward from: the mean square of every output that requires grad."""
    tensors = list(output) if isinstance(output, tuple) else [output]
    terms = [t.float().pow(2).mean() for t in tensors if t.is_floating_point() and t.requires_grad]
    if not terms:
        raise TypeError("the stage's output has no floating-point tensor that requires grad")
    return torch.stack([t.to(terms[0].device) for t in terms]).sum()
