"""Timelines: what ran where and when, predicted by the simulator or measured by the executor.

Pure Python (no torch). A :class:`Timeline` is a tuple of :class:`Span` (device, stream, task, start,
end) and a tuple of :class:`MemorySample` (device, time, bytes). Times are seconds from the start of
the step. Everything downstream (metrics, JSON, the Chrome/Perfetto trace of :mod:`gpipe.schedule.trace`, the
Gantt chart in :mod:`gpipe.schedule.plot`, the comparison) takes either kind.

Streams::

    "compute"  the device's compute stream: F, R, B and W tasks
    "copy"     the receiving device's copy stream: a copy is recorded on the device it arrives at,
               and its ``task`` is the task whose result it carries (F(i, j) for an activation sent
               to stage j+1, B(i, j) for a gradient sent to stage j-1)
    "collective"  the device's communication stream: a data-parallel all-gather, reduce-scatter or
               all-reduce (:mod:`sim.core.collectives`), its ``task`` the compute task it serves and
               its label what it moves

Note [metrics in one pass]: a simulated timeline holds a span per task, millions for a big run, and
a summary asks every device for its busy time, utilisation, bubble and peak memory. So a timeline
groups its spans and samples by device once, the first time a metric needs them, and keeps that
grouping, each device's busy seconds and its start and end (a timeline is immutable): a summary
costs one pass over the spans, not one per device and metric. Each metric is still its per-device
definition (busy: the union of that device's compute spans) evaluated on that device's group.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from json.encoder import encode_basestring_ascii as _json_str  # what json.dumps uses by default
from operator import attrgetter
from pathlib import Path
from typing import Any, TypeVar

from gpipe.schedule import Task
from gpipe.schedule.size import format_bytes, replace_file

__all__ = [
    "ALL_TO_ALL",
    "COLLECTIVE",
    "COMPUTE",
    "COPY",
    "MemorySample",
    "Span",
    "Timeline",
    "collective_label",
]

_START_END = attrgetter("start", "end")  # spans in time order, ties by end

COMPUTE = "compute"
COPY = "copy"
COLLECTIVE = "collective"
#: The kind of a task's all-to-all (a mixture of experts' dispatch and combine) in :func:`collective_label`.
ALL_TO_ALL = "all-to-all"


def collective_label(kind: str, what: int | str, nbytes: float) -> str:
    """A collective span's label, written alike by the simulator and the executor so that predicted and measured
    collectives pair by it: ``all-gather unit 0 (1.5 KiB)``; ``what``: a unit's index, or a name (``"loss"``)."""
    return f"{kind} {f'unit {what}' if isinstance(what, int) else what} ({format_bytes(nbytes)})"


@dataclass(frozen=True, init=False, slots=True)
class Span:
    """One task or copy on one stream of one device, from ``start`` to ``end`` seconds.

    ``label`` only refines the display (``"skip"`` for a skip-connection copy, say); identity is
    ``(device, stream, task, label)``.
    """

    device: int
    stream: str
    task: Task
    start: float
    end: float
    label: str = ""

    def __init__(self, device: int, stream: str, task: Task, start: float, end: float, label: str = "") -> None:
        # Note [fast frozen records] in gpipe.schedule.task: a simulation builds one span per task
        _span_device(self, device)
        _span_stream(self, stream)
        _span_task(self, task)
        _span_start(self, start)
        _span_end(self, end)
        _span_label(self, label)

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def key(self) -> tuple[int, str, Task, str]:
        return (self.device, self.stream, self.task, self.label)

    @property
    def name(self) -> str:
        """Display name: ``F2@1``, ``copy F2@1`` for a copy, ``all-gather unit 0 (1 GiB) for F2@1`` for a collective."""
        if self.stream == COLLECTIVE:
            return f"{self.label or self.stream} for {self.task}"
        base = str(self.task) if self.stream == COMPUTE else f"{self.stream} {self.task}"
        return f"{base} ({self.label})" if self.label else base

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "device": self.device,
            "stream": self.stream,
            "task": str(self.task),
            "start": self.start,
            "end": self.end,
        }
        if self.label:
            d["label"] = self.label
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Span:
        return cls(
            int(d["device"]), str(d["stream"]), Task.parse(d["task"]), float(d["start"]), float(d["end"]),
            str(d.get("label", "")),
        )


@dataclass(frozen=True, init=False, slots=True)
class MemorySample:
    """``bytes`` held on ``device`` from ``time`` seconds until its next sample."""

    device: int
    time: float
    bytes: int

    def __init__(self, device: int, time: float, bytes: int) -> None:
        _sample_device(self, device)  # Note [fast frozen records] in gpipe.schedule.task
        _sample_time(self, time)
        _sample_bytes(self, bytes)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "time": self.time, "bytes": self.bytes}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemorySample:
        return cls(int(d["device"]), float(d["time"]), int(d["bytes"]))


# Note [fast frozen records] in gpipe.schedule.task: the slots' own setters, which bypass the frozen __setattr__
_span_device, _span_stream, _span_task, _span_start, _span_end, _span_label = (
    getattr(Span, name).__set__ for name in ("device", "stream", "task", "start", "end", "label"))
_sample_device, _sample_time, _sample_bytes = (
    getattr(MemorySample, name).__set__ for name in ("device", "time", "bytes"))


@dataclass(frozen=True)
class Timeline:
    """Spans and memory samples of one run of one schedule.

    Attributes:
        spans: every task and copy, in no particular order.
        memory: memory samples; per device, a step function over time.
        num_devices: devices in the run (a device may have no spans).
        source: ``"simulated"`` or ``"measured"``, for display.
        meta: free-form description (schedule name, m, n, checkpoint, hardware ...), JSON-serialisable.
    """

    spans: tuple[Span, ...]
    memory: tuple[MemorySample, ...] = ()
    num_devices: int = 0
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "spans", tuple(self.spans))
        object.__setattr__(self, "memory", tuple(self.memory))
        device = attrgetter("device")
        seen = max(max(map(device, self.spans), default=-1), max(map(device, self.memory), default=-1)) + 1
        object.__setattr__(self, "num_devices", max(self.num_devices, seen))

    # -- selection ---------------------------------------------------------------------------------

    def compute_spans(self, device: int | None = None) -> list[Span]:
        """Compute spans (of ``device``, or all), sorted by start."""
        spans = [s for s in self._spans_of(device) if s.stream == COMPUTE]
        return sorted(spans, key=_START_END)

    def copy_spans(self, device: int | None = None) -> list[Span]:
        """Copy spans (of ``device``, or all), sorted by start: every span neither compute nor collective."""
        spans = [s for s in self._spans_of(device) if s.stream != COMPUTE and s.stream != COLLECTIVE]
        return sorted(spans, key=_START_END)

    def collective_spans(self, device: int | None = None) -> list[Span]:
        """Collective spans (of ``device``, or all), sorted by start."""
        spans = [s for s in self._spans_of(device) if s.stream == COLLECTIVE]
        return sorted(spans, key=_START_END)

    def task_order(self, device: int) -> list[Task]:
        """The tasks ``device`` computed, in the order they started."""
        return [s.task for s in self.compute_spans(device)]

    def span_of(self, task: Task) -> Span:
        """The compute span of ``task``; ``KeyError`` if there is none."""
        for s in self.spans:
            if s.stream == COMPUTE and s.task == task:
                return s
        raise KeyError(f"no compute span for {task}")

    def device_spans(self, device: int) -> Sequence[Span]:
        """Every span of ``device``, any stream, in no particular order (grouped once, Note [metrics in one pass])."""
        return self._spans_of(device)

    def compute_spans_by_task(self, device: int) -> dict[Task, Span]:
        """The compute spans of ``device``, keyed by their task."""
        return {s.task: s for s in self._spans_of(device) if s.stream == COMPUTE}

    def with_spans(self, extra: Sequence[Span]) -> Timeline:
        """This timeline with ``extra`` spans beside its own, none of them compute (collectives added after the fact,
        :func:`sim.core.collectives.add_collectives`). What it has grouped and measured per device carries over
        (Note [metrics in one pass]): only the new spans are grouped.

        Raises:
            ValueError: an extra span is on the compute stream (it would change what was measured).
        """
        if any(s.stream == COMPUTE for s in extra):
            raise ValueError("with_spans adds spans beside the compute; a compute span changes the timeline's tasks")
        out = Timeline((*self.spans, *extra), self.memory, self.num_devices, self.source, dict(self.meta))
        known = self.__dict__  # cached_property values (a timeline is immutable)
        if "_by_device" in known:
            groups = [list(g) for g in known["_by_device"]]
            groups.extend([] for _ in range(out.num_devices - len(groups)))
            for span in extra:
                groups[span.device].append(span)
            out.__dict__["_by_device"] = groups
        for name in ("_busy", "_memory_by_device"):  # compute spans and memory samples are the same
            if name in known and out.num_devices == self.num_devices:
                out.__dict__[name] = known[name]
        return out

    def shifted(self, offset: float) -> Timeline:
        """The same timeline with every time moved by ``offset`` seconds."""
        return Timeline(
            tuple(Span(s.device, s.stream, s.task, s.start + offset, s.end + offset, s.label) for s in self.spans),
            tuple(MemorySample(m.device, m.time + offset, m.bytes) for m in self.memory),
            self.num_devices, self.source, dict(self.meta),
        )

    def _spans_of(self, device: int | None) -> Sequence[Span]:
        if device is None:
            return self.spans
        groups = self._by_device
        return groups[device] if 0 <= device < len(groups) else ()

    @cached_property
    def _by_device(self) -> list[list[Span]]:
        """Note [metrics in one pass]: every span, grouped by device once."""
        return _group_by_device(self.spans, self.num_devices)

    # -- metrics -----------------------------------------------------------------------------------

    @cached_property
    def start(self) -> float:
        return min(map(attrgetter("start"), self.spans), default=0.0)

    @cached_property
    def end(self) -> float:
        return max(map(attrgetter("end"), self.spans), default=0.0)

    @property
    def makespan(self) -> float:
        """Seconds from the first span's start to the last span's end."""
        return self.end - self.start

    def busy(self, device: int) -> float:
        """Seconds ``device``'s compute stream is busy (overlapping spans counted once)."""
        return self._busy[device] if 0 <= device < self.num_devices else 0.0

    def utilisation(self, device: int) -> float:
        """Busy fraction of the makespan on ``device``."""
        return self.busy(device) / self.makespan if self.makespan > 0 else 0.0

    def bubble_fraction(self, device: int | None = None) -> float:
        """Idle fraction of the makespan on ``device``, or the mean over all devices.

        For GPipe with uniform costs and free copies this is ``(n - 1) / (m + n - 1)`` on every device.
        """
        if device is not None:
            return 1.0 - self.utilisation(device)
        if self.num_devices == 0:
            return 0.0
        return sum(self.bubble_fraction(d) for d in range(self.num_devices)) / self.num_devices

    def memory_series(self, device: int) -> list[tuple[float, int]]:
        """``(time, bytes)`` samples of ``device``, sorted by time."""
        samples = self._memory_by_device[device] if 0 <= device < self.num_devices else ()
        return sorted(((m.time, m.bytes) for m in samples), key=lambda p: p[0])

    def peak_memory(self, device: int) -> int:
        """The largest sampled bytes on ``device`` (0 without samples)."""
        samples = self._memory_by_device[device] if 0 <= device < self.num_devices else ()
        return max((m.bytes for m in samples), default=0)

    @cached_property
    def _busy(self) -> list[float]:
        """:meth:`busy` of every device (Note [metrics in one pass])."""
        return [_union_length([s for s in spans if s.stream == COMPUTE]) for spans in self._by_device]

    @cached_property
    def _memory_by_device(self) -> list[list[MemorySample]]:
        """The memory samples, grouped by device once (Note [metrics in one pass])."""
        return _group_by_device(self.memory, self.num_devices)

    def summary(self) -> dict[str, Any]:
        """Makespan, bubble fraction and per-device busy, utilisation and peak memory, as plain data."""
        return {
            "makespan": self.makespan,
            "bubble_fraction": self.bubble_fraction(),
            "devices": [
                {
                    "device": d,
                    "busy": self.busy(d),
                    "utilisation": self.utilisation(d),
                    "bubble_fraction": self.bubble_fraction(d),
                    "peak_memory_bytes": self.peak_memory(d),
                }
                for d in range(self.num_devices)
            ],
        }

    # -- serialisation -----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "num_devices": self.num_devices,
            "meta": self.meta,
            "spans": [s.to_dict() for s in self.spans],
            "memory": [m.to_dict() for m in self.memory],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Timeline:
        return cls(
            tuple(Span.from_dict(s) for s in d.get("spans", [])),
            tuple(MemorySample.from_dict(m) for m in d.get("memory", [])),
            int(d.get("num_devices", 0)),
            str(d.get("source", "")),
            dict(d.get("meta", {})),
        )

    def to_json(self, path: str | Path | None = None) -> str:
        """``json.dumps(self.to_dict(), indent=1)``, written to ``path`` too when one is given.

        Note [quick JSON]: json's encoder is pure Python when it indents, far slower than
        formatting a record directly; a span or sample whose fields are plain ints, finite floats and
        strings is formatted here, to the same text, and any other record goes through ``json.dumps``.
        """
        text = "".join(self._json_pieces())
        if path is not None:
            replace_file(path, lambda tmp: tmp.write_text(text))  # Note [written whole] in gpipe.schedule.size
        return text

    def _json_pieces(self) -> Iterator[str]:
        head = json.dumps({"source": self.source, "num_devices": self.num_devices, "meta": self.meta}, indent=1)
        yield head[:-2]  # without its closing "\n}"
        for name, records in (("spans", [_span_json(s) for s in self.spans]),
                              ("memory", [_sample_json(m) for m in self.memory])):
            yield f',\n "{name}": [\n' + ",\n".join(records) + "\n ]" if records else f',\n "{name}": []'
        yield "\n}"

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> Timeline:
        """Read a timeline from JSON text or from a file path."""
        text = str(text_or_path)
        if not text.lstrip().startswith("{"):
            text = Path(text_or_path).read_text()
        return cls.from_dict(json.loads(text))


def _span_json(s: Span) -> str:
    """Note [quick JSON]: ``s.to_dict()`` as ``json.dumps(..., indent=1)`` writes it two levels down."""
    start, end = s.start, s.end
    if type(start) is float is type(end) and start - start == 0.0 == end - end and type(s.device) is int \
            and type(s.task) is Task and type(s.stream) is str and type(s.label) is str:
        label = f',\n   "label": {_json_str(s.label)}' if s.label else ""
        return (f'  {{\n   "device": {s.device},\n   "stream": {_json_str(s.stream)},\n   "task": "{s.task}",\n'
                f'   "start": {start!r},\n   "end": {end!r}{label}\n  }}')
    return _nested_json(s.to_dict())


def _sample_json(m: MemorySample) -> str:
    """Note [quick JSON]: ``m.to_dict()`` as ``json.dumps(..., indent=1)`` writes it two levels down."""
    time = m.time
    if type(time) is float and time - time == 0.0 and type(m.device) is int and type(m.bytes) is int:
        return f'  {{\n   "device": {m.device},\n   "time": {time!r},\n   "bytes": {m.bytes}\n  }}'
    return _nested_json(m.to_dict())


def _nested_json(d: dict[str, Any]) -> str:
    return "  " + json.dumps(d, indent=1).replace("\n", "\n  ")  # JSON strings hold no raw newline


R = TypeVar("R", Span, MemorySample)


def _group_by_device(records: Iterable[R], devices: int) -> list[list[R]]:
    """``records`` (spans or memory samples) in one list per device, in their order; negative devices left out."""
    groups: list[list[R]] = [[] for _ in range(devices)]
    for r in records:
        if r.device >= 0:
            groups[r.device].append(r)
    return groups


def _union_length(spans: list[Span]) -> float:
    """Seconds covered by ``spans`` (overlaps counted once); sorts ``spans`` by start, then end.

    Two stable sorts by one float each order the spans as ``sorted((start, end))`` would, without
    a tuple per span; the engine's spans come in order, so both sorts are one pass.
    """
    spans.sort(key=attrgetter("end"))
    spans.sort(key=attrgetter("start"))
    total = 0.0
    cur_start = cur_end = None
    for s in spans:
        a, b = s.start, s.end
        if cur_end is None or a > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = a, b
        else:
            cur_end = max(cur_end, b)
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total
