"""``gpipe-sim simulate --import-schedule FILE.csv`` and ``--export-schedule FILE.csv``: a schedule read from, or
written to, torch.distributed.pipelining's CSV (one row per rank, actions such as ``0F1``, ``1I0``, ``2W3``).

The format and its mapping onto this project's tasks: :mod:`gpipe.schedule.pipelining`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gpipe.schedule import Schedule, read_pipelining_csv, write_pipelining_csv
from sim.cli import CommandError
from sim.files import OutputFile

__all__ = ["add_options", "check_export", "export", "imported"]


def add_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--import-schedule`` and ``--export-schedule`` to ``parser``."""
    parser.add_argument("--import-schedule", default=None, metavar="FILE.csv",
                        help="simulate the schedule in this torch.distributed.pipelining CSV (one row per rank, "
                             "actions such as 0F1, 1I0, 2W3) instead of --schedule: its stages, micro-batches "
                             "and placement replace --stages and --chunks; --checkpoint adds recomputes "
                             "(default: never); at most 8 MiB")
    parser.add_argument("--export-schedule", default=None, metavar="FILE.csv",
                        help="write the simulated schedule as a torch.distributed.pipelining CSV, recomputes "
                             "left out; an existing file (or a link) is refused unless --force (a link always)")


def check_export(args: argparse.Namespace) -> OutputFile | None:
    """The ``--export-schedule`` file, checked before any work (:class:`sim.files.OutputFile`: not a folder or a
    link, not an existing file without ``--force``, in a folder that exists); ``None`` without the option."""
    if args.export_schedule is None:
        return None
    return OutputFile(args.export_schedule, force=args.force, flag="--export-schedule", example="schedule.csv")


def imported(args: argparse.Namespace) -> Schedule | None:
    """The schedule ``--import-schedule`` names, under ``--checkpoint`` (default ``never``); ``None`` without it."""
    if args.import_schedule is None:
        return None
    path = Path(args.import_schedule)
    if not path.exists():  # a folder, a FIFO or a device is named by the reader (gpipe.schedule.size.bounded_text)
        raise CommandError(f"--import-schedule {path}: no such file")
    try:
        return read_pipelining_csv(path, args.checkpoint or "never")
    except ValueError as exc:  # ScheduleError too: the message shows the grid
        raise CommandError(f"--import-schedule {path}: {exc}") from None
    except OSError as exc:
        raise CommandError(f"--import-schedule {path}: {exc.strerror or exc}") from None


def export(out: OutputFile | None, schedule: Schedule) -> str | None:
    """Write ``schedule`` beside ``out`` (from :func:`check_export`); ``out.finish()`` moves it into place, with the
    run's other files (Note [all or nothing] in :mod:`sim.files`). Returns the path it will have."""
    if out is None:
        return None
    return out.stage(lambda tmp: write_pipelining_csv(schedule, tmp, overwrite=True))
