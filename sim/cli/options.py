"""Option values every command checks the same way: integers in range, finite numbers, the output folder; the
registered schedules, for ``--schedule``.

Each check raises :class:`~sim.cli.CommandError` (one line, exit status 2) naming the flag, before any work.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable, Iterator

from gpipe.schedule import SCHEDULES, schedule_kind
from sim.cli import CommandError
from sim.files import OutputFolder

__all__ = ["MAX_INT", "MAX_SECONDS", "add_force", "add_out", "integer", "number", "number_list", "output_folder",
           "ScheduleNames", "schedule_names", "schedules_help", "seed"]

MAX_INT = 2**63 - 1  # integers reach torch and numpy as signed 64-bit C integers
MAX_SECONDS = 1e15  # 30 million years: a sum over any schedule of such seconds stays finite
SEEDS = (-(2**63), 2**64 - 1)  # what torch.manual_seed takes

FORCE_HELP = ("replace the files of an earlier run in the output folder, and remove those of its files this run "
              "does not write again; without it, a folder that holds a file this run writes, or one an earlier "
              "gpipe-sim run wrote, is refused. Files gpipe-sim did not write are never removed")


def integer(flag: str, value: int, minimum: int, maximum: int = MAX_INT) -> int:
    """``value`` if ``minimum <= value <= maximum``, else a :class:`CommandError` naming ``flag``."""
    if minimum <= value <= maximum:
        return value
    if value < minimum and maximum == MAX_INT:
        raise CommandError(f"{flag} must be >= {minimum}, got {value}")
    raise CommandError(f"{flag} {value} is out of range: it takes integers from {minimum} to {maximum}")


def seed(flag: str, value: int) -> int:
    """A seed torch can take."""
    return integer(flag, value, *SEEDS)


def number(flag: str, value: float, *, unit: str, positive: bool = False, maximum: float = MAX_SECONDS) -> float:
    """``value`` if finite, ``>= 0`` (``> 0`` when ``positive``) and at most ``maximum``; else a
    :class:`CommandError` naming ``flag`` (``unit`` says what the number counts, for the message)."""
    if math.isnan(value) or math.isinf(value) or value < 0 or (positive and value == 0):
        raise CommandError(f"{flag} must be a finite number of {unit} {'> 0' if positive else '>= 0'}, got {value}")
    if value > maximum:
        raise CommandError(f"{flag} {value:g} is out of range: at most {maximum:g} {unit}")
    return value


def number_list(flag: str, text: str | float, count: int, *, unit: str, what: str = "stage",
                positive: bool = False, maximum: float = MAX_SECONDS) -> tuple[float, ...]:
    """``count`` numbers from ``text``: one value for all, or one per ``what`` separated by commas, each checked
    by :func:`number`; else a :class:`CommandError` naming ``flag``, the count it takes and what it got."""
    words = [str(text)] if isinstance(text, (int, float)) else [w.strip() for w in str(text).split(",")]
    if any(not w for w in words):
        raise CommandError(f"{flag} takes one number or {count} separated by commas (one per {what}), got {text!r}")
    try:
        values = [float(w) for w in words]
    except ValueError:
        raise CommandError(f"{flag} takes numbers of {unit}, one for all or one per {what}, got {text!r}") from None
    if len(values) not in (1, count):
        raise CommandError(f"{flag} takes one value or {count} (one per {what}), got {len(values)}: {text!r}")
    for value in values:
        number(flag, value, unit=unit, positive=positive, maximum=maximum)
    return tuple(values * count if len(values) == 1 else values)


def add_force(parser: argparse.ArgumentParser) -> None:
    """The ``--force`` flag of a command that writes files (Note [ours] in :mod:`sim.files`)."""
    parser.add_argument("--force", action="store_true", help=FORCE_HELP)


def add_out(parser: argparse.ArgumentParser, default: str, files: str) -> None:
    """``--out`` with a default folder, and ``--force``: left out, ``--out`` is a fresh folder named after
    ``default`` (Note [fresh folder] in :mod:`sim.files`); ``files`` names what goes there, for the help."""
    parser.add_argument("--out", default=None, metavar="DIR",
                        help=f"where {files} go (default: ./{default} if it is free, else the first free "
                             f"./{default}-2, ./{default}-3, ..., so a second run never touches the first's; with "
                             f"--force, ./{default} itself); a folder named here that already holds an earlier "
                             "run's files is refused unless --force")
    parser.set_defaults(out_default=default)
    add_force(parser)


def schedules_help() -> str:
    """The registered schedules (:data:`gpipe.schedule.SCHEDULES`), ``name (description)`` each, for the help
    of a ``--schedule`` option."""
    text = "; ".join(f"{k.name} ({k.description})" for k in SCHEDULES.values())
    return text.replace("%", "%%")  # argparse formats help with %


class ScheduleNames:
    """The choices of a ``--schedule`` that takes a name: a registered one, with options where it takes them
    (``interleaved-1f1b:round=4``; :func:`gpipe.schedule.schedule_kind`); argparse lists the bare names when it
    refuses another word."""

    def __contains__(self, text: object) -> bool:
        try:
            schedule_kind(text)  # type: ignore[arg-type]
        except ValueError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(SCHEDULES)


def schedule_names(flag: str, text: str) -> list[str]:
    """The schedules a comma-separated ``text`` names, each registered (options included), else a
    :class:`CommandError` naming ``flag`` with what :func:`~gpipe.schedule.schedule_kind` said."""
    words = [w.strip() for w in text.split(",") if w.strip()]
    if not words:
        raise CommandError(f"{flag} names no schedule; use {', '.join(SCHEDULES)}")
    for w in words:
        try:
            schedule_kind(w)
        except ValueError as exc:
            raise CommandError(f"{flag}: {exc}") from None
    return words


def output_folder(args: argparse.Namespace, names: Iterable[str]) -> OutputFolder:
    """The folder ``--out`` names, checked now, before any work (:class:`sim.files.OutputFolder`).

    With ``--out`` left out, the command's default folder (:func:`add_out`), fresh unless ``--force``, which
    replaces an earlier run's files there as it would in a folder the user names.
    """
    if args.out is None:
        return OutputFolder(args.out_default, names, force=args.force, fresh=not args.force)
    return OutputFolder(args.out, names, force=args.force)
