"""``gpipe-sim plan``: what-if capacity planning, from FLOP counts to a ranked table of pipeline configurations.

The model is counted on the meta device (nothing is allocated, so ``gpt:175b`` works), every
configuration of stages, replicas, chunks, checkpointing and schedule for the given GPU counts is
balanced and simulated on the hardware entry, and the table lists the fastest first, the best one
that fits marked ``*``::

    gpipe-sim plan --model gpt:1.3b --batch 512 --gpus 1,2,4,8 --hardware h100-sxm --link nvlink --price 2.5

``--model`` takes a built-in (``gpt:SIZE``, ``resnet101``, ``unet:B,C``, ``amoebanet:L,D``) or a
user's ``MODULE:FUNCTION`` (a dotted module, or ``path/to/file.py``), whose function takes no
arguments and returns an ``nn.Sequential`` and a sample input (batch in dimension 0).
"""

from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

from torch import nn

from gpipe.schedule import CHECKPOINT_MODES, SCHEDULES
from sim.cli import CommandError
from sim.cli.options import MAX_INT, add_force, integer, number, output_folder, schedules_help
from sim.cli.user_code import Target, blame, call, load_target
from sim.files import json_text
from sim.planning.costs_from_flops import training_policy
from sim.planning.flops import ModelProfile, count_layers
from sim.planning.hardware import get_device
from sim.planning.models import get_model
from sim.planning.plan import Plan, PlanRow, check_request, default_training, plan, planned_schedules, resolve_link

__all__ = ["add_parser", "load_model", "run"]

BUILTIN_FAMILIES = ("gpt", "resnet101", "resnet", "unet", "amoebanet")
BUILTINS = "gpt:SIZE, resnet101, unet:B,C, amoebanet:L,D"
GiB = 2**30
FILES = ("plan.json", "throughput.png", "memory.png")  # what --out receives
MAX_PRICE = 1e9  # USD per GPU-hour; far above any price, and every row's cost stays finite


def add_parser(subparsers: Any) -> None:
    """Register ``plan`` on the ``gpipe-sim`` subcommand parser."""
    p = subparsers.add_parser("plan", help="what-if capacity planning: sweep pipeline configurations of a model",
                              description=__doc__.split("\n\n", 1)[0].split(": ", 1)[1] if __doc__ else None)
    p.add_argument("--model", required=True, metavar="SPEC",
                   help="gpt:SIZE, resnet101, unet:B,C, amoebanet:L,D, or MODULE:FUNCTION")
    p.add_argument("--batch", required=True, type=int, metavar="N", help="global batch, samples per step")
    p.add_argument("--gpus", required=True, metavar="LIST", help="GPU counts to try, e.g. 1,2,4,8")
    p.add_argument("--hardware", required=True, metavar="NAME", help="catalog device (see gpipe-sim hardware)")
    p.add_argument("--link", default="pcie", metavar="NAME",
                   help="catalog link, or nvlink/pcie for the generation of the device (default: pcie)")
    p.add_argument("--price", type=float, default=None, metavar="USD", help="price per GPU-hour, to cost each row")
    p.add_argument("--chunks", default=None, metavar="LIST",
                   help="micro-batch counts to try (default: powers of two up to the batch, at most 128)")
    p.add_argument("--checkpoint", default=",".join(CHECKPOINT_MODES), metavar="LIST",
                   help=f"checkpoint policies to try (default: {','.join(CHECKPOINT_MODES)})")
    p.add_argument("--schedule", default=",".join(planned_schedules()), metavar="LIST",
                   help=f"schedules to try, of {schedules_help()} (default: {','.join(planned_schedules())})")
    p.add_argument("--training", default=None, metavar="POLICY",
                   help="precision and optimizer, e.g. bf16-adam, fp32-sgd (default: the device's 16-bit "
                        "dtype with Adam, else fp32-adam)")
    p.add_argument("--efficiency", type=float, default=None, metavar="F",
                   help="fraction of peak compute and bandwidth reached, replacing the catalog's")
    p.add_argument("--objective", choices=("throughput", "cost"), default="throughput",
                   help="what 'best' means (cost needs --price; default: throughput)")
    p.add_argument("--top", type=int, default=20, metavar="K", help="rows to print (default: 20; 0: all)")
    p.add_argument("--json", action="store_true", help="print the whole plan as one JSON object")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write plan.json, throughput.png and memory.png here; a folder that already holds them is "
                        "refused unless --force")
    add_force(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _ints(flag: str, text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CommandError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values:
        raise CommandError(f"{flag} needs at least one value")
    for v in values:  # the lower bounds are sim.planning.plan.check_request's
        integer(flag, v, -MAX_INT - 1)
    return values


def _words(flag: str, text: str, known: tuple[str, ...]) -> list[str]:
    words = [w.strip() for w in text.split(",") if w.strip()]
    for w in words:
        if w not in known:
            raise CommandError(f"{flag}: unknown value {w!r}; use {', '.join(known)}")
    return words


def load_model(spec: str) -> tuple[str, nn.Sequential, Any]:
    """The model named by ``spec``: a built-in (on meta) or a user's ``MODULE:FUNCTION``.

    Returns:
        ``(name, module, sample)``.

    Raises:
        KeyError: an unknown built-in name.
        CommandError: a ``MODULE:FUNCTION`` that cannot be imported or returns something else.
    """
    name, module, sample, _ = _load(spec)
    return name, module, sample


def _load(spec: str) -> tuple[str, nn.Sequential, Any, Target | None]:
    """:func:`load_model`, and the user's target (``None`` for a built-in)."""
    family = spec.strip().lower().partition(":")[0]
    if family in BUILTIN_FAMILIES:
        entry = get_model(spec)
        return entry.name, entry.module("meta"), entry.sample(2, "meta"), None
    module_name, sep, func_name = spec.rpartition(":")
    if not sep or not module_name or not func_name:
        get_model(spec)  # raises KeyError listing the built-ins
        raise CommandError(f"unknown model {spec!r}")
    try:
        target = load_target(spec, "--model: ")
    except CommandError as exc:
        raise CommandError(f"{exc}; known built-ins: {BUILTINS}") from None
    result = call(target)
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Sequential)):
        raise CommandError(f"--model: {spec} must return (nn.Sequential, sample input), got {type(result).__name__}")
    return spec, result[0], result[1], target


def _bytes(n: float) -> str:
    return f"{n / GiB:.1f}"


def _row_line(r: PlanRow, price: bool) -> str:
    balance = ",".join(map(str, r.balance))
    balance = balance if len(balance) <= 28 else balance[:25] + "..."
    line = (f"{'*' if r.best else ' '} {r.gpus:>4} {r.stages:>3}x{r.replicas:<3} {r.chunks:>6} {r.microbatch:>5} "
            f"{r.checkpoint:>11} {r.schedule:>5} {r.throughput:>11.2f} {r.step_seconds:>9.4g} "
            f"{r.bubble_fraction:>6.1%} {_bytes(r.peak_memory_bytes):>8} {'yes' if r.fits else 'OOM':>4}")
    if price:
        line += f" {r.cost_per_million:>9.2f}" if r.cost_per_million is not None else f" {'':>9}"
    return line + f"  {balance}"


def print_table(result: Plan, top: int) -> None:
    """Print the plan as a table, fastest first, ``top`` rows (the best row always among them)."""
    price = result.price_per_gpu_hour is not None
    rows = sorted(result.rows, key=lambda r: (-r.fits, -r.throughput))
    shown = rows if top <= 0 else rows[:top]
    if result.best is not None and result.best not in shown:
        shown.append(result.best)
    print(f"{result.model}: batch {result.batch} on {result.device} ({_bytes(result.device_memory_bytes)} GiB), "
          f"link {result.link}, training {result.training}; {len(result.rows)} configurations")
    head = (f"  {'gpus':>4} {'pp x dp':<7} {'chunks':>6} {'mb':>5} {'checkpoint':>11} {'sched':>5} "
            f"{'samples/s':>11} {'step (s)':>9} {'bubble':>6} {'GiB/dev':>8} {'fits':>4}")
    print(head + (f" {'$/M samp':>9}" if price else "") + "  balance")
    for r in shown:
        print(_row_line(r, price))
    if len(shown) < len(rows):
        print(f"  ... {len(rows) - len(shown)} more (--top 0 shows all, --json gives every row)")
    best = result.best
    if best is None:
        print("nothing fits in device memory: try more GPUs, more chunks with checkpointing, or a smaller batch")
    else:
        print(f"best: {best.gpus} GPUs as {best.stages} stages x {best.replicas} replicas, {best.chunks} chunks, "
              f"{best.schedule}, checkpoint {best.checkpoint}: {best.throughput:.2f} samples/s")


def run(args: argparse.Namespace) -> int:
    """Count the model, sweep, print the table (or JSON) and write the files; return the exit status."""
    integer("--batch", args.batch, -MAX_INT - 1)  # check_request below says what a batch needs
    integer("--top", args.top, -MAX_INT - 1)
    gpus = _ints("--gpus", args.gpus)
    chunks = _ints("--chunks", args.chunks) if args.chunks is not None else None
    if args.price is not None:
        number("--price", args.price, unit="USD per GPU-hour", maximum=MAX_PRICE)
    checkpoints = _words("--checkpoint", args.checkpoint, CHECKPOINT_MODES)
    schedules = _words("--schedule", args.schedule, tuple(SCHEDULES))
    device = get_device(args.hardware)
    if args.efficiency is not None:
        if not 0 < args.efficiency <= 1:
            raise CommandError(f"--efficiency must be in (0, 1], got {args.efficiency}")
        device = replace(device, efficiency=args.efficiency)
    training = training_policy(args.training) if args.training else default_training(device)
    device.achievable_flops(training.compute)  # KeyError now if the device lacks the dtype
    if args.objective == "cost" and args.price is None:
        raise CommandError("--objective cost needs --price")
    check_request(args.batch, gpus, chunks)  # before the (seconds-long) count
    link = resolve_link(args.link, device)
    out = output_folder(args, FILES) if args.out is not None else None
    name, module, sample, target = _load(args.model)
    with blame(target) if target is not None else nullcontext():  # the user's layers run on meta here
        profile: ModelProfile = count_layers(module, sample, dtype=training.torch_dtype)
    result = plan(profile, args.batch, device, gpus, link, training=training, chunks=chunks,
                  checkpoints=checkpoints, schedules=schedules, price_per_gpu_hour=args.price,
                  objective=args.objective, model_name=name,
                  progress=not args.no_progress and sys.stderr.isatty())
    if out is not None:
        from sim.planning.plan_plot import plot_memory, plot_throughput

        written = out.write_json("plan.json", result.to_dict(), indent=1)
        out.write_with("throughput.png", lambda path: plot_throughput(result, path))
        out.write_with("memory.png", lambda path: plot_memory(result, path=path))
        out.finish()
    if args.json:
        print(json_text(result.to_dict()))
        return 0
    print_table(result, args.top)
    if out is not None:
        print(f"wrote {written}, throughput.png, memory.png")
    return 0
