"""gpipe.distributed.clock.merge: every rank's spans shifted onto rank 0's clock, transfers as copy spans."""

from __future__ import annotations

from typing import Any

from gpipe.distributed.clock import merge
from gpipe.schedule import Op, Task
from gpipe.schedule.timeline import COMPUTE, COPY, MemorySample, Span, Timeline


def _part(rank: int, t0: float, spans: list[Span], transfers: dict[str, list[Any]]) -> dict[str, Any]:
    meta = {"schedule": "gpipe", "m": 1, "n": 2, "rank": rank, "devices": ["cpu", "cpu"],
            "model_state_bytes": [100, 0] if rank == 0 else [0, 40], "held_bytes": {f"F0@{rank}": 8 * (rank + 1)}}
    timeline = Timeline(tuple(spans), (MemorySample(0, 0.0, 0), MemorySample(1, 0.0, 0),
                                       MemorySample(rank, 0.5, 8)), 2, "measured", meta)
    return {"timeline": timeline.to_dict(), "t0": t0, "transfers": transfers}


def test_spans_and_transfers_land_on_rank_zeros_clock() -> None:
    """Rank 1's clock runs 100 s ahead of rank 0's and its recorder started 0.25 s after rank 0's (on rank 0's
    clock): its spans move by 0.25 s; F0@0 posted at 10.0 + 1 (rank 0's clock) and in at 111.5 on rank 1's
    clock is a copy from 1.0 to 1.5; B0@1 posted before it arrived within the residual is clamped to zero."""
    f0, f1, b1, b0 = Task(Op.F, 0, 0), Task(Op.F, 0, 1), Task(Op.B, 0, 1), Task(Op.B, 0, 0)
    parts = [
        _part(0, 10.0, [Span(0, COMPUTE, f0, 0.0, 1.0), Span(0, COMPUTE, b0, 3.0, 4.0)],
              {"sent": [(1, "F0@0", "", 11.0)], "arrived": [(1, "B0@1", "", 12.9)]}),
        _part(1, 110.25, [Span(1, COMPUTE, f1, 1.25, 2.0), Span(1, COMPUTE, b1, 2.0, 2.75)],
              {"sent": [(0, "B0@1", "", 113.0)], "arrived": [(0, "F0@0", "", 111.5)]}),
    ]
    merged = merge(parts, [(0.0, 0.0), (100.0, 0.125)])
    assert merged.num_devices == 2 and merged.source == "measured"
    assert sorted(merged.spans, key=lambda s: (s.start, s.device, s.stream)) == [
        Span(0, COMPUTE, f0, 0.0, 1.0), Span(1, COPY, f0, 1.0, 1.5), Span(1, COMPUTE, f1, 1.5, 2.25),
        Span(1, COMPUTE, b1, 2.25, 3.0), Span(0, COMPUTE, b0, 3.0, 4.0), Span(0, COPY, b1, 3.0, 3.0)]
    assert merged.memory == (MemorySample(0, 0.0, 0), MemorySample(0, 0.5, 8), MemorySample(1, 0.25, 0),
                             MemorySample(1, 0.75, 8))
    assert merged.meta["clock"]["offsets"] == [0.0, 100.0] and merged.meta["clock"]["residual"] == 0.125
    assert merged.meta["model_state_bytes"] == [100, 40] and merged.meta["held_bytes"] == {"F0@0": 8, "F0@1": 16}
    assert merged.meta["world_size"] == 2 and "rank" not in merged.meta


def test_a_skip_crossing_ranks_is_labelled() -> None:
    f0 = Task(Op.F, 0, 0)
    parts = [_part(0, 0.0, [Span(0, COMPUTE, f0, 0.0, 1.0)], {"sent": [(1, "F0@0", "('ns', 'x')", 1.0)],
                                                              "arrived": []}),
             _part(1, 0.0, [], {"sent": [], "arrived": [(0, "F0@0", "('ns', 'x')", 1.5)]})]
    copy, = [s for s in merge(parts, [(0.0, 0.0), (0.0, 0.0)]).spans if s.stream == COPY]
    assert copy == Span(1, COPY, f0, 1.0, 1.5, "skip")
