"""The in-process transport: an inbox per worker thread, a stop when one fails, copies onto the receiving device.

Note [hand-offs]: a worker sends its result (activations downstream, gradients upstream, skip tensors) to the
inbox (a ``queue.SimpleQueue``) of the worker of the receiving stage (:class:`gpipe.transport.base.Transport`). The
receiver moves tensors to its stage's device (on the device's copy stream for CUDA, recorded as a copy span;
on CPU devices the hand-off itself is the copy). An exception in any task is recorded, every worker is woken
with a stop message, all threads are joined, and the original exception is raised in the caller with its
traceback (:class:`gpipe.interpreter.threads.ThreadRun`).

Note [what the hand-offs read]: the transport sits below the interpreter, so it names what it reads of the
interpreter's objects instead of importing them: each stage's device and copy stream (:class:`Stages`, which a
:class:`gpipe.interpreter.pipeline.Pipeline` is) and where a copy is recorded (:class:`Copies`, which a
:class:`gpipe.interpreter.recorder.Recorder` is).
"""

from __future__ import annotations

import queue
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from gpipe.schedule import Schedule, Task
from gpipe.schedule.timeline import COPY
from gpipe.transport.base import DRIVER, Key, Message, Stopped, Transport

__all__ = ["Copies", "InProcess", "Stages", "device_context", "moved"]

_STOP = object()  # wakes a worker when another one failed


class Stages(Protocol):
    """Each stage's device and each device's copy stream (Note [what the hand-offs read])."""

    @property
    def devices(self) -> tuple[torch.device, ...]:
        """The torch device of each stage."""

    def copy_stream(self, device: torch.device) -> Any:
        """The stream copies onto ``device`` run on; ``None`` off CUDA."""


class Copies(Protocol):
    """Where the hand-offs record each copy onto a device (Note [what the hand-offs read])."""

    def now(self, d: int, copy: bool = False) -> Any:
        """A time stamp on schedule device ``d``: on its copy stream with ``copy``."""

    def span(self, d: int, stream: str, task: Task, start: Any, label: str = "") -> None:
        """Record a span of ``task`` on ``d``'s ``stream`` from ``start`` to now."""


class InProcess(Transport):
    """Threads of one process: one inbox per schedule device and one for the driver (Note [hand-offs]).

    Args:
        pipeline: the partitions' devices and copy streams.
        schedule: where each stage runs (its placement).
        recorder: records a copy span per copy onto a device, or ``None``.
    """

    def __init__(self, pipeline: Stages, schedule: Schedule, recorder: Copies | None) -> None:
        self.placement = schedule.placement
        self.devices = pipeline.devices
        self.pipeline = pipeline
        self.recorder = recorder
        workers = schedule.num_devices
        self.inbox: list[queue.SimpleQueue[Any]] = [queue.SimpleQueue() for _ in range(workers + 1)]  # last: driver
        self.mail: list[dict[Key, Message]] = [{} for _ in range(workers + 1)]

    def send(self, stage: int, key: Key, message: Message) -> None:
        self.inbox[self.placement[stage] if stage != DRIVER else -1].put((key, message))

    def receive(self, stage: int, key: Key) -> Message:
        if stage == DRIVER:
            return self._drained(key)
        d = self.placement[stage]
        mail = self.mail[d]
        inbox = self.inbox[d]
        while key not in mail:  # keep what arrives first
            got, payload = inbox.get()
            if payload is _STOP:
                raise Stopped
            mail[got] = payload
        message = mail.pop(key)
        device = self.devices[stage]
        if all(t is None or t.device == device for t in message.tensors):
            return message
        recorder = self.recorder
        start = recorder.now(d, copy=True) if recorder else 0.0
        arrived = moved(message.tensors, device, self.pipeline.copy_stream(device) if device.type == "cuda" else None)
        if recorder is not None:
            recorder.span(d, COPY, key[0], start, label="skip" if isinstance(key[1], tuple) else "")
        return Message(arrived, message.is_tuple)

    def _drained(self, key: Key) -> Message:
        """The driver's message ``key``: the workers have ended, so it is in the inbox or was never sent."""
        mail, inbox = self.mail[-1], self.inbox[-1]
        while key not in mail and not inbox.empty():
            got, payload = inbox.get_nowait()
            mail[got] = payload
        try:
            return mail.pop(key)
        except KeyError:
            raise RuntimeError(f"no worker sent {key[0]} {key[1]!r} to the driver") from None

    def stop(self) -> None:
        for box in self.inbox[:-1]:
            box.put((None, _STOP))


def moved(tensors: Sequence[Tensor | None], device: torch.device, stream: Any) -> tuple[Any, ...]:
    """``tensors`` on ``device``; on a CUDA device, copied on its copy ``stream`` (``None``: a plain ``.to``),
    after the work that made them and before the device's compute stream goes on (Note [hand-offs])."""
    if stream is not None:
        compute = torch.cuda.current_stream(device)
        for t in tensors:
            if t is not None and t.device.type == "cuda":
                stream.wait_stream(torch.cuda.current_stream(t.device))
        with torch.cuda.stream(stream):
            moved = tuple(None if t is None else t.to(device, non_blocking=True) for t in tensors)
        compute.wait_stream(stream)
        for t, out in zip(tensors, moved, strict=True):
            if t is not None and t.device.type == "cuda":
                t.record_stream(stream)
            if out is not None:
                out.record_stream(compute)
    else:
        moved = tuple(None if t is None else t.to(device) for t in tensors)
    return moved


class device_context:  # noqa: N801
    """On a CUDA device, make it and its primary context current on the worker's thread.

    The device guard alone sets no context when the thread's current device already is that one (a
    fresh thread reports device 0 without having a context), and cuBLAS, finding none, warns and sets
    the primary context itself. A stream query is a runtime call, which makes the context current.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.guard = torch.cuda.device(device) if device.type == "cuda" else None

    def __enter__(self) -> None:
        if self.guard is not None:
            self.guard.__enter__()
            torch.cuda.current_stream(self.device).query()

    def __exit__(self, *exc: Any) -> None:
        if self.guard is not None:
            self.guard.__exit__(*exc)
