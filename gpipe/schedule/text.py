"""The project's own text form of a schedule: its shape in a header, then each device's task list, one per line.

::

    # gpipe-sim schedule
    name: 1f1b
    microbatches: 4
    stages: 2
    checkpoint: never
    placement: 0 1
    device 0: F0@0 F1@0 B0@0 F2@0 B1@0 F3@0 B2@0 B3@0
    device 1: F0@1 B0@1 F1@1 B1@1 F2@1 B2@1 F3@1 B3@1

The first line names the format; then one ``key: value`` line each, in any order: ``name`` (optional, default
``custom``), ``microbatches`` (``m``), ``stages`` (``n``), ``checkpoint`` (a policy), ``placement`` (stage ``j``'s
device, ``n`` numbers), ``copies`` (optional, default 1: the copies of the model's stages the ``n`` stages hold, Note
[stage slots] in :mod:`gpipe.schedule.schedule`; written only when more than 1), one ``device d:`` line for each device
``0 .. p-1`` with its tasks in their order (:class:`~gpipe.schedule.Task`'s text form, ``F2@1``), and, only for a
schedule with overlapped pairs (Note [overlapped pairs] in :mod:`gpipe.schedule.schedule`), ``pairs: F5@0+B2@3 ...``,
each pair's tasks joined by ``+``. Blank lines and other lines that start with ``#`` are comments. Pure Python (no
torch); torch pipelining's CSV is :mod:`gpipe.schedule.pipelining`.

Note [an exact round trip]: the text holds every field of a :class:`Schedule` (its name, shape, copies, policy,
placement, each device's list in order and each pair in order), so ``parse_schedule(schedule_text(s)) == s``
for every valid schedule: a schedule saved, hand-edited and read back is the schedule the simulator predicted and
the executor runs, not a regeneration of it. A name is one printable line without spaces at its ends, so that
it reads back the same; :func:`schedule_text` refuses any other.

Note [counts before tasks]: a valid schedule runs a forward and a backward of each micro-batch on each stage of its
route (``n / copies`` stages), so ``m n / copies`` is less than the task words in the file, and ``n`` is the length of
the placement line. The parser checks both on the words before the validator builds anything as long as ``m n /
copies`` (a task or two missing is the validator's to name): a header that claims ``microbatches:
99999999999999999999`` is refused at once, naming its line. With the size cap, :data:`MAX_TEXT_BYTES` (16 MiB, about
two million tasks), a file reads in seconds.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import cast

from gpipe.schedule.schedule import Schedule
from gpipe.schedule.size import bounded_text, replace_file
from gpipe.schedule.task import CHECKPOINT_MODES, INDEX, Checkpoint, Task

__all__ = ["HEADER", "MAX_TEXT_BYTES", "parse_schedule", "read_schedule", "schedule_text", "write_schedule"]

#: The first line of every schedule in the text form.
HEADER = "# gpipe-sim schedule"
#: The largest file :func:`read_schedule` reads, in bytes (Note [counts before tasks]).
MAX_TEXT_BYTES = 16 * 2**20
_MAX_DIGITS = 100  # a number longer than this is refused as it is read (Python's int() stops at 4,300 digits)
_SHOWN = 40  # characters of a word a message shows
_KEYS = ("name", "microbatches", "stages", "copies", "checkpoint", "placement", "device D", "pairs")


class _Lines:
    """The ``key: value`` lines of a text, each key once, each value with the number of its line."""

    def __init__(self, text: str) -> None:
        self.values: dict[str, tuple[int, str]] = {}
        self.devices: dict[int, tuple[int, str]] = {}
        header = False
        for number, raw in enumerate(text.split("\n"), start=1):
            line = raw.rstrip("\r").strip()
            if not header:
                if not line:
                    continue
                if line != HEADER:
                    raise ValueError(f"line {number}: not a schedule in gpipe-sim's text form: it starts with the "
                                     f"line {HEADER!r} (torch pipelining's CSV reads with read_pipelining_csv)")
                header = True
                continue
            if not line or line.startswith("#"):
                continue
            key, colon, value = line.partition(":")
            key = " ".join(key.split())
            if not colon:
                raise ValueError(f"line {number}: expected 'key: value' ({', '.join(_KEYS)}), got {_show(line)!r}")
            if key.startswith("device "):
                d = _number(key[len("device "):], number, "a device", minimum=0)
                if d in self.devices:
                    raise ValueError(f"line {number}: device {d} again (first on line {self.devices[d][0]}); give "
                                     "each device one line")
                self.devices[d] = (number, value)
                continue
            if key not in _KEYS:
                raise ValueError(f"line {number}: unknown key {_show(key)!r}; the keys are {', '.join(_KEYS)}")
            if key in self.values:
                raise ValueError(f"line {number}: {key!r} again (first on line {self.values[key][0]})")
            self.values[key] = (number, value.strip())
        if not header:
            raise ValueError(f"an empty text: a schedule starts with the line {HEADER!r}")

    def get(self, key: str) -> tuple[int, str]:
        if key not in self.values:
            raise ValueError(f"no '{key}:' line; a schedule names its {key}")
        return self.values[key]


def schedule_text(schedule: Schedule) -> str:
    """``schedule`` in the text form (the module docstring shows it); :func:`parse_schedule` reads it back equal.

    Raises:
        ScheduleError: the schedule is not valid (nothing invalid is written).
        ValueError: its name is not one printable line without spaces at its ends (Note [an exact round trip]).
    """
    schedule.validate()
    name = schedule.name
    if not name or not name.isprintable() or name != name.strip():
        raise ValueError(f"schedule name {_show(name)!r} cannot be written as text: a name is one printable line, "
                         "without spaces at its ends; rename it (dataclasses.replace(s, name=...))")
    lines = [HEADER, f"name: {name}", f"microbatches: {schedule.m}", f"stages: {schedule.n}"]
    lines += [f"copies: {schedule.copies}"] if schedule.copies > 1 else []
    lines += [f"checkpoint: {schedule.checkpoint}", f"placement: {' '.join(map(str, schedule.placement))}"]
    lines += [f"device {d}: {' '.join(map(str, ts))}" for d, ts in enumerate(schedule.tasks)]
    if schedule.pairs:
        lines.append("pairs: " + " ".join(f"{a}+{b}" for a, b in schedule.pairs))
    return "\n".join(lines) + "\n"


def parse_schedule(text: str) -> Schedule:
    """The schedule in ``text`` (the text form), validated.

    Raises:
        ValueError: the text is not the text form; the message names the line and what is wrong there
            (Note [counts before tasks]).
        ScheduleError: the tasks do not make a valid schedule (a task missing or twice, on the wrong device, a
            deadlock: the message shows the grid), a :class:`ValueError` too.
    """
    lines = _Lines(text)
    name = lines.values.get("name", (0, "custom"))[1] or "custom"
    m_line, m_text = lines.get("microbatches")
    n_line, n_text = lines.get("stages")
    m, n = _number(m_text, m_line, "the micro-batch count"), _number(n_text, n_line, "the stage count")
    k_line, k_text = lines.values.get("copies", (0, "1"))
    copies = _number(k_text, k_line, "the copies of the stages")
    if copies > n or n % copies:
        raise ValueError(f"line {k_line}: {_show(k_text)} copies of the stages must divide line {n_line}'s "
                         f"{_show(n_text)} stages")
    c_line, checkpoint = lines.get("checkpoint")
    if checkpoint not in CHECKPOINT_MODES:
        raise ValueError(f"line {c_line}: checkpoint {_show(checkpoint)!r}; use one of {', '.join(CHECKPOINT_MODES)}")
    p_line, p_text = lines.get("placement")
    words = p_text.split()
    if len(words) != n:  # Note [counts before tasks]: n is bounded by this line
        raise ValueError(f"line {p_line}: the placement names {len(words)} devices, one per stage, but line {n_line} "
                         f"says {_show(n_text)} stages")
    placement = [_number(w, p_line, "a device", minimum=0) for w in words]
    if not lines.devices:
        raise ValueError("no 'device 0:' line; a schedule lists each device's tasks, one line per device")
    count = len(lines.devices)
    for d in sorted(lines.devices):
        if d >= count:
            absent = next(k for k in range(count) if k not in lines.devices)
            raise ValueError(f"line {lines.devices[d][0]}: device {d}, but no line for device {absent}; number the "
                             f"devices 0..{count - 1}")
    tasks = [_tasks(*lines.devices[d]) for d in range(count)]
    total = sum(map(len, tasks))
    if m * (n // copies) > total:  # Note [counts before tasks]: m is bounded by the task words
        raise ValueError(f"line {m_line}: {_show(m_text)} micro-batches on {n // copies} stages need a forward and a "
                         f"backward of each of {_show(str(m * (n // copies)))} (micro-batch, stage) pairs, but the "
                         f"device lines list {total} tasks")
    for j, d in enumerate(placement):
        if d >= count:
            raise ValueError(f"line {p_line}: stage {j} is placed on device {d}, but the devices are 0..{count - 1}")
    pairs = _pairs(*lines.values["pairs"]) if "pairs" in lines.values else ()
    schedule = Schedule(m, n, cast(Checkpoint, checkpoint), tuple(placement), tuple(tasks), name=name, pairs=pairs,
                        copies=copies)
    return schedule.validate()


def write_schedule(schedule: Schedule, path: str | Path, *, overwrite: bool = False) -> Path:
    """Write ``schedule`` in the text form (:func:`schedule_text`) to ``path``; returns the path. The file is written
    whole and moved into place, never through a link (Note [written whole] in :mod:`gpipe.schedule.size`).

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is not set (nothing a user has is lost unasked).
        ScheduleError, ValueError: as :func:`schedule_text`, before the file is opened.
    """
    text = schedule_text(schedule)
    return replace_file(path, lambda tmp: tmp.write_text(text, encoding="utf-8", newline="\n"), overwrite=overwrite)


def read_schedule(path: str | Path) -> Schedule:
    """The schedule in the text file at ``path``, by :func:`parse_schedule`.

    A file of more than :data:`MAX_TEXT_BYTES` (16 MiB) is refused before it is parsed (Note [counts before
    tasks]).

    Raises:
        ValueError: the file is not a regular file, is larger than :data:`MAX_TEXT_BYTES`, is not UTF-8 text (a
            byte-order mark at its start is dropped), or is not a valid schedule in the text form (the message
            names the line; see :func:`parse_schedule`).
        OSError: the file cannot be opened.
    """
    text = bounded_text(path, MAX_TEXT_BYTES, expected="expected a schedule in gpipe-sim's text form",
                        too_large="the most a schedule's text may be (MAX_TEXT_BYTES in gpipe.schedule.text); a "
                                  "schedule of two million tasks fits")
    return parse_schedule(text)


def _number(text: str, line: int, what: str, minimum: int = 1) -> int:
    """``text`` as a decimal integer ``>= minimum``, else a ``ValueError`` naming ``line`` and ``what`` it is."""
    word = text.strip()
    if not re.fullmatch(INDEX, word) or len(word) > _MAX_DIGITS or int(word) < minimum:
        low = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"line {line}: {what} is {low} (at most {_MAX_DIGITS} digits), got {_show(word)!r}")
    return int(word)


def _task(word: str, line: int) -> Task:
    if len(word) > 2 * _MAX_DIGITS + 2:
        raise ValueError(f"line {line}: {_show(word)!r}: a task's indices have at most {_MAX_DIGITS} digits")
    try:
        return Task.parse(word)
    except ValueError as error:
        raise ValueError(f"line {line}: {error}") from None


def _tasks(line: int, value: str) -> tuple[Task, ...]:
    return tuple(_task(w, line) for w in value.split())


def _pairs(line: int, value: str) -> tuple[tuple[Task, Task], ...]:
    pairs = []
    for word in value.split():
        first, plus, second = word.partition("+")
        if not plus:
            raise ValueError(f"line {line}: {_show(word)!r} is not a pair (expected e.g. 'F3@1+B0@2': two tasks "
                             "of one device that run together)")
        pairs.append((_task(first, line), _task(second, line)))
    return tuple(pairs)


def _show(text: str) -> str:
    """``text`` as a message shows it: cut to :data:`_SHOWN` characters."""
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN - 3]}..."
