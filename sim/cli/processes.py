"""``--processes N`` of ``gpipe-sim demo`` and ``compare``: the ranks spawned here, predicted vs measured.

::

    gpipe-sim demo --processes 2                         # 2 gloo processes on this machine, no torchrun
    gpipe-sim demo --processes 2 --schedule 1f1b --json  # the report, with predicted and measured makespans
    gpipe-sim compare --processes 2 mymodels.py:build
    gpipe-sim demo --processes 1 --replicas 2            # dp 2: 2 replicas of a one-rank pipeline
    gpipe-sim demo --processes 2 --replicas 2 --bucket-bytes 65536   # pp 2 x dp 2 on 4 ranks, several buckets a stage

``--processes N`` is the ranks of one pipeline; ``--replicas R`` runs ``R`` pipelines, ``N * R`` ranks in all, each
stage's gradients all-reduced over its ``R`` ranks (:mod:`sim.calibration.replicas`). The experiment is
:func:`sim.calibration.processes.run_processes`; the files are those of the single-process run (``timeline.png``,
``trace.json``, ``report.json``).
"""

from __future__ import annotations

import argparse
import os
import sys

from gpipe.distributed.reduction import DDP_BUCKET_BYTES
from sim.calibration.experiment_setup import Setup
from sim.calibration.outcome import write_outputs
from sim.calibration.processes import Build, ProcessOutcome, run_processes
from sim.calibration.replicas import collectives_table
from sim.cli import CommandError
from sim.cli.options import integer
from sim.files import OutputFolder, json_text

__all__ = ["add_option", "check", "execute"]


def add_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--processes", type=int, default=None, metavar="N",
                   help="run the pipeline on N processes spawned here (gloo on loopback, one rank per schedule "
                        "device, gpipe.distributed.DistributedGPipe) instead of threads in this one")
    p.add_argument("--replicas", type=int, default=None, metavar="R",
                   help="with --processes N: R replicas of the pipeline, N * R ranks in all, each stage's gradients "
                        "all-reduced over its replicas as DDP does (DistributedGPipe(data_parallel=R)); the report "
                        "sets the all-reduces predicted beside measured")
    p.add_argument("--bucket-bytes", type=int, default=None, metavar="B",
                   help="with --replicas: the most bytes of gradients one all-reduce moves (default: "
                        f"{DDP_BUCKET_BYTES}, DDP's 25 MiB)")


def check(args: argparse.Namespace, devices: object = None) -> None:
    """Reject fewer than two ranks in all, ``--replicas`` without ``--processes``, ``--bucket-bytes`` without
    ``--replicas``, or ``--processes`` beside ``--devices`` (each rank is a device of its own)."""
    if args.replicas is None and args.bucket_bytes is not None:
        raise CommandError("--bucket-bytes sizes the gradients' all-reduces of --replicas R: give --replicas too")
    if args.processes is None:
        if args.replicas is not None:
            raise CommandError("--replicas replicates the pipeline of --processes N: give --processes too")
        return
    replicas = 1 if args.replicas is None else integer("--replicas", args.replicas, 1)
    integer("--processes", args.processes, 1 if replicas > 1 else 2)  # at least two ranks in all
    if args.bucket_bytes is not None:
        integer("--bucket-bytes", args.bucket_bytes, 1)
    if devices is not None:
        raise CommandError("--processes runs a rank per schedule device, each on this machine's CPU: leave out "
                           "--devices (--stages sets the stages, placed on the ranks by the schedule's layout)")


def execute(build: Build, setup: Setup, args: argparse.Namespace, description: str, out: OutputFolder) -> int:
    """Run on ``args.processes`` ranks per replica, write the files into ``out``, print the table (or the report);
    "spawning" is printed once the launcher has checked the setup and is about to start the ranks, with a warning
    where they are more than the machine's cores."""
    replicas, cores = args.replicas or 1, os.cpu_count() or 1
    world = args.processes * replicas
    ranks = f"{world} processes" + (f" ({replicas} replicas of {args.processes})" if replicas > 1 else "")

    def spawning() -> None:
        if world > cores:
            print(f"warning: {world} ranks on {cores} cores: they wait for a core, so the steps are slow and "
                  "their times noisy (compare two ranks at a time)", file=sys.stderr)
        print(f"spawning {ranks} (gloo on loopback) ...", file=sys.stderr)

    try:
        outcome = run_processes(build, setup, args.processes, description=description, on_spawn=spawning,
                                replicas=replicas, bucket_bytes=args.bucket_bytes or DDP_BUCKET_BYTES)
    except ValueError as error:
        raise CommandError(str(error)) from None
    files = write_outputs(outcome, out, measured_by=ranks)
    if args.json:
        print(json_text({**outcome.report(), "files": files}))
        return 0
    _print(outcome, files)
    return 0


def _print(outcome: ProcessOutcome, files: dict[str, str]) -> None:
    s, link, replicas = outcome.schedule, outcome.link, outcome.replication.replicas
    if outcome.description:
        print(outcome.description)
    print(f"{s.name} schedule: m={s.m} micro-batches, n={s.n} stages, checkpoint={s.checkpoint}; balance "
          f"{list(outcome.balance)} on {outcome.processes} processes (stages on ranks "
          f"{', '.join(map(str, s.placement))})" + (f", {replicas} replicas: replica r's rank d is device "
                                                    f"r * {outcome.processes} + d" if replicas > 1 else ""))
    print(f"link: {link.description}: latency {link.latency * 1e6:.0f} us, {link.bandwidth / 1e9:.2f} GB/s; "
          f"clocks aligned to within {outcome.measured.meta['clock']['residual'] * 1e6:.0f} us")
    if outcome.allreduce is not None:
        a = outcome.allreduce
        print(f"all-reduce: {a.description}: {a.latency * 1e6:.0f} us and {a.bandwidth / 1e9:.2f} GB/s a step, "
              f"buckets of at most {outcome.replication.bucket_bytes} B; the step's loss all-reduce is not "
              "modelled and left out of both")
    print(f"measured: step {outcome.chosen_step + 1} of {len(outcome.step_makespans)} (median makespan; all: "
          + ", ".join(f"{t * 1e3:.1f}" for t in outcome.step_makespans) + " ms)")
    paired = outcome.paired_error
    print("predicted from each stage's seconds profiled in its rank after every step, and the link (Note [what "
          "the prediction models] in sim.calibration.processes)"
          + ("" if paired is None else f"; each step against its own ranks' passes: {paired:+.1%} (median)"))
    print()
    print(outcome.comparison.table())
    if outcome.collectives:
        print()
        print(collectives_table(outcome.collectives))
    print()
    print("wrote " + ", ".join(files.values()))
