"""The hand-offs between a run's worker threads: an inbox per device, a stop when one fails, copies onto a device.

Note [hand-offs]: a worker sends its result (activations downstream, gradients upstream) to the
inbox (a ``queue.SimpleQueue``) of the worker of the next stage. The receiver moves tensors to its
device (on its copy stream for CUDA; on CPU devices the hand-off itself is the copy). An exception in
any task is recorded, every worker is woken with a stop message, all threads are joined, and the
original exception is raised in the caller with its traceback (:class:`gpipe.worker.Run`).
"""

from __future__ import annotations

import queue
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from gpipe.schedule import Task

__all__ = ["Inboxes", "Stopped", "device_context", "moved"]

_STOP = object()  # wakes a worker when another one failed


class Stopped(Exception):
    """Raised inside a worker that was told to stop because another one failed."""


class Inboxes:
    """One inbox per device, and the messages a worker took out of its inbox before it needed them."""

    def __init__(self, devices: int) -> None:
        self.inbox: list[queue.SimpleQueue[Any]] = [queue.SimpleQueue() for _ in range(devices)]
        self.mail: list[dict[Task, Any]] = [{} for _ in range(devices)]

    def send(self, d: int, task: Task, payload: Any) -> None:
        """Hand ``payload``, the result of ``task``, to the worker of device ``d``."""
        self.inbox[d].put((task, payload))

    def receive(self, d: int, task: Task) -> Any:
        """The result of ``task`` sent to device ``d``: waits for it, keeping what arrives first.

        Raises:
            Stopped: :meth:`stop` was called (another worker failed).
        """
        mail = self.mail[d]
        while task not in mail:
            key, payload = self.inbox[d].get()
            if payload is _STOP:
                raise Stopped
            mail[key] = payload
        return mail.pop(task)

    def stop(self) -> None:
        """Wake every worker waiting on its inbox with a stop message."""
        for box in self.inbox:
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
