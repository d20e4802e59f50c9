"""``gpipe-sim simulate``: simulate one schedule from explicit per-stage costs and report the timeline.

Each cost is one value for every stage or one per stage (``--forward-time 2,1,1,2``); ``--devices P`` places the
stages by the schedule's layout (default: one per stage). Copies between devices are priced in one of three ways, first
match wins::

    --copy-time S                         every copy takes S seconds
    --activation-bytes B (or --link ...)  latency + B / bandwidth of --link (default pcie4-x16), or of
                                          the link given by --bandwidth [--latency]
    neither                               copies are free (the closed forms hold exactly)

``--communication-time`` gives each task seconds on the network (a mixture of experts' all-to-all): the output
reports them and how many no task's compute hides (``all_to_all`` in the JSON, :mod:`sim.core.exposure`).

``--hardware NAME`` names a catalog device, for display only (the header, and each device's peak memory
as a fraction of its capacity); it changes no time. Files, in ``--out``, each up to a number of spans (one per
task and per timed copy); a bigger run skips them with a note, unless ``--all-files``::

    timeline.png   the Gantt chart                          up to PLOT_SPAN_LIMIT  (4,000) spans
    trace.json     Chrome/Perfetto trace                    up to TRACE_SPAN_LIMIT (250,000) spans
    timeline.json  every span and memory sample             up to TRACE_SPAN_LIMIT   (the summary needs none)
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gpipe.schedule import CHECKPOINT_MODES, SCHEDULES, Schedule, schedule_kind
from gpipe.schedule.timeline import Timeline
from gpipe.schedule.trace import chrome_trace
from sim.cli import CommandError, schedule_files
from sim.cli.options import MAX_SECONDS, add_out, integer, number, number_list, output_folder, schedules_help
from sim.core.config import SimConfig
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate
from sim.core.exposure import Exposure, exposure
from sim.core.link import LinkSpec
from sim.core.size import SPANS_PER_PAIR, TALK_SPANS_PER_PAIR, check_simulation_size
from sim.files import OutputFolder, json_text
from sim.planning.hardware.catalog import DeviceSpec, get_device, get_link

__all__ = ["add_parser", "run"]

DEFAULT_LINK = "pcie4-x16"
PLOT_SPAN_LIMIT = 4000  # a Gantt chart with more bars than this takes long to draw and shows little
# trace.json and timeline.json hold every span: past this (about 40 MB of trace) writing them takes longer
# than simulating, and a trace viewer opens them slowly to show more spans than anyone scrolls through
TRACE_SPAN_LIMIT = 250_000
GRID_LIMIT = (16, 8)  # print the schedule grid up to this many micro-batches and stages
FILES = ("trace.json", "timeline.json", "timeline.png")  # what a run may write into --out


def add_parser(subparsers: Any) -> None:
    """Register ``simulate`` on the ``gpipe-sim`` subcommand parser."""
    p = subparsers.add_parser(
        "simulate", help="simulate a pipeline schedule from explicit costs",
        description="Simulate one schedule (costs one for all stages or one per stage) and report makespan, bubble, "
                    "utilisation and peak memory; write a Gantt chart and a Chrome trace.",
        epilog="Copies: --copy-time wins; else --activation-bytes/--link/--bandwidth price them by a link; "
               "else they are free.",
    )
    p.add_argument("--schedule", default="gpipe", metavar="NAME",  # checked by schedule_kind, with its options
                   help=f"the schedule: {schedules_help()}; a schedule's options follow its name, e.g. "
                        "interleaved-1f1b:round=8 (default: gpipe)")
    p.add_argument("--stages", type=int, default=4, metavar="N", help="pipeline stages (default: 4)")
    p.add_argument("--devices", type=int, default=None, metavar="P",
                   help="devices, the stages placed by the schedule's layout (default: one per stage)")
    p.add_argument("--chunks", type=int, default=8, metavar="M", help="micro-batches (default: 8)")
    p.add_argument("--checkpoint", choices=CHECKPOINT_MODES, default=None,
                   help="checkpoint policy (default: the schedule's own, "
                        + ", ".join(f"{k.name}: {k.default_checkpoint}" for k in SCHEDULES.values()) + ")")
    p.add_argument("--forward-time", default="1", metavar="LIST",
                   help="seconds of one forward per micro-batch, one for every stage or one per stage separated by "
                        "commas (default: 1)")
    p.add_argument("--backward-time", default="2", metavar="LIST",
                   help="seconds of one backward, its input-gradient part where --weight-time is given; one or one "
                        "per stage (default: 2)")
    p.add_argument("--weight-time", default="0", metavar="LIST",
                   help="seconds of the weight-gradient part of a backward: a W task where the schedule splits "
                        "the backward (zb-h1, zb-v), else added to the backward; one or one per stage (default: 0)")
    p.add_argument("--recompute-time", default=None, metavar="LIST",
                   help="seconds of one recompute, one or one per stage (default: the forward time)")
    p.add_argument("--communication-time", default="0", metavar="LIST",
                   help="seconds of each forward, recompute and backward spent waiting on the network (a mixture of "
                        "experts' all-to-all), not computing: a task alone takes its compute plus this, an overlapped "
                        "pair (dualpipe-v) hides one task's behind the other's compute; one or one per stage "
                        "(default: 0)")
    p.add_argument("--copy-time", type=float, default=None, metavar="S", help="seconds of every copy between devices")
    p.add_argument("--activation-bytes", type=int, default=0, metavar="B",
                   help="bytes of the activation a stage sends on (and keeps, as the next stage's input, "
                        "for a checkpointed micro-batch); prices copies by the link")
    p.add_argument("--saved-bytes", type=int, default=0, metavar="B",
                   help="bytes a stage keeps for backward per micro-batch without checkpointing (default: 0)")
    p.add_argument("--model-state-bytes", type=int, default=0, metavar="B",
                   help="bytes of parameters, gradients and optimizer state per stage (default: 0)")
    p.add_argument("--link", default=None, metavar="NAME",
                   help=f"catalog link that prices copies (default: {DEFAULT_LINK}; see gpipe-sim hardware)")
    p.add_argument("--bandwidth", type=float, default=None, metavar="BYTES_PER_S",
                   help="a custom link's bandwidth instead of --link")
    p.add_argument("--latency", type=float, default=None, metavar="S", help="a custom link's latency (default: 0)")
    p.add_argument("--hardware", default=None, metavar="NAME",
                   help="catalog device, for display: peak memory as a fraction of its capacity")
    p.add_argument("--no-copy-streams", action="store_true", help="copies run on the compute streams")
    p.add_argument("--no-fork-join", action="store_true",
                   help="backward order not enforced: gradient copies wait for the next backward")
    p.add_argument("--lockstep", action="store_true", help="the forward runs in lockstep clock cycles")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    schedule_files.add_options(p)
    add_out(p, "out", "timeline.png, trace.json and timeline.json")
    p.add_argument("--all-files", action="store_true",
                   help=f"write the files however many spans (default: timeline.png up to {PLOT_SPAN_LIMIT:,} "
                        f"spans, trace.json and timeline.json up to {TRACE_SPAN_LIMIT:,})")
    p.set_defaults(func=run)


def _link(args: argparse.Namespace) -> LinkSpec | None:
    """The link that prices copies, or ``None`` when copies are fixed or free."""
    if args.copy_time is not None:
        return None
    if args.bandwidth is not None:
        number("--bandwidth", args.bandwidth, unit="bytes/s", positive=True, maximum=float("inf"))
        return LinkSpec("custom", args.latency or 0.0, args.bandwidth, "from --bandwidth/--latency")
    if args.latency is not None:
        raise CommandError("--latency needs --bandwidth (or use --link NAME)")
    if args.link is not None or args.activation_bytes:
        return get_link(args.link or DEFAULT_LINK)
    return None


def _schedule(args: argparse.Namespace) -> Schedule:
    """The schedule of ``--chunks`` over ``--stages`` on ``--devices`` (placed by the schedule's layout).

    Raises:
        CommandError: more than one stage per device for a schedule without a layout.
    """
    kind = schedule_kind(args.schedule)
    if args.devices is not None:
        if kind.place is None and args.devices != args.stages:
            several = ", ".join(k.name for k in SCHEDULES.values() if k.place is not None) or "none registered"
            raise CommandError(f"--schedule {kind.name} runs one stage per device: use --devices {args.stages} (or "
                               f"leave it out), or a schedule that places several stages per device: {several}")
    return kind(args.chunks, args.stages, args.checkpoint, devices=args.devices)  # checkpoint None: its own


def build(args: argparse.Namespace) -> tuple[Schedule, CostModel, SimConfig, DeviceSpec | None]:
    """Check the arguments and turn them into a schedule, a cost model, a configuration and a device.

    Raises:
        CommandError: a bad number (the message names the flag).
        KeyError: an unknown link or device (the message lists the known ones).
        ValueError: a run that would not fit in this machine's memory (:func:`check_size`).
    """
    integer("--stages", args.stages, 1)
    integer("--chunks", args.chunks, 1)
    if args.devices is not None:
        integer("--devices", args.devices, 1, args.stages)
    for flag in ("copy_time", "latency"):
        if getattr(args, flag) is not None:
            number("--" + flag.replace("_", "-"), getattr(args, flag), unit="seconds")
    for flag in ("activation_bytes", "saved_bytes", "model_state_bytes"):
        integer("--" + flag.replace("_", "-"), getattr(args, flag), 0)
    device = get_device(args.hardware) if args.hardware is not None else None
    link = _link(args)
    if link is not None and not link.transfer_seconds(args.activation_bytes) <= MAX_SECONDS:
        by = "--bandwidth" if args.bandwidth is not None else f"--link {link.name}"
        raise CommandError(f"a copy of --activation-bytes {args.activation_bytes} over {by} takes "
                           f"{link.transfer_seconds(args.activation_bytes):.3g} s, more than {MAX_SECONDS:g}")
    priced = bool(args.copy_time) or link is not None
    if args.import_schedule is None:  # Note [bytes of a simulation] in sim.core.size: refused before it is built
        check_size(args, args.chunks, args.stages, args.devices or args.stages, priced,
                   f"--chunks {args.chunks} on --stages {args.stages}", "lower --chunks or --stages")
    # after the size check: a list as long as --stages
    times = {flag: number_list("--" + flag.replace("_", "-"), getattr(args, flag), args.stages, unit="seconds")
             for flag in ("forward_time", "backward_time", "weight_time", "recompute_time", "communication_time")
             if getattr(args, flag) is not None}
    schedule = schedule_files.imported(args) or _schedule(args)
    if args.import_schedule is not None:  # a file of at most 8 MiB: its shape is known once it is read
        check_size(args, schedule.m, schedule.n, schedule.num_devices, priced,
                   f"--import-schedule {args.import_schedule} (m={schedule.m}, n={schedule.n})",
                   "import a schedule of fewer micro-batches or stages")
    if args.import_schedule is not None and schedule.n != args.stages:
        listed = [f"--{f.replace('_', '-')}" for f in times if len(set(times[f])) > 1]
        if listed:
            raise CommandError(f"{', '.join(listed)} give one value per stage of --stages {args.stages}, but "
                               f"--import-schedule {args.import_schedule} has {schedule.n} stages: give one value "
                               "for all, or --stages to match")
        times = {f: (v[0],) * schedule.n for f, v in times.items()}
    stages = []
    for j in range(schedule.n):
        forward, weight = times["forward_time"][j], times["weight_time"][j]
        # a schedule that does not split the backward runs its input and weight gradient as one task
        backward = times["backward_time"][j] + (0.0 if schedule.splits_weight_gradient else weight)
        recompute = times["recompute_time"][j] if "recompute_time" in times else None
        stages.append(StageCost(forward, backward, recompute, weight=weight, send_bytes=args.activation_bytes,
                                saved_bytes=args.saved_bytes, checkpoint_bytes=args.activation_bytes,
                                parameter_bytes=args.model_state_bytes, communication=times["communication_time"][j]))
    copy_seconds = args.copy_time if args.copy_time is not None else (None if link is not None else 0.0)
    cost = CostModel(tuple(stages), copy_seconds=copy_seconds)
    config = SimConfig(link=link, copy_streams=not args.no_copy_streams,
                       enforce_backward_order=not args.no_fork_join, lockstep_forward=args.lockstep)
    return schedule, cost, config, device


def check_size(args: argparse.Namespace, m: int, n: int, devices: int, priced: bool, given: str, fix: str) -> None:
    """Refuse a run of ``m`` micro-batches on ``n`` stages that would not fit in memory, the files it writes
    included (Note [bytes of a simulation] in :mod:`sim.core.size`): ``given`` names what set the shape, ``fix``
    what would shrink it. ``priced``: copies take time, so each device may draw two more rows (its copy streams).

    Raises:
        ValueError: one line (exit status 2).
    """
    check_simulation_size(m, n, given=given, fix=fix)
    # at most; given communication (a list of zeros counts, which overestimates), an all-to-all span per F, R and B
    # too, on a row of its own (Note [communication spans] in sim.core.overlap)
    talks = args.communication_time != "0"
    spans = (SPANS_PER_PAIR + (TALK_SPANS_PER_PAIR if talks else 0)) * m * n
    written = spans if args.all_files else min(spans, TRACE_SPAN_LIMIT)
    plotted = args.all_files or 2 * m * n <= PLOT_SPAN_LIMIT  # every pair has an F and a B span at least
    rows = devices * ((3 if priced else 1) + (1 if talks else 0))
    check_simulation_size(m, n, given=given, fix="leave out --all-files" if args.all_files else fix,
                          written_spans=written, plot_rows=rows if plotted else 0,
                          plot_spans=(spans if args.all_files else min(spans, PLOT_SPAN_LIMIT)) if plotted else 0)


def _copies(cost: CostModel, config: SimConfig) -> str:
    if cost.copy_seconds is not None:
        return "free" if cost.copy_seconds == 0 else f"{cost.copy_seconds:.6g} s each"
    assert config.link is not None
    return f"{config.link.name}: {config.link.transfer_seconds(cost.stages[0].send_bytes):.6g} s each"


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.4g} {unit}"
    return f"{int(n)} B"


def _all_to_all(talks: Exposure) -> str:
    """One line: the all-to-all seconds of all devices, those exposed and those hidden (:mod:`sim.core.exposure`)."""
    return (f"all-to-all {talks.total_communication:.6g} s on the network: {talks.total_exposed:.6g} s exposed (no "
            f"task computing), {talks.total_communication - talks.total_exposed:.6g} s hidden under another task's "
            "compute")


def write_files(timeline: Timeline, out: OutputFolder, *, plot_limit: int | None = PLOT_SPAN_LIMIT,
                trace_limit: int | None = TRACE_SPAN_LIMIT) -> dict[str, str]:
    """Write ``trace.json`` and ``timeline.json`` (up to ``trace_limit`` spans) and ``timeline.png`` (up to
    ``plot_limit``) into ``out``; a limit of ``None`` writes the file however large. Returns the paths written."""
    spans = len(timeline.spans)
    files: dict[str, str] = {}
    if trace_limit is None or spans <= trace_limit:
        files["trace"] = out.write_json("trace.json", chrome_trace(timeline))
        files["timeline"] = out.write_json("timeline.json", timeline.to_dict(), indent=1)
    if plot_limit is None or spans <= plot_limit:
        from gpipe.schedule.plot import plot_timeline

        files["plot"] = out.write_with("timeline.png", lambda path: plot_timeline(timeline, path))
    out.finish()  # a stale timeline.png of an earlier, smaller run goes (Note [ours] in sim.files)
    return files


def skipped_note(files: dict[str, str], spans: int, plot_limit: int, trace_limit: int) -> str | None:
    """One line naming the files :func:`write_files` skipped, and the flag that writes them; ``None``: none."""
    skipped = ([f"timeline.png (more than {plot_limit:,} spans)"] if "plot" not in files else []) \
        + ([f"trace.json and timeline.json (more than {trace_limit:,})"] if "trace" not in files else [])
    if not skipped:
        return None
    where = "; open trace.json in https://ui.perfetto.dev" if "trace" in files else ""
    return f"(skipped {', '.join(skipped)}: this run has {spans:,} spans; --all-files writes them{where})"


def run(args: argparse.Namespace) -> int:
    """Simulate, print the summary (or one JSON object) and write the files; return the exit status."""
    export = schedule_files.check_export(args)  # the files, checked before any work
    schedule, cost, config, device = build(args)
    out = output_folder(args, FILES)
    timeline = simulate(schedule, cost, config)
    limits = (None, None) if args.all_files else (PLOT_SPAN_LIMIT, TRACE_SPAN_LIMIT)
    schedule_files.export(export, schedule)  # written first, moved into place last: Note [all or nothing] in sim.files
    try:
        files = write_files(timeline, out, plot_limit=limits[0], trace_limit=limits[1])
    except BaseException:
        if export is not None:
            export.discard()
        raise
    if export is not None:
        files["schedule"] = export.finish()
    note = None if args.all_files else skipped_note(files, len(timeline.spans), PLOT_SPAN_LIMIT, TRACE_SPAN_LIMIT)
    summary = timeline.summary()  # Note [metrics in one pass] in gpipe.schedule.timeline
    model_state, talks = timeline.meta["model_state_bytes"], exposure(timeline)
    for row in summary["devices"]:
        row["model_state_bytes"] = model_state[row["device"]]
        row["all_to_all_seconds"] = talks.communication[row["device"]]
        row["all_to_all_exposed"] = talks.exposed[row["device"]]
        if device is not None:
            row["memory_fraction"] = (row["peak_memory_bytes"] + row["model_state_bytes"]) / device.memory_bytes
    if args.json:
        doc = {**summary, "schedule": schedule.name, "m": schedule.m, "n": schedule.n,
               "checkpoint": schedule.checkpoint, "copies": _copies(cost, config),
               "copy_streams": config.copy_streams, "fork_join": config.enforce_backward_order,
               "lockstep": config.lockstep_forward, "hardware": device.name if device else None, "files": files,
               "all_to_all": {"seconds": talks.total_communication, "exposed": talks.total_exposed}}
        print(json_text(doc))
        if note is not None:
            print(note, file=sys.stderr)  # stdout holds the JSON object alone
        return 0
    placed = f" on {schedule.num_devices} devices" if schedule.num_devices != schedule.n else ""
    print(f"{schedule.name} schedule: m={schedule.m} micro-batches, n={schedule.n} stages{placed}, "
          f"checkpoint={schedule.checkpoint}" + (f", on {device.name}" if device else ""))
    print(f"copies: {_copies(cost, config)}; copy streams {'on' if config.copy_streams else 'off'}, "
          f"fork/join {'on' if config.enforce_backward_order else 'off'}, "
          f"lockstep {'on' if config.lockstep_forward else 'off'}")
    print(f"makespan {timeline.makespan:.6g} s, bubble fraction {timeline.bubble_fraction():.4f} "
          f"({timeline.bubble_fraction():.1%} idle on average)")
    if talks.total_communication:
        print(_all_to_all(talks))
    print()
    header = f"{'device':>6}  {'busy (s)':>10}  {'utilisation':>11}  {'peak saved':>11}  {'model state':>11}"
    print(header + (f"  {'of ' + device.name:>14}" if device else "")
          + (f"  {'a2a exposed (s)':>15}" if talks.total_communication else ""))
    for row in summary["devices"]:
        line = (f"{row['device']:>6}  {row['busy']:>10.6g}  {row['utilisation']:>11.1%}  "
                f"{_bytes(row['peak_memory_bytes']):>11}  {_bytes(row['model_state_bytes']):>11}")
        if device is not None:
            line += f"  {row['memory_fraction']:>14.1%}"
        if talks.total_communication:
            line += f"  {row['all_to_all_exposed']:>15.6g}"
        print(line)
    if schedule.m <= GRID_LIMIT[0] and schedule.n <= GRID_LIMIT[1]:
        print()
        print("schedule (one step per task):")
        print(schedule.grid())
    print()
    if files:
        print("wrote " + ", ".join(files.values()))
    if note is not None:
        print(note)
    return 0
