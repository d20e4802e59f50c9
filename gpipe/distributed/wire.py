"""The transport between ranks: point-to-point ``isend``/``irecv`` to stages on other ranks, a mailbox for this one.

:class:`Wire` is the :class:`gpipe.transport.base.Transport` of one rank in one step. A message for a stage on this
rank (or for the driver, which is every rank's own caller) stays in process; one for a stage on another rank is
held until its task ends and then sent in the pair's order (Note [one order per pair] in
:mod:`gpipe.transport.routes`), behind a header the first time its kind crosses (Note [structure once] in
:mod:`gpipe.transport.structure`).

Note [receives posted ahead]: at the start of a step, and after each task (its sends first), a rank posts the
receives of the next ``lookahead`` messages each peer will send it, so a message lands while the rank computes;
posting costs the rank's thread time on gloo, and posted there it delays no task whose input just came. A
message whose structure is not yet known is preceded by its header, and nothing after it is posted until that
header arrived (its buffers' sizes come from it). Receives are waited for in a waiter thread per peer, so every
wait is bounded and woken by a failure elsewhere (Note [no rank left waiting] in
:mod:`gpipe.distributed.faults`).

Note [a receive's stream]: with NCCL, ``work.wait()`` blocks no thread: it makes the calling thread's current
CUDA stream wait for the communication. The waiter thread's wait therefore orders nothing the rank computes; the
thread that takes a received buffer calls ``wait()`` again on its own stream before using it (for gloo the work
is complete by then and the call returns at once). Not yet run on a GPU.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from gpipe.distributed.clock import Transfers
from gpipe.distributed.faults import Alarm, Pending, Waiter
from gpipe.distributed.group import Ranks
from gpipe.schedule import Op, Schedule, Task
from gpipe.skip.layout import SkipLayout
from gpipe.transport.base import DRIVER, Key, Message, Transport
from gpipe.transport.routes import LOSS, Route, incoming, loss_key, outgoing
from gpipe.transport.structure import HEADER, Structure, decode, describe, encode, structure_of

__all__ = ["Links", "Wire"]

Kind = tuple[Op, int, Hashable, int]  # the producing op, stage and channel, and the micro-batch's rows


@dataclass
class Links:
    """What outlives a step: the ranks' groups, a waiter per peer and direction, the structures exchanged."""

    ranks: Ranks
    alarm: Alarm
    lookahead: int = 2
    receivers: dict[int, Waiter] = field(default_factory=dict)
    senders: dict[int, Waiter] = field(default_factory=dict)
    sent: dict[tuple[int, Kind], Structure] = field(default_factory=dict)  # per destination rank
    known: dict[tuple[int, Kind], Structure] = field(default_factory=dict)  # per source rank
    routes: dict[int, tuple[Schedule, dict[int, list[Route]]]] = field(default_factory=dict)  # by id(schedule)

    @property
    def rank(self) -> int:
        return self.ranks.rank

    @property
    def device(self) -> torch.device:
        return self.ranks.device

    def incoming(self, schedule: Schedule, layout: SkipLayout) -> dict[int, list[Route]]:
        """What each other rank sends this one in a step of ``schedule``, derived once per schedule (the pipeline
        keeps its schedules, one per micro-batch count and mode; the cache holds each it saw alive)."""
        cached = self.routes.get(id(schedule))
        if cached is None or cached[0] is not schedule:
            cached = self.routes[id(schedule)] = (schedule, incoming(schedule, layout, self.rank))
        return cached[1]

    def waiter(self, peer: int, send: bool) -> Waiter:
        waiters = self.senders if send else self.receivers
        if peer not in waiters:
            waiters[peer] = Waiter(f"gpipe-{'send' if send else 'recv'}-{self.rank}-{peer}")
        return waiters[peer]

    def close(self) -> None:
        for waiter in [*self.receivers.values(), *self.senders.values()]:
            waiter.close()
        self.alarm.close()


@dataclass
class _Posted:
    """A receive posted ahead: its header's work while its structure is unknown, else its tensors' works."""

    key: Key
    kind: Kind
    header: tuple[Tensor, Pending] | None = None
    structure: Structure | None = None
    buffers: list[Tensor | None] = field(default_factory=list)
    works: list[Pending] = field(default_factory=list)


class Wire(Transport):
    """One rank's transport in one step (Note [receives posted ahead]).

    Args:
        links: the rank's process group and what it learnt in earlier steps.
        schedule: the step's schedule; its device ``d`` is rank ``d``.
        layout: where each skip connection is stashed and popped.
        rows: the rows of each micro-batch (every rank knows them from the step's start).
    """

    def __init__(self, links: Links, schedule: Schedule, layout: SkipLayout, rows: list[int],
                 record: bool = False) -> None:
        self.links, self.schedule, self.layout, self.rows = links, schedule, layout, rows
        # Note [one time base] in gpipe.distributed.clock: what crossed, and when, for a recorded step
        self.transfers: Transfers | None = {"sent": [], "arrived": []} if record else None
        self.rank = links.rank
        self.placement = schedule.placement
        self.mailbox: dict[Key, Message] = {}
        self.outbox: list[tuple[int, Key, Message]] = []
        self.streams = {src: deque(routes) for src, routes in links.incoming(schedule, layout).items()}
        self.posted: dict[int, deque[_Posted]] = {src: deque() for src in self.streams}
        self.sends: list[tuple[Pending, Tensor, str]] = []
        for src in self.streams:
            self._post(src)

    # -- Transport ---------------------------------------------------------------------------------

    def send(self, stage: int, key: Key, message: Message) -> None:
        if stage == DRIVER or self.placement[stage] == self.rank:
            self.mailbox[key] = message
        else:
            self.outbox.append((stage, key, message))

    def receive(self, stage: int, key: Key) -> Message:
        if key in self.mailbox:
            return self.mailbox.pop(key)
        src = self.placement[key[0].stage]
        if stage == DRIVER or src == self.rank or src not in self.streams:
            raise RuntimeError(f"no stage sent {key[0]} {key[1]!r} to stage {stage} on rank {self.rank}")
        posted = self.posted[src]
        while not any(p.key == key for p in posted):
            if not self.streams[src] and not (posted and posted[-1].structure is None):
                raise RuntimeError(f"rank {src} never sends {key[0]} {key[1]!r} to rank {self.rank}")
            self._unblock(src)
            self._post(src, force=True)
        while True:  # earlier messages of the stream arrive first; keep them
            entry = posted.popleft()
            message = self._complete(src, entry)
            if entry.key == key:
                break
            self.mailbox[entry.key] = message
        return message

    def stop(self) -> None:
        """Nothing to wake: a rank's waits are woken by its alarm (Note [no rank left waiting])."""

    # -- sending -----------------------------------------------------------------------------------

    def flush(self, task: Task) -> None:
        """Send what ``task`` made for other ranks, in the pair's order (Note [one order per pair])."""
        routes = [r for r in outgoing(task, self.schedule.n, self.layout, self.schedule.copies)
                  if self.placement[r[1]] != self.rank]
        held = {key: (stage, message) for stage, key, message in self.outbox}
        self.outbox = []
        if set(held) != {key for key, _ in routes}:
            raise RuntimeError(f"task {task} on rank {self.rank} sent {sorted(map(str, held))} to other ranks, "
                               f"not the messages its schedule routes: {[str(k) for k, _ in routes]}")
        for key, stage in routes:
            self._send(self.placement[stage], key, held[key][1])
        for src in self.streams:  # Note [receives posted ahead]: after the task, not between its input and it
            self._post(src)

    def send_loss(self, loss: Tensor) -> None:
        """From the last stage's rank: the step's loss to every other rank (:data:`gpipe.transport.routes.LOSS`)."""
        for dst in range(self.schedule.num_devices):
            if dst != self.rank:
                self._send(dst, loss_key(self.schedule), Message((loss,)))

    def _send(self, dst: int, key: Key, message: Message) -> None:
        links = self.links
        kind = self._kind(key)
        structure = structure_of(message.tensors, message.is_tuple)
        declared = links.sent.get((dst, kind))
        what = f"{key[0]} {key[1]!r}" if key[1] != "" else str(key[0])
        if self.transfers is not None and key[1] != LOSS:
            self.transfers["sent"].append((dst, str(key[0]), _channel(key), time.perf_counter()))
        if declared is None:
            links.sent[(dst, kind)] = structure
            self._isend(dst, encode(structure).to(links.device), what)
        elif declared != structure:
            raise ValueError(f"{what} sends {describe(structure)} to rank {dst}, but this pipeline declared "
                             f"{describe(declared)} for it earlier: every step must send one structure per kind "
                             "of message and micro-batch size (build a new DistributedGPipe for a new shape)")
        for t in message.tensors:
            if t is not None:
                self._isend(dst, t.detach().contiguous(), what)

    def _isend(self, dst: int, tensor: Tensor, what: str) -> None:
        work = dist.isend(tensor, group=self.links.ranks.carrying(self.rank, dst), group_dst=dst)
        self.sends.append((self.links.waiter(dst, send=True).add(work), tensor, f"rank {dst} to take {what}"))

    def finish(self) -> None:
        """Wait for every send of the step; check that every message due to this rank came."""
        for pending, _, what in self.sends:
            self.links.alarm.wait(pending, what)
        self.sends = []
        left = [str(p.key[0]) for ps in self.posted.values() for p in ps] + \
               [str(k[0]) for routes in self.streams.values() for k, _ in routes]
        if left:
            raise RuntimeError(f"rank {self.rank} ended its tasks with messages never received: {left}")

    # -- receiving ---------------------------------------------------------------------------------

    def _kind(self, key: Key) -> Kind:
        task, channel = key
        rows = 0 if channel == LOSS else self.rows[task.microbatch]
        return task.op, task.stage, channel, rows

    def _post(self, src: int, force: bool = False) -> None:
        """Post the next receives from ``src`` (Note [receives posted ahead]); ``force``: one more, at least."""
        stream, posted = self.streams[src], self.posted[src]
        while stream and (force or len(posted) < self.links.lookahead):
            if posted and posted[-1].structure is None:
                return  # behind a header: the sizes of what follows are not known yet
            force = False
            (key, _), = (stream.popleft(),)
            entry = _Posted(key, self._kind(key))
            entry.structure = self.links.known.get((src, entry.kind))
            if entry.structure is None:
                header = torch.empty(HEADER, dtype=torch.int64, device=self.links.device)
                entry.header = (header, self._irecv(src, header))
            else:
                self._post_tensors(src, entry)
            posted.append(entry)

    def _unblock(self, src: int) -> None:
        """The last posted entry of ``src`` waits for its header: take it and post its tensors."""
        posted = self.posted[src]
        if posted and posted[-1].structure is None:
            entry = posted[-1]
            assert entry.header is not None
            header, pending = entry.header
            self.links.alarm.wait(pending, f"rank {src} to send the header of {entry.key[0]} {entry.key[1]!r}")
            self._on_this_stream(pending)
            entry.structure = decode(header.cpu())
            self.links.known[(src, entry.kind)] = entry.structure
            self._post_tensors(src, entry)

    def _post_tensors(self, src: int, entry: _Posted) -> None:
        assert entry.structure is not None
        for spec in entry.structure[1]:
            if spec is None:
                entry.buffers.append(None)
                continue
            buffer = torch.empty(spec[1], dtype=spec[0], device=self.links.device)
            entry.buffers.append(buffer)
            entry.works.append(self._irecv(src, buffer))

    def _irecv(self, src: int, buffer: Tensor) -> Pending:
        work = dist.irecv(buffer, group=self.links.ranks.carrying(src, self.rank), group_src=src)
        return self.links.waiter(src, send=False).add(work)

    def _on_this_stream(self, pending: Pending) -> None:
        """Note [posted by the waiters]: on gloo a send does its copy into the socket inside ``isend`` and a receive may
read its data inside ``irecv``: time of the calling thread for every message, on the critical path when the
rank's own thread does it. So on CPU the waiter thread of the peer posts each communication and then
waits for it, in the order handed to it (the pair's order); the rank's thread only hands it over and computes on,
and a core idle in the other rank's bubble can do the copy. With NCCL the rank's thread posts (the communicator
is used from one thread, and a receive's wait orders its stream: below).

Note [a receive's stream]: on CUDA, make this thread's current stream wait for the receive."""
        if self.links.device.type == "cuda":
            pending.work.wait()

    def _complete(self, src: int, entry: _Posted) -> Message:
        if entry.structure is None:
            self.posted[src].appendleft(entry)
            self._unblock(src)
            self.posted[src].popleft()
        assert entry.structure is not None
        for pending in entry.works:
            self.links.alarm.wait(pending, f"rank {src} to send {entry.key[0]} {entry.key[1]!r}")
            self._on_this_stream(pending)
        if self.transfers is not None and entry.key[1] != LOSS:
            works = entry.works or ([entry.header[1]] if entry.header is not None else [])
            at = max((p.at for p in works), default=time.perf_counter())
            self.transfers["arrived"].append((src, str(entry.key[0]), _channel(entry.key), at))
        return Message(tuple(entry.buffers), entry.structure[0])


def _channel(key: Key) -> str:
    """A message's channel as text: ``""`` for an activation or gradient, else the skip key's repr."""
    return "" if key[1] == "" else repr(key[1])
