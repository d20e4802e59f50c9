"""A stage's gradients reduced over its replicas in buckets, each launched as the backward makes it, each a span.

Note [buckets as DDP fills them]: a stage's parameters (those that require grad), in reverse order, fill buckets of
at most ``bucket_bytes`` (a larger parameter is a bucket of its own), as ``DistributedDataParallel``'s reducer fills
them in the order a backward produces gradients. A bucket is numbered as the simulator numbers its units, in forward
order (unit 0 holds the stage's first parameters: :mod:`sim.core.collectives`), and reduced last-unit first. Every
gradient task of a stage adds into every bucket, so a bucket is final during the stage's last gradient task on this
rank (``B``, or ``W`` where the backward is split: ``Schedule.gradient_positions``), once that task has accumulated
each of its parameters' gradients (``register_post_accumulate_grad_hook``, as DDP's reducer hooks them; a task
accumulates a parameter once: ``B`` is one engine call, and ``W``'s calls split the parameters between them). Then it is
launched, ``dist.all_reduce(flat, group=dp, async_op=True)`` of its gradients flattened, while the task computes the
rest; buckets launch in their order, a full one waiting for those before it (DDP's rule: every replica issues the
group's collectives in one order), and any left when the task ends (a parameter it did not reach) launch then. The
step waits for them before it returns, so the caller's optimizer reads reduced gradients. A parameter with no
gradient on this rank adds zeros, so every replica reduces the same bucket, and gets the reduced gradient.

Note [a collective's span]: each bucket is a span on the rank's communication stream (``COLLECTIVE``), its task the
gradient task in which it launched, its label the simulator's (``all-reduce unit 0 (1.5 KiB)``); the step's loss is
one too (``all-reduce loss (4 B)``, after the last stage's last ``F``), which the simulator does not model. Its start is
when it was launched or, if later, when the rank's previous collective ended (the ranks of a group run its
collectives one at a time, in order, as the simulator's stream does); its end is when a waiter thread saw
``work.wait()`` return, on the host clock. On gloo that is when the bytes are in; on NCCL ``wait()`` returns once
the device's stream waits for the collective, so there the end is when it was queued, not done.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from gpipe.distributed.faults import Alarm, Pending, Waiter
from gpipe.interpreter.recorder import Recorder
from gpipe.schedule import Schedule, Task
from gpipe.schedule.timeline import COLLECTIVE, collective_label

__all__ = ["DDP_BUCKET_BYTES", "Bucket", "Reduction", "buckets", "stage_buckets"]

#: ``DistributedDataParallel``'s ``bucket_cap_mb`` default, 25 MiB (torch.nn.parallel.DistributedDataParallel).
DDP_BUCKET_BYTES = 25 * 2**20


@dataclass(frozen=True)
class Bucket:
    """Parameters of one stage reduced together: ``unit``, their place in forward order (Note [buckets as DDP fills
    them])."""

    stage: int
    unit: int
    params: tuple[nn.Parameter, ...]

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.params)


def buckets(stage: int, params: list[nn.Parameter], cap_bytes: int) -> list[Bucket]:
    """Stage ``stage``'s buckets in the order they are reduced, last unit first (Note [buckets as DDP fills them])."""
    filled: list[list[nn.Parameter]] = []
    held = 0
    for p in reversed(params):
        size = p.numel() * p.element_size()
        if not filled or (filled[-1] and held + size > cap_bytes):
            filled.append([])
            held = 0
        filled[-1].append(p)
        held += size
    return [Bucket(stage, len(filled) - 1 - k, tuple(ps)) for k, ps in enumerate(filled)]


def stage_buckets(stage: int, partition: nn.Module, cap_bytes: int) -> list[Bucket]:
    """:func:`buckets` of ``partition``'s parameters that require grad: what the executor reduces for stage
    ``stage``, and what the simulator predicts it reduces (:mod:`sim.calibration.replicas`)."""
    return buckets(stage, [p for p in partition.parameters() if p.requires_grad], cap_bytes)


@dataclass
class _Launched:
    bucket: Bucket | None  # None: the step's loss
    task: Task
    flat: Tensor
    pending: Pending
    issued: float  # seconds from the recorder's start


class Reduction:
    """One step's reductions on this rank over its dp group (Note [buckets as DDP fills them]).

    Args:
        group: the dp group; ``ranks``: its global ranks (for messages).
        schedule, d: the step's schedule and this rank's schedule device.
        stages: each stage of this rank's buckets, in the order they are reduced.
        alarm: bounds every wait (Note [no rank left waiting] in :mod:`gpipe.distributed.faults`).
        recorder: where the spans go (Note [a collective's span]), or ``None``.
    """

    def __init__(self, group: object, ranks: list[int], schedule: Schedule, d: int, stages: dict[int, list[Bucket]],
                 alarm: Alarm, recorder: Recorder | None) -> None:
        self.group, self.ranks, self.d, self.alarm, self.recorder = group, ranks, d, alarm, recorder
        tasks = schedule.tasks[d]
        last = {tasks[k].stage: k for k in schedule.gradient_positions[d]}
        self.due = {k: stages[j] for j, k in last.items() if stages.get(j)}  # task position -> its buckets
        self.launched: list[_Launched] = []
        self.waiter = Waiter(f"gpipe-reduction-{d}")
        self.hooks: list[RemovableHandle] = []
        # the task that runs: its buckets, how many of each one's parameters it has yet to accumulate, the next to go
        self.running: tuple[Task, list[Bucket], list[int]] | None = None
        self.next = 0

    def before(self, k: int, task: Task) -> None:
        """Task ``k`` of this rank's list is to run: hook the buckets it completes (Note [buckets as DDP fills
        them])."""
        due = self.due.get(k)
        if not due:
            return
        self.running, self.next = (task, due, [len(b.params) for b in due]), 0
        for n, bucket in enumerate(due):
            self.hooks += [p.register_post_accumulate_grad_hook(functools.partial(self._accumulated, n))
                           for p in bucket.params]

    def _accumulated(self, n: int, param: Tensor) -> None:
        """The running task has accumulated ``param``'s gradient, of its bucket ``n``: launch the buckets ready."""
        assert self.running is not None
        task, due, missing = self.running
        missing[n] -= 1
        while self.next < len(due) and missing[self.next] == 0:
            self._bucket(due[self.next], task)
            self.next += 1

    def after(self, k: int, task: Task) -> None:
        """Task ``k`` of this rank's list has ended: launch what it completed and did not launch yet."""
        if k not in self.due:
            return
        for hook in self.hooks:
            hook.remove()
        self.hooks.clear()
        assert self.running is not None
        for bucket in self.running[1][self.next:]:
            self._bucket(bucket, task)
        self.running = None

    def _bucket(self, bucket: Bucket, task: Task) -> None:
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in bucket.params]
        self._launch(bucket, task, torch.cat([g.reshape(-1) for g in grads]))

    def total(self, loss: Tensor, task: Task) -> Tensor:
        """The step's loss summed over the replicas (Note [a replica's batch] in :mod:`gpipe.distributed.replicas`);
        ``task``: the last stage's last forward, which it follows."""
        self._launch(None, task, loss.detach().reshape(1).clone())
        return self.finish().view_as(loss)

    def _launch(self, bucket: Bucket | None, task: Task, flat: Tensor) -> None:
        issued = time.perf_counter() - self.recorder.t0 if self.recorder else 0.0
        work = dist.all_reduce(flat, group=self.group, async_op=True)
        self.launched.append(_Launched(bucket, task, flat, self.waiter.add(work), issued))

    def finish(self) -> Tensor:
        """Wait for every reduction launched, write the reduced gradients back, record the spans; the last reduced
        tensor (the loss, from :meth:`total`), or an empty one.

        Raises:
            PipelineFailed: a rank failed, or a reduction was lost or passed the timeout.
        """
        previous, last = 0.0, torch.empty(0)
        for launched in self.launched:
            what = "the step's loss" if launched.bucket is None else \
                f"stage {launched.bucket.stage}'s gradients, unit {launched.bucket.unit}"
            self.alarm.wait(launched.pending, f"the all-reduce of {what} with ranks {self.ranks}", world=True)
            last = launched.flat
            if launched.bucket is not None:
                offset = 0
                for p in launched.bucket.params:
                    reduced = launched.flat[offset:offset + p.numel()].view_as(p)
                    offset += p.numel()
                    if p.grad is None:
                        p.grad = reduced.clone()
                    else:
                        p.grad.copy_(reduced)
            if self.recorder is not None:
                start = max(launched.issued, previous)
                previous = end = max(launched.pending.at - self.recorder.t0, start)
                nbytes = launched.flat.numel() * launched.flat.element_size()
                reduced_what: int | str = "loss" if launched.bucket is None else launched.bucket.unit
                with self.recorder.lock:  # Note [a collective's span]: its own start and end, not the recorder's now
                    self.recorder.spans.append((self.d, COLLECTIVE, launched.task, start, end,
                                                collective_label("all-reduce", reduced_what, nbytes)))
        self.launched.clear()
        return last

    def close(self) -> None:
        for hook in self.hooks:
            hook.remove()
        self.waiter.close()
