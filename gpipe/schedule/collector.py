"""Building millions of small records with Python's cyclic garbage collector paused (Note [gc])."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["collector_paused"]

_YOUNG_LIMIT = 100_000  # Note [gc]: new objects past which a paused block moves them to the oldest generation


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Note [gc]: pause Python's cyclic garbage collector while a big schedule or timeline is built.

    A big schedule or simulation allocates millions of small objects that all stay alive (tasks,
    spans, events); the collector would rescan them again and again, which costs more than building
    them (several times as long, for a schedule as big as ``gpipe(16384, 64)``). Reference counting
    still frees everything; the collector is restored (if it was on) when the block ends. The schedule generators and
    :func:`sim.core.engine.simulate` run inside it.

    When the block leaves more than ``_YOUNG_LIMIT`` new objects, they go straight to the oldest
    generation (``gc.freeze()`` then ``gc.unfreeze()``, both documented to move objects between whole
    generations without looking at them): else the first collection after the block would traverse
    them all at once, a pause of seconds after a simulation that big, only to find them alive. A program
    that froze objects itself keeps them frozen: then the block does not do this.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if gc.get_count()[0] > _YOUNG_LIMIT and not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()
