"""What a simulation of ``m`` micro-batches on ``n`` stages takes in memory, estimated from the shape alone, so
a command refuses a run that would not fit before it builds anything (:mod:`gpipe.schedule.size` checks it).

Note [bytes of a simulation]: a simulation's memory is a sum of shares that the shape alone decides, so any size is
estimated at once: per (micro-batch, stage) pair, the schedule's tasks and, at the peak, the simulator's tables, spans
and memory samples (:data:`PAIR_BYTES`, at least what building the schedule takes); per stage, its rows of the
per-stage tables, its device's process and the summary's row (:data:`STAGE_BYTES`); per span written to
``trace.json`` or ``timeline.json``, the document and its text (:data:`FILE_SPAN_BYTES`); per row and per bar of
``timeline.png`` (:data:`PLOT_ROW_BYTES`, :data:`PLOT_SPAN_BYTES`). Each constant is the largest its share was
measured at on this project's runs (peak resident memory, and tracemalloc over every registered schedule), rounded
up: refusing a run that would just have fit costs less than running the machine out of memory. A run has at most
:data:`SPANS_PER_PAIR` spans per pair: four tasks (F, R, B, W) and two copies, and :data:`TALK_SPANS_PER_PAIR` more
where the tasks communicate (the all-to-all of F, R and B: Note [communication spans] in :mod:`sim.core.overlap`).
"""

from __future__ import annotations

from gpipe.schedule.size import PAIR_BYTES as SCHEDULE_PAIR_BYTES
from gpipe.schedule.size import Available, check_memory

__all__ = ["FILE_SPAN_BYTES", "PAIR_BYTES", "PLOT_ROW_BYTES", "PLOT_SPAN_BYTES", "SPANS_PER_PAIR", "STAGE_BYTES",
           "TALK_SPANS_PER_PAIR", "check_simulation_size", "simulation_bytes"]

#: Bytes per (micro-batch, stage) pair: the schedule and the simulation's state at its peak (Note [bytes of a
#: simulation]); at least what building the schedule takes (:data:`gpipe.schedule.size.PAIR_BYTES`).
PAIR_BYTES = max(2_000, SCHEDULE_PAIR_BYTES)
STAGE_BYTES = 6_000  #: bytes per stage, besides its pairs
FILE_SPAN_BYTES = 2_000  #: bytes per span written to trace.json or timeline.json
PLOT_ROW_BYTES = 400_000  #: bytes per row of timeline.png
PLOT_SPAN_BYTES = 6_000  #: bytes per bar of timeline.png
SPANS_PER_PAIR = 6  #: at most: F, R, B, W and two copies
TALK_SPANS_PER_PAIR = 3  #: at most, where tasks communicate: the all-to-all of F, R and B


def simulation_bytes(m: int, n: int, *, written_spans: int = 0, plot_rows: int = 0, plot_spans: int = 0) -> int:
    """Bytes a simulation of ``m`` micro-batches on ``n`` stages takes at its peak (Note [bytes of a simulation]),
    with ``written_spans`` spans written to JSON files and a chart of ``plot_rows`` rows and ``plot_spans`` bars;
    integer arithmetic, so any size is estimated at once."""
    return (m * n * PAIR_BYTES + n * STAGE_BYTES + written_spans * FILE_SPAN_BYTES + plot_rows * PLOT_ROW_BYTES
            + plot_spans * PLOT_SPAN_BYTES)


def check_simulation_size(m: int, n: int, *, given: str, fix: str, written_spans: int = 0, plot_rows: int = 0,
                          plot_spans: int = 0, available: Available | None = None) -> None:
    """Refuse a simulation that would not fit in this machine's memory, before anything is built.

    Args:
        m: micro-batches.
        n: stages.
        given: what set the shape, for the message (``"--chunks 1000000000 on --stages 4"``).
        fix: what would shrink it (``"lower --chunks or --stages"``).
        written_spans, plot_rows, plot_spans: the files' share (:func:`simulation_bytes`).
        available: the memory source; ``None``: :func:`gpipe.schedule.size.available_bytes`.

    Raises:
        ValueError: one line naming the shape, the estimate, the memory available and the fix.
    """
    estimate = simulation_bytes(m, n, written_spans=written_spans, plot_rows=plot_rows, plot_spans=plot_spans)
    check_memory(estimate, f"{given}: the simulation ({m * n:,} micro-batch-stage pairs)", fix, available)
