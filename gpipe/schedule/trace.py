"""Timelines as Chrome trace-event documents, which https://ui.perfetto.dev and chrome://tracing open: one process
per device (per timeline, when several are given: predicted and measured side by side), one thread per stream (and
per lane of it, Note [lanes]), one complete (``"X"``) event per span, memory as a counter track. Times are
microseconds, as the format requires.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from itertools import islice
from operator import attrgetter
from pathlib import Path
from typing import Any

from gpipe.schedule.size import replace_file
from gpipe.schedule.timeline import COLLECTIVE, COMPUTE, COPY, Span, Timeline

__all__ = ["chrome_trace", "write_chrome_trace"]

_STREAM_TID = {COMPUTE: 0, COPY: 1, COLLECTIVE: 2}
_LANE_TIDS = len(_STREAM_TID) + 1000  # a stream's lane k is thread _tid(stream) + k * _LANE_TIDS


def chrome_trace(timelines: Timeline | Sequence[Timeline], titles: Sequence[str] | None = None) -> dict[str, Any]:
    """A Chrome trace-event document of ``timelines`` (see the module docstring); ``titles`` name them."""
    return {"traceEvents": list(_trace_events(timelines, titles)), "displayTimeUnit": "ms"}


def _trace_events(timelines: Timeline | Sequence[Timeline], titles: Sequence[str] | None) -> Iterator[dict[str, Any]]:
    """The events of :func:`chrome_trace`, one at a time: by timeline, then device, then start."""
    tls = [timelines] if isinstance(timelines, Timeline) else list(timelines)
    names = list(titles) if titles is not None else [t.source or f"timeline {k}" for k, t in enumerate(tls)]
    pid_base = 0
    for k, tl in enumerate(tls):
        prefix = f"{names[k]}: " if len(tls) > 1 else ""
        origin = tl.start
        for d in range(tl.num_devices):  # its threads, then its spans
            pid = pid_base + d
            laned = _lanes(sorted(tl.device_spans(d), key=attrgetter("start")))
            yield {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"{prefix}device {d}"}}
            yield {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}
            for stream, lane in sorted({(s.stream, lane) for s, lane in laned} | {(COMPUTE, 0)},
                                       key=lambda sl: _tid(*sl)):
                name = stream if not lane else f"{stream} {lane + 1}"
                yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": _tid(stream, lane), "args": {"name": name}}
            for s, lane in laned:
                yield {
                    "ph": "X", "name": s.name, "cat": s.task.op.value if s.stream == COMPUTE else s.stream,
                    "pid": pid, "tid": _tid(s.stream, lane),
                    "ts": (s.start - origin) * 1e6, "dur": max(s.duration, 0.0) * 1e6,
                    "args": {"task": str(s.task), "microbatch": s.task.microbatch, "stage": s.task.stage},
                }
        for d in range(tl.num_devices):
            for time, nbytes in tl.memory_series(d):
                yield {"ph": "C", "name": "memory", "pid": pid_base + d, "tid": 0,
                       "ts": max(time - origin, 0.0) * 1e6, "args": {"bytes": nbytes}}
        pid_base += max(tl.num_devices, 1)


def _tid(stream: str, lane: int = 0) -> int:
    """The thread id of a stream's ``lane`` (Note [lanes]): the known streams first, any other after them."""
    return _STREAM_TID.get(stream, len(_STREAM_TID) + sum(map(ord, stream)) % 1000) + lane * _LANE_TIDS


# Note [lanes]: a viewer stacks the complete events of one thread as calls, so two spans of one stream that overlap
# (an overlapped pair's tasks, which start together; their all-to-alls, when both wait on the link at once) would
# show one nested in the other, or be dropped where neither holds the other. Each span goes to the first lane of its
# stream that is free when it starts, a thread of its own: a stream whose spans never overlap keeps one thread.
def _lanes(spans: list[Span]) -> list[tuple[Span, int]]:
    """``spans`` (one device's, by start) each with its lane of its stream."""
    ends: dict[str, list[float]] = {}  # stream -> when each of its lanes is free
    laned = []
    for s in spans:
        free = ends.setdefault(s.stream, [])
        lane = next((k for k, end in enumerate(free) if end <= s.start), len(free))
        if lane == len(free):
            free.append(s.end)
        else:
            free[lane] = s.end
        laned.append((s, lane))
    return laned


def write_chrome_trace(path: str | Path, timelines: Timeline | Sequence[Timeline],
                       titles: Sequence[str] | None = None) -> Path:
    """Write :func:`chrome_trace` to ``path`` and return the path.

    The same text as ``json.dumps(chrome_trace(...))``, encoded a few thousand events at a time, so
    a big timeline's events never all exist at once.
    """
    def write(tmp: Path) -> None:
        with tmp.open("w") as f:
            f.write('{"traceEvents": [')
            events, sep = _trace_events(timelines, titles), ""
            while batch := list(islice(events, 4096)):
                f.write(sep + json.dumps(batch)[1:-1])
                sep = ", "
            f.write('], "displayTimeUnit": "ms"}')

    return replace_file(path, write)  # Note [written whole] in gpipe.schedule.size
