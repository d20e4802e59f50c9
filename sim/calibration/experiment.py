"""Predicted against measured, end to end: balance, calibrate, run the executor, simulate, compare.

One implementation behind ``gpipe-sim demo``, ``gpipe-sim compare``, ``benchmarks/fidelity.py`` and the
integration tests (the steps are spelled out on the docs page *Compare on your own model*). :func:`run` builds the
``GPipe`` that the :class:`Setup` describes, balanced by ``balance_by_time`` unless a balance is given, asks it for
the schedule of a step (Note [one schedule]), where its stages and workers are, and then:

1. calibrates (:mod:`sim.calibration.executor_costs`): the pipe's partitions on their devices, the executor's own
   costs (:func:`~sim.calibration.calibrate.calibrate_executor_overheads`) and each partition alone in the
   executor (:mod:`sim.calibration.thread_costs`);
2. runs the executor: warm-up steps, then ``steps`` recorded training steps (``GPipe.step``),
   each followed by a profiling pass and, on shared cores, some by a round of pairs of tasks
   (:mod:`sim.calibration.pairs`; Note [interleaved calibration]);
3. simulates that schedule with the cost model alone;
4. compares the prediction with the measured step of median makespan (Note [median step]).

It returns a :class:`sim.calibration.outcome.Outcome` (:func:`sim.calibration.outcome.write_outputs` writes
``timeline.png``, ``trace.json`` and ``report.json``). Also here: the demo's model (:func:`demo_model`), which the CLI
and the benchmarks share.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, overload

import torch
from torch import Tensor, nn

from gpipe import microbatch
from gpipe.microbatch import as_tensors
from gpipe.profiling.profile import RecordedSeconds, time_recorded
from gpipe.schedule import Schedule
from gpipe.schedule.timeline import Timeline
from sim.calibration.compare import compare
from sim.calibration.executor_costs import Batch, rows, rows_of, stage_costs, with_executor_costs
from sim.calibration.experiment_setup import Setup
from sim.calibration.machine import (
    BackgroundLoad,
    collected_after,
    default_devices,
    intra_op_threads,
    shares_cores,
    worker_affinity,
)
from sim.calibration.outcome import Outcome, interleaved_cost, median_step
from sim.calibration.pairs import PHASE_PAIRS, PairMeter, rebased
from sim.core.config import SimConfig
from sim.core.cost import CostModel
from sim.core.engine import simulate

if TYPE_CHECKING:
    from gpipe import GPipe

__all__ = [
    "Batch",
    "Setup",
    "demo_model",
    "loss_of",
    "progress_labels",
    "run",
]
Progress = Callable[[str], None]  # called with a label after each unit of work (progress_labels)


# -- models and devices ----------------------------------------------------------------------------


def demo_model(seed: int = 0) -> tuple[nn.Sequential, Tensor]:
    """The demo's model and mini-batch: a small convolutional classifier, seconds per step on a CPU.

    Eight 3x3 convolutions (32 channels, on 32x32 images, two of them halving the size) and a linear
    head, as one ``nn.Sequential`` of 20 layers; a mini-batch of 64 images. One training step of it
    takes a few tens of milliseconds per stage on one core, so the demo, calibration included,
    finishes in well under a minute on two.

    Returns:
        ``(model, batch)``, both made from ``seed``.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers: list[nn.Module] = [nn.Conv2d(3, 32, 3, padding=1), nn.ReLU()]
        for k in range(7):
            stride = 2 if k in (2, 5) else 1
            layers += [nn.Conv2d(32, 32, 3, stride=stride, padding=1), nn.ReLU()]
        layers += [nn.Flatten(), nn.Linear(32 * 8 * 8, 256), nn.ReLU(), nn.Linear(256, 10)]
        model = nn.Sequential(*layers)
    batch = torch.randn(64, 3, 32, 32, generator=generator)
    return model, batch


# Note [loss in the last task]: the experiment trains through ``GPipe.step``, which runs any registered
# schedule (1F1B's backwards start before its forwards end): the loss, :func:`loss_of` of each micro-batch's
# output against a target that only carries the batch size, is the last stage's forward task's last layer.
# So a step is one phase: every task starts when its inputs are there, each worker thread starts once, and
# the simulator models it so (``SimConfig(backward_after_forward=False)``). The loss's own seconds, a mean
# square, are inside the last stage's F and B spans and not in its profiled seconds.
def loss_of(output: Batch) -> Tensor:
    """The experiment's loss: the mean square of every floating-point output (cheap, and any shape goes)."""
    tensors = [output] if isinstance(output, Tensor) else list(output)
    terms = [t.float().pow(2).mean() for t in tensors if t.is_floating_point()]
    if not terms:
        raise TypeError("the model's output has no floating-point tensor to take a loss of")
    return torch.stack([t.to(terms[0].device) for t in terms]).sum()


def progress_labels(setup: Setup) -> Sequence[str]:
    """The units of work :func:`run` reports to its ``progress`` callback, in order (for a progress bar); each label
    is made when it is asked for, so any number of steps costs no memory."""
    return _Labels(() if setup.balance is not None else ("balance",), setup.warmup_steps, setup.steps)


class _Labels(Sequence[str]):
    """The labels of :func:`progress_labels`: ``first``, the warm-up steps, the steps, then simulate and compare."""

    LAST = ("simulate", "compare")

    def __init__(self, first: tuple[str, ...], warmup_steps: int, steps: int) -> None:
        self.first = (*first, "calibrate", "overheads")
        self.warmup_steps, self.steps = warmup_steps, steps

    def __len__(self) -> int:
        return len(self.first) + self.warmup_steps + self.steps + len(self.LAST)

    @overload
    def __getitem__(self, k: int) -> str: ...

    @overload
    def __getitem__(self, k: slice) -> Sequence[str]: ...

    def __getitem__(self, k: int | slice) -> str | Sequence[str]:
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self)))]
        if not -len(self) <= k < len(self):
            raise IndexError(f"label {k} of {len(self)}")
        k %= len(self)
        if k < len(self.first):
            return self.first[k]
        k -= len(self.first)
        if k < self.warmup_steps:
            return f"warm-up step {k + 1}"
        k -= self.warmup_steps
        return f"step {k + 1}" if k < self.steps else self.LAST[k - self.steps]


# -- the run ---------------------------------------------------------------------------------------


# Note [interleaved calibration]: a shared machine's speed drifts over seconds, so a calibration made before the
# executor runs can describe another machine than the one its steps see. After every training step, warm-ups
# included, one profiling pass of every partition runs (:func:`gpipe.profiling.profile.time_recorded`: an untimed run,
# then ``Setup.pass_repeats`` timed runs in a streak); the stage seconds are the medians over the passes (Note [median
# pass] in :mod:`sim.calibration.outcome`). On shared cores ``Setup.pair_rounds`` rounds of pair measurements
# follow passes spread over the steps, and the pairs are their medians, each rebased on the pass before it (Note
# [pair baselines] in :mod:`sim.calibration.pairs`). The prediction still uses nothing the executor measured:
# profiling and stepping only sample the same machine. A schedule whose tasks never run two at once
# (:meth:`gpipe.schedule.Schedule.overlaps`) measures no pairs.
#
# Note [pass repeats]: a step's makespan averages each stage's task over ``chunks`` micro-batches, while one timed
# run a pass is one sample. A task of a micro-batch ``chunks`` times smaller takes about that much less time, so
# ``pass_repeats`` defaults to ``chunks // 2`` (at least one) timed runs a pass, which keeps a pass at about half
# a step whatever the chunks. The runs are a streak rather than that many passes, because a worker runs its stage
# back to back (Note [streaks] in :mod:`gpipe.profiling.timing`).
#
# Note [median step]: a shared machine is noisy, so ``steps`` training steps are recorded after
# ``warmup_steps`` unrecorded ones and the measured timeline is the step whose makespan is the median
# (the lower median for an even count): a real step, not an average of several.
#
# Note [one schedule]: the simulator is given the schedule the executor runs (``pipe.schedule_for(m)``, ``m`` the
# micro-batches :func:`gpipe.microbatch.sizes` cuts the batch into; a given Schedule is that object), so the two
# timelines are of the same schedule by construction; the prediction comes from the calibrated costs alone, never
# from the executor's timelines (Note [interleaved calibration] says when the calibration runs).
def run(model: nn.Sequential, batch: Batch, setup: Setup = Setup(), *, progress: Progress | None = None,
        description: str = "") -> Outcome:
    """Balance, then calibrate, run the executor, simulate and compare (see the module docstring).

    Args:
        model: the model; trained in place for ``warmup_steps + steps`` steps without an optimizer
            (gradients are computed and dropped, so the parameters do not change).
        batch: one mini-batch (a tensor, or a tuple of tensors with the batch in dimension 0).
        setup: what to run and how to measure it.
        progress: called with a label after each unit of :func:`progress_labels`.
        description: a line describing the model, for the report.

    Returns:
        The :class:`Outcome`.

    Raises:
        TypeError: ``model`` is not an ``nn.Sequential`` or ``batch`` is not a tensor or tuple of tensors.
        ValueError: a balance that does not fit the model, too few samples for the chunks, or nothing to
            train: no trainable parameter and no floating-point input (Note [nothing else to train]).
    """
    batch = _trainable(model, batch)
    clock = _Clock(progress)
    torch.manual_seed(setup.seed)
    with intra_op_threads(setup.threads):
        setup = _balanced(model, batch, setup, clock)
        pipe = _executor(model, setup)
        schedule = pipe.schedule_for(len(microbatch.sizes(rows(batch), setup.chunks)))  # Note [one schedule]
        cost, config = _calibrate(model, batch, pipe, schedule, setup, clock)
        steps = _run_steps(pipe, batch, schedule, setup, clock)
        cost, predicted = _simulate(schedule, cost, config, steps, clock)
    return _compare(setup, schedule, cost, config, predicted, steps, clock, description)


def _trainable(model: nn.Sequential, batch: Batch) -> Batch:
    """``batch`` as the experiment trains it (Note [nothing else to train]), once the model and batch are checked.

    Raises:
        TypeError, ValueError: as :func:`run`, before anything runs.
    """
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"the model must be an nn.Sequential, got {type(model).__name__}")
    _, tensors = as_tensors(batch, "the mini-batch")
    if rows(batch) < 1:
        raise ValueError("the mini-batch needs a batch dimension with at least one sample")
    # Note [nothing else to train]: the executor trains (records, and runs a backward) when a parameter or an
    # input requires grad. A model without trainable parameters (activations only) would run its forward
    # alone, with no timeline to compare; the experiment then trains its input: the floating-point tensors
    # of the mini-batch require grad, and the backward computes their gradients, on both halves alike.
    if any(p.requires_grad for p in model.parameters()):
        return batch
    if not any(t.is_floating_point() for t in tensors):
        raise ValueError("nothing to train: the model has no parameter that requires grad and the mini-batch "
                         "no floating-point tensor to take a gradient of")
    tensors = tuple(t.detach().requires_grad_(t.is_floating_point()) for t in tensors)
    return tensors[0] if isinstance(batch, Tensor) else tensors


def _balanced(model: nn.Sequential, batch: Batch, setup: Setup, clock: _Clock) -> Setup:
    """``setup`` with its devices (Note [devices and stages] in :mod:`sim.calibration.experiment_setup`) and its
    balance: ``balance_by_time`` of the first micro-batch unless one is given."""
    from gpipe.balance import balance_by_time

    devices = setup.devices or default_devices(setup.partitions)
    balance = setup.balance
    if balance is None:
        with clock.timed("balance"):
            first = rows_of(batch, 0, microbatch.sizes(rows(batch), setup.chunks)[0], torch.device(devices[0]))
            balance = tuple(balance_by_time(setup.partitions, model, first, timeout=setup.balance_timeout,
                                            device=devices[0]))
    return replace(setup, balance=tuple(balance), stages=None, devices=tuple(devices))


# Note [pinned per worker]: the executor runs every stage a schedule places on one device on that device's one
# worker thread, so the experiment pins a core per worker (schedule device), not per partition, and profiles each
# stage on its worker's core. What is a worker's own (the probe pipelines' hand-offs and launch, contention, the
# simulator's devices) is measured per worker; what a task costs (stage seconds, host seconds) per stage; the
# thread start per stage too, paid by the first task of each worker's list (``RunnerCosts.first_seconds``).
def _executor(model: nn.Sequential, setup: Setup) -> GPipe:
    """The recording :class:`gpipe.GPipe` that ``setup`` (balanced) describes; with ``pin``, on CPU devices, each
    stage on the core of its worker, the ``d``-th core for schedule device ``d`` (Note [pinned per worker]). Where
    the stages and workers are, and the schedule of a step, are asked of it from here on."""
    from gpipe import GPipe  # the executor; imported here so the simulator never needs it

    assert setup.balance is not None and setup.devices is not None
    cores = worker_affinity(setup.devices) if setup.pin else None
    affinity = None if cores is None else [cores[d] for d in setup.placement()]  # the front-end's placement
    return GPipe(model, balance=list(setup.balance), devices=list(setup.devices), chunks=setup.chunks,
                 checkpoint=setup.checkpoint, cpu_affinity=affinity, schedule=setup.schedule, record=True)


def _calibrate(model: nn.Sequential, batch: Batch, pipe: GPipe, schedule: Schedule, setup: Setup,
               clock: _Clock) -> tuple[CostModel, SimConfig]:
    """Calibrate: each of the pipe's partitions on its device and core (:func:`stage_costs`), then what the executor
    adds around them on its workers (:func:`with_executor_costs`; the pairs come with the steps, Note [interleaved
    calibration])."""
    workers, cores = pipe.pipeline.workers(schedule)
    with clock.timed("calibrate"):
        cost = stage_costs(model, batch, pipe.balance, setup.chunks, _names(pipe.devices), warmup=setup.warmup,
                           repeats=setup.repeats, affinity=pipe.cpu_affinity, split=schedule.splits_weight_gradient)
    with clock.timed("overheads"):
        return with_executor_costs(cost, list(pipe.partitions), _first(batch, pipe), _names(workers), affinity=cores,
                                   pairs=False, checkpoint=schedule.checkpoint, placement=schedule.placement)


@dataclass(frozen=True)
class _Steps:
    """What the recorded steps gave: their timelines, every step's profiling pass (warm-ups included), the pair
    rounds (recorded step, pairs) and the cores other processes used meanwhile."""

    measured: list[Timeline]
    passes: list[list[RecordedSeconds]]
    pair_rounds: list[tuple[int, dict[tuple[str, int, str, int], float]]]
    background: float | None

    @property
    def makespans(self) -> tuple[float, ...]:
        return tuple(t.makespan for t in self.measured)


def _run_steps(pipe: GPipe, batch: Batch, schedule: Schedule, setup: Setup, clock: _Clock) -> _Steps:
    """Run the executor: warm-up steps, then the recorded ones, each followed by a profiling pass and some, on
    shared cores, by a round of pairs (Note [interleaved calibration])."""
    parts, first, devices = list(pipe.partitions), _first(batch, pipe), _names(pipe.devices)
    target = torch.zeros(rows(batch))  # Note [loss in the last task]
    measured: list[Timeline] = []
    passes: list[list[RecordedSeconds]] = []
    rounds: list[tuple[int, dict[tuple[str, int, str, int], float]]] = []
    pair_steps = _spread(setup.pair_rounds, setup.warmup_steps + setup.steps)
    meter = BackgroundLoad()
    with clock.timed("measure", tick=False), _pair_meter(pipe, schedule, first) as pairs:
        for k in range(setup.warmup_steps + setup.steps):
            if k == setup.warmup_steps:
                meter = BackgroundLoad()
            timeline = _train_step(pipe, batch, target)
            recorded = k >= setup.warmup_steps
            if recorded:
                measured.append(timeline)
            passes.append(time_recorded(parts, first, device=devices, warmup=1, repeats=1,
                                        streak=setup.repeats_per_pass, affinity=pipe.cpu_affinity,
                                        split=schedule.splits_weight_gradient))
            if pairs is not None and k in pair_steps:  # against the pass just taken: Note [pair baselines]
                rounds.append((k - setup.warmup_steps, rebased(pairs.round(), pairs.alone, passes[-1])))
            clock.tick(f"step {k - setup.warmup_steps + 1}" if recorded else f"warm-up step {k + 1}")
    return _Steps(measured, passes, rounds, meter.cores())


def _pair_meter(pipe: GPipe, schedule: Schedule, first: Batch) -> contextlib.AbstractContextManager[PairMeter | None]:
    """A :class:`PairMeter` of the pipe's partitions where its workers share cores and the schedule runs tasks at
    once, else nothing (Note [interleaved calibration])."""
    workers, _ = pipe.pipeline.workers(schedule)
    if not (shares_cores(_names(workers)) and schedule.overlaps()):
        return contextlib.nullcontext()
    # 1F1B, whose forwards and backwards interleave, also runs a checkpointed forward beside a backward
    kinds = PHASE_PAIRS if schedule.forwards_first else (*PHASE_PAIRS, ("Fc", "B"), ("B", "Fc"))
    return PairMeter(list(pipe.partitions), first, kinds=kinds, affinity=pipe.cpu_affinity,
                     placement=schedule.placement)


def _simulate(schedule: Schedule, cost: CostModel, config: SimConfig, steps: _Steps,
              clock: _Clock) -> tuple[CostModel, Timeline]:
    """Simulate: the cost model of the profiling passes and pair rounds taken beside the steps (Note [interleaved
    calibration]), and the timeline it predicts for the schedule the executor ran."""
    with clock.timed("simulate"):
        cost = interleaved_cost(cost, steps.passes, [r for _, r in steps.pair_rounds])
        return cost, simulate(schedule, cost, config)


def _compare(setup: Setup, schedule: Schedule, cost: CostModel, config: SimConfig, predicted: Timeline,
             steps: _Steps, clock: _Clock, description: str) -> Outcome:
    """Compare: the prediction against the measured step of median makespan (Note [median step])."""
    chosen = median_step(steps.makespans)
    comparison = compare(predicted, steps.measured[chosen])
    clock.tick("compare")
    return Outcome(setup, schedule, cost, config, predicted, steps.measured[chosen], steps.makespans, chosen,
                   comparison, clock.seconds, description, steps.background,
                   tuple(tuple(p) for p in steps.passes[setup.warmup_steps:]), tuple(steps.pair_rounds))


def _spread(count: int, steps: int) -> set[int]:
    """``min(count, steps)`` of the step indices ``0 .. steps - 1``, evenly spread, the last one included."""
    count = min(count, steps)
    return {k for k in range(steps) if (k * count) // steps != ((k + 1) * count) // steps}


def _train_step(pipe: GPipe, batch: Batch, target: Tensor) -> Timeline:
    """One recorded training step of ``pipe`` on ``batch`` through ``GPipe.step`` (Note [loss in the last task]),
    the collector off until after it (Note [collect after the step] in :mod:`sim.calibration.machine`); the
    gradients are dropped afterwards."""
    with collected_after():
        pipe.step(batch, target, _loss_fn)
    timeline = pipe.timeline
    for p in [*pipe.parameters(), *as_tensors(batch, "the mini-batch")[1]]:
        p.grad = None
    if timeline is None:
        raise RuntimeError("the executor recorded no timeline for a training step")
    return timeline


def _loss_fn(output: Batch, _target: Tensor) -> Tensor:
    """``GPipe.step``'s loss: :func:`loss_of` of a micro-batch's output; the target only carries the batch size."""
    return loss_of(output)


class _Clock:
    """Seconds per unit of work (``seconds``), each unit's label given to ``progress`` as it ends."""

    def __init__(self, progress: Progress | None) -> None:
        self.seconds: dict[str, float] = {}
        self.tick: Progress = progress if progress is not None else (lambda _label: None)

    @contextlib.contextmanager
    def timed(self, label: str, *, tick: bool = True) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.seconds[label] = time.perf_counter() - start
        if tick:
            self.tick(label)


def _first(batch: Batch, pipe: GPipe) -> Batch:
    """The first micro-batch of ``batch`` as ``pipe`` cuts it (:func:`gpipe.microbatch.sizes`), on its first stage's
    device: the sample every calibration runs."""
    return rows_of(batch, 0, microbatch.sizes(rows(batch), pipe.chunks)[0], pipe.devices[0])


def _names(devices: Sequence[torch.device]) -> list[str]:
    return [str(d) for d in devices]
