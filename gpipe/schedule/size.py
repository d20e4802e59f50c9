"""What a schedule of ``m`` micro-batches on ``n`` stages takes in memory, checked against this machine before it
is built.

A schedule's tasks grow with ``m * n``; a number typed by mistake (``chunks=10**9``) would spend a minute
building tasks before the kernel or a ``MemoryError`` stops it. :func:`check_schedule_size` refuses it at once,
in one line that names the estimate, what is available and the argument to lower::

    check_schedule_size(chunks, len(balance), "chunks=")   # GPipe, DistributedGPipe
    check_simulation_size(m, n, given=..., fix=...)         # the simulator's own estimate (sim.core.size)

Pure Python (no torch). Where the memory comes from is an argument (``available``), so tests pass a small figure.
"""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["PAIR_BYTES", "Available", "available_bytes", "bounded_text", "check_memory", "check_schedule_size",
           "format_bytes", "schedule_bytes"]

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


def bounded_text(path: str | os.PathLike[str], limit: int, encoding: str, *, too_large: str, expected: str) -> str:
    """A schedule file's text, read at most ``limit`` bytes however large the file (or a device) is, so a size cap
    holds before anything is parsed.

    Raises:
        ValueError: the file is larger than ``limit`` ("the file is larger than N MiB, " then ``too_large``), or
            it is not text in ``encoding`` ("not UTF-8 text (byte K cannot be read): " then ``expected``).
        OSError: the file cannot be opened.
    """
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"the file is larger than {limit // 2**20} MiB, {too_large}")
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as error:
        raise ValueError(f"not UTF-8 text (byte {error.start} cannot be read): {expected}") from None
