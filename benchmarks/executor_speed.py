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
the same name) is ``--schedules NAMES`` (or ``all``), which runs ``benchmarks/schedule_speed.py``.

Note [one thread per worker]: ``torch.set_num_threads(1)`` is set on purpose. Two pipeline workers share
the two cores of a small machine; letting each one's intra-op pool grab every core would make them fight.
The plain model is also shown with two threads: that is what a user without a pipeline would get.

Note [interleaving]: the machine is shared, so the in-process configurations are timed round-robin (one
step of each per round, in an order shuffled anew each round) and every time is the median over rounds; a slow spell
then spoils one sample of each configuration instead of every sample of one. A ratio between two of them is
the median of the per-round ratios (each pair timed within the same fraction of a second), which a machine
whose speed drifts during the run distorts far less than a ratio of medians. The pipelining rows run in
separate processes and are timed in a block of their own, and so is the two-thread plain row, last: switching
the thread count between interleaved steps would let its second OpenMP thread compete with the others' steps.
On a machine whose second core is busy with other work that row can be far slower than one thread (an OpenMP
team waits at every barrier for its descheduled member): that is what the row is there to show.

Note [pipelining]: each of the two processes builds the same model from the same seed and keeps its own
partition (``sim.calibration.calibrate.partitions_of``, the cut GPipe uses), wrapped by hand in a ``PipelineStage`` (the
manual front end; tracing with ``pipeline()`` yields the same two stages for an ``nn.Sequential``), and runs
``ScheduleGPipe`` then ``Schedule1F1B`` with ``m`` micro-batches and the same MSE loss (per micro-batch, averaged:
equal to the whole batch's for equal chunks). The step is timed on rank 0 between two barriers, so it ends when
the slower rank ends.

Note [prediction]: the simulator's figure comes from calibrating this machine: each partition profiled at the
micro-batch size (``sim.calibration.calibrate.calibrate``), the executor's own costs measured (task overhead, hand-off,
two workers sharing the cores: ``sim.calibration.experiment.with_executor_costs``, which runs
``calibrate_executor_overheads``, ``sim.calibration.thread_costs.measure_stage_extras`` and ``measure_pairs``) and
merged into the cost model, then
``simulate(gpipe(m, n, checkpoint), cost)``. A shared machine drifts (the cores' contention measured a few
seconds apart has ranged from 0.5 to 1.9 here), so it is calibrated three times, before, halfway through and after
the timed rounds; the prediction is the median of the three, and all three are kept. Two bounds come
with it: ``(m + n - 1) / (m n)`` of the plain step (perfect pipelining of perfectly divisible work), and the
same simulation without overheads (what the smaller micro-batches alone allow). The prediction leaves out the
loss and ``zero_grad``, which the measured step includes (both are small here).

Goals (from the issue): gpipe faster than plain where micro-batches stay large enough; at most 0.6 x
torchgpipe's step for the same checkpoint policy; within 10 % of the simulator's prediction; recording on
within 5 % of recording off; its two entry points (``forward()`` + ``backward()``, and ``step()``) within 3 %
of each other, measured on one pipe alternated after the rounds (Note [entry points alternated]).

Run: ``.venv/bin/python benchmarks/executor_speed.py`` (about a minute on two busy cores; installs
torchgpipe 0.0.7 with ``pip --no-deps`` when it is missing) or ``--quick``; writes
``benchmarks/results/executor_speed.json``. The wider model kept for checking (steps of 0.3-1 s)::

    .venv/bin/python benchmarks/executor_speed.py --width 2048 --modes never --repeats 30 --skip-torchgpipe \
        --skip-pipelining --json benchmarks/results/executor_speed_wide.json
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from gpipe.schedule import Checkpoint  # noqa: E402
from gpipe.schedule import gpipe as gpipe_schedule  # noqa: E402
from sim.calibration.calibrate import calibrate, on_device, partitions_of  # noqa: E402
from sim.calibration.experiment import with_executor_costs  # noqa: E402
from sim.calibration.host import Overheads, executor_costs, with_overheads  # noqa: E402
from sim.core.engine import simulate  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "executor_speed.json"
MODES: tuple[Checkpoint, ...] = ("never", "except_last", "always")
TORCHGPIPE = "torchgpipe==0.0.7"
THREADS = 1  # Note [one thread per worker]
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


# -- the workload ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """The model and batch every configuration runs."""

    layers: int  # (Linear + ReLU) pairs
    width: int  # features in and out of every Linear
    batch: int
    chunks: int
    seed: int = 0

    @property
    def balance(self) -> list[int]:
        """Two partitions of whole (Linear + ReLU) pairs, the first one the larger when ``layers`` is odd."""
        return [2 * (self.layers - self.layers // 2), 2 * (self.layers // 2)]

    @property
    def m(self) -> int:
        return min(self.chunks, self.batch)

    def model(self) -> nn.Sequential:
        torch.manual_seed(self.seed)
        body: list[nn.Module] = []
        for _ in range(self.layers):
            body += [nn.Linear(self.width, self.width), nn.ReLU()]
        return nn.Sequential(*body)

    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed + 1)
        x = torch.randn(self.batch, self.width, generator=generator)  # (B, width)
        y = torch.randn(self.batch, self.width, generator=generator)  # (B, width)
        return x, y


def train_step(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One step: zero the gradients, forward, MSE loss, backward; returns the loss (detached)."""
    module.zero_grad(set_to_none=True)
    loss = F.mse_loss(module(x), y)
    loss.backward()
    return loss.detach()


def pipe_step(pipe: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The same step through GPipe's other entry point: zero the gradients, ``pipe.step`` (MSE inside)."""
    pipe.zero_grad(set_to_none=True)
    return pipe.step(x, y, F.mse_loss)


def gradients_match(reference: nn.Module, other: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    step: Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor] = train_step) -> bool:
    """One step of each from the same weights: equal loss and parameter gradients (the pipeline is transparent)."""
    a, b = train_step(reference, x, y), step(other, x, y)
    ok = torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    pa, pb = list(reference.parameters()), list(other.parameters())
    ok = ok and len(pa) == len(pb)
    for p, q in zip(pa, pb, strict=False):
        ok = ok and p.grad is not None and q.grad is not None and torch.allclose(p.grad, q.grad.to(p.device),
                                                                                 rtol=1e-4, atol=1e-6)
    return bool(ok)


# -- timing ----------------------------------------------------------------------------------------


@dataclass
class Runner:
    """One in-process configuration: a name and the zero-argument step it times."""

    name: str
    step: Callable[[], object]
    samples: list[float]


def interleaved(runners: Sequence[Runner], warmup: int, repeats: int) -> None:
    """Time one step of every runner per round, in a seeded random order (Note [interleaving])."""
    for _ in range(warmup):
        for r in runners:
            r.step()
    gc.collect()
    # shuffled, not rotated: under rotation each runner always follows the same one; "gpipe never", always right
    # after the plain model, read 1.13 and 1.23 x its own step() row in two rotated runs, 1.03-1.04 shuffled
    order = random.Random(0)
    for _ in range(repeats):
        for r in order.sample(list(runners), len(runners)):
            start = time.perf_counter()
            r.step()
            r.samples.append(time.perf_counter() - start)


# Note [entry points alternated]: the two entry points run the same interpreter, so what separates them is a few
# percent, below what rounds of a dozen runners in shuffled order resolve (each one's neighbour, and the caches it
# leaves, changes from round to round). Their ratio is therefore measured apart, after the rounds: the same pipe
# stepped through forward() + backward() and through step() back to back, in a seeded random order within each
# pair, and the ratio is the median of the per-pair ratios. The shuffled rounds' ratio is kept in the results.
def entry_pairs(off: Callable[[], object], stepped: Callable[[], object], pairs: int) -> float:
    """forward() + backward() over step(), alternated on one pipe (Note [entry points alternated])."""
    order = random.Random(1)
    ratios = []
    for _ in range(pairs):
        seconds = {}
        for name, fn in order.sample([("off", off), ("step", stepped)], 2):
            start = time.perf_counter()
            fn()
            seconds[name] = time.perf_counter() - start
        ratios.append(seconds["off"] / seconds["step"])
    return statistics.median(ratios)


def block(step: Callable[[], object], warmup: int, repeats: int) -> list[float]:
    """Time ``repeats`` steps in a row after ``warmup`` untimed ones."""
    for _ in range(warmup):
        step()
    gc.collect()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        samples.append(time.perf_counter() - start)
    return samples


def ms(samples: Sequence[float]) -> float:
    return statistics.median(samples) * 1e3


def ratio(a: Sequence[float], b: Sequence[float], paired: bool) -> float:
    """``a`` over ``b``: the median of per-round ratios when both were timed in the same rounds, else of medians."""
    if paired and len(a) == len(b):
        return statistics.median(x / y for x, y in zip(a, b, strict=True))
    return statistics.median(a) / statistics.median(b)


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


def run_pipelining(workload: Workload, warmup: int, repeats: int) -> dict[str, list[float]]:
    """torch.distributed.pipelining's GPipe and 1F1B on two spawned gloo processes, one stage and one thread each
    (Note [pipelining]); seconds per step. The ranks are ``schedule_speed.py``'s, which run any schedule."""
    from schedule_speed import run_pipelining as run_schedules

    times = run_schedules(workload, {name: ([0, 1], workload.balance) for name in ("gpipe", "1f1b")}, warmup, repeats)
    return {"GPipe": times["gpipe"], "1F1B": times["1f1b"]}


# -- the simulator's prediction ----------------------------------------------------------------------


def predict(workload: Workload, quick: bool) -> dict[str, Any]:
    """Calibrate on this machine and simulate GPipe for every checkpoint policy (Note [prediction])."""
    model = workload.model()
    x, _ = workload.data()
    pieces = x.tensor_split(workload.m)  # (B / m, width) each
    sample = pieces[0]
    devices = ["cpu", "cpu"]
    cost = calibrate(model, workload.balance, sample, devices=devices, warmup=2 if quick else 3,
                     repeats=3 if quick else 15)
    # the executor's own costs, measured as sim.calibration.experiment measures them
    parts = [on_device(p, d) for p, d in zip(partitions_of(model, workload.balance), devices, strict=True)]
    cost, config = with_executor_costs(cost, parts, sample, devices, steps=4 if quick else 12, two_phases=True)
    overheads = executor_costs(cost).overheads
    scale = tuple(p.shape[0] / sample.shape[0] for p in pieces)
    if all(s == 1.0 for s in scale):
        scale = ()
    full = replace(cost, microbatch_scale=scale)
    ideal = with_overheads(full, Overheads())
    n = len(workload.balance)
    out: dict[str, Any] = {
        "overheads": {"task_seconds": overheads.task, "handoff_seconds": overheads.handoff,
                      "contention": overheads.contention},
        "stages": [{"forward_ms": s.forward * 1e3, "forward_checkpointed_ms": s.forward_seconds(True) * 1e3,
                    "recompute_ms": s.recompute_seconds * 1e3, "backward_ms": s.backward * 1e3}
                   for s in cost.stages],
        # Every micro-batch through every stage, one after the other: the plain step at the micro-batch size.
        "serial_microbatch_ms": sum((s.forward + s.backward) * (ideal.scale(i))
                                    for s in cost.stages for i in range(workload.m)) * 1e3,
        "m": workload.m, "n": n, "modes": {},
    }
    for mode in MODES:
        schedule = gpipe_schedule(workload.m, n, mode)
        predicted = simulate(schedule, full, config)
        out["modes"][mode] = {
            "predicted_ms": predicted.makespan * 1e3,
            "without_overheads_ms": simulate(schedule, ideal, config).makespan * 1e3,
            "timeline": predicted,
        }
    return out


def merge_predictions(calibrations: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Several calibrations spread over the run: per policy the median prediction, every one kept (the machine
    drifts, and one calibration caught in a slow spell must not decide the figure)."""
    last = calibrations[-1]
    merged: dict[str, Any] = {"m": last["m"], "n": last["n"], "calibrations": [
        {**{k: v for k, v in c.items() if k not in ("modes", "m", "n")},
         "predicted_ms": {mode: e["predicted_ms"] for mode, e in c["modes"].items()}} for c in calibrations]}
    merged["serial_microbatch_ms"] = statistics.median(c["serial_microbatch_ms"] for c in calibrations)
    merged["modes"] = {}
    for mode in last["modes"]:
        ranked = sorted((c["modes"][mode] for c in calibrations), key=lambda e: e["predicted_ms"])
        middle = ranked[(len(ranked) - 1) // 2]
        merged["modes"][mode] = {**middle, "predicted_ms_range": [ranked[0]["predicted_ms"],
                                                                  ranked[-1]["predicted_ms"]]}
    return merged


# -- the report --------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "cpus": os.cpu_count(), "torch": torch.__version__, "threads_per_worker": THREADS,
        "python": platform.python_version(), "platform": platform.platform(terse=True),
        "processor": platform.processor() or platform.machine(),
        "load_average_1min": round(load[0], 2) if load else None,
    }


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--schedules" in argv or any(a.startswith("--schedules=") for a in argv):  # the schedule axis
        import schedule_speed

        schedule_speed.main(argv)
        return 0
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                     epilog="--schedules NAMES: the schedule axis instead "
                                            "(benchmarks/schedule_speed.py takes the same flags; see its --help)")
    parser.add_argument("--batch", type=int, default=256, help="samples per step (default 256)")
    parser.add_argument("--chunks", type=int, default=4, help="micro-batches per step (default 4)")
    parser.add_argument("--layers", type=int, default=8, help="(Linear + ReLU) pairs, >= 2 (default 8)")
    parser.add_argument("--width", type=int, default=512, help="features of every Linear (default 512)")
    parser.add_argument("--repeats", type=int, default=None, help="timed steps per configuration (default 60)")
    parser.add_argument("--json", type=Path, default=RESULTS, help=f"where to write the results (default {RESULTS})")
    parser.add_argument("--skip-torchgpipe", action="store_true", help="leave torchgpipe out (no install)")
    parser.add_argument("--skip-pipelining", action="store_true", help="leave torch.distributed.pipelining out")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"checkpoint policies to time, comma-separated (default {','.join(MODES)})")
    parser.add_argument("--quick", action="store_true", help="few repeats and a short calibration (smoke test)")
    args = parser.parse_args(argv)
    modes = tuple(m for m in args.modes.split(",") if m)
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes takes some of {','.join(MODES)}")
    if args.layers < 2 or args.width < 1 or args.batch < 1 or args.chunks < 1:
        parser.error("need --layers >= 2 and positive --width, --batch and --chunks")
    repeats = args.repeats if args.repeats is not None else (5 if args.quick else 60)
    warmup = 1 if args.quick else 3
    if repeats < 1:
        parser.error("--repeats must be positive")

    workload = Workload(args.layers, args.width, args.batch, args.chunks)
    torch.set_num_threads(THREADS)  # Note [one thread per worker]
    model = workload.model()
    x, y = workload.data()
    notes: list[str] = [
        f"torch.set_num_threads({THREADS}) on purpose: one intra-op thread per worker (each pipelining rank too); "
        "'plain (2 threads)' shows the model with both cores."]
    print(f"model: {args.layers} x (Linear({args.width}) + ReLU), balance {workload.balance}, batch {args.batch}, "
          f"chunks {args.chunks} (m = {workload.m}); {os.cpu_count()} CPUs, torch {torch.__version__}")
    print(notes[0], flush=True)

    # Who runs, in-process: plain, torchgpipe, this GPipe (with and without recording).
    plain_model = copy.deepcopy(model)
    runners = [Runner("plain", lambda: train_step(plain_model, x, y), [])]
    tg_version = None
    if not args.skip_torchgpipe:
        torchgpipe = import_torchgpipe()
        tg_version = getattr(torchgpipe, "__version__", "?")
        for mode in modes:
            pipe = torchgpipe.GPipe(copy.deepcopy(model), balance=workload.balance, devices=["cpu", "cpu"],
                                    chunks=args.chunks, checkpoint=mode)
            if not gradients_match(copy.deepcopy(model), pipe, x, y):
                raise SystemExit(f"torchgpipe {tg_version} ({mode}) does not match the plain model on this torch")

            def tg_step(p: Any = pipe) -> object:
                return train_step(p, x, y)

            runners.append(Runner(f"torchgpipe {mode}", tg_step, []))
        note = (f"torchgpipe {tg_version} on torch {torch.__version__}: "
                + (f"patched at runtime ({'; '.join(TORCHGPIPE_PATCHES)})" if TORCHGPIPE_PATCHES else "unpatched")
                + ", loss and gradients checked equal to the plain model")
        notes.append(note)
        print(note, flush=True)

    gpipes: dict[str, Any] = {}
    off_runs: dict[str, Callable[[], object]] = {}  # Note [entry points alternated]
    step_runs: dict[str, Callable[[], object]] = {}
    recorded: dict[str, list[Any]] = {}  # checkpoint -> the measured Timeline of every recorded step
    gpipe_cls: Any = None
    try:
        gpipe_cls = importlib.import_module("gpipe").GPipe
    except (ImportError, AttributeError) as error:
        notes.append(f"gpipe.GPipe is not importable ({error}): its rows are missing")
        print(notes[-1], flush=True)
    if gpipe_cls is not None:
        for mode in modes:
            pipe = gpipe_cls(copy.deepcopy(model), balance=workload.balance, devices=["cpu", "cpu"],
                         chunks=args.chunks, checkpoint=mode, record=False)
            if not gradients_match(copy.deepcopy(model), pipe, x, y):
                raise SystemExit(f"gpipe.GPipe ({mode}) does not match the plain model")
            if not gradients_match(copy.deepcopy(model), pipe, x, y, step=pipe_step):
                raise SystemExit(f"gpipe.GPipe.step ({mode}) does not match the plain model")
            gpipes[mode] = pipe

            def off(p: Any = pipe) -> object:
                p.record = False
                return train_step(p, x, y)

            recorded[mode] = []

            def on(p: Any = pipe, kept: list[Any] = recorded[mode]) -> object:
                p.record = True
                loss = train_step(p, x, y)
                kept.append(p.timeline)
                return loss

            def stepped(p: Any = pipe) -> object:
                p.record = False
                return pipe_step(p, x, y)

            runners.append(Runner(f"gpipe {mode}", off, []))
            runners.append(Runner(f"gpipe {mode}, step", stepped, []))
            off_runs[mode], step_runs[mode] = off, stepped
            runners.append(Runner(f"gpipe {mode}, record", on, []))

    calibrations: list[dict[str, Any]] = []  # Note [prediction]: before, between and after the timed rounds
    print(f"timing {len(runners)} configurations round-robin: {warmup} warm-up + {repeats} timed rounds"
          + (", calibrating the simulator before, halfway and after" if gpipes else "") + " ...", flush=True)
    for k, rounds in enumerate((repeats // 2, repeats - repeats // 2)):
        if gpipes:
            calibrations.append(predict(workload, args.quick))
        interleaved(runners, warmup if k == 0 else 0, rounds)
    samples = {r.name: r.samples for r in runners}
    same_rounds = set(samples)
    alternated = {mode: entry_pairs(off_runs[mode], step_runs[mode], repeats) for mode in off_runs}

    def vs(a: str, b: str) -> float:
        return ratio(samples[a], samples[b], a in same_rounds and b in same_rounds)

    if not args.skip_pipelining:
        print("timing torch.distributed.pipelining on two gloo processes ...", flush=True)
        for name, values in run_pipelining(workload, warmup, repeats).items():
            samples[f"pipelining {name}"] = values

    torch.set_num_threads(2)
    try:
        samples["plain (2 threads)"] = block(lambda: train_step(plain_model, x, y), warmup, repeats)
    finally:
        torch.set_num_threads(THREADS)

    prediction = None
    measured_timelines: dict[str, Any] = {}  # checkpoint -> the timed recorded step of median makespan
    if gpipes:
        calibrations.append(predict(workload, args.quick))
        prediction = merge_predictions(calibrations)
        for policy_name, timelines in recorded.items():
            timed = sorted((t for t in timelines[-repeats:] if t is not None), key=lambda t: t.makespan)
            if timed:
                measured_timelines[policy_name] = timed[len(timed) // 2]

    # -- table ---------------------------------------------------------------------------------
    medians = {name: ms(values) for name, values in samples.items()}
    plain = medians["plain"]
    order = (["plain", "plain (2 threads)"] + [f"torchgpipe {m}" for m in modes] + [f"gpipe {m}" for m in modes]
             + [f"gpipe {m}, step" for m in modes] + [f"gpipe {m}, record" for m in modes]
             + ["pipelining GPipe", "pipelining 1F1B"])
    rows: list[dict[str, Any]] = []
    for name in order:
        if name not in medians:
            continue
        row: dict[str, Any] = {"configuration": name, "median_ms": round(medians[name], 3),
                               "vs_plain": round(vs(name, "plain"), 3)}
        policy = next((m for m in modes if name.endswith((m, f"{m}, record", f"{m}, step"))), None)
        if name.startswith("gpipe") and policy and f"torchgpipe {policy}" in medians:
            row["vs_torchgpipe"] = round(vs(name, f"torchgpipe {policy}"), 3)
        if policy and name == f"gpipe {policy}" and f"gpipe {policy}, step" in medians:
            row["vs_step"] = round(vs(name, f"gpipe {policy}, step"), 3)  # forward()+backward() over step()
        if prediction is not None and name.startswith("gpipe") and policy:
            row["predicted_ms"] = round(prediction["modes"][policy]["predicted_ms"], 3)
        if name in REFERENCE_MS and _is_reference(workload):
            row["issue_ms"] = REFERENCE_MS[name]
        row["samples"] = len(samples[name])
        rows.append(row)

    print()
    print(f"{'configuration':<26}{'median ms':>10}{'/ plain':>9}{'/ torchgpipe':>14}{'/ step':>8}{'predicted ms':>14}"
          f"{'issue ms':>10}")
    for row in rows:
        print(f"{row['configuration']:<26}{row['median_ms']:>10.2f}{row['vs_plain']:>9.2f}"
              f"{_fmt(row.get('vs_torchgpipe'), '.2f'):>14}{_fmt(row.get('vs_step'), '.3f'):>8}"
              f"{_fmt(row.get('predicted_ms'), '.2f'):>14}{_fmt(row.get('issue_ms'), '.1f'):>10}")

    simulator: dict[str, Any] | None = None
    goals: dict[str, Any] = {}
    m, n = workload.m, len(workload.balance)
    bound = (m + n - 1) / (m * n)
    if prediction is not None:
        simulator = {k: v for k, v in prediction.items() if k != "modes"}
        simulator["bound_fraction_of_plain"] = bound
        simulator["bound_ms"] = plain * bound
        simulator["modes"] = {}
        from sim.calibration.compare import compare

        for k, c in enumerate(prediction["calibrations"]):
            when = ("before timing", "halfway", "after timing")[k] if len(prediction["calibrations"]) == 3 else k
            over = c["overheads"]
            print(f"{'' if k else chr(10)}simulator calibrated {when}: task overhead "
                  f"{over['task_seconds'] * 1e6:.1f} us, hand-off {over['handoff_seconds'] * 1e6:.1f}"
                  f" us, contention {over['contention']:.2f}, stages (F + B) "
                  + " ".join(f"{st['forward_ms'] + st['backward_ms']:.2f}" for st in c["stages"]) + " ms")
        print(f"bound (m + n - 1) / (m n) = {bound:.3f} of plain = {plain * bound:.2f} ms; all micro-batches through "
              f"all stages serially at the micro-batch size: {prediction['serial_microbatch_ms']:.2f} ms "
              f"(plain {plain:.2f} ms)")
        print(f"{'checkpoint':<13}{'measured ms':>12}{'predicted':>11}{'(range)':>14}{'no overheads':>14}"
              f"{'error':>8}{'recorded ms':>13}{'order':>7}{'busy/device: recorded vs predicted ms':>40}")
        for mode in modes:
            p = prediction["modes"][mode]
            measured = medians[f"gpipe {mode}"]
            entry = {"measured_ms": measured, **{k: v for k, v in p.items() if k != "timeline"},
                     "error": measured / p["predicted_ms"] - 1.0}
            tl = measured_timelines.get(mode)
            if tl is not None:
                c = compare(p["timeline"], tl)
                entry.update(measured_timeline_ms=tl.makespan * 1e3, order_agreement=c.order_agreement,
                             start_error_mean_ms=c.start_error_mean * 1e3,
                             busy_ms_measured=[d.measured_busy * 1e3 for d in c.devices],
                             busy_ms_predicted=[d.predicted_busy * 1e3 for d in c.devices])
            simulator["modes"][mode] = entry
            spread = "{:.1f}-{:.1f}".format(*p["predicted_ms_range"])
            print(f"{mode:<13}{measured:>12.2f}{p['predicted_ms']:>11.2f}{spread:>14}{p['without_overheads_ms']:>14.2f}"
                  f"{entry['error']:>+8.1%}{_fmt(entry.get('measured_timeline_ms'), '.2f'):>13}"
                  f"{_fmt(entry.get('order_agreement'), '.0%'):>7}{_busy(entry):>40}")

    if gpipes:
        goals["faster_than_plain"] = {"gpipe_never_ms": medians["gpipe never"], "plain_ms": plain,
                                      "ratio": vs("gpipe never", "plain"), "met": vs("gpipe never", "plain") < 1.0}
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
        entries = alternated  # Note [entry points alternated]
        goals["entry_points"] = {"limit": GOAL_ENTRY_POINTS, "forward_backward_over_step": entries,
                                 "in_shuffled_rounds": {mode: vs(f"gpipe {mode}", f"gpipe {mode}, step")
                                                        for mode in modes},
                                 "met": all(abs(r - 1.0) <= GOAL_ENTRY_POINTS for r in entries.values())}
        print("\ngoals:")
        print(f"  faster than plain (gpipe never {medians['gpipe never']:.2f} ms vs plain {plain:.2f} ms, "
              f"ratio {goals['faster_than_plain']['ratio']:.2f}): "
              f"{_met(goals['faster_than_plain'])}")
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

    doc = {
        "benchmark": "executor_speed",
        "command": " ".join(["python benchmarks/executor_speed.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": machine(),
        "note": " ".join(notes),
        "workload": {"layers": args.layers, "width": args.width, "batch": args.batch, "chunks": args.chunks,
                     "m": workload.m, "balance": workload.balance, "loss": "mse",
                     "step": "zero_grad + forward + loss + backward"},
        "quick": args.quick, "warmup": warmup, "repeats": repeats, "threads_per_worker": THREADS,
        "torchgpipe": None if tg_version is None else {"version": tg_version, "patches": TORCHGPIPE_PATCHES},
        "reference_ms": REFERENCE_MS,
        "rows": rows,
        "simulator": simulator,
        "goals": goals,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\nwrote {args.json}")
    return 0


def _is_reference(workload: Workload) -> bool:
    return (workload.layers, workload.width, workload.batch, workload.chunks) == (8, 512, 256, 4)


def _busy(entry: dict[str, Any]) -> str:
    if "busy_ms_measured" not in entry:
        return "-"
    return "  ".join(f"{a:.1f} vs {b:.1f}" for a, b in zip(entry["busy_ms_measured"], entry["busy_ms_predicted"],
                                                         strict=True))


def _met(goal: dict[str, Any]) -> str:
    return "met" if goal["met"] else "NOT met"


if __name__ == "__main__":
    raise SystemExit(main())
