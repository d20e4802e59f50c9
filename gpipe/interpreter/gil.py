"""How often Python's interpreter lock changes hands while several workers run: Note [switch interval].

Note [switch interval]: the workers of a pipeline are threads of one process, and every Python-level
step of a task (a module's ``__call__``, a saved-tensor hook) needs the interpreter's lock, which a holder
gives up at the latest after ``sys.getswitchinterval()`` seconds (5 ms by default). Between two partitions
of small layers that is a convoy: each Python step of one worker can wait up to 5 ms for the other's.
So while two or more workers run, :class:`gpipe.GPipe` sets the interval to ``switch_interval`` (1 ms by
default; ``None`` leaves it alone) and restores it when they are done or parked: the caller's code between
the phases (the loss) runs with its own interval. On by default for every model, not by a rule: small-layer
steps gain from it, and a task of long C++ kernels holds no lock while they run, so a shorter interval
forces no hand-offs there (``benchmarks/investigations/switch_interval.py``: the ``conv`` and ``wide`` rows
show no cost beyond their run's noise; the results are in its JSON).

The interval is the process's, not the thread's: overlapping users (two pipelines at once, the pair
measurements of :mod:`sim.calibration.pairs`) share one setting, kept until the last of them leaves (the
shortest interval asked for wins meanwhile).
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["DEFAULT_SWITCH_INTERVAL", "check_switch_interval", "switch_interval"]

#: Seconds between forced hand-overs of the interpreter lock while a pipeline's workers run.
DEFAULT_SWITCH_INTERVAL = 0.001

_lock = threading.Lock()
_holders: list[float] = []  # the intervals asked for by the users inside, in entry order
_saved: float | None = None  # the interval before the first of them entered


def check_switch_interval(seconds: float | None) -> float | None:
    """``seconds`` if it is ``None`` or a positive finite number, else ``ValueError``."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or seconds <= 0:
        raise ValueError(f"switch_interval must be a positive number of seconds or None, got {seconds!r}")
    return float(seconds)


@contextmanager
def switch_interval(seconds: float | None) -> Iterator[None]:
    """Set Python's switch interval to ``seconds`` inside, restore it after (Note [switch interval])."""
    value = check_switch_interval(seconds)
    if value is None:
        yield
        return
    enter(value)
    try:
        yield
    finally:
        leave(value)


def enter(seconds: float) -> None:
    """Ask for ``seconds`` until the matching :func:`leave`; the shortest interval asked for is in force."""
    global _saved
    with _lock:
        if not _holders:
            _saved = sys.getswitchinterval()
        _holders.append(seconds)
        sys.setswitchinterval(min(_holders))


def leave(seconds: float) -> None:
    """End one :func:`enter` of ``seconds``; the last one out restores the interval from before the first."""
    with _lock:
        _holders.remove(seconds)
        if _holders:
            sys.setswitchinterval(min(_holders))
        elif _saved is not None:
            sys.setswitchinterval(_saved)
