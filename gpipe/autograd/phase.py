"""Which phase the current thread is in: a checkpointed forward, or the recompute before a backward.

The flags are thread-local because each device's worker runs on its own thread; a layer that must
behave differently on recompute (``DeferredBatchNorm`` must not count a micro-batch twice) asks
:func:`is_recomputing`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["checkpointing", "is_checkpointing", "is_recomputing", "recomputing"]

_local = threading.local()


def is_checkpointing() -> bool:
    """True inside the forward of a checkpointed micro-batch (activations are not kept for backward)."""
    return bool(getattr(_local, "checkpointing", False))


def is_recomputing() -> bool:
    """True inside the recompute of a checkpointed forward, right before its backward."""
    return bool(getattr(_local, "recomputing", False))


@contextmanager
def checkpointing() -> Iterator[None]:
    """Mark the current thread as running a checkpointed forward."""
    prev = is_checkpointing()
    _local.checkpointing = True
    try:
        yield
    finally:
        _local.checkpointing = prev


@contextmanager
def recomputing() -> Iterator[None]:
    """Mark the current thread as running a recompute."""
    prev = is_recomputing()
    _local.recomputing = True
    try:
        yield
    finally:
        _local.recomputing = prev
