"""The schedule interpreter: one worker runs one schedule device's tasks (F, R, B, W) over a transport.

A :class:`Worker` is one schedule device: the stages the schedule places on it, each stage's partition on its
own torch device (stages that share a worker share a device: :meth:`gpipe.interpreter.pipeline.Pipeline.workers`). It
receives what its tasks need and sends what they make through a :class:`gpipe.transport.base.Transport`, and knows
nothing of threads or processes (:class:`gpipe.interpreter.threads.ThreadRun` starts it on a thread).

Note [checkpointing]: a checkpointed forward runs under ``no_grad`` and keeps only its input; the
``R`` task recomputes it with grad right before the ``B`` task. Every random draw is identical
in both (see :mod:`gpipe.autograd.rng`).

Note [entering a partition]: a partition's input is a fresh leaf (its gradient is what goes back to the
previous stage). A partition that writes its input in place (``nn.ReLU(inplace=True)`` first) gets a
copy of it: the leaf keeps the values a recompute starts from, and the micro-batches of the first
stage, views of one batch that share a version counter, do not invalidate each other's saved tensors.
Whether it writes is learnt on a copy in its first training task; the others get an identity node
(``_Enter``), a non-leaf alias of the leaf, since autograd refuses in-place writes to a leaf that
requires grad. A partition that starts writing later, when checkpointed, is refused.

Note [batch norm in a recompute]: a plain ``nn.BatchNorm*`` layer in training mode updates its running statistics
on every call, so a checkpointed micro-batch would count twice (its forward, then its recompute). During a ``R``
task each such layer of the partition stops tracking (``track_running_stats`` off: it still normalises with the
micro-batch's own statistics, so the recompute's output is the forward's), and starts again after. Each
micro-batch then moves the running statistics once, whatever the checkpoint mode, as without a pipeline on
micro-batches; :class:`gpipe.DeferredBatchNorm` asks :func:`gpipe.autograd.phase.is_recomputing` itself and moves them
once per mini-batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from gpipe.autograd.gradients import Gradients
from gpipe.autograd.phase import checkpointing, recomputing
from gpipe.autograd.rng import Plan
from gpipe.autograd.split_backward import WeightGrads
from gpipe.batchnorm import DeferredBatchNorm
from gpipe.interpreter.pipeline import Pipeline
from gpipe.interpreter.portals import Portals
from gpipe.interpreter.recorder import Recorder
from gpipe.loss import NO_GRAD, LossPlan
from gpipe.microbatch import as_tensors
from gpipe.schedule import Op, Schedule, Task
from gpipe.schedule.timeline import COMPUTE
from gpipe.skip.skippable import use_tracker
from gpipe.transport.base import DRIVER, Message, Transport

__all__ = ["Step", "Worker"]

Grads = tuple[Tensor | None, ...]


@dataclass(frozen=True)
class Step:
    """What every worker of one step shares and only reads (``drew`` and ``gradients`` gather per partition).

    Attributes:
        pipeline: the partitions and what the runs learnt.
        schedule: the step's schedule.
        train: a training step (else: forwards under ``no_grad``).
        recorder: records the measured timeline, or ``None``.
        draw_plan, step_seed, drew: Note [random state] in :mod:`gpipe.autograd.rng`.
        gradients: where parameter gradients go (Note [gradients the caller asked for] in
            :mod:`gpipe.autograd.gradients`).
        loss: what :meth:`gpipe.GPipe.step`'s last stage computes on each micro-batch (:mod:`gpipe.loss`);
            ``None`` for ``forward()``.
    """

    pipeline: Pipeline
    schedule: Schedule
    train: bool
    recorder: Recorder | None
    draw_plan: list[Plan]
    step_seed: int
    drew: list[set[int]]
    gradients: Gradients
    loss: LossPlan | None


class Worker:
    """Runs the tasks of schedule device ``d``, keeping what only its own tasks need."""

    def __init__(self, step: Step, d: int, device: torch.device, transport: Transport) -> None:
        self.step, self.d, self.device, self.transport = step, d, device, transport
        self.leaves: dict[tuple[int, int], tuple[tuple[Tensor, ...], bool]] = {}  # with whether it was a tuple
        self.graphs: dict[tuple[int, int], tuple[Tensor, ...]] = {}
        # kept by a split B for W (gpipe.autograd.split_backward)
        self.pending: dict[tuple[int, int], WeightGrads | None] = {}
        self.split = {(t.microbatch, t.stage) for t in step.schedule.tasks[d] if t.op is Op.W}
        self.out_grads: dict[int, Grads] = {}  # step(): the gradient of the last stage's loss
        self.targets: dict[int, Message] = {}
        self.norms: dict[int, list[_BatchNorm]] = {}  # Note [batch norm in a recompute]
        self.skips = Portals(step.pipeline.skip_layout, step.train, transport)

    def run(self, task: Task) -> None:
        # Note [a pair in turn]: the two tasks of an overlapped pair (Schedule.pairs) run one after the other, in
        # list order: on a CPU device one thread computes both either way, and any valid pair also runs in turn
        # (Note [overlapped pairs] in gpipe.schedule.schedule). A CUDA device could give the second its own stream.
        op = task.op
        if op is Op.F:
            self._forward(task)
        elif op is Op.R:
            self._recompute(task)
        elif op is Op.B:
            self._backward(task)
        else:
            self._weight(task)

    def release(self) -> None:
        self.leaves.clear()
        self.graphs.clear()
        self.pending.clear()
        self.targets.clear()
        self.skips.release()

    def _call(self, task: Task, leaves: tuple[Tensor, ...], is_tuple: bool, recompute: bool,
              checkpointed: bool = False) -> tuple[tuple[Tensor, ...], bool]:
        """Run partition ``j`` on ``leaves``: its outputs and whether they were a tuple."""
        step = self.step
        i, j = task.microbatch, task.stage
        tracker = self.skips.tracker(i, j, recompute)
        writes = step.pipeline.writes_input[j] if step.train else False
        if writes is not False:  # Note [entering a partition]: a copy, to be written (or learn whether it is)
            fed = tuple(t.clone() for t in leaves)
        elif torch.is_grad_enabled():
            fed = tuple(_Enter.apply(t) if t.requires_grad else t for t in leaves)
        else:
            fed = leaves
        versions = [t._version for t in fed]
        arg: Any = fed if is_tuple else fed[0]
        layers: list[Callable[[Any], Any]] = list(cast(nn.Sequential, step.pipeline.partitions[j]))
        with_loss = step.schedule.is_last(j) and step.loss is not None
        if with_loss:  # GPipe.step: the loss is the task's last layer, seeded like the others (gpipe.autograd.rng)
            layers.append(functools.partial(self._loss, task))
        with use_tracker(tracker):
            output = step.pipeline.draws.forward(j, step.draw_plan[j], layers, arg, step.step_seed, i, self.device,
                                                 step.drew)
        changed = [k for k, (t, v) in enumerate(zip(fed, versions, strict=True)) if t._version != v]
        if writes is None and not recompute:
            step.pipeline.writes_input[j] = bool(changed)
        elif changed and checkpointed and not writes:
            raise RuntimeError(
                f"partition {j} modified its input in place (input {changed[0]}) during a checkpointed forward, "
                "which its earlier steps did not, so its recompute would start from different values; make the "
                "in-place layer out-of-place (e.g. nn.ReLU(inplace=False)) or use checkpoint='never'")
        if with_loss:
            if not recompute:
                self.transport.send(DRIVER, (task, "loss"), Message((output.detach(),)))
            if torch.is_grad_enabled():
                self.out_grads[i] = (torch.ones_like(output),)
            return (output,), False
        was_tuple, outputs = as_tensors(output, f"the output of partition {j}")
        return outputs, was_tuple

    def _loss(self, task: Task, output: Any) -> Tensor:
        """The scaled loss of micro-batch ``task.microbatch`` (:meth:`GPipe.step`; Note [an exact loss] in
        :mod:`gpipe.loss`), computed inside the task."""
        plan = self.step.loss
        assert plan is not None
        i = task.microbatch
        was_tuple, outputs = as_tensors(output, f"the output of partition {task.stage}")
        if i not in self.targets:  # kept for a recompute
            self.targets[i] = self.transport.receive(task.stage, (task, "target"))
        target, target_is_tuple = self.targets[i]
        loss = plan.fn(outputs[0] if not was_tuple else outputs, target if target_is_tuple else target[0])
        if not isinstance(loss, Tensor) or loss.dim() != 0:
            raise TypeError("loss_fn must return a scalar tensor (a reduced loss), got "
                            f"{type(loss).__name__ if not isinstance(loss, Tensor) else tuple(loss.shape)}")
        if torch.is_grad_enabled() and not loss.requires_grad:  # a checkpointed forward checks in its recompute
            raise RuntimeError(NO_GRAD)
        return loss * plan.scales[i]

    def _forward(self, task: Task) -> None:
        step = self.step
        i, j = task.microbatch, task.stage
        first = step.schedule.is_first(j)  # of its micro-batch's route (Note [stage slots] in gpipe.schedule)
        key = (task, "input") if first else (Task(Op.F, i, j - 1), "")
        inputs, is_tuple = self.transport.receive(j, key)
        recorder = step.recorder
        d = self.d
        start = recorder.now(d) if recorder else 0.0
        if step.train:
            leaves = tuple(t.detach().requires_grad_(t.requires_grad or (not first and t.is_floating_point()))
                           for t in cast(tuple[Tensor, ...], inputs))
            if step.schedule.is_checkpointed(i):
                with torch.no_grad(), checkpointing():
                    outputs, was_tuple = self._call(task, leaves, is_tuple, recompute=False, checkpointed=True)
                self.leaves[(i, j)] = (leaves, is_tuple)
                if recorder:
                    recorder.hold(d, i, j, sum(t.numel() * t.element_size() for t in leaves))
            else:
                with torch.enable_grad(), (recorder.saved(d, i, j) if recorder else _nothing()):
                    outputs, was_tuple = self._call(task, leaves, is_tuple, recompute=False)
                self.leaves[(i, j)] = (leaves, is_tuple)
                self.graphs[(i, j)] = outputs
        else:
            with torch.no_grad():  # a new thread starts with grad enabled, whatever the caller's mode
                outputs, was_tuple = self._call(task, cast(tuple[Tensor, ...], inputs), is_tuple, recompute=False)
        if recorder:
            recorder.span(d, COMPUTE, task, start)
        if not step.schedule.is_last(j):
            self.transport.send(j + 1, (task, ""), Message(tuple(t.detach() for t in outputs), was_tuple))
        elif step.loss is None:
            self.transport.send(DRIVER, (task, "output"),
                                Message(tuple(t.detach() if step.train else t for t in outputs), was_tuple))

    def _recompute(self, task: Task) -> None:
        i, j = task.microbatch, task.stage
        recorder = self.step.recorder
        start = recorder.now(self.d) if recorder else 0.0
        leaves, is_tuple = self.leaves[(i, j)]
        norms = self._tracking_norms(j)  # Note [batch norm in a recompute]
        for norm in norms:
            norm.track_running_stats = False
        try:
            with torch.enable_grad(), recomputing(), (recorder.saved(self.d, i, j) if recorder else _nothing()):
                self.graphs[(i, j)] = self._call(task, leaves, is_tuple, recompute=True)[0]
        finally:
            for norm in norms:
                norm.track_running_stats = True
        if recorder:
            recorder.span(self.d, COMPUTE, task, start)

    def _tracking_norms(self, j: int) -> list[_BatchNorm]:
        """Partition ``j``'s plain batch-norm layers that update running statistics now (found once a step)."""
        if j not in self.norms:
            self.norms[j] = [m for m in self.step.pipeline.partitions[j].modules()
                             if isinstance(m, _BatchNorm) and not isinstance(m, DeferredBatchNorm)
                             and m.training and m.track_running_stats]
        return self.norms[j]

    def _backward(self, task: Task) -> None:
        step = self.step
        i, j = task.microbatch, task.stage
        if not step.schedule.is_last(j):
            grads: Sequence[Tensor | None] = self.transport.receive(j, (Task(Op.B, i, j + 1), "")).tensors
        elif step.loss is not None:
            grads = self.out_grads.pop(i)
        else:
            grads = self.transport.receive(j, (Task(Op.F, i, j), "grad")).tensors
        stashed, skip_grads = self.skips.gradients_in(i, j)
        outputs = list(self.graphs.pop((i, j))) + stashed
        recorder = step.recorder
        start = recorder.now(self.d) if recorder else 0.0
        pairs = [(o, g) for o, g in zip(outputs, [*grads, *skip_grads], strict=True)
                 if g is not None and o.requires_grad]
        leaves = self.leaves.pop((i, j))[0]
        popped = self.skips.popped.pop((i, j), {})
        inputs = [t for t in leaves if t.requires_grad] + list(popped.values())
        if (i, j) in self.split:  # Note [split backward] in gpipe.autograd.split_backward: W(i, j) takes the rest
            some, self.pending[(i, j)] = step.gradients.input_grads(j, pairs, inputs)
            found = iter(some)
        else:
            found = iter(step.gradients.differentiate(j, pairs, inputs))
        result = tuple(next(found) if t.requires_grad else None for t in leaves)
        self.skips.send_gradients(task, popped, list(found))
        if recorder:
            recorder.span(self.d, COMPUTE, task, start)
            if (i, j) not in self.split:
                recorder.free(self.d, i, j)
        if not step.schedule.is_first(j):
            self.transport.send(j - 1, (task, ""), Message(result))
        else:
            self.transport.send(DRIVER, (task, "input-grad"), Message(result))

    def _weight(self, task: Task) -> None:
        i, j = task.microbatch, task.stage
        recorder = self.step.recorder
        start = recorder.now(self.d) if recorder else 0.0
        self.step.gradients.weight_grads(j, self.pending.pop((i, j)))
        if recorder:
            recorder.span(self.d, COMPUTE, task, start)
            recorder.free(self.d, i, j)


class _Enter(torch.autograd.Function):
    """Identity between a partition's leaf input and its first layer (Note [entering a partition])."""

    @staticmethod
    def forward(ctx: Any, input: Tensor) -> Tensor:  # type: ignore[override]
        return input.detach()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:  # type: ignore[override]
        return grad


class _nothing:  # noqa: N801 - a cheap null context manager
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None
