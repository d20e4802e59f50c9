"""``gpipe-sim search``: the best schedule for given per-stage costs under a memory limit, beside the named ones.

Costs are one value per stage or one for all (``--forward-time 2,1,1,2``); the memory limit is the most
micro-batches' activations a device may hold at once (``--memory-limit``: one per device or one for all; a
stage's micro-batch counts ``1/v`` with ``v`` stages per device), or bytes (``--activation-bytes`` per stage with
``--memory-bytes`` per device). The search (:func:`gpipe.schedule.search.search`) returns a schedule; the simulator
runs it with the same costs, and the command prints its makespan beside each named schedule's and the lower bound,
then writes into ``--out``::

    schedule.txt   the searched schedule in the project's text form (gpipe.schedule.text; GPipe(schedule=...) and
                   gpipe-sim compare --schedule read it)
    schedule.csv   the same as torch.distributed.pipelining's CSV (recomputes left out)
    timeline.png   the simulated timeline of the searched schedule
    search.json    makespan, lower_bound, named (each named schedule's makespan, or why it does not fit), schedule

Bad input is one line naming the flag, exit status 2, before anything is written. A search interrupted (Ctrl-C)
exits with status 130 and leaves ``--out`` as it was (Note [all or nothing] in :mod:`sim.files`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gpipe.schedule import Schedule, looped, v_shape, write_pipelining_csv
from gpipe.schedule.search import SearchResult, StageCosts, search
from gpipe.schedule.text import schedule_text
from gpipe.schedule.timeline import Timeline
from sim.cli import CommandError
from sim.cli.options import add_out, integer, number, number_list, output_folder, seed
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate
from sim.files import json_text

__all__ = ["add_parser", "run", "simulated"]

FILES = ("schedule.txt", "schedule.csv", "timeline.png", "search.json")
#: Bytes one micro-batch-unit of activation stands for in the simulator when the limit is in micro-batches.
UNIT_BYTES = 1 << 20
#: The most tasks the command searches (the solver past a few thousand is slow; the heuristic is not the limit).
MAX_TASKS = 200_000


def add_parser(subparsers: Any) -> None:
    """Register ``search`` on the ``gpipe-sim`` subcommand parser."""
    p = subparsers.add_parser(
        "search", help="search for the best schedule for given stage costs under a memory limit",
        description="Search for the fastest valid schedule of --chunks micro-batches over --stages stages on "
                    "--devices devices, for per-stage costs and a memory limit per device; simulate it and "
                    "print its makespan beside every named schedule's under the same limit.",
        epilog="A cost LIST is one value for all stages or one per stage, separated by commas.")
    p.add_argument("--stages", type=int, default=4, metavar="N", help="pipeline stages (default: 4)")
    p.add_argument("--devices", type=int, default=None, metavar="P", help="devices (default: one per stage)")
    p.add_argument("--placement", default=None, metavar="looped|v|LIST",
                   help="where the stages go when there are fewer devices than stages: looped (stage s on device "
                        "s mod P, the default), v (stages d and 2P-1-d on device d; needs 2P stages), or a device "
                        "per stage (0,1,1,0)")
    p.add_argument("--chunks", type=int, default=8, metavar="M", help="micro-batches (default: 8)")
    p.add_argument("--forward-time", default="1", metavar="LIST", help="seconds of a forward (default: 1)")
    p.add_argument("--backward-time", default="1", metavar="LIST",
                   help="seconds of a backward's input gradient B (default: 1)")
    p.add_argument("--weight-time", default="1", metavar="LIST",
                   help="seconds of its weight gradient W (default: 1); 0 everywhere: the backward is not split")
    p.add_argument("--copy-time", type=float, default=0.0, metavar="S",
                   help="seconds of one copy between devices (default: 0)")
    p.add_argument("--memory-limit", default=None, metavar="LIST",
                   help="the most micro-batches' activations a device may hold at once, one for all devices or "
                        "one per device (default: no limit)")
    p.add_argument("--activation-bytes", default=None, metavar="LIST",
                   help="bytes of one micro-batch's activations per stage; with --memory-bytes, the limit in bytes")
    p.add_argument("--memory-bytes", default=None, metavar="LIST",
                   help="bytes of activations each device may hold (with --activation-bytes)")
    p.add_argument("--time-limit", type=float, default=10.0, metavar="S",
                   help="seconds the search may take: the heuristic tries the rules that fit half of it, the solver "
                        "stops within it and the heuristic's answer stands when it runs out (default: 10)")
    p.add_argument("--solver", choices=("auto", "cp-sat", "greedy"), default="auto",
                   help="auto: OR-Tools' CP-SAT where installed and the problem is not too large, else the greedy "
                        "heuristic (default: auto)")
    p.add_argument("--seed", type=int, default=0, help="the solver's seed (default: 0)")
    p.add_argument("--json", action="store_true", help="print search.json's object instead of the table")
    add_out(p, "search", ", ".join(FILES))
    p.set_defaults(func=run)


def _placement(args: argparse.Namespace) -> tuple[int, ...]:
    n, p = args.stages, args.devices if args.devices is not None else args.stages
    integer("--devices", p, 1, n)
    text = args.placement
    if text is None:
        return looped(n, p)
    if text == "looped":
        return looped(n, p)
    if text == "v":
        if n != 2 * p:
            raise CommandError(f"--placement v puts two stages on each device: --stages must be 2 x --devices "
                               f"({2 * p}), got {n}")
        return v_shape(n, p)
    try:
        placement = tuple(int(w) for w in text.split(","))
    except ValueError:
        raise CommandError(f"--placement takes looped, v or one device per stage (0,1,1,0), got {text!r}") from None
    if len(placement) != n or sorted(set(placement)) != list(range(p)):
        raise CommandError(f"--placement {text} must name a device from 0 to {p - 1} for each of the {n} stages, "
                           f"using every device")
    return placement


def _problem(args: argparse.Namespace) -> tuple[tuple[int, ...], StageCosts, tuple[float, ...] | None, bool]:
    """The placement, the costs and the limit; ``True`` when the limit is in bytes."""
    integer("--stages", args.stages, 1)
    integer("--chunks", args.chunks, 1)
    placement = _placement(args)
    n, p = args.stages, max(placement) + 1
    lists = {name: number_list(f"--{name}-time", getattr(args, f"{name}_time"), n, unit="seconds")
             for name in ("forward", "backward", "weight")}
    for j in range(n):
        if lists["forward"][j] + lists["backward"][j] + lists["weight"][j] <= 0:
            raise CommandError(f"--forward-time, --backward-time and --weight-time are all 0 for stage {j}: a stage "
                               "must cost something")
    number("--copy-time", args.copy_time, unit="seconds")
    number("--time-limit", args.time_limit, unit="seconds", positive=True, maximum=3600.0)
    seed("--seed", args.seed)
    if args.stages * args.chunks * 3 > MAX_TASKS:
        raise CommandError(f"--chunks {args.chunks} on --stages {args.stages} makes more than {MAX_TASKS:,} tasks to "
                           "search; lower one of them")
    in_bytes = args.activation_bytes is not None or args.memory_bytes is not None
    if in_bytes and args.memory_limit is not None:
        raise CommandError("give --memory-limit (in micro-batches) or --activation-bytes with --memory-bytes, not both")
    if in_bytes and (args.activation_bytes is None or args.memory_bytes is None):
        raise CommandError("--activation-bytes and --memory-bytes go together (the limit in bytes)")
    activation = None
    limit = None
    if in_bytes:
        activation = number_list("--activation-bytes", args.activation_bytes, n, unit="bytes")
        limit = number_list("--memory-bytes", args.memory_bytes, p, unit="bytes", what="device", maximum=2.0**63)
    elif args.memory_limit is not None:
        limit = number_list("--memory-limit", args.memory_limit, p, unit="micro-batches", what="device",
                            positive=True)
    costs = StageCosts(lists["forward"], lists["backward"], lists["weight"], copy=args.copy_time,
                       activation=activation)
    return placement, costs, limit, in_bytes


def simulated(schedule: Schedule, costs: StageCosts, unit_bytes: float = UNIT_BYTES) -> Timeline:
    """``schedule`` run by the simulator with ``costs`` (ideal runner, fixed copies); a stage keeps its activation
    (times ``unit_bytes`` when it counts micro-batches) from its forward to its weight gradient."""
    split = schedule.splits_weight_gradient
    per_device = [schedule.placement.count(d) for d in schedule.placement]
    activation = costs.activation if costs.activation is not None else tuple(1 / v for v in per_device)
    stages = tuple(StageCost(f, b if split else b + w, weight=w if split else 0.0,
                             saved_bytes=int(round(a * unit_bytes)))
                   for f, b, w, a in zip(costs.forward, costs.backward, costs.weight, activation, strict=True))
    return simulate(schedule, CostModel(stages, copy_seconds=costs.copy))


def _document(result: SearchResult, timeline: Timeline, unit: str, unit_bytes: float,
              limit: tuple[float, ...] | None) -> dict[str, Any]:
    schedule = result.schedule
    peaks = [row["peak_memory_bytes"] / unit_bytes for row in timeline.summary()["devices"]]
    return {"makespan": result.makespan, "simulated_makespan": timeline.makespan, "lower_bound": result.lower_bound,
            "gap": result.makespan / result.lower_bound - 1 if result.lower_bound > 0 else 0.0,
            "method": result.method, "optimal": result.optimal, "memory_unit": unit,
            "memory_limit": list(limit) if limit is not None else None,
            "peak_memory": list(result.peak_memory), "simulated_peak_memory": peaks,
            "named": result.named, "m": schedule.m, "n": schedule.n, "placement": list(schedule.placement),
            "schedule": schedule_text(schedule)}


def run(args: argparse.Namespace) -> int:
    """Search, simulate, print and write; return the exit status."""
    placement, costs, limit, in_bytes = _problem(args)
    out = output_folder(args, FILES)  # checked before the search: nothing is lost, nothing written on bad input
    try:
        result = search(args.chunks, placement, costs, limit, time_limit=args.time_limit, seed=args.seed,
                        solver=args.solver)
    except ValueError as exc:
        flag = "--memory-bytes" if in_bytes else "--memory-limit"
        raise CommandError(f"{flag}: {exc}" if "memory" in str(exc) else str(exc)) from None
    unit, unit_bytes = ("bytes", 1.0) if in_bytes else ("micro-batches", float(UNIT_BYTES))
    timeline = simulated(result.schedule, costs, unit_bytes)
    doc = _document(result, timeline, unit, unit_bytes, limit)
    files = [out.write_text("schedule.txt", schedule_text(result.schedule)),
             out.write_with("schedule.csv", lambda path: write_pipelining_csv(result.schedule, path, overwrite=True))]
    from gpipe.schedule.plot import plot_timeline

    files.append(out.write_with("timeline.png", lambda path: plot_timeline(timeline, path)))
    files.append(out.write_json("search.json", doc, indent=1))
    out.finish()  # every file moves into place only now (Note [all or nothing] in sim.files)
    if args.json:
        print(json_text(doc))
        return 0
    _print(result, doc, files)
    return 0


def _print(result: SearchResult, doc: dict[str, Any], files: list[str]) -> None:
    schedule = result.schedule
    where = f" on {schedule.num_devices} devices" if schedule.num_devices != schedule.n else ""
    print(f"search: m={schedule.m} micro-batches, n={schedule.n} stages{where}; {result.method}")
    limit = doc["memory_limit"]
    print(f"memory limit per device: {'none' if limit is None else ', '.join(f'{x:g}' for x in limit)}"
          f" ({doc['memory_unit']})")
    print()
    print(f"{'schedule':<22} {'makespan':>12}  {'vs searched':>11}  peak memory / why not")
    peaks = ", ".join(f"{x:.3g}" for x in result.peak_memory)
    print(f"{'searched':<22} {result.makespan:>12.6g}  {'':>11}  {peaks}")
    for name, value in result.named.items():
        if isinstance(value, str):
            print(f"{name:<22} {'-':>12}  {'':>11}  {value}")
        else:
            print(f"{name:<22} {value:>12.6g}  {value / result.makespan - 1:>+10.1%}")
    print()
    print(f"lower bound {result.lower_bound:.6g} (searched is {doc['gap']:.1%} above it); the simulator runs the "
          f"searched schedule in {doc['simulated_makespan']:.6g}")
    if schedule.m <= 16 and schedule.n <= 8:
        print()
        print(schedule.grid())
    print()
    print("wrote " + ", ".join(files), file=sys.stdout)
