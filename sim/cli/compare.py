"""``gpipe-sim compare MODULE:FUNCTION``: the simulator's prediction beside the executor's measurement, on your model.

``FUNCTION`` takes no arguments and returns ``(model, batch)``: an ``nn.Sequential`` and one sample
mini-batch (a tensor, or a tuple of tensors, batch in dimension 0). ``MODULE`` is a dotted module
importable from the current directory, or a path to a ``.py`` file::

    gpipe-sim compare mypackage.models:build --chunks 8 --balance 3,5 --devices cpu,cpu
    gpipe-sim compare examples/wide_mlp.py:build --json
    gpipe-sim compare examples/wide_mlp.py:build --schedule NAME --stages 4 --devices cpu,cpu   # 4 stages, 2 workers
    gpipe-sim compare examples/wide_mlp.py:build --schedule searched.txt   # a schedule from a file, run as it is

The same pipeline as ``gpipe-sim demo`` (:func:`sim.calibration.experiment.run`): balance (unless ``--balance``),
calibrate, simulate, run the executor for ``--steps`` steps, compare, write the files.

Note [a schedule file]: ``--schedule FILE`` is one exact schedule that both halves run (Note [a given schedule] in
:mod:`gpipe.frontend`): ``.txt`` the text form (:mod:`gpipe.schedule.text`), ``.csv`` torch pipelining's, whose
recomputes ``--checkpoint`` adds. Its ``m``, stages and (a ``.txt``'s) policy decide ``--chunks``, ``--stages`` and
``--checkpoint``, which may be left out and, given, must agree. A registered name is looked up first; argparse refuses
a word with neither suffix nor folder, listing the names, and :func:`schedule_file` another suffix, one line each.
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor, nn

from gpipe import microbatch
from gpipe.schedule import SCHEDULES, Checkpoint, Schedule, read_pipelining_csv, read_schedule, schedule_kind
from sim.calibration.experiment import Batch, Setup
from sim.calibration.machine import default_devices
from sim.cli import CommandError, processes
from sim.cli.demo import add_common_options, check_chunks, check_common, execute
from sim.cli.options import integer
from sim.cli.user_code import Target, blame, call, layer_failure, load_target
from sim.core.size import check_simulation_size

__all__ = ["add_parser", "check_runs", "load", "run", "schedule_file"]


def add_parser(subparsers: Any) -> None:
    """Register ``compare`` on the ``gpipe-sim`` subcommand parser."""
    p = subparsers.add_parser(
        "compare", help="predicted vs measured on your model (MODULE:FUNCTION returning a model and a batch)",
        description="Calibrate, simulate and run your nn.Sequential in the executor, and print the prediction "
                    "beside the measurement; write timeline.png, trace.json and report.json.",
        conflict_handler="resolve",  # --schedule below takes a file too, in place of the shared option
    )
    p.add_argument("target", metavar="MODULE:FUNCTION",
                   help="a function of no arguments returning (nn.Sequential, sample mini-batch); MODULE is a "
                        "dotted module or a path to a .py file")
    p.add_argument("--balance", default=None, metavar="LIST",
                   help="layers per partition, e.g. 3,5 (default: balance_by_time over the devices)")
    p.add_argument("--devices", default=None, metavar="LIST",
                   help="one torch device per schedule device (worker), e.g. cpu,cpu or cuda:0,cuda:1: one per "
                        "partition, or fewer for a schedule that places several stages on one device (default: the "
                        "CUDA devices when there are enough, else cpu for each partition)")
    add_common_options(p, out="compare")
    p.add_argument("--schedule", default="gpipe", metavar="NAME|FILE", choices=_NamesOrFiles(),
                   help=f"the schedule the executor runs and the simulator predicts: a registered name "
                        f"({', '.join(SCHEDULES)}; default: gpipe), or a file holding one schedule, run as it is: "
                        "FILE.txt in gpipe-sim's text form, FILE.csv in torch.distributed.pipelining's (--checkpoint "
                        "adds its recomputes); a file's micro-batches and stages set --chunks and --stages, and a "
                        ".txt's policy --checkpoint")
    p.set_defaults(func=run, chunks=None, checkpoint=None)  # Note [a schedule file]: None until settled


class _NamesOrFiles:
    """The choices of ``--schedule``: a registered name, or anything with a suffix or a folder, which
    :func:`schedule_file` reads or refuses; argparse lists the names when it refuses something else."""

    def __contains__(self, text: object) -> bool:
        if not isinstance(text, str):
            return False
        try:
            schedule_kind(text)
        except ValueError:
            return bool(Path(text).suffix) or os.sep in text
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(SCHEDULES)


def parse_balance(text: str) -> tuple[int, ...]:
    """``"3,5"`` -> ``(3, 5)``; anything but positive integers is a :class:`CommandError`."""
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise CommandError(f"--balance takes comma-separated positive integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise CommandError(f"--balance takes comma-separated positive integers, got {text!r}")
    for v in values:
        integer("--balance", v, 1)
    return values


def parse_devices(text: str) -> tuple[str, ...]:
    """``"cpu,cpu"`` -> ``("cpu", "cpu")``, each checked to be a device this machine has."""
    names = tuple(x.strip() for x in text.split(","))
    for name in names:
        try:
            device = torch.device(name)
        except RuntimeError:
            raise CommandError(f"--devices: {name!r} is not a torch device") from None
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise CommandError(f"--devices: {name!r} asked for, but CUDA is not available here")
            if device.index is not None and device.index >= torch.cuda.device_count():
                raise CommandError(f"--devices: {name!r} asked for, but there are {torch.cuda.device_count()} "
                                   "CUDA devices")
        elif device.type != "cpu":
            raise CommandError(f"--devices: {name!r}: only cpu and cuda devices are supported")
    return names


def load(target: str | Target) -> tuple[nn.Sequential, Batch]:
    """Import ``MODULE:FUNCTION`` (unless given loaded), call it, and check it returned ``(nn.Sequential, mini-batch)``.

    Raises:
        CommandError: a malformed target, a module or function that is not there, or a wrong return value.
        UserCodeError: the user's module or function raised (:mod:`sim.cli.user_code`).
    """
    loaded = target if isinstance(target, Target) else load_target(target)
    spec = loaded.spec
    result = call(loaded)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise CommandError(f"{spec} must return (nn.Sequential, sample mini-batch), got {_kind(result)}")
    model, batch = result
    if not isinstance(model, nn.Sequential):
        raise CommandError(f"{spec} must return an nn.Sequential first, got {_kind(model)}")
    if isinstance(batch, list):
        batch = tuple(batch)
    ok = isinstance(batch, Tensor) or (isinstance(batch, tuple) and batch and all(isinstance(t, Tensor)
                                                                                 for t in batch))
    if not ok:
        raise CommandError(f"{spec} must return a tensor (or a tuple of tensors) as the mini-batch, "
                           f"got {_kind(batch)}")
    first = batch if isinstance(batch, Tensor) else batch[0]
    if first.dim() == 0 or first.shape[0] < 1:
        raise CommandError(f"{spec}: the mini-batch needs a batch dimension (dimension 0) with samples")
    return model, batch


def check_runs(target: Target, model: nn.Sequential, batch: Batch, chunks: int) -> None:
    """Run one micro-batch of ``batch`` through the layers in turn, before any work, so that a layer whose input
    does not fit is named at once (:func:`sim.cli.user_code.layer_failure`: one line, or the user's traceback
    where their code raised). Without gradients, in eval mode (a batch norm takes one sample) and on a copy of
    the random state: the model, its statistics and the run's seeds are as they were.

    Raises:
        CommandError: a layer fails inside a library (the message names it).
        UserCodeError: a layer fails in the user's own code.
    """
    tensors = (batch,) if isinstance(batch, Tensor) else tuple(batch)
    rows = microbatch.sizes(tensors[0].shape[0], chunks)[0]
    x: Any = tensors[0][:rows] if isinstance(batch, Tensor) else tuple(t[:rows] for t in tensors)
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            for k, layer in enumerate(model):
                try:
                    x = layer(x)
                except Exception as error:  # noqa: BLE001 - the user's layer: theirs, or named in one line
                    raise layer_failure(target, k, layer, error) from None
    finally:
        for m, training in modes:
            m.training = training


def _kind(value: object) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    return type(value).__name__


def schedule_file(text: str, checkpoint: str | None) -> Schedule | None:
    """The schedule in the file ``--schedule`` names (Note [a schedule file]); ``None`` for a registered name.

    ``checkpoint``: the policy whose recomputes a ``.csv`` gets (``None``: ``except_last``).

    Raises:
        CommandError: neither a registered name nor a ``.txt`` or ``.csv`` file, a file that is not there, or one
            that holds no valid schedule (the message names the line, or shows the grid).
    """
    try:
        schedule_kind(text)
        return None
    except ValueError:
        pass
    path = Path(text)
    suffix = path.suffix.lower()
    if suffix not in (".txt", ".csv"):
        raise CommandError(f"--schedule {text!r} is neither a registered schedule ({', '.join(SCHEDULES)}) nor a "
                           "schedule file: FILE.txt (gpipe-sim's text form) or FILE.csv (torch pipelining's)")
    if not path.exists():  # a folder, a FIFO or a device is named by the reader (gpipe.schedule.size.bounded_text)
        raise CommandError(f"--schedule {path}: no such file")
    try:
        if suffix == ".txt":
            return read_schedule(path)
        return read_pipelining_csv(path, cast(Checkpoint, checkpoint or "except_last"))  # a choice of --checkpoint
    except ValueError as exc:  # ScheduleError too: the message shows the grid
        raise CommandError(f"--schedule {path}: {exc}") from None
    except OSError as exc:
        raise CommandError(f"--schedule {path}: {exc.strerror or exc}") from None


def _settle(args: argparse.Namespace) -> Schedule | None:
    """Note [a schedule file]: ``--chunks`` and ``--checkpoint`` from the file's schedule, or their defaults (4 and
    ``except_last``) for a name; the schedule, or ``None`` for a name.

    Raises:
        CommandError: a file whose schedule disagrees with a ``--chunks``, ``--checkpoint`` or ``--stages`` given.
    """
    given = schedule_file(args.schedule, args.checkpoint)
    if given is None:
        args.chunks = 4 if args.chunks is None else args.chunks
        args.checkpoint = "except_last" if args.checkpoint is None else args.checkpoint
        return None
    for flag, value, theirs in (("--chunks", args.chunks, given.m), ("--checkpoint", args.checkpoint, given.checkpoint),
                                ("--stages", args.stages, given.n)):
        if value is not None and value != theirs:
            raise CommandError(f"{flag} {value}, but the schedule in {args.schedule} has {flag[2:]} {theirs}: leave "
                               f"{flag} out (the file decides it) or give {flag} {theirs}")
    args.chunks, args.checkpoint = given.m, given.checkpoint
    return given


def run(args: argparse.Namespace) -> int:
    """Load the user's model, run the experiment, report; return the exit status."""
    given = _settle(args)  # Note [a schedule file]
    out = check_common(args)
    balance = parse_balance(args.balance) if args.balance is not None else None
    devices = parse_devices(args.devices) if args.devices is not None else None
    if given is not None and balance is not None and len(balance) != given.n:
        raise CommandError(f"--balance has {len(balance)} partitions but the schedule in {args.schedule} has "
                           f"{given.n} stages: give a balance of {given.n} partitions")
    if balance is not None and args.stages is not None and len(balance) != args.stages:
        raise CommandError(f"--balance has {len(balance)} partitions but --stages is {args.stages}: give one of them")
    if balance is not None and devices is not None and len(balance) < len(devices):
        raise CommandError(f"--balance has {len(balance)} partitions but --devices names {len(devices)} devices: "
                           "give at most one device per partition")
    processes.check(args, devices)
    torch.manual_seed(args.seed)
    target = load_target(args.target)
    model, batch = load(target)
    size = batch.shape[0] if isinstance(batch, Tensor) else batch[0].shape[0]
    if given is not None and given.m > size:
        raise CommandError(f"the schedule in {args.schedule} runs {given.m} micro-batches, more than the {size} "
                           "samples of the mini-batch: every micro-batch needs at least one")
    check_chunks(args.chunks, batch)
    check_runs(target, model, batch, args.chunks)
    if balance is not None and sum(balance) != len(model):
        raise CommandError(f"--balance {args.balance} sums to {sum(balance)}, but the model has {len(model)} layers")
    partitions = len(balance) if balance is not None else args.stages if args.stages is not None \
        else given.n if given is not None else len(devices) if devices is not None else 2
    if partitions > len(model):
        raise CommandError(f"{partitions} partitions for a model of {len(model)} layers")
    stages = max(partitions, args.processes or 0)  # --processes without --stages runs a stage per rank
    check_simulation_size(args.chunks, stages, given=f"--chunks {args.chunks} on {stages} stages",
                          fix="lower --chunks or --stages")  # sim.core.size: before any work
    if args.processes is not None:
        setup = Setup(chunks=args.chunks, checkpoint=args.checkpoint, schedule=given or args.schedule,
                      steps=args.steps, seed=args.seed, balance=balance,
                      stages=args.stages if balance is None else None)
        with blame(target):
            return processes.execute(functools.partial(load, args.target), setup, args,
                                     f"compare: {args.target}, {len(model)} layers", out)
    setup = Setup(chunks=args.chunks, checkpoint=args.checkpoint, schedule=given or args.schedule, steps=args.steps,
                  seed=args.seed, balance=balance, stages=None if balance is not None else partitions,
                  devices=devices or default_devices(partitions if given is None else given.num_devices))
    layers = len(model)
    with blame(target):  # an error in a layer of the user's is theirs (sim.cli.user_code)
        return execute(model, batch, setup, args, f"compare: {args.target}, {layers} layers, batch {size}", out)
