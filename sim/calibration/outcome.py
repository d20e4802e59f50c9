"""What one experiment produced, and what can be read from it: errors, the machine's own noise, the files.

:func:`sim.calibration.experiment.run` calibrates, simulates and runs the executor; it returns an
:class:`Outcome`, which keeps the prediction, the measured step it is compared with, every recorded
step's makespan and every calibration sample taken among the steps (the profiling passes and the
pair rounds, Note [interleaved calibration] in :mod:`sim.calibration.experiment`). From those samples alone an
outcome derives how the prediction holds step by step (:attr:`Outcome.paired_error`), block by block
(:meth:`Outcome.block_errors`), and how far the machine itself moved while it ran
(:attr:`Outcome.drift`); :func:`interleaved_cost` makes a cost model of the samples (Note [median pass]),
and :func:`write_outputs` writes the picture, the trace and the report.
"""

from __future__ import annotations

import functools
import itertools
import platform
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import torch

from gpipe.checks import check_positive
from gpipe.profiling.profile import RecordedSeconds
from gpipe.schedule import Schedule
from gpipe.schedule.timeline import Timeline
from gpipe.schedule.trace import chrome_trace
from sim.calibration.compare import Comparison
from sim.calibration.experiment_setup import Setup
from sim.calibration.host import ExecutorCosts, ExecutorStage, executor_costs
from sim.calibration.machine import cpu_count
from sim.calibration.pairs import median_pairs
from sim.core.config import SimConfig
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate
from sim.files import OutputFolder

__all__ = ["DRIFT_LIMIT", "OUTPUT_FILES", "Outcome", "drift_of", "halves", "interleaved_cost", "median_paired_error",
           "median_step", "pass_predictions", "write_outputs"]

#: Note [drift]: a run whose machine moved more than this while it ran cannot tell an error of this size
#: (the fidelity benchmark's max-error goal) from the machine's
DRIFT_LIMIT = 0.08
#: The files :func:`write_outputs` writes.
OUTPUT_FILES = ("timeline.png", "trace.json", "report.json")


@dataclass(frozen=True)
class Outcome:
    """Everything one experiment produced.

    Attributes:
        setup: what was asked for, with ``balance`` and ``devices`` filled in.
        schedule: the schedule both halves ran (Note [one schedule] in :mod:`sim.calibration.experiment`).
        cost: the calibrated cost model, overheads included.
        config: the simulator's switches.
        predicted: the simulator's timeline.
        measured: the executor's timeline of the median step (Note [median step] in :mod:`sim.calibration.experiment`).
        step_makespans: the makespan of every recorded step, seconds, in order.
        chosen_step: the index of ``measured`` in ``step_makespans``.
        comparison: ``compare(predicted, measured)``.
        seconds: wall seconds each phase took (balance, calibrate, overheads, simulate, measure).
        model: a one-line description of the model.
        background_cores: CPU cores other processes used, on average, while the steps were measured
            (Linux; ``None`` elsewhere): a busy machine makes the measurement, not the model, noisy.
        passes: per recorded step, the profiling pass that ran right after it (Note [interleaved
            calibration] in :mod:`sim.calibration.experiment`).
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
    passes: tuple[tuple[RecordedSeconds, ...], ...] = field(default=(), repr=False, compare=False)
    pair_rounds: tuple[tuple[int, dict[tuple[str, int, str, int], float]], ...] = field(
        default=(), repr=False, compare=False)

    # Note [paired error]: the machine's speed drifts between seconds, so besides the median step against the
    # prediction from the median calibration, each recorded step is also compared with the prediction made
    # from the one profiling pass that ran right after it (the same machine, a second later; the pairs stay
    # the medians, since one round of them is too noisy to pair):
    # ``Outcome.paired_error`` is the median of those per-step errors. Both use only calibrated costs; the
    # pairing only decides which calibration a step is held against.
    @functools.cached_property
    def step_predictions(self) -> tuple[float, ...]:
        """Per recorded step, the makespan predicted from the profiling pass that ran right after it alone
        (Note [paired error]); the pairs stay the medians over all rounds."""
        return pass_predictions(self.schedule, self.cost, self.config, self.passes)

    # Note [block errors]: how much of an experiment's error is the machine's. The recorded steps are cut
    # into runs of consecutive steps (blocks); each block gives a prediction of its own, from the profiling
    # passes after its steps and the pair rounds taken among them (the pairs of all rounds where a block has
    # none), against its own median step (:meth:`Outcome.block_errors`). Blocks of consecutive steps, not
    # single steps, so that the machine's regimes, which last seconds, count as the few samples they are;
    # the spread of the block errors is what sampling the same machine again would move the error by,
    # calibration and measurement together.
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
            cost = interleaved_cost(self.cost, self.passes[lo:hi], rounds)
            measured = statistics.median(self.step_makespans[lo:hi])
            errors.append((simulate(self.schedule, cost, self.config).makespan - measured) / measured)
        return tuple(errors)

    @property
    def paired_error(self) -> float | None:
        """Note [paired error]: the median over steps of (predicted - measured) / measured, each step
        against the prediction from its own calibration pass; ``None`` without step predictions."""
        return median_paired_error(self.step_predictions, self.step_makespans)

    # Note [drift]: how far the machine itself moved while an experiment ran. ``halves`` of a sample in time order is
    # the median of its last half against its first half's, relative to the median of all; ``Outcome.drift`` is the
    # larger in size of the halves of the recorded steps and of the per-step predictions (Note [paired error]). It
    # compares each against itself, never prediction against measurement, so it says whether a run is fit to judge the
    # simulator by without looking at the answer (benchmarks/fidelity.py relates the two); ``gpipe-sim demo`` says so
    # when the drift is large.
    @property
    def drift(self) -> float | None:
        """Note [drift]: the larger in size of :func:`halves` of the recorded steps and of the per-step
        predictions, signed; ``None`` with fewer than two recorded steps."""
        return drift_of(self.step_makespans, self.step_predictions)

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
            "placement": list(self.schedule.placement),
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


def pass_predictions(schedule: Schedule, cost: CostModel, config: SimConfig,
                     passes: Sequence[Sequence[RecordedSeconds]]) -> tuple[float, ...]:
    """Note [paired error]: per profiling pass (its seconds per stage), the makespan predicted from that pass
    alone, everything else as in ``cost``."""
    return tuple(simulate(schedule, interleaved_cost(cost, [p], []), config).makespan for p in passes)


def median_paired_error(predictions: Sequence[float], makespans: Sequence[float]) -> float | None:
    """Note [paired error]: the median over steps of (predicted - measured) / measured; ``None`` without
    predictions."""
    if not predictions:
        return None
    return statistics.median((p - m) / m for p, m in zip(predictions, makespans, strict=True))


def median_step(makespans: Sequence[float]) -> int:
    """Note [median step] in :mod:`sim.calibration.experiment`: the index of the step of median makespan (the lower
    median for an even count)."""
    return sorted(range(len(makespans)), key=lambda k: makespans[k])[(len(makespans) - 1) // 2]


def drift_of(makespans: Sequence[float], predictions: Sequence[float]) -> float | None:
    """Note [drift]: the larger in size of :func:`halves` of the recorded steps and of the per-step predictions,
    signed; ``None`` with fewer than two recorded steps."""
    if len(makespans) < 2:
        return None
    return max((halves(makespans), halves(predictions)), key=abs)


def halves(values: Sequence[float]) -> float:
    """Note [drift]: the median of the last half of ``values`` (in time order) less that of the first
    half, over the median of all; 0.0 for fewer than two values or a median of 0."""
    half = len(values) // 2
    middle = statistics.median(values) if values else 0.0
    if half < 1 or middle == 0:
        return 0.0
    return (statistics.median(values[-half:]) - statistics.median(values[:half])) / middle


# Note [median pass]: the measured step is the step of median makespan (Note [median step] in
# :mod:`sim.calibration.experiment`), and a profiling pass samples the machine over a stretch of time as a step
# does; so a task's seconds are the median over the passes, each pass's own the median of its streak. A slow
# stretch (another process, the host) that makes a pass slow makes the steps beside it slow too, and the median
# step leaves those out as the median pass does; a mean lets one such pass raise every task
# (``benchmarks/demo_repeat.py`` repeats the demo; docs/benchmarks.md). The pairs are medians of their rounds for
# the same reason.
def interleaved_cost(cost: CostModel, passes: Sequence[Sequence[RecordedSeconds]],
                     rounds: Sequence[dict[tuple[str, int, str, int], float]]) -> CostModel:
    """``cost`` with the medians of interleaved profiling ``passes`` (Note [median pass]) and the medians of pair
    ``rounds`` (if any)."""
    executor = executor_costs(cost)
    stages, extras = [], []
    for j, (stage, extra) in enumerate(zip(cost.stages, executor.stages, strict=True)):
        stage, extra = _median_seconds(stage, extra, [p[j] for p in passes])
        stages.append(stage)
        extras.append(extra)
    overheads = replace(executor.overheads, pairs=median_pairs(rounds)) if rounds else executor.overheads
    return replace(cost, stages=tuple(stages), runner=ExecutorCosts(overheads, tuple(extras)))


def _median_seconds(stage: StageCost, extra: ExecutorStage,
                    profiles: Sequence[RecordedSeconds]) -> tuple[StageCost, ExecutorStage]:
    """``stage`` and ``extra`` with the seconds a recording executor's tasks take replaced by the medians over
    ``profiles`` (Note [median pass]); its plain seconds, which such an executor never runs, stay those of the
    first calibration."""
    median = statistics.median
    weight = None if extra.weight_recorded is None else median(p.weight for p in profiles)  # split: W
    return (replace(stage, forward_checkpointed=median(p.forward_nograd for p in profiles)),
            replace(extra, forward_recorded=median(p.forward for p in profiles),
                    backward_recorded=median(p.backward for p in profiles), weight_recorded=weight))


def _cost_dict(cost: CostModel) -> dict[str, Any]:
    executor = executor_costs(cost)
    o = executor.overheads
    return {
        "stages": [{**{k: getattr(s, k) for k in s.__dataclass_fields__},
                    **{k: getattr(e, k) for k in e.__dataclass_fields__}}
                   for s, e in zip(cost.stages, executor.stages, strict=True)],
        "copy_seconds": cost.copy_seconds,
        "overheads": {k: getattr(o, k) for k in o.__dataclass_fields__},
        "microbatch_scale": list(cost.microbatch_scale),
    }


class Compared(Protocol):
    """What :func:`write_outputs` draws and reports: both timelines, their comparison and a report (an
    :class:`Outcome`, or the multi-process run's :class:`sim.calibration.processes.ProcessOutcome`)."""

    @property
    def predicted(self) -> Timeline: ...
    @property
    def measured(self) -> Timeline: ...
    @property
    def comparison(self) -> Comparison: ...
    def report(self) -> dict[str, Any]: ...


def write_outputs(outcome: Compared, out: str | Path | OutputFolder, measured_by: str = "executor") -> dict[str, str]:
    """Write ``timeline.png`` (predicted above measured), ``trace.json`` (both) and ``report.json`` into ``out``.

    Args:
        outcome: what to write.
        out: a folder checked before the run (:class:`sim.files.OutputFolder`), or a path: a folder
            written as if forced (files of these names replaced, stale ones of earlier runs removed).
        measured_by: what ran the measured step, for the picture's title (``"2 processes"``).

    Returns:
        The paths written, by kind (``plot``, ``trace``, ``report``); the report lists them too.
    """
    from gpipe.schedule.plot import plot_side_by_side

    folder = out if isinstance(out, OutputFolder) else OutputFolder(out, OUTPUT_FILES, force=True)
    c = outcome.comparison
    titles = [f"predicted (simulator): makespan {c.predicted_makespan * 1e3:.2f} ms",
              f"measured ({measured_by}): makespan {c.measured_makespan * 1e3:.2f} ms, "
              f"error {c.makespan_error:+.1%}"]
    files = {"plot": str(folder.path / "timeline.png"), "trace": str(folder.path / "trace.json"),
             "report": str(folder.path / "report.json")}
    folder.write_with("timeline.png", lambda path: plot_side_by_side([outcome.predicted, outcome.measured], path,
                                                                     titles=titles))
    folder.write_json("trace.json", chrome_trace([outcome.predicted, outcome.measured], titles=["predicted",
                                                                                                  "measured"]))
    folder.write_json("report.json", {**outcome.report(), "files": files}, indent=1)
    folder.finish()
    return files
