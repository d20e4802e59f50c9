"""What a schedule of ``m`` micro-batches on ``n`` stages takes in memory, checked against this machine before it
is built.

A schedule's tasks grow with ``m * n``; a number typed by mistake (``chunks=10**9``) would spend a minute
building tasks before the kernel or a ``MemoryError`` stops it. :func:`check_schedule_size` refuses it at once,
in one line that names the estimate, what is available and the argument to lower::

    check_schedule_size(chunks, len(balance), "chunks=")   # GPipe, DistributedGPipe
    check_simulation_size(m, n, given=..., fix=...)         # the simulator's own estimate (sim.core.size)

A schedule file is bounded too: :func:`bounded_text` reads at most a cap, from a regular file only (Note [a
schedule file read]); :func:`replace_file` and :func:`write_beside` write one whole, never through a link (Note
[written whole]), for every writer of gpipe and sim.

Pure Python (no torch). Where the memory comes from is an argument (``available``), so tests pass a small figure.
"""

from __future__ import annotations

import codecs
import errno
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

__all__ = ["PAIR_BYTES", "Available", "available_bytes", "bounded_text", "check_memory", "check_schedule_size",
           "format_bytes", "replace_file", "schedule_bytes", "write_beside"]

# Note [bytes per pair]: a schedule holds two to four tasks per micro-batch and stage (F and B; R where
# checkpointed; W where the backward is split), each a 56-byte record (Note [fast frozen records] in
# gpipe.schedule.task) and an 8-byte place in its device's tuple; the validator's tables add a few bytes per
# task, and a generator's lists before they become tuples more at its peak. Every registered schedule under
# every checkpoint policy, traced by tracemalloc while built and validated (m=512 on n=8, m=1 on n=20,000, and
# inside GPipe's constructor, m=100,000 on n=4), peaked at 1,150 bytes per pair (dualpipe-v, whose overlapped
# pairs are built beside the lists) and kept at most 380; the others peaked under 650. PAIR_BYTES rounds the peak up.
#: Bytes per (micro-batch, stage) pair at the peak of building and validating a schedule (Note [bytes per pair]).
PAIR_BYTES = 1_200

Available = Callable[[], int | None]
"""Where the memory figure comes from: a function of no arguments returning bytes, or ``None`` when unknown."""


def available_bytes() -> int | None:
    """The memory a new allocation can take on this machine now, in bytes: ``MemAvailable`` of ``/proc/meminfo``
    (Linux: free memory plus the caches the kernel can drop), else the physical memory (``os.sysconf``), else
    ``None``. A container's own limit (a cgroup's) is not read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the kernel writes kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def schedule_bytes(m: int, n: int) -> int:
    """Bytes that building and validating a schedule of ``m`` micro-batches on ``n`` stages takes at its peak
    (Note [bytes per pair]); a product of integers, so any size is estimated at once."""
    return m * n * PAIR_BYTES


def format_bytes(count: float) -> str:
    """``count`` bytes as a person reads them: ``512 B``, ``3.2 MiB``, ``1.8 TiB``."""
    for unit, size in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:.3g} {unit}" if count < 1000 * 2**50 else f"{count / size:.3e} {unit}"
    return f"{int(count)} B"


def check_memory(estimate: int, what: str, fix: str, available: Available | None = None) -> None:
    """Refuse work whose ``estimate`` (bytes) is more than the memory ``available()`` says this machine has.

    Args:
        estimate: the bytes the work would take at its peak.
        what: the work, for the message (``"--chunks 1000000000 on --stages 4: the simulation"``).
        fix: what would shrink it (``"lower --chunks or --stages"``).
        available: the memory source; ``None``: :func:`available_bytes`. One returning ``None`` lets any size pass.

    Raises:
        ValueError: one line naming the work, the estimate, the memory available and the fix.
    """
    have = (available or available_bytes)()
    if have is None or estimate <= have:
        return
    raise ValueError(f"{what} needs about {format_bytes(estimate)} of memory, more than the {format_bytes(have)} "
                     f"available on this machine: {fix}")


def check_schedule_size(m: int, n: int, name: str = "chunks=", available: Available | None = None) -> None:
    """Refuse a schedule of ``m`` micro-batches on ``n`` stages whose tasks would not fit in memory
    (:func:`schedule_bytes` against :func:`check_memory`), before any task is built.

    Args:
        m: micro-batches.
        n: stages.
        name: the argument that set ``m``, for the message: ``"chunks="`` (a keyword argument) or a flag
            (``"--chunks"``).
        available: the memory source; ``None``: :func:`available_bytes`.

    Raises:
        ValueError: the schedule would not fit (one line: ``chunks=1000000000 on 2 stages: the schedule needs
            about 2.18 TiB of memory, more than the 21.9 GiB available on this machine: lower chunks=``).
    """
    given = f"{name}{m}" if name.endswith("=") else f"{name} {m}"
    check_memory(schedule_bytes(m, n), f"{given} on {n} stage{'s' if n != 1 else ''}: the schedule ({m * n:,} "
                 f"micro-batch-stage pairs)", f"lower {name}", available)


# Note [a schedule file read]: the file is UTF-8, and a byte-order mark at its start is dropped (editors on
# Windows write one); both formats read through here, so they take the same bytes. Only a regular file is read:
# a folder, a FIFO or a device is named as what it is, a FIFO is never waited on (its kind is checked before it
# is opened, and it is opened without blocking), and a device such as /dev/zero is never read up to the cap.
def bounded_text(path: str | os.PathLike[str], limit: int, *, too_large: str, expected: str) -> str:
    """A schedule file's text (Note [a schedule file read]), read at most ``limit`` bytes however large the file
    is, so a size cap holds before anything is parsed.

    Raises:
        ValueError: the file is not a regular file ("is a folder, not a file: " then ``expected``), is larger
            than ``limit`` ("the file is larger than N MiB, " then ``too_large``), or is not UTF-8 text ("not
            UTF-8 text (byte K cannot be read): " then ``expected``).
        OSError: the file cannot be opened.
    """
    _refuse_special(os.stat(path).st_mode, expected)
    # O_NONBLOCK: a FIFO put in the file's place since the stat opens at once, and is refused below
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    with open(fd, "rb") as f:
        _refuse_special(os.fstat(fd).st_mode, expected)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"the file is larger than {limit // 2**20} MiB, {too_large}")
    skip = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"not UTF-8 text (byte {error.start + skip} cannot be read): {expected}") from None


def _refuse_special(mode: int, expected: str) -> None:
    """Refuse a file of ``mode`` that is not a regular file, naming what it is (Note [a schedule file read])."""
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise ValueError(f"is a folder, not a file: {expected}")
    kinds = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    what = next((name for test, name in kinds if test(mode)), "a special file")
    raise ValueError(f"is {what}, not a regular file: {expected}")


# Note [written whole]: a file is written into a new temporary beside it, then renamed onto its name. The
# temporary is made with O_CREAT | O_EXCL under a random name, so it is a regular file this process made, never a
# link or a file planted there; the rename replaces a link at the final name, never writes through it. A reader
# never sees half a file, and a write that fails (a full disk) leaves no temporary and the old file untouched.
def write_beside(path: str | os.PathLike[str], write: Callable[[Path], object]) -> Path:
    """Call ``write`` with the path of a new, empty regular file beside ``path`` (Note [written whole]); return
    that temporary's path, for the caller to move into place.

    The temporary is named ``.NAME.RANDOM.partial.SUFFIX``: the same suffix, as a writer such as matplotlib picks
    its format by it. ``write`` may open it by path (it truncates our own file) or replace it.

    Raises:
        whatever ``write`` raises, and OSError; the temporary is removed first.
    """
    final = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = final.with_name(f".{final.stem}.{secrets.token_hex(4)}.partial{final.suffix}")
        try:
            os.close(os.open(tmp, flags, 0o666))  # 0o666 less the umask: the mode an ordinary write gives
            break
        except FileExistsError:  # a name taken, a link there included: draw another
            continue
    try:
        write(tmp)
        if not stat.S_ISREG(os.lstat(tmp).st_mode):  # swapped for a link meanwhile: never moved into place
            raise OSError(f"{tmp} is no longer the regular file made for the write")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def replace_file(path: str | os.PathLike[str], write: Callable[[Path], object], *, overwrite: bool = True) -> Path:
    """Write ``path`` whole through ``write`` (called with a temporary path, :func:`write_beside`) and move it into
    place (Note [written whole]); return ``path``.

    Raises:
        FileExistsError: ``path`` exists (a link included) and ``overwrite`` is not set; checked before ``write``
            is called and again, atomically, as the file is put in place.
        whatever ``write`` raises, and OSError; nothing is left behind.
    """
    final = Path(path)
    if not overwrite and os.path.lexists(final):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(final))
    tmp = write_beside(final, write)
    try:
        if overwrite:
            os.replace(tmp, final)
        else:
            _move_new(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return final


def _move_new(tmp: Path, final: Path) -> None:
    """Move ``tmp`` to ``final`` unless ``final`` exists: a hard link fails on any file there, a link included."""
    try:
        os.link(tmp, final)
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(final)) from None
    except OSError:  # a file system without hard links: checked, then renamed
        if os.path.lexists(final):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(final)) from None
        os.replace(tmp, final)
        return
    tmp.unlink()
