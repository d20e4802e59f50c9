"""How fast each schedule trains: this GPipe, the plain model and torch.distributed.pipelining's same schedule.

The model is ``executor_speed.py``'s (``--layers`` x (Linear(width) + ReLU), batch ``--batch``, ``--chunks``
micro-batches, MSE loss), on two CPU "devices". A schedule that runs one stage per device cuts it in two stages;
one built for several per device (registered with a layout: interleaved 1F1B, looped BFS, the V-shapes) cuts it in
``2 * --virtual`` stages placed by its layout. Every registered schedule is timed three ways::

    plain               the model itself, one thread
    gpipe NAME          this GPipe, ``pipe.step(x, y, mse_loss)`` (one worker thread per device), record off
    pipelining NAME     torch.distributed.pipelining's schedule of the same name on two gloo processes, each holding
                        the stages our layout puts on its device (Note [pipelining] in _shared/pipelining.py)

Which class of torch.distributed.pipelining pairs with which schedule is Note [schedule pairs] in
``_shared/pipelining.py``. Every schedule's loss and gradients are checked equal to the plain model's before timing.

The in-process rows are timed round-robin in a shuffled order (Note [interleaving] in _shared/rounds.py) and ratios
are medians of per-round ratios; the pipelining rows run after, schedule by schedule, in their own processes.
One intra-op thread per worker and per rank (``--threads``; Note [threads] in _shared/machine.py).

Run: ``.venv/bin/python -m benchmarks.schedule_speed`` (a few minutes on two cores) or ``--quick``; also
``-m benchmarks.executor_speed --schedules``. Writes ``benchmarks/results/schedule_speed.json``.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch

from benchmarks._shared import options
from benchmarks._shared.machine import set_threads
from benchmarks._shared.pipelining import DEVICES, TORCH_SCHEDULES, balance_of, layout, run_pipelining
from benchmarks._shared.record import command_line, results_path, write_json
from benchmarks._shared.rounds import Runner, interleaved, ms, ratio
from benchmarks._shared.workload import Workload, gradients_match, pipe_step, train_step
from gpipe import GPipe
from gpipe.schedule import SCHEDULES, schedule_kind

RESULTS = results_path("schedule_speed")


# -- the run ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = options.parser(__doc__)
    parser.add_argument("--batch", type=int, default=256, help="samples per step (default 256)")
    parser.add_argument("--chunks", type=int, default=4, help="micro-batches per step (default 4)")
    parser.add_argument("--layers", type=int, default=8, help="(Linear + ReLU) pairs (default 8)")
    parser.add_argument("--width", type=int, default=512, help="features of every Linear (default 512)")
    parser.add_argument("--virtual", type=int, default=2,
                        help="stages per device for schedules that place several (default 2)")
    parser.add_argument("--schedules", default=",".join(SCHEDULES),
                        help="registered schedules to time, comma-separated, or all (default: all)")
    parser.add_argument("--repeats", type=int, default=None, help="timed steps per configuration (default 40)")
    parser.add_argument("--skip-pipelining", action="store_true", help="leave torch.distributed.pipelining out")
    options.add_quick(parser, "few repeats (smoke test)")
    options.add_out(parser, RESULTS)
    options.add_threads(parser)
    args = parser.parse_args(argv)
    names = list(SCHEDULES) if args.schedules == "all" else [s for s in args.schedules.split(",") if s]
    for name in names:
        try:
            schedule_kind(name)
        except ValueError as error:
            parser.error(str(error))
    if args.virtual < 1 or args.chunks < 1 or args.batch < 1 or args.width < 1:
        parser.error("need positive --virtual, --chunks, --batch and --width")
    repeats = args.repeats if args.repeats is not None else (3 if args.quick else 40)
    warmup = 1 if args.quick else 3

    set_threads(args.threads)  # Note [threads] in _shared.machine
    workload = Workload(args.layers, args.width, args.batch, args.chunks)
    model, (x, y) = workload.model(), workload.data()
    plain_model = copy.deepcopy(model)
    runners = [Runner("plain", lambda: train_step(plain_model, x, y), [])]
    plans: dict[str, tuple[list[int], list[int]]] = {}
    notes = [f"torch.set_num_threads({args.threads}) in every worker and rank, on purpose (one core each)"]
    for name in names:
        try:
            placement = layout(name, args.virtual)
            balance = balance_of(workload, len(placement))
            pipe = GPipe(copy.deepcopy(model), balance, devices=["cpu"] * DEVICES, chunks=args.chunks,
                         checkpoint="never", schedule=name)
        except ValueError as error:
            notes.append(f"{name}: not run ({error})")
            print(notes[-1], flush=True)
            continue
        if not gradients_match(copy.deepcopy(model), pipe, x, y, step=pipe_step):
            raise SystemExit(f"gpipe.GPipe ({name}) does not match the plain model")

        def stepped(p: Any = pipe) -> object:
            return pipe_step(p, x, y)

        runners.append(Runner(f"gpipe {name}", stepped, []))
        if name in TORCH_SCHEDULES:
            plans[name] = (list(placement), balance)
        else:
            notes.append(f"{name}: torch.distributed.pipelining has no schedule of this order (Note [schedule pairs])")
    print(f"model: {args.layers} x (Linear({args.width}) + ReLU), batch {args.batch}, chunks {args.chunks}, "
          f"{DEVICES} CPU devices; {os.cpu_count()} CPUs, torch {torch.__version__}", flush=True)
    print(f"timing {len(runners)} configurations round-robin: {warmup} warm-up + {repeats} rounds ...", flush=True)
    interleaved(runners, warmup, repeats)
    samples = {r.name: r.samples for r in runners}
    if plans and not args.skip_pipelining:
        print(f"timing torch.distributed.pipelining ({', '.join(plans)}) on two gloo processes ...", flush=True)
        for name, values in run_pipelining(workload, plans, warmup, repeats, args.threads).items():
            samples[f"pipelining {name}"] = values

    rows = []
    for runner in runners[1:]:
        name = runner.name.removeprefix("gpipe ")
        placement = layout(name, args.virtual)
        row: dict[str, Any] = {"schedule": name, "stages": len(placement), "devices": DEVICES,
                               "gpipe_ms": round(ms(runner.samples), 3),
                               "gpipe_vs_plain": round(ratio(runner.samples, samples["plain"], True), 3)}
        if f"pipelining {name}" in samples:
            theirs = samples[f"pipelining {name}"]
            row["pipelining_ms"] = round(ms(theirs), 3)
            row["gpipe_vs_pipelining"] = round(ratio(runner.samples, theirs, False), 3)
        rows.append(row)
    print(f"\nplain: {ms(samples['plain']):.2f} ms per step")
    print(f"{'schedule':18s} {'stages':>6s} {'gpipe ms':>9s} {'vs plain':>9s} {'pipelining ms':>14s} "
          f"{'gpipe/theirs':>13s}")
    for row in rows:
        cells = f"{row['pipelining_ms']:14.2f} {row['gpipe_vs_pipelining']:13.3f}" if "pipelining_ms" in row \
            else f"{'-':>14s} {'-':>13s}"
        print(f"{row['schedule']:18s} {row['stages']:6d} {row['gpipe_ms']:9.2f} {row['gpipe_vs_plain']:9.3f} {cells}")
    for note in notes[1:]:
        print("note:", note)
    doc = {
        "workload": {"layers": args.layers, "width": args.width, "batch": args.batch, "chunks": args.chunks,
                     "virtual": args.virtual, "repeats": repeats},
        "plain_ms": round(ms(samples["plain"]), 3),
        "rows": rows,
        "notes": notes,
        "goal": "every schedule faster than plain where micro-batches stay efficient, and faster than the same "
                "schedule in torch.distributed.pipelining",
    }
    write_json(args.out, doc, command=command_line(__file__, argv), machine={"threads_per_worker": args.threads})
    print(f"wrote {args.out}")
    return doc


if __name__ == "__main__":
    main()
