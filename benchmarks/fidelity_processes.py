"""How well the simulator predicts the distributed executor: predicted against measured makespan on 2 processes.

Each row runs :func:`sim.calibration.processes.run_processes` (the experiment behind ``gpipe-sim demo --processes
2``): two ranks spawned on this machine (gloo on loopback), :class:`gpipe.distributed.DistributedGPipe` trained for a
few steps, each rank profiling its own stages after every step (Note [calibrated in the ranks] there), the step of
median makespan against the prediction. The grid::

    model       the demo's convolutional classifier (sim.calibration.experiment.demo_model), batch 64
    schedule    every registered one whose layout places stages on 2 ranks (Note [schedule axis] in
                _shared/fidelity.py: two stages per rank for one with a layout)
    chunks      2, 4, 8
    checkpoint  except_last

Errors as in ``benchmarks/fidelity.py`` (``error``: the median step against the prediction from the means of the
passes; ``paired``: each step against its own passes, the median; ``trimmed``: trimmed means), summarised alike
(``_shared/fidelity.py``). The goal (issue 23): mean |error| <= 5%. Each row records the cores other processes used
while it ran (``background``) and the load average after it: the machine may be shared. Before each row the script
waits up to ``QUIET_WAIT`` seconds for a quiet machine (``_shared.machine.wait_until_quiet``), and runs it whatever it
found; no re-runs (``fidelity.py``'s gate is for its 3% goal). Writes
``benchmarks/results/fidelity_processes.json``::

    .venv/bin/python -m benchmarks.fidelity_processes            # about 10 minutes on two cores
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

from benchmarks._shared.machine import omp_threads, set_threads, wait_until_quiet

omp_threads()  # before torch loads: one intra-op thread per rank (Note [threads] in _shared.machine)

from benchmarks._shared import options  # noqa: E402
from benchmarks._shared.fidelity import BATCH, refusal, stages_for, summary, trimmed_mean  # noqa: E402
from benchmarks._shared.record import command_line, results_path, write_json  # noqa: E402
from gpipe import microbatch  # noqa: E402
from gpipe.balance import balance_by_time  # noqa: E402
from gpipe.schedule import SCHEDULES  # noqa: E402
from sim.calibration.experiment import Setup, demo_model  # noqa: E402
from sim.calibration.machine import BackgroundLoad  # noqa: E402
from sim.calibration.processes import run_processes  # noqa: E402

RESULTS = results_path("fidelity_processes")
PROCESSES = 2
CHUNKS = (2, 4, 8)
CHECKPOINT = "except_last"
STEPS = 21  # recorded steps a row, after two warm-up steps; the median one is compared
GOAL_MEAN = 0.05
QUIET_WAIT = 20.0  # seconds a row waits, at most, for other processes to use under _shared.machine.QUIET cores


def main(argv: list[str] | None = None) -> int:
    parser = options.parser(__doc__)
    parser.add_argument("--schedules", default=",".join(SCHEDULES), help="comma-separated registered schedules")
    parser.add_argument("--chunks", default=",".join(map(str, CHUNKS)), help="comma-separated chunk counts")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"recorded steps a row (default {STEPS})")
    options.add_out(parser, RESULTS)
    args = parser.parse_args(argv)
    schedules = [s for s in args.schedules.split(",") if s]
    unknown = [s for s in schedules if s not in SCHEDULES]
    if unknown or not schedules:
        parser.error(f"unknown schedule(s) {', '.join(unknown) or '(none given)'}; registered: {', '.join(SCHEDULES)}")
    chunk_grid = [int(c) for c in args.chunks.split(",") if c]
    set_threads(1)  # one intra-op thread per rank, on purpose
    model, batch = demo_model(0)
    if batch.shape[0] != BATCH:
        raise RuntimeError(f"the demo's batch is {batch.shape[0]}, _shared.fidelity.refusal assumes {BATCH}")
    micro = batch[:microbatch.sizes(BATCH, 4)[0]]
    balances: dict[int, tuple[int, ...]] = {}
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    began = time.perf_counter()
    print(f"{'schedule':>16} {'chunks':>6} {'predicted ms':>13} {'measured ms':>12} {'error':>8} {'paired':>8} "
          f"{'trimmed':>8} {'drift':>7} {'busy':>5} {'load':>5}")
    for schedule in schedules:
        try:
            stages = stages_for(schedule, PROCESSES)
        except ValueError as refused:
            skipped.append({"schedule": schedule, "why": str(refused).splitlines()[0]})
            continue
        if stages not in balances:
            balances[stages] = tuple(balance_by_time(stages, model, micro, timeout=2.0, device="cpu"))
        for chunks in chunk_grid:
            why = refusal(schedule, chunks, stages, CHECKPOINT, PROCESSES)
            if why is not None:
                skipped.append({"schedule": schedule, "chunks": chunks, "why": why})
                print(f"{schedule:>16} {chunks:>6} skipped: {why}", flush=True)
                continue
            row = measure(schedule, chunks, balances[stages], args.steps)
            rows.append(row)
            print(f"{schedule:>16} {chunks:>6} {row['predicted_ms']:>13.1f} {row['measured_ms']:>12.1f} "
                  f"{row['error']:>+8.1%} {row['paired_error']:>+8.1%} {row['trimmed_error']:>+8.1%} "
                  f"{row['drift']:>+7.1%} {row['background']:>5.2f} {row['load_after']:>5.2f}", flush=True)
    if not rows:
        print("no configuration ran: every one was skipped")
        return 1
    overall = summary(rows)
    names = dict.fromkeys(r["schedule"] for r in rows)
    per_schedule = {s: summary([r for r in rows if r["schedule"] == s]) for s in names}
    background = sum(r["background"] for r in rows) / len(rows)
    print(f"\nmean |error| {overall['mean_abs_error']:.2%} (goal <= {GOAL_MEAN:.0%}), max "
          f"{overall['max_abs_error']:.2%}; paired: mean {overall['mean_abs_paired_error']:.2%}; trimmed: mean "
          f"{overall['mean_abs_trimmed_error']:.2%}; {len(rows)} rows in {time.perf_counter() - began:.0f} s, other "
          f"processes using {background:.2f} cores on average")
    doc = {
        "benchmark": "fidelity_processes",
        "load": {"mean_background_cores": background, "loadavg_at_end": list(os.getloadavg())},
        "note": (f"{PROCESSES} processes (gloo on loopback), the demo's model, batch {BATCH}, checkpoint {CHECKPOINT}, "
                 f"{args.steps} recorded steps a row (2 warm-up), the median step compared; stage seconds from each "
                 "rank's passes after every step; error = (predicted - measured) / measured; background = cores "
                 "other processes used while the row ran."),
        "summary": {**overall, "goal_mean": GOAL_MEAN, "rows": len(rows), "per_schedule": per_schedule,
                    "skipped": skipped},
        "rows": rows,
    }
    write_json(args.out, doc, command=command_line(__file__, argv),
               machine={"OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"]})
    print(f"wrote {args.out}")
    return 0


def measure(schedule: str, chunks: int, balance: tuple[int, ...], steps: int) -> dict[str, Any]:
    """One row: the experiment on :data:`PROCESSES` ranks, and what other processes did meanwhile."""
    setup = Setup(chunks=chunks, checkpoint=CHECKPOINT, schedule=schedule, balance=balance, steps=steps, threads=1)
    began = time.perf_counter()
    wait_until_quiet(QUIET_WAIT)
    meter = BackgroundLoad()
    outcome = run_processes(functools.partial(demo_model, 0), setup, PROCESSES)
    c = outcome.comparison
    return {
        "schedule": schedule, "chunks": chunks, "checkpoint": CHECKPOINT, "balance": list(balance),
        "placement": list(outcome.schedule.placement),
        "predicted_ms": c.predicted_makespan * 1e3, "measured_ms": c.measured_makespan * 1e3,
        "error": c.makespan_error, "paired_error": outcome.paired_error,
        "trimmed_error": (trimmed_mean(outcome.step_predictions) - trimmed_mean(outcome.step_makespans))
        / trimmed_mean(outcome.step_makespans),
        "drift": outcome.drift, "order_agreement": c.order_agreement,
        "link": {"latency": outcome.link.latency, "bandwidth": outcome.link.bandwidth},
        "step_ms": [m * 1e3 for m in outcome.step_makespans],
        "step_predicted_ms": [p * 1e3 for p in outcome.step_predictions],
        "background": meter.cores() or 0.0, "load_after": os.getloadavg()[0],
        "seconds": time.perf_counter() - began,
    }


if __name__ == "__main__":
    raise SystemExit(main())
