"""compare(): alignment by task key, makespan error, order agreement, per-device figures."""

from __future__ import annotations

import pytest

from gpipe.schedule import Task, parse_tasks
from gpipe.schedule.timeline import COMPUTE, MemorySample, Span, Timeline
from sim.calibration.compare import compare, order_agreement


def _timeline(order: dict[int, str], scale: float = 1.0, offset: float = 0.0, peak: int = 0) -> Timeline:
    spans = []
    for d, text in order.items():
        t = offset
        for task in parse_tasks(text):
            spans.append(Span(d, COMPUTE, task, t, t + scale))
            t += scale
    memory = [MemorySample(d, offset, peak) for d in order]
    return Timeline(tuple(spans), tuple(memory))


def test_identical_timelines_agree_exactly() -> None:
    tl = _timeline({0: "F0@0 F1@0 B1@0 B0@0", 1: "F0@1 F1@1 B1@1 B0@1"}, peak=10)
    c = compare(tl, tl.shifted(123.0))  # a measured clock starts anywhere
    assert c.makespan_error == 0.0
    assert c.start_error_max == 0.0 and c.duration_error_max == 0.0
    assert c.order_agreement == 1.0
    assert all(d.order_identical and d.peak_bytes_error == 0.0 for d in c.devices)
    assert c.matched == 8 and not c.only_measured and not c.only_predicted
    assert "makespan" in c.table()


def test_makespan_error_sign_and_size() -> None:
    pred = _timeline({0: "F0@0 B0@0"}, scale=1.1)
    meas = _timeline({0: "F0@0 B0@0"}, scale=1.0)
    c = compare(pred, meas)
    assert c.makespan_error == pytest.approx(0.1)
    assert c.start_error_max == pytest.approx(0.1)
    assert c.duration_error_mean == pytest.approx(0.1)


def test_order_agreement_is_kendall_fraction() -> None:
    a = parse_tasks("F0@0 F1@0 F2@0 F3@0")
    assert order_agreement(a, a) == 1.0
    assert order_agreement(a, tuple(reversed(a))) == 0.0
    swapped = (a[1], a[0], a[2], a[3])
    assert order_agreement(a, swapped) == pytest.approx(5 / 6)
    assert order_agreement(a[:1], a) == 1.0


def test_missing_tasks_are_listed_and_disjoint_timelines_rejected() -> None:
    pred = _timeline({0: "F0@0 B0@0"})
    meas = _timeline({0: "F0@0"})
    c = compare(pred, meas)
    assert c.only_predicted == ("B0@0",)
    with pytest.raises(ValueError, match="no task in common"):
        compare(pred, Timeline((Span(0, COMPUTE, Task.parse("F9@9"), 0, 1),)))
