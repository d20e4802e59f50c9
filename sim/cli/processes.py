"""``--processes N`` of ``gpipe-sim demo`` and ``compare``: the ranks spawned here, predicted vs measured.

::

    gpipe-sim demo --processes 2                         # 2 gloo processes on this machine, no torchrun
    gpipe-sim demo --processes 2 --schedule 1f1b --json  # the report, with predicted and measured makespans
    gpipe-sim compare --processes 2 mymodels.py:build

The experiment is :func:`sim.calibration.processes.run_processes`; the files are those of the single-process
run (``timeline.png``, ``trace.json``, ``report.json``).
"""

from __future__ import annotations

import argparse
import sys

from sim.calibration.experiment_setup import Setup
from sim.calibration.outcome import write_outputs
from sim.calibration.processes import Build, ProcessOutcome, run_processes
from sim.cli import CommandError
from sim.cli.options import integer
from sim.files import OutputFolder, json_text

__all__ = ["add_option", "check", "execute"]


def add_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--processes", type=int, default=None, metavar="N",
                   help="run the pipeline on N processes spawned here (gloo on loopback, one rank per schedule "
                        "device, gpipe.distributed.DistributedGPipe) instead of threads in this one")


def check(args: argparse.Namespace, devices: object = None) -> None:
    """Reject ``--processes`` below 2, or beside ``--devices`` (each rank is a device of its own)."""
    if args.processes is None:
        return
    integer("--processes", args.processes, 2)
    if devices is not None:
        raise CommandError("--processes runs a rank per schedule device, each on this machine's CPU: leave out "
                           "--devices (--stages sets the stages, placed on the ranks by the schedule's layout)")


def execute(build: Build, setup: Setup, args: argparse.Namespace, description: str, out: OutputFolder) -> int:
    """Run on ``args.processes`` ranks, write the files into ``out``, print the table (or the report); "spawning"
    is printed once the launcher has checked the setup and is about to start the ranks."""
    def spawning() -> None:
        print(f"spawning {args.processes} processes (gloo on loopback) ...", file=sys.stderr)

    try:
        outcome = run_processes(build, setup, args.processes, description=description, on_spawn=spawning)
    except ValueError as error:
        raise CommandError(str(error)) from None
    files = write_outputs(outcome, out, measured_by=f"{args.processes} processes")
    if args.json:
        print(json_text({**outcome.report(), "files": files}))
        return 0
    _print(outcome, files)
    return 0


def _print(outcome: ProcessOutcome, files: dict[str, str]) -> None:
    s, link = outcome.schedule, outcome.link
    if outcome.description:
        print(outcome.description)
    print(f"{s.name} schedule: m={s.m} micro-batches, n={s.n} stages, checkpoint={s.checkpoint}; balance "
          f"{list(outcome.balance)} on {outcome.processes} processes (stages on ranks "
          f"{', '.join(map(str, s.placement))})")
    print(f"link: {link.description}: latency {link.latency * 1e6:.0f} us, {link.bandwidth / 1e9:.2f} GB/s; "
          f"clocks aligned to within {outcome.measured.meta['clock']['residual'] * 1e6:.0f} us")
    print(f"measured: step {outcome.chosen_step + 1} of {len(outcome.step_makespans)} (median makespan; all: "
          + ", ".join(f"{t * 1e3:.1f}" for t in outcome.step_makespans) + " ms)")
    paired = outcome.paired_error
    print("predicted from each stage's seconds profiled in its rank after every step, and the link (Note [what "
          "the prediction models] in sim.calibration.processes)"
          + ("" if paired is None else f"; each step against its own ranks' passes: {paired:+.1%} (median)"))
    print()
    print(outcome.comparison.table())
    print()
    print("wrote " + ", ".join(files.values()))
