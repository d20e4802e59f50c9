"""Faults across ranks: a failure on one rank reaches every rank, and every wait for another rank is bounded.

Note [no rank left waiting]: a rank that fails (an exception in a task, a wait past the timeout, a peer lost)
writes a report (its rank, stage, task and traceback) under one key of the rendezvous store. Every rank has an
:class:`Alarm` whose thread watches that key; when it appears, the alarm wakes the rank's current wait, which
raises :class:`PipelineFailed` with the report. A wait never blocks the rank itself: a waiter thread per peer
blocks on the communication work, in posting order (Note [one order per pair] in
:mod:`gpipe.transport.routes`), and the rank waits on an event with the timeout. A killed rank closes its
connections, so its peers' works fail at once (gloo); one that hangs is caught by the timeout. A rank busy in
a task sees the alarm at its next task or wait.
"""

from __future__ import annotations

import datetime
import queue
import threading
import time
import traceback
from typing import Any

import torch.distributed as dist

__all__ = ["Alarm", "Pending", "PipelineFailed", "Waiter", "report"]

_KEY = "failed"


class PipelineFailed(RuntimeError):
    """A distributed step failed: the message names the rank, stage and task that failed and its traceback."""


def report(rank: int, where: str, error: BaseException) -> str:
    """The text every rank raises with: who failed, where, and the original traceback."""
    trace = "".join(traceback.format_exception(error)).rstrip()
    return (f"rank {rank}, {where} failed with {type(error).__name__}: {error}\n"
            f"--- traceback on rank {rank} ---\n{trace}")


class Alarm:
    """One pipeline's failure key in the store, watched by a thread (Note [no rank left waiting]).

    Args:
        store: a store every rank reaches (the rendezvous's); ``watcher``: a second client of it for the thread.
        rank: this process's rank.
        timeout: seconds any wait for another rank may last.
        poll: seconds between two looks of the thread at the store.
        peers: how the ranks that waits name are numbered, where that is not the world's (a replica's pipeline:
            its transport names its peers by schedule device); ``""``: the world's.
    """

    def __init__(self, store: Any, watcher: Any, rank: int, timeout: float, poll: float = 0.25,
                 peers: str = "") -> None:
        self.store, self.watcher, self.rank, self.timeout, self.poll = store, watcher, rank, timeout, poll
        self.peers = peers
        self.failure: str | None = None
        self.lock = threading.Lock()
        self.waiting: threading.Event | None = None
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True, name=f"gpipe-alarm-{rank}")
        self.thread.start()

    def _watch(self) -> None:
        while not self.closed.wait(self.poll):
            try:
                if not self.watcher.check([_KEY]):
                    continue
                text = self.watcher.get(_KEY).decode(errors="replace")
            except Exception as lost:  # noqa: BLE001 - the store's host is gone
                if not self.closed.is_set():
                    self._ring(f"rank {self.rank} lost the rendezvous store (its host rank died?): {lost}")
                return
            self._ring(text)
            return

    def _ring(self, text: str) -> None:
        with self.lock:
            if self.failure is None:
                self.failure = text
            if self.waiting is not None:
                self.waiting.set()

    def fail(self, text: str) -> None:
        """Tell every rank (this one too) that the step failed, with ``text`` (:func:`report`)."""
        self._ring(text)
        try:
            self.store.set(_KEY, text)
        except Exception:  # noqa: BLE001 - the store is gone: the others learn from their own waits
            pass

    def check(self) -> None:
        """Raise :class:`PipelineFailed` if any rank has failed."""
        if self.failure is not None:
            raise PipelineFailed(self._told(self.failure))

    def _told(self, text: str) -> str:
        if text.startswith(f"rank {self.rank},"):
            return text
        return f"rank {self.rank} stopped because {text}"

    def wait(self, pending: Pending, what: str, world: bool = False) -> None:
        """Wait for ``pending`` at most the timeout; raise at once when a rank fails (Note [no rank left waiting]).
        ``world``: ``what`` names ranks in the world (else as :attr:`peers` says).

        Raises:
            PipelineFailed: a rank failed, the work failed (a peer lost), or the timeout passed.
        """
        self.check()
        done = pending.done
        with self.lock:
            self.waiting = done
        try:
            finished = done.wait(self.timeout)
        finally:
            with self.lock:
                self.waiting = None
        self.check()
        peers = "" if world else self.peers
        if not finished:
            text = (f"rank {self.rank} waited {self.timeout:g} s for {what}{peers}, which never came: that rank "
                    "died or hangs (raise DistributedGPipe(timeout=...) for slow steps)")
        elif pending.error is not None:
            text = f"rank {self.rank} lost {what}{peers}: {pending.error}"
        else:
            return
        self.fail(text)
        raise PipelineFailed(text) from pending.error

    def close(self) -> None:
        self.closed.set()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=2 * self.poll)


class Pending:
    """A posted communication work and, once a waiter has waited for it, whether it failed."""

    def __init__(self, work: Any) -> None:
        self.work = work
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.at = 0.0  # when the waiter saw it complete (time.perf_counter), for a recorded timeline


class Waiter:
    """A thread that waits for one peer's works in the order they were posted (Note [no rank left waiting])."""

    def __init__(self, name: str) -> None:
        self.queue: queue.SimpleQueue[Pending | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, daemon=True, name=name)
        self.thread.start()

    def add(self, work: Any) -> Pending:
        pending = Pending(work)
        self.queue.put(pending)
        return pending

    def _run(self) -> None:
        while (pending := self.queue.get()) is not None:
            try:
                pending.work.wait()
            except BaseException as error:  # noqa: BLE001 - handed to the rank that waits for it
                pending.error = error
            pending.at = time.perf_counter()
            pending.done.set()

    def close(self) -> None:
        """End the thread once the works queued so far are waited for (at once after a good step)."""
        self.queue.put(None)
        self.thread.join(timeout=1.0)


def store_client(store: Any, timeout: float) -> Any:
    """A second client of ``store``'s TCP store, for a thread of its own (a client is one socket)."""
    inner = store
    while isinstance(inner, dist.PrefixStore):
        inner = inner.underlying_store
    if isinstance(inner, dist.TCPStore):
        return dist.TCPStore(inner.host, inner.port, is_master=False,
                             timeout=datetime.timedelta(seconds=max(timeout, 1.0)), wait_for_workers=False)
    return store
