"""CPU cores per worker: pin the thread that runs a partition (and the thread that profiles it) to cores.

Note [pinned workers]: on a CPU device every worker thread computes on the machine's cores, and the
operating system moves threads between them as it likes. On a shared (virtual) machine the cores are
not equally fast from moment to moment: one core can run at a fraction of its speed for a while when
another does not. A step that puts its two workers on whichever cores the
scheduler picks, and a profile that ran on whichever core the profiling thread was on, then sample
different machines. Pinning each partition's worker to its own cores (``GPipe(..., cpu_affinity=...)``)
and profiling each partition on the same cores (:func:`gpipe.profiling.profile.profile_blocks`'s ``affinity``)
makes them sample the same one; it also spares a worker the cost of migrating between cores.

Affinity is per thread on Linux (``os.sched_setaffinity(0, ...)`` sets the calling thread's), and a new
thread starts with its creator's. Elsewhere (macOS, Windows) there is no such call, and asking for it
is an error rather than silently unpinned.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager

__all__ = ["Cores", "available_cores", "check_affinity", "pinned", "supported"]

Cores = Collection[int]


def supported() -> bool:
    """Whether this platform can pin a thread to cores (Linux)."""
    return hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


def available_cores() -> list[int]:
    """The cores this process may run on, in order (every core the OS reports where affinity is unknown)."""
    if supported():
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def check_affinity(affinity: Sequence[Cores | None] | None, partitions: int) -> list[frozenset[int] | None] | None:
    """Validate one set of cores (or ``None``: unpinned) per partition; ``None`` for no pinning at all.

    Raises:
        TypeError: not a list of core sets.
        ValueError: the wrong length, an empty set, or a core this process may not use; any pinning where
            the platform cannot pin threads.
    """
    if affinity is None:
        return None
    if isinstance(affinity, (str, bytes, int)):
        raise TypeError(f"cpu_affinity must be a list with one set of cores per partition, got {affinity!r}")
    values = list(affinity)
    if len(values) != partitions:
        raise ValueError(f"cpu_affinity has {len(values)} entries for {partitions} partitions; give one set of "
                         "cores (or None) per partition")
    if any(v is not None for v in values) and not supported():
        raise ValueError("cpu_affinity needs os.sched_setaffinity (Linux); this platform cannot pin threads")
    allowed = set(available_cores())
    result: list[frozenset[int] | None] = []
    for k, cores in enumerate(values):
        if cores is None:
            result.append(None)
            continue
        try:
            chosen = frozenset(cores)
        except TypeError:
            raise TypeError(f"cpu_affinity[{k}] must be a set of core numbers, got {cores!r}") from None
        if not chosen or any(isinstance(c, bool) or not isinstance(c, int) for c in chosen):
            raise ValueError(f"cpu_affinity[{k}] must be a non-empty set of core numbers, got {cores!r}")
        if not chosen <= allowed:
            raise ValueError(f"cpu_affinity[{k}] names cores {sorted(chosen - allowed)} that this process cannot "
                             f"use; available: {sorted(allowed)}")
        result.append(chosen)
    return result


@contextmanager
def pinned(cores: Cores | None) -> Iterator[None]:
    """Run the block with the calling thread on ``cores`` (``None``: leave it alone), then restore its cores."""
    if cores is None or not supported():
        yield
        return
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, previous)
