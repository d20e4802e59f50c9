"""Import and export of ``torch.distributed.pipelining``'s schedule format: per-rank action lists and their CSV.

That library writes a schedule as one list of actions per rank, each action a word ``{stage}{type}{micro-batch}``
(``0F1``: forward of micro-batch 1 on stage 0), and saves it as CSV, one row per rank. Its compute actions map
onto this project's tasks one for one::

    theirs   F (forward)   I (input gradient)   W (weight gradient)   B (full backward)
    ours     F             B (with W tasks)     W                     B (without W tasks)

Their rank is our device, their stage our stage. Our ``R`` (recompute) has no counterpart: export drops it,
import puts one right before each backward of a micro-batch the caller's checkpoint policy checkpoints.
Pure Python (no torch): pass their ``pipeline_order`` straight in, each action reads as its ``str``.

Note [indices before tasks]: a schedule's shape comes from the largest indices its actions name, and every
stage runs one forward of each micro-batch; so a valid file of ``k`` actions has at most ``k`` stages and
``k`` micro-batches. Import checks that, on the words alone, before it builds a task or a list as long as a
stage or micro-batch count: every stage ``0..n-1`` has a rank, and every stage names as many forwards as
there are micro-batches (``0F99999999999999999999`` is refused at once, not after building every task up to
it). Then the schedule holds at most a few tasks per action, and a file of at most :data:`MAX_CSV_BYTES`
(8 MiB, about a million actions: ``gpipe(4096, 64)``'s 524,288 take 3.8 MiB) reads in seconds.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path

from gpipe.schedule.schedule import Schedule
from gpipe.schedule.size import bounded_text, replace_file
from gpipe.schedule.task import INDEX, Checkpoint, Op, Task, checkpointed

__all__ = ["COMMUNICATION", "MAX_CSV_BYTES", "from_pipelining", "read_pipelining_csv", "to_pipelining",
           "write_pipelining_csv"]

#: The largest CSV :func:`read_pipelining_csv` reads, in bytes (Note [indices before tasks]).
MAX_CSV_BYTES = 8 * 2**20
_MAX_DIGITS = 100  # an index longer than this is refused as it is read (Python's int() stops at 4,300 digits)
_SHOWN = 40  # characters of an action a message shows

#: Their action types that move or reduce data rather than compute; import skips them. Our copies follow from
#: the dependencies (the simulator and the executor place them), and we model no FSDP or data-parallel step.
COMMUNICATION = frozenset({"SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD", "REDUCE_GRAD"})
_COMPUTE = ("F", "I", "W", "B")
_ACTION = re.compile(rf"^({INDEX})([A-Z][A-Z_]*[A-Z]|[A-Z])({INDEX})?$")  # 0F1, 1SEND_F0, 2REDUCE_GRAD
_OVERLAP = re.compile(r"^\((.*)\)([A-Z_]+)$")  # (2F3;1B0)OVERLAP_F_B

Actions = Mapping[int, Sequence[object]] | Sequence[Sequence[object]]
"""Per-rank action lists: a mapping from rank to its list (their ``pipeline_order``) or a list indexed by rank.
An action is a word such as ``"0F1"``, anything whose ``str`` is one (their ``_Action``), or ``None`` (idle)."""


def to_pipelining(schedule: Schedule) -> dict[int, list[str]]:
    """``schedule`` as their per-rank compute actions: ``{rank: ["0F0", "0F1", "0I0", "0W0", ...]}``.

    ``B`` is written ``I`` when the schedule has ``W`` tasks, else ``B`` (a full backward). ``R`` tasks are
    dropped: their format has no recompute (checkpointing there is the module's own business).

    Raises:
        ValueError: the schedule runs copies of its stages (DualPipe's; Note [stage slots] in
            :mod:`gpipe.schedule.schedule`): their format runs every micro-batch through every stage.
    """
    schedule.validate()
    if schedule.copies > 1:
        raise ValueError(f"schedule {schedule.name!r} runs {schedule.copies} copies of its stages, each micro-batch "
                         "through one; torch pipelining's actions run every micro-batch through every stage, so it "
                         "has no such form: save it with write_schedule")
    backward = "I" if schedule.splits_weight_gradient else "B"
    word = {Op.F: "F", Op.B: backward, Op.W: "W"}
    return {d: [f"{t.stage}{word[t.op]}{t.microbatch}" for t in ts if t.op is not Op.R]
            for d, ts in enumerate(schedule.tasks)}


def from_pipelining(actions: Actions, checkpoint: Checkpoint = "never", name: str = "pipelining",
                    m: int | None = None) -> Schedule:
    """The :class:`Schedule` that runs their per-rank actions, each rank's compute in its order.

    ``n`` is the largest stage seen plus one, and ``m`` (unless given) the largest micro-batch plus one; the
    placement is which rank runs each stage. Idle steps (``None``, ``""``) and :data:`COMMUNICATION` are
    skipped; an ``OVERLAP_F_B`` runs its sub-actions in their order, as their default runtime does (a custom
    function there may overlap them; this schedule runs them one after the other). Note [full backward among
    split ones].

    Args:
        actions: per-rank action lists (:data:`Actions`).
        checkpoint: the policy whose checkpointed micro-batches get an ``R`` right before each ``B``.
        name: the schedule's name, for display.
        m: the micro-batch count, when known: an action outside it is named in the error.

    Raises:
        ValueError: an action this project cannot express or read (the message names it and its rank), a
            rank missing or running no stage, a stage on two ranks or on none, a forward missing (checked on
            the actions before any task is built: Note [indices before tasks]).
        ScheduleError: the actions do not make a valid schedule (a task missing or twice, a deadlock).
    """
    checkpointed(checkpoint, 0, 1)  # rejects an unknown policy before any work
    ranks = _ranks(actions)
    per_rank = [[_compute(a, r) for a in ranks[r]] for r in range(len(ranks))]
    words = [[w for ws in row for w in ws] for row in per_rank]
    kinds = {w[1] for row in words for w in row}
    split = bool(kinds & {"I", "W"})
    n = 1 + max((w[0] for row in words for w in row), default=-1)
    largest = max((w[2] for row in words for w in row), default=-1)
    if m is None:
        m = largest + 1
    elif largest >= m:
        r, (stage, kind, i) = next((r, w) for r, row in enumerate(words) for w in row if w[2] >= m)
        raise ValueError(f"rank {r}: action '{stage}{kind}{i}' is outside m={m} micro-batches (0..{m - 1})")
    ranks_of: dict[int, int] = {}  # stage -> rank; a dict, as n is not checked yet (Note [indices before tasks])
    for r, row in enumerate(words):
        if not row:
            raise ValueError(f"rank {r} runs no compute action; every rank 0..{len(words) - 1} needs a stage")
        for stage, _, _ in row:
            if ranks_of.setdefault(stage, r) != r:
                raise ValueError(f"stage {stage} runs on ranks {ranks_of[stage]} and {r}; a stage lives on one rank")
    if len(ranks_of) < n:
        raise ValueError(f"no rank runs stage {_first_absent(ranks_of)} of stages 0..{_show(str(n - 1))}")
    _check_forwards(words, m, largest)
    placement = tuple(ranks_of[j] for j in range(n))
    tasks = [_tasks(row, split, checkpoint, m) for row in words]
    return Schedule(m, n, checkpoint, placement, tuple(map(tuple, tasks)), name=name).validate()


def _first_absent(present: Collection[int]) -> int:
    """The smallest index ``>= 0`` not in ``present`` (looks at ``len(present) + 1`` numbers at most)."""
    return next(k for k in range(len(present) + 1) if k not in present)


def _check_forwards(words: list[list[tuple[int, str, int]]], m: int, largest: int) -> None:
    """Note [indices before tasks]: every stage names a forward of each micro-batch ``0..m-1``; else the
    first missing one is named, in a time linear in the words, whatever ``m`` is."""
    forwards: dict[int, set[int]] = {}
    for row in words:
        for stage, kind, i in row:
            forwards.setdefault(stage, set())
            if kind == "F":
                forwards[stage].add(i)
    for stage in sorted(forwards):
        if len(forwards[stage]) < m:
            why = ""
            if largest == m - 1:  # m was read off the actions: name the one that set it
                r, w = next((r, w) for r, row in enumerate(words) for w in row if w[2] == largest)
                why = f", as rank {r}'s action '{w[0]}{w[1]}{_show(str(w[2]))}' names the largest"
            raise ValueError(f"no action runs the forward '{stage}F{_first_absent(forwards[stage])}': every stage "
                             f"runs one forward of each micro-batch 0..{_show(str(m - 1))}{why}")


def _show(text: str) -> str:
    """``text`` as a message shows it: cut to :data:`_SHOWN` characters."""
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN - 3]}..."


# Note [full backward among split ones]: their schedules may mix full backwards (B) with split ones (I, W),
# as DualPipeV does; a Schedule splits every backward or none. A B among I and W becomes our B (their I) and
# W right after it on the same device: the same work in the same place, the W costed as the weight part of
# that backward. Export writes them as I then W, which their _merge_bw pass would merge back into one B.
def _tasks(row: list[tuple[int, str, int]], split: bool, checkpoint: Checkpoint, m: int) -> list[Task]:
    """One rank's words as our tasks: ``R`` before each checkpointed ``B``, a full backward split when needed."""
    out: list[Task] = []
    for stage, kind, i in row:
        if kind == "F":
            out.append(Task(Op.F, i, stage))
            continue
        if kind == "W":
            out.append(Task(Op.W, i, stage))
            continue
        if checkpointed(checkpoint, i, m):
            out.append(Task(Op.R, i, stage))
        out.append(Task(Op.B, i, stage))
        if kind == "B" and split:  # Note [full backward among split ones]
            out.append(Task(Op.W, i, stage))
    return out


def _ranks(actions: Actions) -> list[Sequence[object]]:
    """The per-rank lists in rank order; a mapping must hold ranks ``0..p-1``."""
    if isinstance(actions, Mapping):
        keys = sorted(actions)
        if keys != list(range(len(keys))):
            raise ValueError(f"ranks must be 0..{len(keys) - 1}, got {keys}")
        lists = [actions[k] for k in keys]
    else:
        lists = list(actions)
    if not lists:
        raise ValueError("no ranks: the schedule has no action list")
    for r, row in enumerate(lists):
        if isinstance(row, (str, bytes)) or not isinstance(row, Iterable):
            raise ValueError(f"rank {r}: expected a list of actions, got {row!r}")
    return lists


def _compute(action: object, rank: int) -> list[tuple[int, str, int]]:
    """The compute words ``(stage, type, micro-batch)`` of one action: none for an idle step or communication,
    the sub-actions of an ``OVERLAP_F_B`` in their order."""
    text = "" if action is None else str(action).strip()
    if not text:
        return []
    shown = repr(_show(text))
    overlap = _OVERLAP.match(text)
    if overlap:
        inner, kind = overlap.groups()
        if kind != "OVERLAP_F_B":
            raise ValueError(f"rank {rank}: action {shown}: sub-actions come with OVERLAP_F_B only, not "
                             f"{_show(kind)}")
        words = [_word(sub.strip(), rank, shown) for sub in inner.split(";") if sub.strip()]
        if not words or any(w is None for w in words):
            raise ValueError(f"rank {rank}: action {shown}: an OVERLAP_F_B holds compute actions (F, I, W, B) only")
        return [w for w in words if w is not None]
    word = _word(text, rank, shown)
    return [] if word is None else [word]


def _word(text: str, rank: int, whole: str) -> tuple[int, str, int] | None:
    """``(stage, type, micro-batch)`` of one plain action; ``None`` for communication. ``whole``: the action as
    messages show it (its ``repr``, cut by :func:`_show`)."""
    match = _ACTION.match(text)
    if match is None:
        raise ValueError(f"rank {rank}: not an action: {whole} (expected e.g. '0F1': stage, type, micro-batch)")
    stage, kind, microbatch = match.groups()  # microbatch None: none given
    if kind in COMMUNICATION:
        return None
    if kind not in _COMPUTE:
        raise ValueError(f"rank {rank}: action {whole}: type {_show(kind)} has no counterpart here; this project "
                         f"runs {', '.join(_COMPUTE)} and OVERLAP_F_B, and skips {', '.join(sorted(COMMUNICATION))}")
    if not microbatch:
        raise ValueError(f"rank {rank}: action {whole} names no micro-batch (expected e.g. '{_show(stage)}{kind}0')")
    if max(len(stage), len(microbatch)) > _MAX_DIGITS:
        raise ValueError(f"rank {rank}: action {whole}: an index of more than {_MAX_DIGITS} digits")
    return int(stage), kind, int(microbatch)


def write_pipelining_csv(schedule: Schedule, path: str | Path, *, overwrite: bool = False) -> Path:
    """Write ``schedule`` as their CSV (one row per rank, :func:`to_pipelining`'s actions); returns the path.

    Their ``PipelineScheduleMulti._load_csv`` reads it back. The file is written whole and moved into place, never
    through a link (Note [written whole] in :mod:`gpipe.schedule.size`).

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is not set (nothing a user has is lost unasked).
    """
    rows = to_pipelining(schedule)

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f)
            for r in range(len(rows)):
                writer.writerow(rows[r])

    return replace_file(path, write, overwrite=overwrite)


def read_pipelining_csv(path: str | Path, checkpoint: Checkpoint = "never", name: str | None = None) -> Schedule:
    """The schedule in their CSV at ``path`` (one row per rank; empty cells idle; blank lines at the end dropped,
    Note [blank lines]), by :func:`from_pipelining`.

    ``name``: the schedule's name; default the file's name without its suffix. A file of more than
    :data:`MAX_CSV_BYTES` (8 MiB) is refused before it is parsed (Note [indices before tasks]).

    Raises:
        ValueError: the file is not a regular file, is larger than :data:`MAX_CSV_BYTES`, is not UTF-8 CSV, or its
            actions cannot be read (see :func:`from_pipelining`); ``ScheduleError`` among them.
        OSError: the file cannot be opened.
    """
    source = Path(path)
    text = bounded_text(source, MAX_CSV_BYTES, expected="expected a CSV of actions",
                        too_large="the most a schedule CSV may be (MAX_CSV_BYTES in gpipe.schedule.pipelining); a "
                                  "schedule of a million actions fits")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        rows = list(reader)
    except csv.Error as error:
        raise ValueError(f"line {reader.line_num}: not CSV: {error}") from None
    while rows and _blank(rows[-1]):  # Note [blank lines]
        rows.pop()
    return from_pipelining(rows, checkpoint, name=source.stem if name is None else name)


# Note [blank lines]: each row of their CSV is a rank, an empty one a rank that runs nothing (their _load_csv
# reads it so), which this project refuses by its number. Blank lines at the end are no rank, only how a file
# or an editor ends: they are dropped. A file is UTF-8, a byte-order mark dropped, as the text form's
# (Note [a schedule file read] in gpipe.schedule.size).
def _blank(row: list[str]) -> bool:
    """A row read from an empty line, or one of spaces only."""
    return len(row) <= 1 and not "".join(row).strip()
