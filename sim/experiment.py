"""Predicted against measured, end to end: balance, calibrate, simulate, run the executor, compare, write.

One implementation behind ``gpipe-sim demo``, ``gpipe-sim compare``, ``benchmarks/fidelity.py`` and the
integration tests::

    model, mini-batch
        |  balance_by_time (unless a balance is given)
        v
    calibrate: the partitions on their devices (sim.calibrate.calibrate), the executor's own costs
    (calibrate_executor_overheads), fresh-thread starts, pairs of tasks on shared cores
        |
        v
    GPipe(model, balance, devices, chunks, checkpoint): warm-up steps, then ``steps`` recorded
    training steps, each followed by one profiling pass (and, on shared cores, some by a round of
    pair measurements; Note [interleaved calibration])
        |                                             |
        v                                             v
    measured Timeline                              CostModel -> simulate(pipe.schedule, cost, config)
    (the step of median makespan)                                        |
        |                                                                v
        +---------------------------- compare ----------------------- predicted Timeline
                                        |
                    timeline.png, trace.json, report.json  (write_outputs)

Note [one schedule]: the simulator is given the schedule the executor reports (``pipe.schedule``), so
the two timelines are of the same schedule by construction (each measured step's ``meta`` is checked
against it); the prediction comes from the calibrated costs alone, never from the executor's
timelines (Note [interleaved calibration] says when the calibration runs).

Note [interleaved calibration]: the speed of a shared (virtual) machine drifts by ten per cent and
more over seconds, so a calibration made before the executor runs can describe a faster or slower
machine than the one the steps see. After every training step, warm-up steps included, one timed
profiling pass of every partition runs, after one untimed pass (:func:`gpipe.profile.profile_blocks`,
the profiler ``balance_by_time`` uses; a first pass pays one-off costs, a backward's a quarter more);
the stage seconds of the cost model are the medians over the timed passes. On shared cores
(:func:`sim.machine.shares_cores`) ``Setup.pair_rounds`` rounds of pair measurements follow passes spread evenly
over the steps (one :class:`sim.pairs.PairMeter` kept open across them), and ``Overheads.pairs`` are
the medians over the rounds: one round of a pair is a poor sample of Python's lock changing hands
(Note [pair rounds] in :mod:`sim.pairs`), and measured once up front the pairs of 64 x (Linear(64,
64), ReLU) put a prediction 40% off a run whose interleaved medians were 4% off. The prediction still
uses nothing the executor measured: profiling and stepping merely sample the same machine.

Note [paired error]: the machine's speed drifts between seconds, so besides the median step against the
prediction from the median calibration, each recorded step is also compared with the prediction made
from the one profiling pass that ran right after it (the same machine, a second later; the pairs stay
the medians, since one round of them is too noisy to pair):
``Outcome.paired_error`` is the median of those per-step errors. Both use only calibrated costs; the
pairing only decides which calibration a step is held against.

Note [block errors]: how much of an experiment's error is the machine's. The recorded steps are cut
into runs of consecutive steps (blocks); each block gives a prediction of its own, from the profiling
passes after its steps and the pair rounds taken among them (the pairs of all rounds where a block has
none), against its own median step (:meth:`Outcome.block_errors`). Blocks of consecutive steps, not
single steps, so that the machine's regimes, which last seconds, count as the few samples they are;
the spread of the block errors is what sampling the same machine again would move the error by,
calibration and measurement together.

Note [drift]: how far the machine itself moved while an experiment ran. ``halves`` of a sample
taken in time order is the median of its last half against that of its first half, relative to the
median of all; ``Outcome.drift`` is the larger in size of the halves of the recorded steps and of the
per-step predictions (one from each profiling pass, Note [paired error]). It uses no comparison of
prediction and measurement, only each against itself, so it can say whether a run is fit to judge the
simulator by, without looking at the answer: on this project's shared two-core machine every row of
the fidelity benchmark beyond 8% error had a drift beyond 8% (benchmarks/fidelity.py, Note [steady
rows]). ``gpipe-sim demo`` says so when the drift is large.

Note [median step]: a shared machine is noisy, so ``steps`` training steps are recorded after
``warmup_steps`` unrecorded ones and the measured timeline is the step whose makespan is the median
(the lower median for an even count): a real step, not an average of several.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import json
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from gpipe.affinity import Cores
from gpipe.checks import check_positive
from gpipe.profile import BlockProfile, profile_blocks
from gpipe.schedule import CHECKPOINT_MODES, Checkpoint, Schedule, gpipe
from gpipe.timeline import Timeline, write_chrome_trace
from sim.calibrate import (
    calibrate,
    calibrate_executor_overheads,
    measure_thread_start,
    on_device,
    partitions_of,
)
from sim.compare import Comparison, compare
from sim.cost import CostModel, StageCost
from sim.engine import SimConfig, simulate
from sim.machine import (
    BackgroundLoad,
    cpu_count,
    default_devices,
    intra_op_threads,
    shares_cores,
    worker_affinity,
)
from sim.pairs import PairMeter, measure_pairs, median_pairs

__all__ = [
    "DRIFT_LIMIT",
    "Outcome",
    "Setup",
    "demo_model",
    "halves",
    "loss_of",
    "microbatch_sizes",
    "progress_labels",
    "run",
    "stage_costs",
    "write_outputs",
]

Batch = Tensor | tuple[Tensor, ...]
#: Note [drift]: a run whose machine moved more than this while it ran cannot tell an error of this size
#: (the fidelity benchmark's max-error goal) from the machine's
DRIFT_LIMIT = 0.08
Progress = Callable[[str], None]  # called with a label after each unit of work (progress_labels)


@dataclass(frozen=True)
class Setup:
    """What to run and how to measure it.

    Attributes:
        chunks: micro-batches per mini-batch (GPipe's ``chunks``).
        checkpoint: ``always``, ``except_last`` or ``never``.
        balance: layers per partition; ``None``: ``balance_by_time`` over ``len(devices)`` partitions.
        devices: one torch device per partition; ``None``: :func:`sim.machine.default_devices` of two partitions
            (or of ``len(balance)`` when a balance is given).
        steps: recorded training steps; the measured timeline is the median one (Note [median step]).
        warmup_steps: unrecorded training steps first (allocator, thread pools, first-call costs).
        seed: seeds PyTorch before anything random (the caller seeds the model and input it builds).
        threads: intra-op threads per worker during the whole experiment (Note [threads] in :mod:`sim.machine`).
        warmup: untimed passes before the first calibration.
        repeats: timed passes of the first calibration, which the bytes, the balance check and the
            overhead measurements use; the stage seconds of the prediction are the medians over the
            passes interleaved with the steps (Note [interleaved calibration]).
        pair_rounds: on shared cores, rounds of pair measurements spread evenly over the warm-up and
            recorded steps (at most one after each step); ``Overheads.pairs`` are their medians
            (Note [interleaved calibration]).
        balance_timeout: seconds ``balance_by_time`` may spend.
        pin: on CPU devices (Linux), pin partition ``j``'s worker, and everything that calibrates it,
            to one core of its own (Note [pinned workers] in :mod:`gpipe.affinity`); ``False``:
            the operating system places the threads.
    """

    chunks: int = 4
    checkpoint: Checkpoint = "except_last"
    balance: tuple[int, ...] | None = None
    devices: tuple[str, ...] | None = None
    steps: int = 5
    warmup_steps: int = 2
    seed: int = 0
    threads: int | None = 1
    warmup: int = 2
    repeats: int = 3
    pair_rounds: int = 9
    balance_timeout: float = 1.0
    pin: bool = True

    def __post_init__(self) -> None:
        if self.balance is not None:
            object.__setattr__(self, "balance", tuple(self.balance))
        if self.devices is not None:
            object.__setattr__(self, "devices", tuple(str(d) for d in self.devices))
        for name, low in (("chunks", 1), ("steps", 1), ("warmup_steps", 0), ("warmup", 0), ("repeats", 1),
                          ("pair_rounds", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.checkpoint not in CHECKPOINT_MODES:
            raise ValueError(f"checkpoint must be one of {', '.join(CHECKPOINT_MODES)}, got {self.checkpoint!r}")
        if self.threads is not None and (isinstance(self.threads, bool) or self.threads < 1):
            raise ValueError(f"threads must be a positive integer or None, got {self.threads!r}")
        if self.balance is not None and self.devices is not None and len(self.balance) != len(self.devices):
            raise ValueError(f"balance has {len(self.balance)} partitions but {len(self.devices)} devices are given")
        if not self.balance_timeout >= 0:
            raise ValueError(f"balance_timeout must be >= 0 seconds, got {self.balance_timeout!r}")

    @property
    def partitions(self) -> int:
        if self.balance is not None:
            return len(self.balance)
        return len(self.devices) if self.devices is not None else 2


@dataclass(frozen=True)
class Outcome:
    """Everything one experiment produced.

    Attributes:
        setup: what was asked for, with ``balance`` and ``devices`` filled in.
        schedule: the schedule both halves ran (Note [one schedule]).
        cost: the calibrated cost model, overheads included.
        config: the simulator's switches.
        predicted: the simulator's timeline.
        measured: the executor's timeline of the median step (Note [median step]).
        step_makespans: the makespan of every recorded step, seconds, in order.
        chosen_step: the index of ``measured`` in ``step_makespans``.
        comparison: ``compare(predicted, measured)``.
        seconds: wall seconds each phase took (balance, calibrate, overheads, simulate, measure).
        model: a one-line description of the model.
        background_cores: CPU cores other processes used, on average, while the steps were measured
            (Linux; ``None`` elsewhere): a busy machine makes the measurement, not the model, noisy.
        passes: per recorded step, the profiling pass that ran right after it (Note [interleaved
            calibration]).
        pair_rounds: the rounds of pair measurements, each with the index of the recorded step it
            followed (negative after a warm-up step).
    """

    setup: Setup
    schedule: Schedule
    cost: CostModel
    config: SimConfig
    predicted: Timeline
    measured: Timeline
    step_makespans: tuple[float, ...]
    chosen_step: int
    comparison: Comparison
    seconds: dict[str, float] = field(default_factory=dict)
    model: str = ""
    background_cores: float | None = None
    passes: tuple[tuple[BlockProfile, ...], ...] = field(default=(), repr=False, compare=False)
    pair_rounds: tuple[tuple[int, dict[tuple[str, int, str, int], float]], ...] = field(
        default=(), repr=False, compare=False)

    @functools.cached_property
    def step_predictions(self) -> tuple[float, ...]:
        """Per recorded step, the makespan predicted from the profiling pass that ran right after it alone
        (Note [paired error]); the pairs stay the medians over all rounds."""
        return tuple(simulate(self.schedule, _interleaved(self.cost, [p], []), self.config).makespan
                     for p in self.passes)

    def block_errors(self, blocks: int = 5) -> tuple[float, ...]:
        """Note [block errors]: per run of consecutive recorded steps, (predicted - measured) / measured
        with the prediction from that run's own profiling passes and pair rounds.

        Raises:
            ValueError: ``blocks < 1``, fewer than two recorded steps a block, or an outcome without
                its passes.
        """
        check_positive("blocks", blocks)
        count = len(self.step_makespans)
        if count < 2 * blocks:
            raise ValueError(f"{blocks} blocks need at least {2 * blocks} recorded steps, got {count}")
        if len(self.passes) != count:
            raise ValueError(f"this outcome has {len(self.passes)} profiling passes for {count} recorded steps")
        bounds = [count * b // blocks for b in range(blocks + 1)]
        errors = []
        for lo, hi in itertools.pairwise(bounds):
            rounds = [r for k, r in self.pair_rounds if lo <= k < hi]
            cost = _interleaved(self.cost, self.passes[lo:hi], rounds)
            measured = statistics.median(self.step_makespans[lo:hi])
            errors.append((simulate(self.schedule, cost, self.config).makespan - measured) / measured)
        return tuple(errors)

    @property
    def paired_error(self) -> float | None:
        """Note [paired error]: the median over steps of (predicted - measured) / measured, each step
        against the prediction from its own calibration pass; ``None`` without step predictions."""
        if not self.step_predictions:
            return None
        return statistics.median((p - m) / m for p, m in zip(self.step_predictions, self.step_makespans, strict=True))

    @property
    def drift(self) -> float | None:
        """Note [drift]: the larger in size of :func:`halves` of the recorded steps and of the per-step
        predictions, signed; ``None`` with fewer than two recorded steps."""
        if len(self.step_makespans) < 2:
            return None
        return max((halves(self.step_makespans), halves(self.step_predictions)), key=abs)

    def report(self) -> dict[str, Any]:
        """The report as plain data (what ``report.json`` holds)."""
        c = self.comparison
        return {
            "predicted_makespan": c.predicted_makespan,
            "measured_makespan": c.measured_makespan,
            "makespan_error": c.makespan_error,
            "order_agreement": c.order_agreement,
            "model": self.model,
            "balance": list(self.setup.balance or ()),
            "devices": list(self.setup.devices or ()),
            "chunks": self.setup.chunks,
            "m": self.schedule.m,
            "n": self.schedule.n,
            "checkpoint": self.schedule.checkpoint,
            "schedule": self.schedule.name,
            "seed": self.setup.seed,
            "threads_per_worker": self.setup.threads,
            "pinned_workers": self.setup.pin,
            "steps": self.setup.steps,
            "warmup_steps": self.setup.warmup_steps,
            "step_makespans": list(self.step_makespans),
            "step_predictions": list(self.step_predictions),
            "paired_error": self.paired_error,
            "drift": self.drift,
            "chosen_step": self.chosen_step,
            "comparison": c.to_dict(),
            "cost_model": _cost_dict(self.cost),
            "phase_seconds": dict(self.seconds),
            "background_cores": self.background_cores,
            "environment": {"torch": torch.__version__, "python": platform.python_version(),
                            "machine": platform.machine(), "cpus": cpu_count()},
        }


# -- models and devices ----------------------------------------------------------------------------


def halves(values: Sequence[float]) -> float:
    """Note [drift]: the median of the last half of ``values`` (in time order) less that of the first
    half, over the median of all; 0.0 for fewer than two values or a median of 0."""
    half = len(values) // 2
    middle = statistics.median(values) if values else 0.0
    if half < 1 or middle == 0:
        return 0.0
    return (statistics.median(values[-half:]) - statistics.median(values[:half])) / middle


def demo_model(seed: int = 0) -> tuple[nn.Sequential, Tensor]:
    """The demo's model and mini-batch: a small convolutional classifier, seconds per step on a CPU.

    Eight 3x3 convolutions (32 channels, on 32x32 images, two of them halving the size) and a linear
    head, as one ``nn.Sequential`` of 19 layers; a mini-batch of 64 images. One training step of it
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


def microbatch_sizes(batch: int, chunks: int) -> list[int]:
    """The micro-batch sizes the executor cuts a mini-batch of ``batch`` samples into.

    As ``torch.tensor_split`` (the executor's :func:`gpipe.microbatch.scatter`): ``chunks`` pieces,
    the first ``batch % chunks`` of them one sample larger.

    Raises:
        ValueError: fewer samples than chunks (the executor refuses that too).
    """
    if chunks > batch:
        raise ValueError(f"chunks={chunks} is more than the batch size {batch}: every micro-batch needs at least "
                         "one sample")
    return [batch // chunks + (1 if k < batch % chunks else 0) for k in range(chunks)]


def loss_of(output: Batch) -> Tensor:
    """The experiment's loss: the mean square of every floating-point output (cheap, and any shape goes)."""
    tensors = [output] if isinstance(output, Tensor) else list(output)
    terms = [t.float().pow(2).mean() for t in tensors if t.is_floating_point()]
    if not terms:
        raise TypeError("the model's output has no floating-point tensor to take a loss of")
    return torch.stack([t.to(terms[0].device) for t in terms]).sum()


def progress_labels(setup: Setup) -> list[str]:
    """The units of work :func:`run` reports to its ``progress`` callback, in order (for a progress bar)."""
    labels = [] if setup.balance is not None else ["balance"]
    labels += ["calibrate", "overheads"]
    labels += [f"warm-up step {k + 1}" for k in range(setup.warmup_steps)]
    labels += [f"step {k + 1}" for k in range(setup.steps)]
    return labels + ["simulate", "compare"]


# -- the run ---------------------------------------------------------------------------------------


def run(model: nn.Sequential, batch: Batch, setup: Setup = Setup(), *, progress: Progress | None = None,
        description: str = "") -> Outcome:
    """Balance, calibrate, simulate, run the executor and compare (see the module docstring).

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
        ValueError: a balance that does not fit the model, or too few samples for the chunks.
    """
    from gpipe import GPipe  # the executor; imported here so the simulator never needs it
    from gpipe.balance import balance_by_time

    if not isinstance(model, nn.Sequential):
        raise TypeError(f"the model must be an nn.Sequential, got {type(model).__name__}")
    tensors = _tensors(batch)
    size = tensors[0].shape[0] if tensors[0].dim() else 0
    if size < 1:
        raise ValueError("the mini-batch needs a batch dimension with at least one sample")
    tick = _ticker(progress)
    seconds: dict[str, float] = {}
    torch.manual_seed(setup.seed)
    with intra_op_threads(setup.threads):
        devices = setup.devices or default_devices(setup.partitions)
        sizes = microbatch_sizes(size, setup.chunks)
        first = _slice(batch, 0, sizes[0], torch.device(devices[0]))
        balance = setup.balance
        if balance is None:
            clock = time.perf_counter()
            balance = tuple(balance_by_time(len(devices), model, first, timeout=setup.balance_timeout,
                                            device=devices[0]))
            seconds["balance"] = time.perf_counter() - clock
            tick("balance")
        partitions_of(model, balance)  # raises on a balance that does not fit, before anything runs
        setup = replace(setup, balance=tuple(balance), devices=tuple(devices))

        clock = time.perf_counter()
        affinity = worker_affinity(devices) if setup.pin else None
        cost = stage_costs(model, batch, balance, setup.chunks, devices, warmup=setup.warmup, repeats=setup.repeats,
                           affinity=affinity)
        seconds["calibrate"] = time.perf_counter() - clock
        tick("calibrate")

        clock = time.perf_counter()
        parts = [on_device(p, d) for p, d in zip(partitions_of(model, balance), devices, strict=True)]
        cost, config = with_executor_costs(cost, parts, first, devices, affinity=affinity, pairs=False)
        seconds["overheads"] = time.perf_counter() - clock
        tick("overheads")

        pipe = GPipe(model, balance=list(balance), devices=list(devices), chunks=setup.chunks,
                     checkpoint=setup.checkpoint, cpu_affinity=affinity)
        pipe.record = True
        schedule = pipe.schedule  # Note [one schedule]
        if schedule != gpipe(len(sizes), len(balance), setup.checkpoint):
            raise RuntimeError(f"the executor plans {schedule.name} with m={schedule.m}, n={schedule.n}, "
                               f"checkpoint={schedule.checkpoint}; expected GPipe's schedule of {len(sizes)} "
                               f"micro-batches and {len(balance)} stages")

        clock = time.perf_counter()
        measured_steps: list[Timeline] = []
        passes: list[list[BlockProfile]] = []  # Note [interleaved calibration]
        rounds: list[tuple[int, dict[tuple[str, int, str, int], float]]] = []  # of pairs, after pair_steps
        pair_steps = _spread(setup.pair_rounds, setup.warmup_steps + setup.steps)
        meter = BackgroundLoad()
        with contextlib.ExitStack() as stack:
            pairs = stack.enter_context(PairMeter(parts, first, affinity=affinity)) if shares_cores(devices) else None
            for k in range(setup.warmup_steps + setup.steps):
                if k == setup.warmup_steps:
                    meter = BackgroundLoad()
                timeline = _train_step(pipe, model, batch)
                if k >= setup.warmup_steps:
                    measured_steps.append(timeline)
                passes.append(profile_blocks(parts, first, device=list(devices), warmup=1, repeats=1,
                                             recorded=True, affinity=affinity))
                if pairs is not None and k in pair_steps:
                    rounds.append((k - setup.warmup_steps, pairs.round()))
                tick(f"step {k - setup.warmup_steps + 1}" if k >= setup.warmup_steps else f"warm-up step {k + 1}")
        seconds["measure"] = time.perf_counter() - clock
        background = meter.cores()
        for timeline in measured_steps:
            if timeline.meta.get("m") != schedule.m or timeline.meta.get("checkpoint") != schedule.checkpoint:
                raise RuntimeError(f"the executor ran m={timeline.meta.get('m')}, checkpoint="
                                   f"{timeline.meta.get('checkpoint')}; the prediction is of m={schedule.m}, "
                                   f"checkpoint={schedule.checkpoint}")

        clock = time.perf_counter()
        cost = _interleaved(cost, passes, [r for _, r in rounds])
        predicted = simulate(schedule, cost, config)
        seconds["simulate"] = time.perf_counter() - clock
        tick("simulate")

    makespans = tuple(t.makespan for t in measured_steps)
    chosen = sorted(range(len(makespans)), key=lambda k: makespans[k])[(len(makespans) - 1) // 2]
    comparison = compare(predicted, measured_steps[chosen])
    tick("compare")
    return Outcome(setup, schedule, cost, config, predicted, measured_steps[chosen], makespans, chosen,
                   comparison, seconds, description, background,
                   tuple(tuple(p) for p in passes[setup.warmup_steps:]), tuple(rounds))


def with_executor_costs(cost: CostModel, parts: Sequence[nn.Module], sample: Batch, devices: Sequence[str], *,
                        steps: int = 12, affinity: Sequence[Cores | None] | None = None, pairs: bool = True
                        ) -> tuple[CostModel, SimConfig]:
    """``cost`` with what the executor adds, and the simulator's switches for it.

    The executor's own overheads from probe pipelines, each partition's first task on a fresh thread,
    and, for workers sharing the CPU's cores and Python's lock (:func:`sim.machine.shares_cores`), what each pair
    of tasks costs. Partitions on one torch device hand tensors over and nothing is copied; GPipe's
    ``forward()`` returns before ``loss.backward()`` starts the backward phase (sim.engine, Note [two
    phases]). ``affinity``: the executor's ``cpu_affinity``; every measurement pins its threads the
    same way. ``pairs=False`` leaves ``Overheads.pairs`` to the caller (:func:`run` measures a round
    of them after every step, Note [interleaved calibration]).
    """
    overheads = calibrate_executor_overheads(list(devices), steps=steps, affinity=affinity)
    starts = measure_thread_start(parts, sample, affinity=affinity)
    cost = replace(cost, stages=tuple(replace(s, thread_start=t) for s, t in zip(cost.stages, starts, strict=True)))
    if pairs and shares_cores(devices):
        overheads = replace(overheads, pairs=measure_pairs(parts, sample, affinity=affinity))
    return replace(cost, overheads=overheads, copy_seconds=None), SimConfig(link=None, backward_after_forward=True)


def _spread(count: int, steps: int) -> set[int]:
    """``min(count, steps)`` of the step indices ``0 .. steps - 1``, evenly spread, the last one included."""
    count = min(count, steps)
    return {k for k in range(steps) if (k * count) // steps != ((k + 1) * count) // steps}


def _interleaved(cost: CostModel, passes: Sequence[Sequence[BlockProfile]],
                 rounds: Sequence[dict[tuple[str, int, str, int], float]]) -> CostModel:
    """``cost`` with the medians of interleaved profiling ``passes`` and pair ``rounds`` (if any)."""
    cost = replace(cost, stages=tuple(_median_seconds(stage, [p[j] for p in passes])
                                      for j, stage in enumerate(cost.stages)))
    if rounds:
        cost = replace(cost, overheads=replace(cost.overheads, pairs=median_pairs(rounds)))
    return cost


def _median_seconds(stage: StageCost, profiles: Sequence[BlockProfile]) -> StageCost:
    """``stage`` with its seconds replaced by the medians over ``profiles`` (Note [interleaved calibration])."""
    def median(values: Sequence[float | None], default: float | None = None) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else default

    forward = statistics.median(p.forward_seconds for p in profiles)
    return replace(stage, forward=forward, recompute=forward,
                   forward_checkpointed=median([p.forward_nograd_seconds for p in profiles]),
                   backward=statistics.median(p.backward_seconds for p in profiles),
                   forward_recorded=median([p.forward_recorded_seconds for p in profiles], stage.forward_recorded),
                   backward_recorded=median([p.backward_recorded_seconds for p in profiles], stage.backward_recorded))


def stage_costs(model: nn.Sequential, batch: Batch, balance: Sequence[int], chunks: int, devices: Sequence[str], *,
                warmup: int = 3, repeats: int = 9, affinity: Sequence[Cores | None] | None = None) -> CostModel:
    """Calibrate each partition on its device at the first micro-batch's size (no overheads).

    The executor the experiment runs records its timeline, so each stage's forward and backward are
    also measured with the recorder's hooks (``StageCost.forward_recorded``, ``backward_recorded``).

    An uneven split (``torch.tensor_split`` makes the first ``batch % chunks`` micro-batches one
    sample larger) becomes the cost model's ``microbatch_scale``: sample counts relative to the first.
    """
    tensors = _tensors(batch)
    sizes = microbatch_sizes(tensors[0].shape[0], chunks)
    first = _slice(batch, 0, sizes[0], torch.device(devices[0]))
    cost = calibrate(model, balance, first, devices=list(devices), warmup=warmup, repeats=repeats, recorded=True,
                     affinity=affinity)
    if len(set(sizes)) > 1:
        cost = replace(cost, microbatch_scale=tuple(s / sizes[0] for s in sizes))
    return cost


def _train_step(pipe: Any, model: nn.Module, batch: Batch) -> Timeline:
    """One recorded training step of ``pipe`` on ``batch``; the gradients are dropped afterwards."""
    gc.collect()
    output = pipe(batch)
    loss_of(output).backward()
    timeline = pipe.timeline
    for p in model.parameters():
        p.grad = None
    if timeline is None:
        raise RuntimeError("the executor recorded no timeline for a training step")
    return timeline


def _ticker(progress: Progress | None) -> Progress:
    return progress if progress is not None else (lambda _label: None)


def _tensors(batch: Batch) -> tuple[Tensor, ...]:
    if isinstance(batch, Tensor):
        return (batch,)
    if isinstance(batch, tuple) and batch and all(isinstance(t, Tensor) for t in batch):
        return batch
    raise TypeError(f"the mini-batch must be a tensor or a tuple of tensors, got {type(batch).__name__}")


def _slice(batch: Batch, start: int, stop: int, device: torch.device) -> Batch:
    if isinstance(batch, Tensor):
        return batch[start:stop].to(device)
    return tuple(t[start:stop].to(device) for t in batch)


def _cost_dict(cost: CostModel) -> dict[str, Any]:
    o = cost.overheads
    return {
        "stages": [{k: getattr(s, k) for k in s.__dataclass_fields__} for s in cost.stages],
        "copy_seconds": cost.copy_seconds,
        "overheads": {k: getattr(o, k) for k in o.__dataclass_fields__},
        "microbatch_scale": list(cost.microbatch_scale),
    }


# -- the files -------------------------------------------------------------------------------------


def write_outputs(outcome: Outcome, out: str | Path) -> dict[str, str]:
    """Write ``timeline.png`` (predicted above measured), ``trace.json`` (both) and ``report.json`` into ``out``.

    Returns:
        The paths written, by kind (``plot``, ``trace``, ``report``); the report lists them too.
    """
    from gpipe.plot import plot_side_by_side

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    c = outcome.comparison
    titles = [f"predicted (simulator): makespan {c.predicted_makespan * 1e3:.2f} ms",
              f"measured (executor): makespan {c.measured_makespan * 1e3:.2f} ms, "
              f"error {c.makespan_error:+.1%}"]
    files = {"plot": str(folder / "timeline.png"), "trace": str(folder / "trace.json"),
             "report": str(folder / "report.json")}
    plot_side_by_side([outcome.predicted, outcome.measured], files["plot"], titles=titles)
    write_chrome_trace(files["trace"], [outcome.predicted, outcome.measured], titles=["predicted", "measured"])
    report = {**outcome.report(), "files": files}
    Path(files["report"]).write_text(json.dumps(report, indent=1))
    return files
