"""The shared timeline type (metrics, JSON, Chrome trace) and the Gantt charts of gpipe.schedule.plot."""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path

import pytest

from gpipe.schedule import Task, gpipe, one_f_one_b
from gpipe.schedule.plot import drawn_kinds, plot_side_by_side, plot_timeline
from gpipe.schedule.timeline import COMPUTE, COPY, MemorySample, Span, Timeline
from gpipe.schedule.trace import chrome_trace, write_chrome_trace
from sim.core.config import SimConfig
from sim.core.cost import CostModel
from sim.core.engine import simulate

PNG = b"\x89PNG\r\n\x1a\n"


def T(text: str) -> Task:
    return Task.parse(text)


def sample() -> Timeline:
    spans = (
        Span(0, COMPUTE, T("F0@0"), 1.0, 2.0),
        Span(0, COMPUTE, T("F1@0"), 2.0, 3.0),
        Span(1, COPY, T("F0@0"), 2.0, 2.5),
        Span(1, COPY, T("F0@0"), 2.5, 2.75, "skip"),
        Span(1, COMPUTE, T("F0@1"), 2.5, 4.0),
    )
    memory = (MemorySample(0, 1.0, 0), MemorySample(0, 2.0, 100), MemorySample(1, 4.0, 7))
    return Timeline(spans, memory, source="test", meta={"m": 2, "model_state_bytes": [1, 2]})


def test_json_round_trip(tmp_path: Path) -> None:
    tl = sample()
    assert Timeline.from_json(tl.to_json()) == tl
    path = tmp_path / "t.json"
    tl.to_json(path)
    assert Timeline.from_json(path) == tl
    simulated = simulate(gpipe(3, 2, "except_last"), CostModel.uniform(2, 1, 2, copy_seconds=0.5, saved_bytes=10))
    assert Timeline.from_json(simulated.to_json()) == simulated


def test_json_is_json_dumps_indented() -> None:
    """Note [quick JSON]: plain records formatted directly, odd ones through json.dumps, one text."""
    odd = Timeline(
        (Span(0, COMPUTE, T("F0@0"), 0, 1), Span(1, COPY, T("F0@0"), 0.5, float("inf"), 'sk"ip\u00e9\n'),
         Span(2, "str\u00e9am", T("B1@2"), float("nan"), 1e300), Span(True, COMPUTE, T("F0@0"), -0.0, 5e-324)),
        (MemorySample(0, 0, 5), MemorySample(1, 1.5, 2**70), MemorySample(0, float("-inf"), -3)),
        source="x\u00e9", meta={"a": [1, {"b": None}], "c": "\u2603"})
    simulated = simulate(gpipe(3, 2, "except_last"), CostModel.uniform(2, 0.1, 0.3, copy_seconds=0.07, saved_bytes=10))
    for tl in (sample(), odd, simulated, Timeline(()), Timeline((), (MemorySample(0, 1.0, 2),))):
        assert tl.to_json() == json.dumps(tl.to_dict(), indent=1)


def test_metrics() -> None:
    tl = sample()
    assert tl.num_devices == 2 and tl.start == 1.0 and tl.end == 4.0 and tl.makespan == 3.0
    assert tl.busy(0) == 2.0 and tl.busy(1) == 1.5  # copies are not compute
    assert tl.bubble_fraction(0) == pytest.approx(1 / 3) and tl.bubble_fraction() == pytest.approx((1 / 3 + 0.5) / 2)
    assert tl.peak_memory(0) == 100 and tl.peak_memory(1) == 7 and tl.memory_series(0) == [(1.0, 0), (2.0, 100)]
    assert tl.task_order(0) == [T("F0@0"), T("F1@0")] and tl.span_of(T("F0@1")).end == 4.0
    assert [s.name for s in tl.copy_spans(1)] == ["copy F0@0", "copy F0@0 (skip)"]
    summary = tl.summary()
    assert summary["makespan"] == 3.0 and summary["devices"][1]["peak_memory_bytes"] == 7
    shifted = tl.shifted(10.0)
    assert shifted.start == 11.0 and shifted.makespan == tl.makespan and shifted.memory[0].time == 11.0
    with pytest.raises(KeyError):
        tl.span_of(T("B0@0"))


def test_busy_is_the_union_of_overlapping_spans() -> None:
    spans = (Span(0, COMPUTE, T("F0@0"), 0.0, 2.0), Span(0, COMPUTE, T("F1@0"), 1.0, 3.0),
             Span(0, COMPUTE, T("F2@0"), 3.0, 4.0), Span(0, COMPUTE, T("F3@0"), 5.0, 6.0),
             Span(0, COMPUTE, T("F4@0"), 5.5, 5.75))
    tl = Timeline(spans)
    assert tl.busy(0) == 5.0 and tl.makespan == 6.0
    assert Timeline(()).makespan == 0.0 and Timeline(()).bubble_fraction() == 0.0


def straightforward_summary(tl: Timeline) -> dict:
    """Note [metrics in one pass]'s definitions, each computed from scratch over every span and sample."""
    start = min((s.start for s in tl.spans), default=0.0)
    makespan = max((s.end for s in tl.spans), default=0.0) - start
    rows = []
    for d in range(tl.num_devices):
        mine = sorted((s.start, s.end) for s in tl.spans if s.device == d and s.stream == COMPUTE)
        busy, block = 0.0, None  # the union of the device's compute spans
        for a, b in mine:
            if block is None or a > block[1]:
                busy += block[1] - block[0] if block is not None else 0.0
                block = [a, b]
            else:
                block[1] = max(block[1], b)
        busy += block[1] - block[0] if block is not None else 0.0
        utilisation = busy / makespan if makespan > 0 else 0.0
        peak = max((m.bytes for m in tl.memory if m.device == d), default=0)
        rows.append({"device": d, "busy": busy, "utilisation": utilisation, "bubble_fraction": 1.0 - utilisation,
                     "peak_memory_bytes": peak})
    bubble = sum(r["bubble_fraction"] for r in rows) / len(rows) if rows else 0.0
    return {"makespan": makespan, "bubble_fraction": bubble, "devices": rows}


def test_metrics_are_the_per_device_definitions() -> None:
    """Note [metrics in one pass]: grouping once changes no number, not even in the last bit."""
    m, n = 6, 4
    free = simulate(gpipe(m, n, "never"), CostModel.uniform(n, 1.0, 2.0, copy_seconds=0.0))
    summary = free.summary()
    assert summary == straightforward_summary(free)
    assert summary["makespan"] == (m + n - 1) * 3.0  # GPipe's closed form
    assert summary["bubble_fraction"] == pytest.approx((n - 1) / (m + n - 1), rel=1e-12)
    assert all(row["busy"] == m * 3.0 for row in summary["devices"])
    timelines = [
        sample(),
        Timeline((Span(0, COMPUTE, T("F0@0"), 0.0, 2.0), Span(0, COMPUTE, T("F1@0"), 1.0, 3.0),
                  Span(0, COMPUTE, T("F2@0"), 5.0, 6.0)), num_devices=3),  # overlaps, and an idle device
        Timeline(()),
        simulate(gpipe(5, 3, "except_last"), CostModel.uniform(3, 0.1, 0.3, copy_seconds=0.07, saved_bytes=10,
                                                                checkpoint_bytes=3)),
        simulate(one_f_one_b(7, 4), CostModel.uniform(4, 0.3, 0.7, copy_seconds=None, send_bytes=2**20,
                                                     saved_bytes=5), SimConfig(copy_streams=False)),
        simulate(gpipe(4, 4, placement=(0, 1, 1, 0)), CostModel.uniform(4, 1.1, 2.3, copy_seconds=0.2)),
    ]
    for tl in timelines:
        expected = straightforward_summary(tl)
        assert tl.summary() == expected
        for d, row in enumerate(expected["devices"]):
            assert (tl.busy(d), tl.utilisation(d), tl.bubble_fraction(d), tl.peak_memory(d)) == \
                (row["busy"], row["utilisation"], row["bubble_fraction"], row["peak_memory_bytes"])
            assert tl.compute_spans(d) == sorted((s for s in tl.spans if s.device == d and s.stream == COMPUTE),
                                                 key=lambda s: (s.start, s.end))
            assert tl.memory_series(d) == sorted(((m.time, m.bytes) for m in tl.memory if m.device == d),
                                                 key=lambda p: p[0])
        assert tl.busy(tl.num_devices) == 0.0 and tl.peak_memory(-1) == 0 and tl.compute_spans(99) == []


def test_chrome_trace_structure(tmp_path: Path) -> None:
    tl = sample()
    doc = chrome_trace(tl)
    events = doc["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"device 0", "device 1"}
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(tl.spans)
    first = next(e for e in complete if e["name"] == "F0@0")
    assert first["ts"] == 0.0 and first["dur"] == 1e6 and first["tid"] == 0 and first["cat"] == "F"
    assert {e["tid"] for e in complete if e["name"].startswith("copy")} == {1}
    counters = [e for e in events if e["ph"] == "C"]
    assert [c["args"]["bytes"] for c in counters] == [0, 100, 7]
    both = chrome_trace([tl, tl.shifted(5.0)], titles=["predicted", "measured"])
    pids = {e["pid"] for e in both["traceEvents"] if e["ph"] == "X"}
    assert pids == {0, 1, 2, 3}
    path = write_chrome_trace(tmp_path / "trace.json", tl)
    assert json.loads(path.read_text())["traceEvents"] == json.loads(json.dumps(events))
    big = simulate(gpipe(40, 8), CostModel.uniform(8, 1, 2, copy_seconds=0.5, saved_bytes=3))  # > 4096 events
    for timelines in (tl, [tl, tl.shifted(5.0)], big, Timeline(())):  # written in batches, to the same text
        write_chrome_trace(path, timelines)
        assert path.read_text() == json.dumps(chrome_trace(timelines))


def test_plots_write_pngs(tmp_path: Path) -> None:
    tl = simulate(gpipe(4, 3, "except_last"), CostModel.uniform(3, 1, 2, copy_seconds=0.3))
    plot_timeline(tl, tmp_path / "one.png")
    plot_side_by_side([tl, tl.shifted(1.0)], tmp_path / "two.png", titles=["a", "b"])
    for name in ("one.png", "two.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == PNG and len(data) > 1000


def test_legend_names_only_what_is_drawn() -> None:
    plain = simulate(gpipe(4, 3, "never"), CostModel.uniform(3, 1, 2))
    copied = simulate(gpipe(4, 3, "except_last"), CostModel.uniform(3, 1, 2, copy_seconds=0.3))
    assert drawn_kinds([plain]) == ["F", "B"]
    assert drawn_kinds([plain, copied]) == ["F", "B", "R", "copy"]
    fig = plot_timeline(plain)
    assert [t.get_text() for legend in fig.legends for t in legend.get_texts()] == ["forward", "backward"]
    fig = plot_side_by_side([plain, copied])
    assert [t.get_text() for legend in fig.legends for t in legend.get_texts()] == [
        "forward", "backward", "recompute", "copy"]


def test_spans_and_samples_stay_frozen_dataclasses() -> None:
    """Note [fast frozen records]: the quick constructors change nothing a caller sees."""
    span = Span(1, COPY, T("F0@0"), 2.5, 2.75, "skip")
    same = Span(1, COPY, T("F0@0"), 2.5, 2.75, "skip")
    assert span == same and hash(span) == hash(same) and span != dataclasses.replace(same, label="")
    assert Span(0, COMPUTE, T("F0@0"), 1.0, 2.0).label == "" and span.duration == 0.25
    assert repr(span) == "Span(device=1, stream='copy', task=Task('F0@0'), start=2.5, end=2.75, label='skip')"
    assert [f.name for f in dataclasses.fields(Span)] == ["device", "stream", "task", "start", "end", "label"]
    assert dataclasses.replace(span, end=3.0).duration == 0.5
    sample_ = MemorySample(0, 1.0, 100)
    assert dataclasses.astuple(sample_) == (0, 1.0, 100) and dataclasses.replace(sample_, bytes=7).bytes == 7
    for record, name in ((span, "start"), (sample_, "bytes")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(record, name, 0)
    assert pickle.loads(pickle.dumps(sample())) == sample()


def test_num_devices_counts_spans_and_samples() -> None:
    assert Timeline((Span(2, COMPUTE, T("F0@2"), 0.0, 1.0),)).num_devices == 3
    assert Timeline((), (MemorySample(4, 0.0, 1),)).num_devices == 5
    assert Timeline((), num_devices=2).num_devices == 2 and Timeline(()).num_devices == 0
