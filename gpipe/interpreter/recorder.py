"""Measured timelines: the spans and memory samples one training step of :class:`gpipe.GPipe` records.

Times come from a monotonic host clock on CPU devices and from CUDA events on CUDA streams, brought to one
time base (each device's first event is recorded right after the host clock starts). Memory samples are the
bytes saved for backward per device, on every device type, counted by saved-tensor hooks exactly as the profiler
counts them (:mod:`gpipe.profiling.profile`: parameters and buffers excluded, overlapping views counted once), so that
they mean what the simulator's samples mean. On CUDA devices ``meta["allocator_peak_bytes"]`` adds what the
caching allocator held at its peak during the step beyond what it held when the step began (gradients,
activations in flight, workspaces: everything; the step resets the device's peak statistics). The time between
``forward()`` and the output's ``backward()`` (the user's loss) is cut out on CPU devices: it is not the
pipeline's. ``meta["held_bytes"]`` maps each ``F`` and ``R`` task (``"R0@1"``) to the bytes it added to its
device's count: per stage and micro-batch, what the simulator's saved and checkpoint bytes stand for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from gpipe.autograd.saved import SavedBytes, storage_key
from gpipe.interpreter.pipeline import Pipeline
from gpipe.schedule import Schedule, Task
from gpipe.schedule.timeline import COPY, MemorySample, Span, Timeline

__all__ = ["Recorder"]


class Recorder:
    """Spans and memory samples of one step (Note [the schedule drives both passes]: one per device).

    Args:
        pipeline: what the step runs: its devices, partitions and copy streams.
        schedule: the step's schedule, described in the timeline's ``meta``.
        threads_per_worker: each worker's intra-op threads, for the ``meta`` too.
        devices: the torch device of each schedule device (:meth:`gpipe.interpreter.pipeline.Pipeline.workers`).
    """

    def __init__(self, pipeline: Pipeline, schedule: Schedule, threads_per_worker: int,
                 devices: Sequence[torch.device]) -> None:
        self.pipeline = pipeline
        self.schedule = schedule
        self.threads_per_worker = threads_per_worker
        self.devices = tuple(devices)
        self.cuda = any(dev.type == "cuda" for dev in self.devices)
        self.spans: list[tuple[int, str, Task, Any, Any, str]] = []
        self.lock = threading.Lock()
        self.held: dict[int, dict[tuple[int, int], int]] = {d: {} for d in range(len(self.devices))}
        self.memory: list[tuple[int, Any, int]] = []
        self.added: dict[str, int] = {}  # "F0@1" / "R0@1" -> the bytes that task added to its device's count
        self.model_state = [{storage_key(t) for t in [*p.parameters(), *p.buffers()]} for p in pipeline.partitions]
        self.paused_at = 0.0
        self.paused = 0.0
        if self.cuda:
            self.base: dict[torch.device, Any] = {}
            self.allocated0: dict[torch.device, int] = {}
            for dev in {d for d in self.devices if d.type == "cuda"}:
                torch.cuda.synchronize(dev)
                self.allocated0[dev] = torch.cuda.memory_allocated(dev)
                torch.cuda.reset_peak_memory_stats(dev)
        self.t0 = time.perf_counter()
        if self.cuda:
            for dev in {d for d in self.devices if d.type == "cuda"}:
                event = torch.cuda.Event(enable_timing=True)
                event.record(torch.cuda.current_stream(dev))
                self.base[dev] = event
        for d in range(len(self.devices)):
            self.memory.append((d, 0.0, 0))

    def pause(self) -> None:
        self.paused_at = time.perf_counter()

    def resume(self) -> None:
        """Time between the forward and the backward (the user's loss) is not the pipeline's: cut it out."""
        if self.paused_at and not self.cuda:
            self.paused += time.perf_counter() - self.paused_at

    def now(self, d: int, copy: bool = False) -> Any:
        device = self.devices[d]
        if device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            stream = self.pipeline.copy_stream(device) if copy else torch.cuda.current_stream(device)
            event.record(stream)
            return event
        return time.perf_counter() - self.t0 - self.paused

    def span(self, d: int, stream: str, task: Task, start: Any, label: str = "") -> None:
        end = self.now(d, copy=stream == COPY)
        with self.lock:
            self.spans.append((d, stream, task, start, end, label))

    def hold(self, d: int, i: int, j: int, nbytes: int) -> None:
        with self.lock:
            held = self.held[d]
            op = "R" if (i, j) in held else "F"  # F(i, j) always holds first (its input, or what it saved)
            self.added[f"{op}{i}@{j}"] = nbytes
            held[(i, j)] = held.get((i, j), 0) + nbytes
            self.memory.append((d, self.now(d), sum(held.values())))

    def free(self, d: int, i: int, j: int) -> None:
        with self.lock:
            self.held[d].pop((i, j), None)
            self.memory.append((d, self.now(d), sum(self.held[d].values())))

    def saved(self, d: int, i: int, j: int) -> Any:
        """Count the bytes this task saves for backward (parameters and buffers excluded), as the profiler does."""
        counter = SavedBytes(self.model_state[j])
        recorder = self

        class _Saved:
            def __enter__(self) -> None:
                self.hooks = counter.hooks()
                self.hooks.__enter__()

            def __exit__(self, *exc: Any) -> None:
                self.hooks.__exit__(*exc)
                if exc[0] is None:
                    recorder.hold(d, i, j, counter.nbytes)

        return _Saved()

    def timeline(self) -> Timeline:
        schedule = self.schedule
        peaks: dict[str, int] = {}
        if self.cuda:
            for dev in self.base:
                torch.cuda.synchronize(dev)
                peaks[str(dev)] = max(torch.cuda.max_memory_allocated(dev) - self.allocated0[dev], 0)

        def seconds(d: int, value: Any) -> float:
            if isinstance(value, float):
                return value
            return self.base[self.devices[d]].elapsed_time(value) / 1e3

        spans = [Span(d, stream, task, seconds(d, start), seconds(d, end), label)
                 for d, stream, task, start, end, label in self.spans]
        memory = [MemorySample(d, seconds(d, t), b) for d, t, b in self.memory]
        memory.sort(key=lambda s: (s.device, s.time))
        meta: dict[str, Any] = {
            "schedule": schedule.name, "m": schedule.m, "n": schedule.n,
            "checkpoint": schedule.checkpoint, "placement": list(schedule.placement),
            "devices": [str(dev) for dev in self.devices],
            "model_state_bytes": [sum(t.numel() * t.element_size() for t in [*p.parameters(), *p.buffers()])
                                  for p in self.pipeline.partitions],
            "threads_per_worker": self.threads_per_worker,
            "held_bytes": dict(self.added),
        }
        if peaks:
            meta["allocator_peak_bytes"] = peaks
        return Timeline(tuple(spans), tuple(memory), len(self.devices), "measured", meta)
