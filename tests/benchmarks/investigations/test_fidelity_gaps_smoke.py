"""The fidelity-gaps benchmark takes a timeline apart as its docs say, and runs end to end on its quick setting."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from benchmarks.investigations.fidelity_gaps import busy_idle, combined, duration_ratios, handoff_waits
from gpipe.schedule import COMPUTE, Op, Task, Timeline
from gpipe.schedule.timeline import Span


def _timeline(*spans: tuple[int, str, int, int, float, float]) -> Timeline:
    return Timeline(tuple(Span(d, COMPUTE, Task(Op(op), i, j), start, end) for d, op, i, j, start, end in spans))


# two stages on two workers: F0 on worker 0, then F0 of stage 1 on worker 1 after a 0.5 s hand-off; B back
PIPELINE = _timeline((0, "F", 0, 0, 0.0, 1.0), (1, "F", 0, 1, 1.5, 2.5), (1, "B", 0, 1, 2.5, 4.5),
                     (0, "B", 0, 0, 5.0, 7.0))


def test_busy_and_idle_are_per_worker_means() -> None:
    busy, idle = busy_idle(PIPELINE)
    assert busy == pytest.approx(3.0)  # (1 + 2) on worker 0, (1 + 2) on worker 1
    assert idle == pytest.approx(2.0)  # worker 0 waits 4 s between its tasks, worker 1 none


def test_handoff_waits_count_only_a_waiting_worker() -> None:
    assert handoff_waits(PIPELINE, (0, 1), 2) == pytest.approx([0.5, 0.5])
    busy_worker = _timeline((0, "F", 0, 0, 0.0, 1.0), (1, "F", 9, 1, 0.0, 2.0), (1, "F", 0, 1, 2.0, 3.0))
    assert handoff_waits(busy_worker, (0, 1), 2) == []  # worker 1 was still busy when F0's output came
    assert handoff_waits(PIPELINE, (0, 0), 2) == []  # both stages on one worker: no hand-off between workers


def test_duration_ratios_split_by_overlap() -> None:
    slower = _timeline((0, "F", 0, 0, 0.0, 2.0), (1, "F", 0, 1, 3.0, 4.0), (0, "F", 1, 0, 3.0, 4.0))
    predicted = _timeline((0, "F", 0, 0, 0.0, 1.0), (1, "F", 0, 1, 1.0, 2.0), (0, "F", 1, 0, 1.0, 2.0))
    ratios = duration_ratios(slower, predicted)
    assert ratios["alone"] == pytest.approx(2.0) and ratios["alone_tasks"] == 1
    assert ratios["together"] == pytest.approx(1.0) and ratios["together_tasks"] == 2


def test_combined_takes_medians_and_keeps_runs() -> None:
    runs = [{"model": "mlp", "chunks": 8, "error": e, "alone": a} for e, a in ((-0.1, None), (-0.3, 1.2), (0.2, 1.0))]
    row = combined(runs)
    assert row["model"] == "mlp" and row["chunks"] == 8 and row["runs"] == runs
    assert row["error"] == pytest.approx(-0.1) and row["alone"] == pytest.approx(1.1)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fidelity_gaps_quick(run_benchmark: Callable[..., Any]) -> None:
    """Structure only: every number the run measures may stretch on a loaded machine (about 10 s on two cores,
    minutes on a busy one: its time limits are generous), but a makespan holds its busy seconds and a median its
    90th percentile."""
    doc = run_benchmark("investigations.fidelity_gaps", "--quick", timeout=840).doc
    assert {"command", "date", "machine", "note", "rows"} <= set(doc)
    (row,) = doc["rows"]
    assert row["model"] == "mlp" and row["schedule"] == "1f1b" and row["busy_measured_ms"] > 0
    assert row["measured_ms"] >= row["busy_measured_ms"] and row["predicted_ms"] >= row["busy_predicted_ms"]
    waits = [0.0, 0.2, 1.0, 3.0, 10.0, 30.0]
    expected = [(sender, wait) for sender in ("waits", "mlp", "conv") for wait in waits]
    assert [(w["sender"], w["idle_ms"]) for w in doc["wakes"]] == expected
    assert all(0 < w["wake_median_us"] <= w["wake_p90_us"] for w in doc["wakes"])
    assert doc["alternation"] > 0
    assert len(row["runs"]) == 1 and row["runs"][0]["error"] == row["error"]
