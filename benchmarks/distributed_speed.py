"""How fast DistributedGPipe trains on two gloo processes, beside torch.distributed.pipelining on the same two.

The model is the speed benchmarks' (``--layers`` x (Linear(width) + ReLU), batch ``--batch``, ``--chunks``
micro-batches, MSE loss: ``_shared/workload.py``), cut into stages as ``schedule_speed.py`` cuts it (one per rank, or
``2 * --virtual`` by the schedule's layout). Each schedule with a counterpart in torch (GPipe, 1F1B, interleaved
1F1B, ZB-H1, ZB-V: Note [schedule pairs] in _shared/pipelining.py) is timed four ways::

    plain               the model itself, one thread, in this process
    threaded NAME       gpipe.GPipe, worker threads in this process
    distributed NAME    gpipe.distributed.DistributedGPipe on two spawned gloo processes (loopback)
    pipelining NAME     torch.distributed.pipelining's schedule on the same two processes

Note [same ranks, same rounds]: the distributed rows share one spawn: in each rank, both pipelines of a schedule
are built, their first step is checked against the plain model (loss on every rank, this rank's gradients), and
then each round times one step of ours and one of torch's, in a seeded random order, each between barriers (a
step ends when the slower rank is done). The ratio is the median of per-round ratios, so a busy moment of a
shared machine weighs on both alike. One intra-op thread per rank and worker (``--threads``; Note [threads] in
_shared/machine.py).

Note [a floor for any executor]: each round also runs one recorded step of ours, and its timeline gives the
step's floor (:func:`floor_seconds`): the schedule's order and dependencies with every task taking just what it
took in that step and nothing else taking time (no message, no gap between tasks). An executor of the same tasks
at the same speed, torch's included, steps no faster; a goal below it asks for faster kernels, not a better
executor. The recorded step's own time is reported beside it (``recorded_ms``): its tasks carry the recorder's
hooks, so the floor is high by what they cost, which that column bounds.

Run: ``.venv/bin/python -m benchmarks.distributed_speed`` (``--quick``: few rounds). Writes
``benchmarks/results/distributed_speed.json``. Goal: each distributed step at most 0.9x torch's.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from benchmarks._shared import options
from benchmarks._shared.machine import set_threads
from benchmarks._shared.pipelining import DEVICES as WORLD
from benchmarks._shared.pipelining import TORCH_SCHEDULES, balance_of, layout, torch_step
from benchmarks._shared.record import command_line, results_path, write_json
from benchmarks._shared.rounds import Runner, interleaved, ms, ratio
from benchmarks._shared.workload import Workload, pipe_step, train_step
from gpipe import GPipe
from gpipe.distributed.loopback import free_port, init_loopback_group
from gpipe.schedule import Schedule, Task, schedule_kind
from gpipe.schedule.timeline import COMPUTE, Timeline

RESULTS = results_path("distributed_speed")
GOAL = 0.9  # DistributedGPipe's step over torch.distributed.pipelining's, on the same schedule
DEFAULT = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v")


def _rank(rank: int, world: int, port: int, workload: Workload, plans: dict[str, tuple[list[int], list[int]]],
          warmup: int, repeats: int, threads: int, out: str) -> None:
    """One rank: per schedule, ours and torch's on this rank's stages, checked, then timed in shuffled rounds."""
    import torch.distributed as dist

    from gpipe.distributed import DistributedGPipe

    set_threads(threads)
    init_loopback_group(rank, world, port, datetime.timedelta(minutes=30))
    try:
        x, y = workload.data()
        result: dict[str, Any] = {}
        for name, (placement, balance) in plans.items():
            reference = workload.model()
            expected = F.mse_loss(reference(x), y)
            expected.backward()
            ours = DistributedGPipe(workload.model(), balance, chunks=workload.m, checkpoint="never", schedule=name)
            first, last = ours.placement[0] == rank, ours.placement[-1] == rank

            def our_step(pipe: Any = ours, first: bool = first, last: bool = last) -> torch.Tensor:
                pipe.zero_grad(set_to_none=True)
                return pipe.step(x if first else None, y if last else None, F.mse_loss)

            loss = our_step()
            torch.testing.assert_close(loss, expected.detach())
            params = dict(reference.named_parameters())
            for key, p in ours.named_parameters():
                torch.testing.assert_close(p.grad, params[key.split(".", 2)[2]].grad)
            their_step = torch_step(name, workload, placement, balance, rank, x, y)

            def recorded_step(pipe: Any = ours) -> None:
                pipe.record = True
                try:
                    our_step()
                finally:
                    pipe.record = False

            steps = {"distributed": our_step, "pipelining": their_step, "recorded": recorded_step}
            for _ in range(warmup):
                for step in steps.values():
                    step()
            samples: dict[str, list[float]] = {k: [] for k in [*steps, "floor"]}
            order = random.Random(0)  # the same order on every rank
            schedule = ours.schedule_for(workload.m, "never")
            for _ in range(repeats):
                for k in order.sample(list(steps), len(steps)):
                    dist.barrier()
                    start = time.perf_counter()
                    steps[k]()
                    dist.barrier()
                    samples[k].append(time.perf_counter() - start)
                    if k == "recorded":  # Note [a floor for any executor]
                        timeline = ours.gather_timeline()
                        samples["floor"] += [floor_seconds(schedule, timeline)] if timeline is not None else []
            ours.close()
            result[name] = samples
        if rank == 0:
            Path(out).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def floor_seconds(schedule: Schedule, timeline: Timeline) -> float:
    """Note [a floor for any executor]: the step of ``schedule`` if each task took what it took in ``timeline``
    (device ``d`` is rank ``d``) and nothing else took time."""
    took = {(s.device, s.task): s.end - s.start for s in timeline.spans if s.stream == COMPUTE}
    done: dict[Task, float] = {}
    free = [0.0] * schedule.num_devices
    position = [0] * schedule.num_devices
    moved = True
    while moved:  # a task starts when its device is free and its dependencies are done, in its device's order
        moved = False
        for d, tasks in enumerate(schedule.tasks):
            while position[d] < len(tasks) and all(t in done for t in schedule.dependencies(tasks[position[d]])):
                task = tasks[position[d]]
                start = max([free[d], *(done[t] for t in schedule.dependencies(task))])
                done[task] = free[d] = start + took[(d, task)]
                position[d] += 1
                moved = True
    return max(free)


def run_distributed(workload: Workload, plans: dict[str, tuple[list[int], list[int]]], warmup: int,
                    repeats: int, threads: int) -> dict[str, dict[str, list[float]]]:
    """Per schedule, seconds per step of ``distributed`` and ``pipelining`` on two spawned gloo processes."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "distributed.json")
        mp.spawn(_rank, args=(WORLD, free_port(), workload, plans, warmup, repeats, threads, out), nprocs=WORLD,
                 join=True)
        return json.loads(Path(out).read_text())


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = options.parser(__doc__)
    parser.add_argument("--batch", type=int, default=256, help="samples per step (default 256)")
    parser.add_argument("--chunks", type=int, default=4, help="micro-batches per step (default 4)")
    parser.add_argument("--layers", type=int, default=8, help="(Linear + ReLU) pairs (default 8)")
    parser.add_argument("--width", type=int, default=512, help="features of every Linear (default 512)")
    parser.add_argument("--virtual", type=int, default=2, help="stages per rank where the layout places several")
    parser.add_argument("--schedules", default=",".join(DEFAULT),
                        help=f"schedules to time, comma-separated (default {','.join(DEFAULT)})")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 30; --quick 5)")
    options.add_quick(parser, "few rounds")
    options.add_out(parser, RESULTS)
    options.add_threads(parser)
    args = parser.parse_args(argv)
    names = [s for s in args.schedules.split(",") if s]
    for name in names:
        try:
            schedule_kind(name)
        except ValueError as error:
            parser.error(str(error))
        if name not in TORCH_SCHEDULES:
            parser.error(f"{name}: torch.distributed.pipelining has no schedule of its order; time one of "
                         f"{', '.join(TORCH_SCHEDULES)}")
    if min(args.virtual, args.chunks, args.batch, args.width, args.layers) < 1:
        parser.error("need positive --virtual, --chunks, --batch, --width and --layers")
    repeats = args.repeats if args.repeats is not None else (5 if args.quick else 30)
    warmup = 1 if args.quick else 3

    set_threads(args.threads)  # Note [threads] in _shared.machine
    workload = Workload(args.layers, args.width, args.batch, args.chunks)
    model, (x, y) = workload.model(), workload.data()
    plain = copy.deepcopy(model)
    runners = [Runner("plain", lambda: train_step(plain, x, y), [])]
    plans: dict[str, tuple[list[int], list[int]]] = {}
    for name in names:
        placement = layout(name, args.virtual)
        balance = balance_of(workload, len(placement))
        plans[name] = (list(placement), balance)
        pipe = GPipe(copy.deepcopy(model), balance, devices=["cpu"] * WORLD, chunks=args.chunks, checkpoint="never",
                     schedule=name)
        runners.append(Runner(f"threaded {name}", lambda p=pipe: pipe_step(p, x, y), []))
    print(f"model: {args.layers} x (Linear({args.width}) + ReLU), batch {args.batch}, chunks {args.chunks}; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, torch {torch.__version__}", flush=True)
    print(f"timing plain and threaded round-robin: {warmup} warm-up + {repeats} rounds ...", flush=True)
    interleaved(runners, warmup, repeats)
    samples = {r.name: r.samples for r in runners}
    print(f"timing DistributedGPipe and torch.distributed.pipelining on {WORLD} gloo processes ...", flush=True)
    distributed = run_distributed(workload, plans, warmup, repeats, args.threads)

    rows = []
    for name in names:
        ours, theirs = distributed[name]["distributed"], distributed[name]["pipelining"]
        rows.append({"schedule": name, "stages": len(plans[name][0]), "placement": plans[name][0],
                     "distributed_ms": round(ms(ours), 3), "pipelining_ms": round(ms(theirs), 3),
                     "threaded_ms": round(ms(samples[f"threaded {name}"]), 3),
                     "distributed_vs_pipelining": round(ratio(ours, theirs, True), 3),
                     "distributed_vs_plain": round(ms(ours) / ms(samples["plain"]), 3),
                     "recorded_ms": round(ms(distributed[name]["recorded"]), 3),
                     "floor_ms": round(ms(distributed[name]["floor"]), 3),
                     "pipelining_vs_floor": round(ms(theirs) / ms(distributed[name]["floor"]), 3)})
    print(f"\nplain: {ms(samples['plain']):.2f} ms per step")
    print(f"{'schedule':18s} {'stages':>6s} {'distributed ms':>15s} {'pipelining ms':>14s} {'ours/theirs':>12s} "
          f"{'threaded ms':>12s} {'recorded ms':>12s} {'floor ms':>9s} {'theirs/floor':>13s}")
    for r in rows:
        print(f"{r['schedule']:18s} {r['stages']:6d} {r['distributed_ms']:15.2f} {r['pipelining_ms']:14.2f} "
              f"{r['distributed_vs_pipelining']:12.3f} {r['threaded_ms']:12.2f} {r['recorded_ms']:12.2f} "
              f"{r['floor_ms']:9.2f} {r['pipelining_vs_floor']:13.3f}")
    met = [r["schedule"] for r in rows if r["distributed_vs_pipelining"] <= GOAL]
    below = [r["schedule"] for r in rows if GOAL * r["pipelining_ms"] < r["floor_ms"]]
    print(f"goal: DistributedGPipe's step <= {GOAL}x torch.distributed.pipelining's on the same schedule: met by "
          f"{', '.join(met) or 'none'} of {len(rows)}; below the floor (Note [a floor for any executor]): "
          f"{', '.join(below) or 'none'}")
    doc = {
        "workload": {"layers": args.layers, "width": args.width, "batch": args.batch, "chunks": args.chunks,
                     "virtual": args.virtual, "repeats": repeats, "processes": WORLD, "backend": "gloo"},
        "plain_ms": round(ms(samples["plain"]), 3),
        "rows": rows,
        "goal": f"distributed_vs_pipelining <= {GOAL} on every schedule",
        "goal_met_by": met,
        "goal_below_floor": below,
    }
    write_json(args.out, doc, command=command_line(__file__, argv), machine={"threads_per_rank": args.threads})
    print(f"wrote {args.out}")
    return doc


if __name__ == "__main__":
    main()
