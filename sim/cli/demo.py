"""``gpipe-sim demo``: the simulator's prediction beside the executor's measurement, on a built-in model.

Balance a small convolutional model over two devices (the CPU twice, or the CUDA devices when there
are two), calibrate a cost model by measuring its partitions and the executor's own overheads,
simulate the schedule (GPipe's, or ``--schedule``), run the same schedule in the executor for a few training
steps (``GPipe.step``), and compare the step of median makespan with the prediction::

    gpipe-sim demo                       # the table; timeline.png, trace.json, report.json in ./demo
    gpipe-sim demo --verbose             # and what calibration found: overheads, worker threads, contention
    gpipe-sim demo --chunks 8 --checkpoint always --json
    gpipe-sim demo --schedule 1f1b       # any registered schedule (gpipe.schedule.SCHEDULES)
    gpipe-sim demo --schedule NAME --stages 4 --devices 2   # four stages on two workers, placed by its layout
    gpipe-sim demo --processes 1 --replicas 2   # two spawned ranks, data parallel: the all-reduces predicted too

The pipeline itself is :func:`sim.calibration.experiment.run`; ``gpipe-sim compare`` runs it on a user's model.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Any

# Note [one thread per worker]: the executor starts fresh worker threads, and in a fresh thread MKL
# ignores torch.set_num_threads() from the caller: its first call builds a team of OpenMP threads
# as wide as the machine, whose spinning then takes the other worker's core. Only the environment, read when
# torch loads, reaches every thread; this module is the CLI's first to import torch, so it sets it
# here, unless the user chose a value or torch is already loaded (then it changes nothing).
if "torch" not in sys.modules:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from gpipe.schedule import CHECKPOINT_MODES  # noqa: E402
from sim.calibration.experiment import Batch, Setup, demo_model, progress_labels, run  # noqa: E402
from sim.calibration.host import executor_costs  # noqa: E402
from sim.calibration.machine import default_devices, keep_freed_memory  # noqa: E402
from sim.calibration.outcome import DRIFT_LIMIT, OUTPUT_FILES, Outcome, write_outputs  # noqa: E402
from sim.cli import CommandError, processes  # noqa: E402
from sim.cli.options import ScheduleNames, add_out, integer, output_folder, schedules_help, seed  # noqa: E402
from sim.files import OutputFolder, json_text  # noqa: E402

__all__ = ["MAX_STEPS", "add_common_options", "add_parser", "check_chunks", "describe", "execute", "run_command"]

#: The most ``--steps``: each step runs a training step and a profiling pass, and its timeline and pass stay in
#: memory until the comparison, so a thousand already take many minutes; a billion would fill the memory first.
MAX_STEPS = 1000


def add_parser(subparsers: Any) -> None:
    """Register ``demo`` on the ``gpipe-sim`` subcommand parser."""
    p = subparsers.add_parser(
        "demo", help="predicted vs measured on a built-in model: calibrate, simulate, run, compare",
        description="Balance a small built-in model over two devices, calibrate, simulate a pipeline schedule "
                    "(GPipe's by default), run it in the executor for a few steps and print the prediction beside "
                    "the measurement; write timeline.png, trace.json and report.json.",
    )
    p.add_argument("--devices", type=int, default=None, metavar="P",
                   help="schedule devices (workers), each the CPU or a CUDA device of its own when there are enough; "
                        "fewer than --stages for a schedule that places several stages on one device (default: one "
                        "per stage)")
    add_common_options(p, out="demo")
    p.set_defaults(func=run_command)


def add_common_options(p: argparse.ArgumentParser, *, out: str) -> None:
    """The options ``demo`` and ``compare`` share."""
    p.add_argument("--chunks", type=int, default=4, metavar="M", help="micro-batches per mini-batch (default: 4)")
    p.add_argument("--checkpoint", choices=CHECKPOINT_MODES, default="except_last",
                   help="checkpoint policy (default: except_last)")
    p.add_argument("--schedule", choices=ScheduleNames(), default="gpipe", metavar="NAME",
                   help=f"the schedule the executor runs and the simulator predicts: {schedules_help()}; a name "
                        "takes its options after a colon, e.g. interleaved-1f1b:round=4 (default: gpipe)")
    p.add_argument("--stages", type=int, default=None, metavar="N",
                   help="partitions of the model, balanced by time (default: one per device, two without --devices)")
    p.add_argument("--steps", type=int, default=Setup.steps, metavar="K",
                   help="training steps measured; the step of median makespan is compared (default: "
                        f"{Setup.steps}; at most {MAX_STEPS})")
    p.add_argument("--seed", type=int, default=0, help="seed of the model, the input and PyTorch (default: 0)")
    add_out(p, out, "timeline.png, trace.json and report.json")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object instead of the table")
    p.add_argument("--verbose", action="store_true",
                   help="also print the calibrated internals: the executor's overheads, each stage's worker-thread "
                        "times, the contention of pairs of tasks running together")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    processes.add_option(p)


def check_common(args: argparse.Namespace) -> OutputFolder:
    """Reject bad values of the shared options (one-line errors); return the output folder, checked before any
    work (:mod:`sim.files`)."""
    integer("--chunks", args.chunks, 1)
    integer("--steps", args.steps, 1, MAX_STEPS)
    if args.stages is not None:
        integer("--stages", args.stages, 1)
    seed("--seed", args.seed)
    return output_folder(args, OUTPUT_FILES)


def run_command(args: argparse.Namespace) -> int:
    """Run the demo; return the exit status."""
    out = check_common(args)
    model, batch = demo_model(args.seed)
    if args.devices is not None:
        integer("--devices", args.devices, 1)
    stages = args.stages if args.stages is not None else args.devices
    if stages is not None and stages > len(model):
        raise CommandError(f"--stages {stages} is more than the {len(model)} layers of the demo's model")
    processes.check(args, args.devices)
    if args.processes is not None and stages is None and args.processes > len(model):
        raise CommandError(f"--processes {args.processes} runs a stage on each rank, more than the {len(model)} "
                           f"layers of the demo's model: use at most --processes {len(model)}")
    check_chunks(args.chunks, batch)
    description = f"demo: {len(model)}-layer convolutional classifier, batch {describe(batch)}"
    if args.processes is not None:
        setup = Setup(chunks=args.chunks, checkpoint=args.checkpoint, schedule=args.schedule, steps=args.steps,
                      seed=args.seed, stages=stages)
        return processes.execute(functools.partial(demo_model, args.seed), setup, args, description, out)
    devices = default_devices(args.devices) if args.devices is not None else None
    setup = Setup(chunks=args.chunks, checkpoint=args.checkpoint, schedule=args.schedule, steps=args.steps,
                  seed=args.seed, stages=stages, devices=devices)
    return execute(model, batch, setup, args, description, out)


def describe(batch: Batch) -> str:
    """``64 of 3x32x32``: the samples of a mini-batch and the shape of one (of the first tensor's)."""
    first = batch if isinstance(batch, torch.Tensor) else batch[0]
    return f"{first.shape[0]} of {'x'.join(map(str, first.shape[1:])) or 'scalars'}"


def check_chunks(chunks: int, batch: Batch) -> None:
    """Refuse more micro-batches than the mini-batch has samples, before any work (threads or processes)."""
    size = (batch if isinstance(batch, torch.Tensor) else batch[0]).shape[0]
    if chunks > size:
        raise CommandError(f"--chunks {chunks} is more than the {size} samples of the mini-batch: every "
                           "micro-batch needs at least one")


def execute(model: nn.Sequential, batch: Batch, setup: Setup, args: argparse.Namespace, description: str,
            out: OutputFolder) -> int:
    """Run the experiment with a progress bar, write the files into ``out``, print the table (or the report)."""
    from tqdm import tqdm

    check_chunks(setup.chunks, batch)
    keep_freed_memory()  # sim.calibration.machine, Note [allocator]
    labels = progress_labels(setup)  # each made when shown: a count and a label per position, not a list
    done = 0
    with tqdm(total=len(labels), desc="starting", unit="step", file=sys.stderr, leave=False,
              disable=args.no_progress, bar_format="{desc:<18}{bar}| {n_fmt}/{total_fmt} [{elapsed}]") as bar:
        def progress(_label: str) -> None:  # run reports the units of progress_labels in their order
            nonlocal done
            done += 1
            bar.update(1)
            bar.set_description_str(labels[done] if done < len(labels) else "done")

        bar.set_description_str(labels[0])
        outcome = run(model, batch, setup, progress=progress, description=description)
    files = write_outputs(outcome, out)
    if args.json:
        print(json_text({**outcome.report(), "files": files}))
        return 0
    print_outcome(outcome, files, verbose=args.verbose)
    return 0


def print_outcome(outcome: Outcome, files: dict[str, str], *, verbose: bool = False) -> None:
    """The human-readable report: what ran, one line on calibration, the comparison table, the files; with
    ``verbose``, the calibrated internals too (overheads, worker threads, contention)."""
    s = outcome.setup
    if outcome.model:
        print(outcome.model)
    placed = outcome.schedule.placement
    where = "" if placed == tuple(range(len(placed))) else f" (stages on devices {', '.join(map(str, placed))})"
    print(f"{outcome.schedule.name} schedule: m={outcome.schedule.m} micro-batches, n={outcome.schedule.n} stages, "
          f"checkpoint={outcome.schedule.checkpoint}; balance {list(s.balance or ())} on {', '.join(s.devices or ())}"
          + where + (f", {s.threads} intra-op thread(s) per worker" if s.threads else ""))
    print(f"measured: step {outcome.chosen_step + 1} of {len(outcome.step_makespans)} (median makespan; all: "
          + ", ".join(f"{t * 1e3:.1f}" for t in outcome.step_makespans) + " ms)")
    paired = "" if outcome.paired_error is None else (
        f"; paired error {outcome.paired_error:+.1%} (each step against the calibration pass right after it)")
    print("calibration: the simulator's costs timed on this machine (each stage's tasks, the executor's overheads"
          + ("" if verbose else "; --verbose prints them") + ")" + paired)
    if outcome.drift is not None and abs(outcome.drift) > DRIFT_LIMIT:
        print(f"note: the machine changed speed by {outcome.drift:+.0%} between the first and the last half of the "
              "steps (Note [drift] in sim.calibration.outcome); an error of that size may be the machine's, not the "
              "simulator's: run again on a quieter machine or with more --steps")
    if outcome.background_cores is not None and outcome.background_cores > 0.2:
        print(f"note: other processes kept {outcome.background_cores:.1f} cores busy while the steps were "
              "measured; the measurement is noisier than usual")
    if verbose:
        print_internals(outcome)
    print()
    print(outcome.comparison.table())
    print()
    print("wrote " + ", ".join(files.values()))


def print_internals(outcome: Outcome) -> None:
    """What calibration found (``--verbose``): the executor's overheads, each stage's worker-thread times, the
    contention of pairs of tasks running together."""
    executor = executor_costs(outcome.cost)
    o = executor.overheads
    measured_hooks = all(st.forward_recorded is not None for st in executor.stages)
    print(f"calibrated overheads: launch {o.launch * 1e6:.1f} us, task {o.task * 1e6:.1f} us, "
          f"gap {o.gap * 1e6:.1f} us, hand-off {o.handoff * 1e6:.1f} us, turnaround {o.turnaround * 1e6:.1f} us, "
          f"recording {o.recording * 1e6:.1f} us per task "
          + ("+ the recorder's hooks measured on each stage (recorded forward and backward)" if measured_hooks else
             f"+ {o.per_saved_tensor * 1e6:.2f} us per saved tensor (and {o.per_unpacked_tensor * 1e6:.2f} us to "
             "unpack it in the backward)"))
    threads = "; ".join(f"stage {j} {st.host_forward * 1e6:.0f} / {st.host_nograd * 1e6:.0f} / "
                        f"{st.host_backward * 1e6:.0f} us, +{st.thread_start * 1e6:.0f} us"
                        for j, st in enumerate(executor.stages))
    print("each stage's worker threads (sim.calibration.thread_costs; grad-enabled forward / no-grad forward / "
          f"backward, first task of a phase): {threads}")
    if o.pairs:
        print("contention of pairs running together (task kind@stage beside kind@stage: slowdown): "
              + ", ".join(f"{a}@{j}|{b}@{k} {1 + c:.2f}x" for a, j, b, k, c in o.pairs))
    elif o.contention:
        print(f"contention {o.contention:.3f}")
