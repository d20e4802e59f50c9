"""How fast the executor trains: one model run plain, with this GPipe, with torchgpipe and with torch's pipelining.

A step is ``zero_grad`` + forward + loss (MSE) + backward, on ``--layers`` x (Linear(width) + ReLU), cut in half
across two partitions (two CPU "devices"), the batch split into ``--chunks`` micro-batches. The configurations::

    plain                      the model itself, one thread (and again with two threads, for honesty)
    torchgpipe <checkpoint>    torchgpipe 0.0.7's GPipe, devices ['cpu', 'cpu']
    gpipe <checkpoint>         this project's GPipe, devices ['cpu', 'cpu'], record off: forward() + loss + backward()
    gpipe <checkpoint>, step   the same pipe trained through its other entry point, ``pipe.step(x, y, mse_loss)``
    gpipe <checkpoint>, record the same pipe with ``record=True`` (a measured Timeline every step)
    pipelining GPipe / 1F1B    torch.distributed.pipelining, one stage per process, two gloo processes

The schedule axis (every registered schedule against plain and against torch.distributed.pipelining's schedule of
the same name) is ``--schedules NAMES`` (or ``all``), which runs ``benchmarks.schedule_speed``.

Note [one thread per worker]: one intra-op thread per worker and per rank, on purpose (``--threads``; Note [threads]
in ``_shared/machine.py``). The plain model is also shown with two threads: what a user without a pipeline gets.

The in-process configurations are timed in shuffled rounds (Note [interleaving] in ``_shared/rounds.py``). The
pipelining rows run in separate processes (Note [pipelining] in ``_shared/pipelining.py``) and are timed in a block
of their own, and so is the two-thread plain row, last: switching the thread count between interleaved steps would
let its second OpenMP thread compete with the others' steps. On a machine whose second core is busy with other work
that row can be far slower than one thread (an OpenMP team waits at every barrier for its descheduled member): that
is what the row is there to show.

Note [prediction]: the simulator's figure is the median of three calibrations of this machine, before, halfway
through and after the timed rounds (``_shared/prediction.py``, Note [prediction] there, which says how and what bounds
come with it).

Goals (from the issue): gpipe faster than plain where micro-batches stay large enough; at most 0.6 x
torchgpipe's step for the same checkpoint policy; within 10 % of the simulator's prediction; recording on
within 5 % of recording off; its two entry points (``forward()`` + ``backward()``, and ``step()``) within 3 %
of each other, measured on one pipe alternated after the rounds (Note [entry points alternated]).

Run: ``.venv/bin/python -m benchmarks.executor_speed`` (about a minute on two busy cores; installs
torchgpipe 0.0.7 with ``pip --no-deps`` when it is missing) or ``--quick``; writes
``benchmarks/results/executor_speed.json``. The wider model kept for checking (steps of 0.3-1 s)::

    .venv/bin/python -m benchmarks.executor_speed --width 2048 --modes never --repeats 30 --skip-torchgpipe \
        --skip-pipelining --json benchmarks/results/executor_speed_wide.json
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from benchmarks._shared import options, prediction
from benchmarks._shared.machine import load_average, set_threads
from benchmarks._shared.pipelining import run_pipelining as run_schedules
from benchmarks._shared.record import command_line, results_path, write_json
from benchmarks._shared.rounds import Runner, alternated, block, interleaved, ms, ratio
from benchmarks._shared.workload import Workload, gradients_match, pipe_step, train_step
from gpipe.schedule import Checkpoint

RESULTS = results_path("executor_speed")
MODES: tuple[Checkpoint, ...] = ("never", "except_last", "always")
TORCHGPIPE = "torchgpipe==0.0.7"
# The issue's figures for the default configuration (8 layers of 512, batch 256, chunks 4), milliseconds.
REFERENCE_MS = {
    "plain": 22.8,
    "torchgpipe never": 38.6, "torchgpipe except_last": 44.6, "torchgpipe always": 46.6,
    "pipelining GPipe": 32.9, "pipelining 1F1B": 24.8,
}
GOAL_VS_TORCHGPIPE = 0.6
GOAL_VS_PREDICTION = 0.10
GOAL_RECORD = 0.05
GOAL_ENTRY_POINTS = 0.03


# Note [entry points alternated]: the two entry points run the same interpreter, so what separates them is a few
# percent, below what rounds of a dozen runners in shuffled order resolve (each one's neighbour, and the caches it
# leaves, changes from round to round). Their ratio is therefore measured apart, after the rounds: the same pipe
# stepped through forward() + backward() and through step() back to back, in a seeded random order within each
# pair, and the ratio is the median of the per-pair ratios (``_shared.rounds.alternated``). The shuffled rounds'
# ratio is kept in the results.


# -- torchgpipe ------------------------------------------------------------------------------------


def import_torchgpipe() -> Any:
    """torchgpipe, installed into this interpreter first when missing (``--no-deps``: torch stays as it is)."""
    try:
        return importlib.import_module("torchgpipe")
    except ImportError:
        print(f"torchgpipe is not importable: python -m pip install --no-deps {TORCHGPIPE}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", TORCHGPIPE], check=True)
        importlib.invalidate_caches()
        return importlib.import_module("torchgpipe")


# Runtime patches applied to torchgpipe for this torch. Checked on torch 2.13.0+cpu: 0.0.7 runs unpatched on
# CPU devices, for every checkpoint policy, and matches the plain model's loss and gradients (checked again
# on every run below), so the list is empty. A patch added here must name itself in this list.
TORCHGPIPE_PATCHES: list[str] = []


# -- torch.distributed.pipelining --------------------------------------------------------------------


def run_pipelining(workload: Workload, warmup: int, repeats: int, threads: int) -> dict[str, list[float]]:
    """torch.distributed.pipelining's GPipe and 1F1B on two spawned gloo processes, one stage and ``threads``
    intra-op threads each (Note [pipelining] in _shared/pipelining.py); seconds per step."""
    plans = {name: ([0, 1], workload.balance) for name in ("gpipe", "1f1b")}
    times = run_schedules(workload, plans, warmup, repeats, threads)
    return {"GPipe": times["gpipe"], "1F1B": times["1f1b"]}


# -- the run, step by step -----------------------------------------------------------------------------


@dataclass
class Setup:
    """What the rounds time: the workload and its batch, the in-process configurations, and per checkpoint policy
    this GPipe's two entry points (Note [entry points alternated]) and the timelines its recording steps keep."""

    workload: Workload
    x: torch.Tensor
    y: torch.Tensor
    plain: nn.Module
    runners: list[Runner]
    notes: list[str]
    torchgpipe: str | None = None  # its version, where its rows run
    off: dict[str, Callable[[], object]] = field(default_factory=dict)
    stepped: dict[str, Callable[[], object]] = field(default_factory=dict)
    recorded: dict[str, list[Any]] = field(default_factory=dict)


@dataclass
class Timed:
    """What the run measured: seconds per step by configuration, the simulator's prediction (Note [prediction]),
    per policy the recorded step of median makespan and the entry points' alternated ratio."""

    samples: dict[str, list[float]]
    same_rounds: set[str]  # the configurations timed in the same rounds (Note [interleaving])
    alternated: dict[str, float]
    prediction: dict[str, Any] | None
    timelines: dict[str, Any]

    @functools.cached_property
    def medians(self) -> dict[str, float]:
        return {name: ms(values) for name, values in self.samples.items()}

    def vs(self, a: str, b: str) -> float:
        return ratio(self.samples[a], self.samples[b], a in self.same_rounds and b in self.same_rounds)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--schedules" in argv or any(a.startswith("--schedules=") for a in argv):
        return schedule_axis(argv)
    args = parse(argv)
    setup = set_up(args)
    timed = run(setup, args)
    rows = tabulate(setup.workload, args.modes, timed)
    simulator = against_simulator(setup.workload, args.modes, timed)
    goals = judge(args.modes, timed, simulator) if setup.off else {}
    write(args, argv, setup, {"rows": rows, "simulator": simulator, "goals": goals})
    return 0


def schedule_axis(argv: list[str]) -> int:
    """``--schedules``: the schedule axis, which ``schedule_speed.py`` runs with the same flags, in a process of its
    own; its exit status."""
    return subprocess.run([sys.executable, "-m", "benchmarks.schedule_speed", *argv], check=False).returncode


def parse(argv: list[str]) -> argparse.Namespace:
    """The flags, checked, with ``modes``, ``repeats`` and ``warmup`` resolved."""
    parser = options.parser(__doc__)
    parser.epilog = ("--schedules NAMES: the schedule axis instead (benchmarks.schedule_speed takes the same "
                     "flags; see its --help)")
    parser.add_argument("--batch", type=int, default=256, help="samples per step (default 256)")
    parser.add_argument("--chunks", type=int, default=4, help="micro-batches per step (default 4)")
    parser.add_argument("--layers", type=int, default=8, help="(Linear + ReLU) pairs, >= 2 (default 8)")
    parser.add_argument("--width", type=int, default=512, help="features of every Linear (default 512)")
    parser.add_argument("--repeats", type=int, default=None, help="timed steps per configuration (default 60)")
    options.add_out(parser, RESULTS)
    parser.add_argument("--skip-torchgpipe", action="store_true", help="leave torchgpipe out (no install)")
    parser.add_argument("--skip-pipelining", action="store_true", help="leave torch.distributed.pipelining out")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"checkpoint policies to time, comma-separated (default {','.join(MODES)})")
    options.add_quick(parser, "few repeats and a short calibration (smoke test)")
    options.add_threads(parser)
    args = parser.parse_args(argv)
    args.modes = tuple(m for m in args.modes.split(",") if m)
    if not args.modes or any(m not in MODES for m in args.modes):
        parser.error(f"--modes takes some of {','.join(MODES)}")
    if args.layers < 2 or args.width < 1 or args.batch < 1 or args.chunks < 1:
        parser.error("need --layers >= 2 and positive --width, --batch and --chunks")
    args.repeats = args.repeats if args.repeats is not None else (5 if args.quick else 60)
    args.warmup = 1 if args.quick else 3
    if args.repeats < 1:
        parser.error("--repeats must be positive")
    return args


def set_up(args: argparse.Namespace) -> Setup:
    """The workload on ``args.threads`` intra-op threads, and every in-process configuration: plain, torchgpipe and
    this GPipe (with and without recording), each pipeline checked equal to the plain model first."""
    workload = Workload(args.layers, args.width, args.batch, args.chunks)
    set_threads(args.threads)  # Note [threads] in _shared.machine
    model = workload.model()
    x, y = workload.data()
    note = (f"torch.set_num_threads({args.threads}) on purpose: {'one' if args.threads == 1 else args.threads} "
            f"intra-op thread{'s' if args.threads > 1 else ''} per worker (each pipelining rank too); "
            "'plain (2 threads)' shows the model with both cores.")
    print(f"model: {args.layers} x (Linear({args.width}) + ReLU), balance {workload.balance}, batch {args.batch}, "
          f"chunks {args.chunks} (m = {workload.m}); {os.cpu_count()} CPUs, torch {torch.__version__}")
    print(note, flush=True)
    plain = copy.deepcopy(model)
    setup = Setup(workload, x, y, plain, [Runner("plain", lambda: train_step(plain, x, y), [])], [note])
    if not args.skip_torchgpipe:
        add_torchgpipe(setup, model, args.modes)
    add_gpipe(setup, model, args.modes)
    return setup


def add_torchgpipe(setup: Setup, model: nn.Module, modes: Sequence[str]) -> None:
    """torchgpipe's rows, one per checkpoint policy."""
    torchgpipe = import_torchgpipe()
    setup.torchgpipe = getattr(torchgpipe, "__version__", "?")
    x, y, workload = setup.x, setup.y, setup.workload
    for mode in modes:
        pipe = torchgpipe.GPipe(copy.deepcopy(model), balance=workload.balance, devices=["cpu", "cpu"],
                                chunks=workload.chunks, checkpoint=mode)
        if not gradients_match(copy.deepcopy(model), pipe, x, y):
            raise SystemExit(f"torchgpipe {setup.torchgpipe} ({mode}) does not match the plain model on this torch")
        setup.runners.append(Runner(f"torchgpipe {mode}", lambda p=pipe: train_step(p, x, y), []))
    setup.notes.append(f"torchgpipe {setup.torchgpipe} on torch {torch.__version__}: "
                       + (f"patched at runtime ({'; '.join(TORCHGPIPE_PATCHES)})" if TORCHGPIPE_PATCHES
                          else "unpatched") + ", loss and gradients checked equal to the plain model")
    print(setup.notes[-1], flush=True)


def add_gpipe(setup: Setup, model: nn.Module, modes: Sequence[str]) -> None:
    """This GPipe's rows per checkpoint policy: forward() + backward(), step(), and recording on."""
    try:
        gpipe_cls = importlib.import_module("gpipe").GPipe
    except (ImportError, AttributeError) as error:
        setup.notes.append(f"gpipe.GPipe is not importable ({error}): its rows are missing")
        print(setup.notes[-1], flush=True)
        return
    x, y, workload = setup.x, setup.y, setup.workload
    for mode in modes:
        pipe = gpipe_cls(copy.deepcopy(model), balance=workload.balance, devices=["cpu", "cpu"],
                         chunks=workload.chunks, checkpoint=mode, record=False)
        if not gradients_match(copy.deepcopy(model), pipe, x, y):
            raise SystemExit(f"gpipe.GPipe ({mode}) does not match the plain model")
        if not gradients_match(copy.deepcopy(model), pipe, x, y, step=pipe_step):
            raise SystemExit(f"gpipe.GPipe.step ({mode}) does not match the plain model")
        setup.recorded[mode] = []

        def off(p: Any = pipe) -> object:
            p.record = False
            return train_step(p, x, y)

        def on(p: Any = pipe, kept: list[Any] = setup.recorded[mode]) -> object:
            p.record = True
            loss = train_step(p, x, y)
            kept.append(p.timeline)
            return loss

        def stepped(p: Any = pipe) -> object:
            p.record = False
            return pipe_step(p, x, y)

        setup.runners += [Runner(f"gpipe {mode}", off, []), Runner(f"gpipe {mode}, step", stepped, []),
                          Runner(f"gpipe {mode}, record", on, [])]
        setup.off[mode], setup.stepped[mode] = off, stepped


def run(setup: Setup, args: argparse.Namespace) -> Timed:
    """The shuffled rounds (Note [interleaving]) with the simulator calibrated before, halfway and after them (Note
    [prediction]); then, each in a block of its own, the entry points alternated (Note [entry points alternated]),
    torch's pipelining on two processes and the plain model on two threads."""
    gpipes = bool(setup.off)
    calibrations: list[dict[str, Any]] = []
    print(f"timing {len(setup.runners)} configurations round-robin: {args.warmup} warm-up + {args.repeats} timed "
          "rounds" + (", calibrating the simulator before, halfway and after" if gpipes else "") + " ...", flush=True)
    for k, rounds in enumerate((args.repeats // 2, args.repeats - args.repeats // 2)):
        if gpipes:
            calibrations.append(prediction.predict(setup.workload, MODES, args.quick))
        interleaved(setup.runners, args.warmup if k == 0 else 0, rounds)
    samples = {r.name: r.samples for r in setup.runners}
    same_rounds = set(samples)
    entries = {mode: alternated(setup.off[mode], setup.stepped[mode], args.repeats) for mode in setup.off}
    if not args.skip_pipelining:
        print("timing torch.distributed.pipelining on two gloo processes ...", flush=True)
        for name, values in run_pipelining(setup.workload, args.warmup, args.repeats, args.threads).items():
            samples[f"pipelining {name}"] = values
    set_threads(2)  # the plain model as a user without a pipeline runs it, on both cores
    try:
        samples["plain (2 threads)"] = block(lambda: train_step(setup.plain, setup.x, setup.y), args.warmup,
                                             args.repeats)
    finally:
        set_threads(args.threads)
    predicted, timelines = None, {}
    if gpipes:
        calibrations.append(prediction.predict(setup.workload, MODES, args.quick))
        predicted = prediction.merge(calibrations)
        for mode, recorded in setup.recorded.items():  # the timed recorded step of median makespan
            steps = sorted((t for t in recorded[-args.repeats:] if t is not None), key=lambda t: t.makespan)
            if steps:
                timelines[mode] = steps[len(steps) // 2]
    return Timed(samples, same_rounds, entries, predicted, timelines)


def tabulate(workload: Workload, modes: Sequence[str], timed: Timed) -> list[dict[str, Any]]:
    """A row per configuration, printed as the table."""
    medians = timed.medians
    order = (["plain", "plain (2 threads)"] + [f"torchgpipe {m}" for m in modes] + [f"gpipe {m}" for m in modes]
             + [f"gpipe {m}, step" for m in modes] + [f"gpipe {m}, record" for m in modes]
             + ["pipelining GPipe", "pipelining 1F1B"])
    rows: list[dict[str, Any]] = []
    for name in order:
        if name not in medians:
            continue
        row: dict[str, Any] = {"configuration": name, "median_ms": round(medians[name], 3),
                               "vs_plain": round(timed.vs(name, "plain"), 3)}
        policy = next((m for m in modes if name.endswith((m, f"{m}, record", f"{m}, step"))), None)
        if name.startswith("gpipe") and policy and f"torchgpipe {policy}" in medians:
            row["vs_torchgpipe"] = round(timed.vs(name, f"torchgpipe {policy}"), 3)
        if policy and name == f"gpipe {policy}" and f"gpipe {policy}, step" in medians:
            row["vs_step"] = round(timed.vs(name, f"gpipe {policy}, step"), 3)  # forward()+backward() over step()
        if timed.prediction is not None and name.startswith("gpipe") and policy:
            row["predicted_ms"] = round(timed.prediction["modes"][policy]["predicted_ms"], 3)
        if name in REFERENCE_MS and _is_reference(workload):
            row["issue_ms"] = REFERENCE_MS[name]
        row["samples"] = len(timed.samples[name])
        rows.append(row)
    print()
    print(f"{'configuration':<26}{'median ms':>10}{'/ plain':>9}{'/ torchgpipe':>14}{'/ step':>8}{'predicted ms':>14}"
          f"{'issue ms':>10}")
    for row in rows:
        print(f"{row['configuration']:<26}{row['median_ms']:>10.2f}{row['vs_plain']:>9.2f}"
              f"{_fmt(row.get('vs_torchgpipe'), '.2f'):>14}{_fmt(row.get('vs_step'), '.3f'):>8}"
              f"{_fmt(row.get('predicted_ms'), '.2f'):>14}{_fmt(row.get('issue_ms'), '.1f'):>10}")
    return rows


def against_simulator(workload: Workload, modes: Sequence[str], timed: Timed) -> dict[str, Any] | None:
    """The prediction beside the measurement (Note [prediction]), printed; ``None`` without this GPipe's rows."""
    if timed.prediction is None:
        return None
    measured = {mode: timed.medians[f"gpipe {mode}"] for mode in modes}
    return prediction.compared(timed.prediction, workload, modes, measured, timed.medians["plain"], timed.timelines)


def judge(modes: Sequence[str], timed: Timed, simulator: dict[str, Any] | None) -> dict[str, Any]:
    """The issue's goals, each with what was measured, printed."""
    medians, vs, plain = timed.medians, timed.vs, timed.medians["plain"]
    goals: dict[str, Any] = {"faster_than_plain": {"gpipe_never_ms": medians["gpipe never"], "plain_ms": plain,
                                                   "ratio": vs("gpipe never", "plain"),
                                                   "met": vs("gpipe never", "plain") < 1.0}}
    if any(f"torchgpipe {mode}" in medians for mode in modes):
        ratios = {mode: vs(f"gpipe {mode}", f"torchgpipe {mode}") for mode in modes}
        goals["vs_torchgpipe"] = {"limit": GOAL_VS_TORCHGPIPE, "ratios": ratios,
                                  "met": all(r <= GOAL_VS_TORCHGPIPE for r in ratios.values())}
    if simulator is not None:
        errors = {mode: simulator["modes"][mode]["error"] for mode in modes}
        goals["vs_prediction"] = {"limit": GOAL_VS_PREDICTION, "errors": errors,
                                  "met": all(abs(e) <= GOAL_VS_PREDICTION for e in errors.values())}
    costs = {mode: vs(f"gpipe {mode}, record", f"gpipe {mode}") - 1.0 for mode in modes}
    goals["record_overhead"] = {"limit": GOAL_RECORD, "overheads": costs,
                                "met": all(c <= GOAL_RECORD for c in costs.values())}
    entries = timed.alternated  # Note [entry points alternated]
    goals["entry_points"] = {"limit": GOAL_ENTRY_POINTS, "forward_backward_over_step": entries,
                             "in_shuffled_rounds": {mode: vs(f"gpipe {mode}", f"gpipe {mode}, step") for mode in modes},
                             "met": all(abs(r - 1.0) <= GOAL_ENTRY_POINTS for r in entries.values())}
    print("\ngoals:")
    print(f"  faster than plain (gpipe never {medians['gpipe never']:.2f} ms vs plain {plain:.2f} ms, "
          f"ratio {goals['faster_than_plain']['ratio']:.2f}): {_met(goals['faster_than_plain'])}")
    if "vs_torchgpipe" in goals:
        print(f"  <= {GOAL_VS_TORCHGPIPE} x torchgpipe: "
              + ", ".join(f"{k} {v:.2f}" for k, v in goals["vs_torchgpipe"]["ratios"].items())
              + f": {_met(goals['vs_torchgpipe'])}")
    if "vs_prediction" in goals:
        print(f"  within {GOAL_VS_PREDICTION:.0%} of the simulator: "
              + ", ".join(f"{k} {v:+.1%}" for k, v in goals["vs_prediction"]["errors"].items())
              + f": {_met(goals['vs_prediction'])}")
    print(f"  recording costs <= {GOAL_RECORD:.0%}: "
          + ", ".join(f"{k} {v:+.1%}" for k, v in costs.items()) + f": {_met(goals['record_overhead'])}")
    print(f"  forward()+backward() within {GOAL_ENTRY_POINTS:.0%} of step(): "
          + ", ".join(f"{k} {v:.3f}" for k, v in entries.items()) + f": {_met(goals['entry_points'])}")
    return goals


def write(args: argparse.Namespace, argv: list[str], setup: Setup, results: dict[str, Any]) -> None:
    """The results as JSON: the run's settings, then ``results`` (rows, simulator, goals)."""
    workload = setup.workload
    doc = {
        "benchmark": "executor_speed",
        "note": " ".join(setup.notes),
        "workload": {"layers": workload.layers, "width": workload.width, "batch": workload.batch,
                     "chunks": workload.chunks, "m": workload.m, "balance": workload.balance, "loss": "mse",
                     "step": "zero_grad + forward + loss + backward"},
        "quick": args.quick, "warmup": args.warmup, "repeats": args.repeats, "threads_per_worker": args.threads,
        "torchgpipe": None if setup.torchgpipe is None else {"version": setup.torchgpipe,
                                                             "patches": TORCHGPIPE_PATCHES},
        "reference_ms": REFERENCE_MS,
        **results,
    }
    write_json(args.out, doc, command=command_line(__file__, argv),
               machine={"threads_per_worker": args.threads, "processor": platform.processor() or platform.machine(),
                        "load_average_1min": load_average()})
    print(f"\nwrote {args.out}")


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _is_reference(workload: Workload) -> bool:
    return (workload.layers, workload.width, workload.batch, workload.chunks) == (8, 512, 256, 4)


def _met(goal: dict[str, Any]) -> str:
    return "met" if goal["met"] else "NOT met"


if __name__ == "__main__":
    raise SystemExit(main())
