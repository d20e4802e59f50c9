"""How fast the simulator runs: tasks simulated per second for GPipe over a grid of stages and micro-batches.

Each point is ``gpipe(m, n, "never")`` (2·m·n tasks) simulated twice:

    free   every copy free (``copy_seconds=0``), no bytes tracked: the scheduling core alone
    link   copies priced by pcie4-x16 with 16 MiB activations (a copy span each) and 64 MiB saved per
           micro-batch (two memory samples per forward/backward pair): everything recorded

Three figures per point: ``validate`` (seconds of ``Schedule.validate`` alone), ``simulate/s`` (tasks per
second of the whole public call: validation, the simulation, and building the Timeline of spans and
memory samples) and ``engine/s`` (tasks per second of the simulation proper, timed through the engine's
:func:`sim.core.engine.run_validated` on the already validated schedule). A schedule remembers that it passed validation
(Note [linear validation] in :mod:`gpipe.schedule.validator`), so every timed call gets a fresh, equal copy of the
schedule: ``simulate/s`` is what a first call costs. Each time is the best of a few repeats (the machine
is shared). The goal: ``simulate/s`` >= 250,000 at n=64, m=4096 with free copies.

Then the command line, end to end, as a user runs it: ``gpipe-sim simulate --stages 64 --chunks M`` (its
default costs: GPipe with ``except_last`` checkpointing, 2·m·n + n·(m-1) tasks, free copies) for the
sizes in ``CLI_CHUNKS``, each in a subprocess (``python -m sim``, files into a temporary folder): wall
seconds (best of two), CPU seconds (from ``os.wait4``) and peak resident memory (the most of the two, see
:func:`run_cli`).
The goal: m=16384 (3.1 million tasks) in under 15 s and 2 GiB.

Run: ``.venv/bin/python -m benchmarks.sim_speed`` (about two minutes on two cores) or ``--quick`` (a few
seconds, a smaller grid and one small command); writes ``benchmarks/results/sim_speed.json``.
"""

from __future__ import annotations

import gc
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import simpy

from benchmarks._shared import options
from benchmarks._shared.machine import load_average
from benchmarks._shared.record import command_line, results_path, write_json
from gpipe.schedule import Schedule, checkpointed, gpipe
from sim.core.config import SimConfig
from sim.core.cost import CostModel
from sim.core.engine import run_validated, simulate
from sim.planning.hardware.catalog import get_link

MiB = 2**20
STAGES = (4, 16, 64)
CHUNKS = (32, 256, 4096)
GOAL = 250_000  # simulate() tasks per second at n=64, m=4096, free copies
CLI_STAGES = 64
CLI_CHUNKS = (1000, 4096, 16384)  # the sizes issue 20 reported; the last one is the goal's
CLI_GOAL_SECONDS, CLI_GOAL_BYTES = 15.0, 2 * 2**30  # wall and peak RSS of the m=16384 command
ROOT = Path(__file__).resolve().parents[1]
RESULTS = results_path("sim_speed")


def variants(n: int) -> dict[str, tuple[CostModel, SimConfig]]:
    """The two cost models of the module docstring, for ``n`` stages."""
    return {
        "free": (CostModel.uniform(n, 1e-3, 2e-3, copy_seconds=0.0), SimConfig()),
        "link": (CostModel.uniform(n, 1e-3, 2e-3, copy_seconds=None, send_bytes=16 * MiB, saved_bytes=64 * MiB,
                                   checkpoint_bytes=16 * MiB), SimConfig(link=get_link("pcie4-x16"))),
    }


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    """The shortest of ``repeats`` wall-clock runs of ``fn``, seconds (the collector paused, as simulate does)."""
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        was = gc.isenabled()
        gc.disable()
        try:
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
        finally:
            if was:
                gc.enable()
    return best


def fresh(schedule: Schedule) -> Schedule:
    """An equal schedule that has not been validated yet (building it copies no task)."""
    return Schedule(schedule.m, schedule.n, schedule.checkpoint, schedule.placement, schedule.tasks, schedule.name)


def measure(schedule: Schedule, repeats: int) -> dict[str, Any]:
    """Time validation and both variants on ``schedule``."""
    tasks = sum(map(len, schedule.tasks))
    validate = best_seconds(lambda: fresh(schedule).validate(), repeats)
    row: dict[str, Any] = {"n": schedule.n, "m": schedule.m, "tasks": tasks, "validate_seconds": validate}
    schedule.validate()  # the engine alone runs on a validated schedule
    for name, (cost, config) in variants(schedule.n).items():
        total = best_seconds(lambda c=cost, k=config: simulate(fresh(schedule), c, k), repeats)  # type: ignore[misc]
        engine = best_seconds(lambda c=cost, k=config: run_validated(schedule, c, k), repeats)  # type: ignore[misc]
        row[name] = {"simulate_seconds": total, "simulate_tasks_per_second": tasks / total,
                     "engine_seconds": engine, "engine_tasks_per_second": tasks / engine}
    return row


def cli_command(stages: int, chunks: int) -> list[str]:
    return ["gpipe-sim", "simulate", "--stages", str(stages), "--chunks", str(chunks)]


def run_cli(stages: int, chunks: int, repeats: int) -> dict[str, Any]:
    """Run ``gpipe-sim simulate`` ``repeats`` times in a subprocess: best wall seconds, most CPU and memory.

    Peak memory is the child's ``VmHWM``, read from ``/proc`` while it runs (its peak comes before it
    frees its timeline, so the last reading has it): ``ru_maxrss`` would not do, as Linux counts in it
    this process's own memory, which the child shares until it starts Python. Elsewhere, ``ru_maxrss``.
    """
    words = cli_command(stages, chunks)
    tasks = 2 * chunks * stages + stages * sum(checkpointed("except_last", i, chunks) for i in range(chunks))
    walls, cpus, peaks = [], [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as out, tempfile.TemporaryFile() as log:
            argv = [sys.executable, "-m", "sim", *words[1:], "--out", out]
            start = time.perf_counter()
            child = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            high = 0
            while True:
                high = max(high, _high_water_bytes(child.pid))
                done, status, usage = os.wait4(child.pid, os.WNOHANG)  # the rusage of this child alone
                if done:
                    break
                time.sleep(0.01)
            walls.append(time.perf_counter() - start)
            child.returncode = os.waitstatus_to_exitcode(status)
            if child.returncode:
                log.seek(0)
                raise RuntimeError(f"{' '.join(words)} exited {child.returncode}:\n{log.read().decode()[-2000:]}")
            cpus.append(usage.ru_utime + usage.ru_stime)
            peaks.append(high or usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024))  # Linux counts KiB
    return {"command": " ".join(words), "stages": stages, "chunks": chunks, "tasks": tasks,
            "wall_seconds": min(walls), "cpu_seconds": max(cpus), "peak_rss_bytes": max(peaks),
            "wall_samples": walls}


def _high_water_bytes(pid: int) -> int:
    """``VmHWM`` of a running process (its peak resident memory so far), 0 where ``/proc`` does not say."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:")), 0)


def main(argv: list[str] | None = None) -> int:
    parser = options.parser(__doc__)
    options.add_quick(parser, "n in {4, 16}, m in {32, 256}, one repeat")
    options.add_out(parser, RESULTS)
    args = parser.parse_args(argv)
    stages, chunks = ((4, 16), (32, 256)) if args.quick else (STAGES, CHUNKS)
    load = load_average()  # the machine is shared
    rows = []
    print(f"{'n':>3} {'m':>5} {'tasks':>8} {'validate':>9} | {'free: simulate/s':>16} {'engine/s':>9} | "
          f"{'link: simulate/s':>16} {'engine/s':>9}")
    for n in stages:
        for m in chunks:
            schedule = gpipe(m, n, "never")
            tasks = sum(map(len, schedule.tasks))
            repeats = 1 if args.quick else 3 if tasks < 100_000 else 2
            row = measure(schedule, repeats)
            rows.append(row)
            free, link = row["free"], row["link"]
            print(f"{n:>3} {m:>5} {tasks:>8} {row['validate_seconds']:>8.3f}s | "
                  f"{free['simulate_tasks_per_second']:>16,.0f} {free['engine_tasks_per_second']:>9,.0f} | "
                  f"{link['simulate_tasks_per_second']:>16,.0f} {link['engine_tasks_per_second']:>9,.0f}",
                  flush=True)
    goal_row = next((r for r in rows if r["n"] == 64 and r["m"] == 4096), None)
    if goal_row is not None:
        got = goal_row["free"]["simulate_tasks_per_second"]
        print(f"\ngoal: simulate >= {GOAL:,} tasks/s at n=64, m=4096 (free copies): {got:,.0f} "
              f"({'met' if got >= GOAL else 'not met'}); with a link: "
              f"{goal_row['link']['simulate_tasks_per_second']:,.0f}")
    print(f"\n{'command (through the CLI, files included)':<46} {'tasks':>9} {'wall':>7} {'cpu':>7} {'peak RSS':>9}")
    cli_rows = []
    for cli_chunks in ((256,) if args.quick else CLI_CHUNKS):
        row = run_cli(16 if args.quick else CLI_STAGES, cli_chunks, 1 if args.quick else 2)
        cli_rows.append(row)
        print(f"{row['command']:<46} {row['tasks']:>9,} {row['wall_seconds']:>6.2f}s {row['cpu_seconds']:>6.2f}s "
              f"{row['peak_rss_bytes'] / 2**20:>5,.0f} MiB", flush=True)
    cli_goal = next((r for r in cli_rows if r["stages"] == CLI_STAGES and r["chunks"] == CLI_CHUNKS[-1]), None)
    if cli_goal is not None:
        met = cli_goal["wall_seconds"] < CLI_GOAL_SECONDS and cli_goal["peak_rss_bytes"] < CLI_GOAL_BYTES
        print(f"\ngoal: {cli_goal['command']} in under {CLI_GOAL_SECONDS:.0f} s and {CLI_GOAL_BYTES / 2**30:.0f} GiB: "
              f"{cli_goal['wall_seconds']:.1f} s, {cli_goal['peak_rss_bytes'] / 2**30:.2f} GiB "
              f"({'met' if met else 'not met'})")
    note = (f"Goal: simulate >= {GOAL:,} tasks/s at n=64, m=4096 with free copies (validation and the Timeline "
            f"included), and `{' '.join(cli_command(CLI_STAGES, CLI_CHUNKS[-1]))}` end to end in under "
            f"{CLI_GOAL_SECONDS:.0f} s and {CLI_GOAL_BYTES / 2**30:.0f} GiB. The machine is shared: the 1-minute load "
            f"average was {'unknown' if load is None else f'{load:.2f}'} when the run started.")
    doc = {
        "benchmark": "sim_speed",
        "note": note, "load_average": load, "quick": args.quick, "schedule": "gpipe, checkpoint never",
        "variants": {"free": "copy_seconds=0, no bytes", "link": "pcie4-x16, 16 MiB activations, 64 MiB saved"},
        "python": platform.python_version(), "simpy": simpy.__version__, "processor": platform.processor(),
        "cpus": os.cpu_count(),
        "goal_simulate_tasks_per_second": GOAL, "rows": rows,
        "cli": {"goal_wall_seconds": CLI_GOAL_SECONDS, "goal_peak_rss_bytes": CLI_GOAL_BYTES, "rows": cli_rows},
    }
    write_json(args.out, doc, command=command_line(__file__, argv), machine={"simpy": simpy.__version__})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
