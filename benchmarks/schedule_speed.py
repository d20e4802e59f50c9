"""How fast each schedule trains: this GPipe, the plain model and torch.distributed.pipelining's same schedule.

The model is ``executor_speed.py``'s (``--layers`` x (Linear(width) + ReLU), batch ``--batch``, ``--chunks``
micro-batches, MSE loss), on two CPU "devices". A schedule that runs one stage per device cuts it in two stages;
one built for several per device (registered with a layout: interleaved 1F1B, looped BFS, the V-shapes) cuts it in
``2 * --virtual`` stages placed by its layout. Every registered schedule is timed three ways::

    plain               the model itself, one thread
    gpipe NAME          this GPipe, ``pipe.step(x, y, mse_loss)`` (one worker thread per device), record off
    pipelining NAME     torch.distributed.pipelining's schedule of the same name on two gloo processes, each holding
                        the stages our layout puts on its device (Note [pipelining] in executor_speed.py)

Note [schedule pairs]: which class of torch.distributed.pipelining runs the same order as a registered schedule is
the table ``TORCH_SCHEDULES``; a schedule without a counterpart there gets no pipelining row, said in the output.
ZB-H1 pairs with ``ScheduleInterleavedZeroBubble`` with one stage per rank (the issue: its order reaches ZB-H1's
bubble). Every schedule's loss and gradients are checked equal to the plain model's before timing.

The in-process rows are timed round-robin in a shuffled order (Note [interleaving] in executor_speed.py) and ratios
are medians of per-round ratios; the pipelining rows run after, schedule by schedule, in their own processes.
One intra-op thread per worker and per rank (Note [one thread per worker] there).

Run: ``.venv/bin/python benchmarks/schedule_speed.py`` (a few minutes on two cores) or ``--quick``; also
``benchmarks/executor_speed.py --schedules``. Writes ``benchmarks/results/schedule_speed.json``.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from executor_speed import (  # noqa: E402
    THREADS,
    Runner,
    Workload,
    gradients_match,
    interleaved,
    ms,
    pipe_step,
    ratio,
    train_step,
)
from torch.nn import functional as F  # noqa: E402

from gpipe import GPipe  # noqa: E402
from gpipe.distributed.loopback import free_port, init_loopback_group  # noqa: E402
from gpipe.schedule import SCHEDULES, schedule_kind  # noqa: E402
from sim.calibration.calibrate import partitions_of  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "schedule_speed.json"
DEVICES = 2
# Note [schedule pairs]
TORCH_SCHEDULES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
    "looped-bfs": "ScheduleLoopedBFS",
    "zb-h1": "ScheduleInterleavedZeroBubble",
    "zb-v": "ScheduleZBVZeroBubble",
    "dualpipe-v": "ScheduleDualPipeV",
}
SINGLE_STAGE = {"ScheduleGPipe", "Schedule1F1B"}  # torch's classes that take one stage per rank, not a list


def layout(name: str, virtual: int) -> tuple[int, ...]:
    """Where each stage goes on the two devices: one stage each, or ``2 * virtual`` by the schedule's layout."""
    kind = schedule_kind(name)
    if kind.place is None:
        return kind.layout(DEVICES, DEVICES)
    return kind.layout(DEVICES * virtual, DEVICES)


def balance_of(workload: Workload, stages: int) -> list[int]:
    """Whole (Linear + ReLU) pairs per stage, the first stages the larger ones; two modules per pair."""
    if workload.layers < stages:
        raise SystemExit(f"--layers {workload.layers} cannot fill {stages} stages: give at least {stages}")
    base, extra = divmod(workload.layers, stages)
    return [2 * (base + (1 if s < extra else 0)) for s in range(stages)]


# -- torch.distributed.pipelining ----------------------------------------------------------------------


def _rank(rank: int, world: int, port: int, workload: Workload, plans: dict[str, tuple[list[int], list[int]]],
          warmup: int, repeats: int, out: str) -> None:
    """One rank: for each schedule, the stages its layout puts here, timed between barriers; rank 0 writes."""
    import torch.distributed as dist
    from torch.distributed import pipelining

    torch.set_num_threads(THREADS)
    init_loopback_group(rank, world, port, datetime.timedelta(minutes=30))
    try:
        x, y = workload.data()
        result: dict[str, Any] = {}
        for name, (placement, balance) in plans.items():
            cls = getattr(pipelining, TORCH_SCHEDULES[name])
            parts = partitions_of(workload.model(), balance)
            mine = [s for s, d in enumerate(placement) if d == rank]
            stages = [pipelining.PipelineStage(parts[s], s, len(placement), torch.device("cpu")) for s in mine]
            kwargs: dict[str, Any] = {"n_microbatches": workload.m, "loss_fn": F.mse_loss}
            schedule = cls(stages[0], **kwargs) if TORCH_SCHEDULES[name] in SINGLE_STAGE else cls(stages, **kwargs)
            first, last = 0 in mine, len(placement) - 1 in mine

            def step(schedule: Any = schedule, first: bool = first, last: bool = last, mine: list[int] = mine,
                     parts: list[Any] = parts) -> None:
                for s in mine:
                    parts[s].zero_grad(set_to_none=True)
                args = (x,) if first else ()
                schedule.step(*args, **({"target": y, "losses": []} if last else {}))

            for _ in range(warmup):
                step()
            samples = []
            for _ in range(repeats):
                dist.barrier()
                start = time.perf_counter()
                step()
                dist.barrier()  # the step ends when the slower rank is done
                samples.append(time.perf_counter() - start)
            result[name] = samples
        if rank == 0:
            Path(out).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def run_pipelining(workload: Workload, plans: dict[str, tuple[list[int], list[int]]], warmup: int,
                   repeats: int) -> dict[str, list[float]]:
    """Every planned schedule on two spawned gloo processes; seconds per step."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "pipelining.json")
        mp.spawn(_rank, args=(DEVICES, free_port(), workload, plans, warmup, repeats, out), nprocs=DEVICES,
                 join=True)
        return {k: list(v) for k, v in json.loads(Path(out).read_text()).items()}


# -- the run ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
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
    parser.add_argument("--quick", action="store_true", help="few repeats (smoke test)")
    parser.add_argument("--json", type=Path, default=RESULTS, help=f"where to write the results (default {RESULTS})")
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

    torch.set_num_threads(THREADS)
    workload = Workload(args.layers, args.width, args.batch, args.chunks)
    model, (x, y) = workload.model(), workload.data()
    plain_model = copy.deepcopy(model)
    runners = [Runner("plain", lambda: train_step(plain_model, x, y), [])]
    plans: dict[str, tuple[list[int], list[int]]] = {}
    notes = [f"torch.set_num_threads({THREADS}) in every worker and rank, on purpose (one core each)"]
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
        for name, values in run_pipelining(workload, plans, warmup, repeats).items():
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
        "command": "python benchmarks/schedule_speed.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
                    "threads_per_worker": THREADS, "load": os.getloadavg()[0] if hasattr(os, "getloadavg") else None},
        "workload": {"layers": args.layers, "width": args.width, "batch": args.batch, "chunks": args.chunks,
                     "virtual": args.virtual, "repeats": repeats},
        "plain_ms": round(ms(samples["plain"]), 3),
        "rows": rows,
        "notes": notes,
        "goal": "every schedule faster than plain where micro-batches stay efficient, and faster than the same "
                "schedule in torch.distributed.pipelining",
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.json}")
    return doc


if __name__ == "__main__":
    main()
