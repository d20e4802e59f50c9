"""GPipe: an ``nn.Sequential`` split into partitions over devices, run by worker threads that follow a schedule.

Switching from torchgpipe is a change of import::

    from gpipe import GPipe
    model = GPipe(model, balance=[2, 2], devices=["cpu", "cpu"], chunks=8)
    output = model(input)
    loss_fn(output, target).backward()

Note [the schedule drives both passes]: one worker thread per schedule device runs that device's task
list (its stages' tasks, e.g. from :func:`gpipe.schedule.gpipe`) in the schedule's order. ``forward()``
runs the forward tasks (each device's ``F`` prefix) and returns the gathered output, wired into autograd
through two nodes::

    inputs --> _Wait --phony--> _Gather --> output --> (the user's loss)

``_Gather.backward`` receives the output gradient and hands one piece per micro-batch to the workers; it
returns at once, because on a CUDA output it runs on the autograd engine's device thread, which the
workers' own backward calls need. The phony gradient is a CPU tensor, so ``_Wait.backward`` runs on the
thread that called ``backward()``: it starts the backward phase (the ``R``, ``B`` and any ``W`` tasks, on
the workers parked since the forward: Note [parked workers] in :mod:`gpipe.interpreter.parking`), waits for the
workers and returns the gradient of the inputs. Each ``B`` task calls ``torch.autograd.backward`` on its
own partition's graph on its worker's thread, so on CPU devices the backward passes of different
partitions overlap (autograd alone would run all of them on the caller's thread), and the order that
torchgpipe's fork/join enforces holds by construction.

Note [step]: ``pipe.step(input, target, loss_fn)`` runs a whole training step in one call: every task of
the schedule, the loss computed by the last partition on each micro-batch as soon as its forward ends.
That lets a schedule start backwards before all forwards end, as 1F1B (``schedule="1f1b"``) does. The
``forward()`` + ``backward()`` path runs the pipeline's schedule when every device runs its forwards first
(:attr:`Schedule.forwards_first <gpipe.schedule.Schedule.forwards_first>`: GPipe's, any such registered
schedule); one that interleaves them trains only through ``step()``, and infers with GPipe's forwards.

A schedule of copies of the stages (``schedule="dualpipe"``, DeepSeek-V3's two directions) runs a copy of each
partition in its second slot, synced before each step and its gradients summed into the partition's after it
(Note [one model, two copies] in :mod:`gpipe.interpreter.copies`); it trains through ``step()``.

What the arguments decide (partitions, placement, the schedule of each step) is decided in :mod:`gpipe.frontend`,
as for :class:`gpipe.distributed.DistributedGPipe` (Note [one front-end] there). Every step runs the
:class:`gpipe.interpreter.pipeline.Pipeline` this ``GPipe`` built (Note [what a run is given] there). The
worker threads are in :mod:`gpipe.interpreter.threads`, the interpreter of a device's tasks and checkpointing in
:mod:`gpipe.interpreter.worker`, what crosses between them in :mod:`gpipe.transport.base` and
:mod:`gpipe.transport.inprocess`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.autograd.graph import get_gradient_edge

from gpipe.checks import check_devices
from gpipe.frontend import Arguments, FrontEnd, forwards_first
from gpipe.interpreter.affinity import Cores, check_affinity
from gpipe.interpreter.copies import StageCopies
from gpipe.interpreter.gil import DEFAULT_SWITCH_INTERVAL, check_switch_interval
from gpipe.interpreter.parking import Parked
from gpipe.interpreter.pipeline import Pipeline
from gpipe.interpreter.threads import ThreadRun
from gpipe.loss import NO_GRAD, loss_plan, reduction_of
from gpipe.microbatch import as_tensors, scatter
from gpipe.schedule import Schedule
from gpipe.schedule.timeline import Timeline
from gpipe.skip.layout import SkipLayout

__all__ = ["GPipe"]

Device = torch.device | str | int


class GPipe(FrontEnd):
    """Pipeline-parallel wrapper of an ``nn.Sequential`` (torchgpipe's API).

    Args:
        module: the model; its children are the layers that ``balance`` counts.
        balance: layers per partition, e.g. ``[2, 3]``; see :mod:`gpipe.balance` to choose it.
        devices: one device per partition (several partitions may share one), or one per schedule device when
            the schedule places the stages on fewer (Note [placed stages] in :mod:`gpipe.interpreter.pipeline`): a
            schedule registered with a layout (``"interleaved-1f1b"``, ``"zb-v"``) places ``len(balance)`` stages on
            the ``p`` devices given; default: a CUDA device per schedule device when there are enough, else
            ``"cpu"`` for every partition.
        chunks: micro-batches per mini-batch; default 1, or a given schedule's ``m`` (Note [a given schedule] in
            :mod:`gpipe.frontend`).
        checkpoint: ``"always"``, ``"except_last"`` (default) or ``"never"``; a given schedule's policy by default.
        deferred_batch_norm: replace batch norm by :class:`gpipe.DeferredBatchNorm`.
        record: record a measured :class:`~gpipe.schedule.timeline.Timeline` of every training step
            (:attr:`timeline`); settable later.
        schedule: the name of a registered schedule (:data:`gpipe.schedule.SCHEDULES`): ``"gpipe"``
            (default), ``"1f1b"`` (trained with :meth:`step`), ``"dualpipe"`` (DeepSeek-V3's two directions: a
            device per stage, each also running a copy of another, Note [one model, two copies] in
            :mod:`gpipe.interpreter.copies`), or one a user registered; or a
            :class:`~gpipe.schedule.Schedule` itself (generated, searched, read with
            :func:`~gpipe.schedule.read_schedule`), which every training step then runs as it is: its stages are the
            partitions, its placement places them, ``chunks`` and ``checkpoint`` must agree with it (Note [a given
            schedule] in :mod:`gpipe.frontend`).
        cpu_affinity: one set of CPU cores per partition or per schedule device (or ``None`` for one left
            unpinned): its worker thread runs only there (Linux; :mod:`gpipe.interpreter.affinity`, Note [pinned
            workers]).
        switch_interval: seconds Python's interpreter lock may stay with one thread while two or more
            workers run (:mod:`gpipe.interpreter.gil`, Note [switch interval]). This changes interpreter-wide state:
            ``sys.setswitchinterval`` holds for every thread of the process while a phase's workers run, and
            the previous interval comes back when they end, on every path (a failing task, an interrupt, a
            forward whose backward never runs; overlapping pipelines keep the shortest until the last one
            ends). ``None`` opts out: the interpreter's setting is left alone.

    Raises:
        TypeError: ``module`` is not an ``nn.Sequential``.
        ValueError: a bad balance, chunks, checkpoint mode, schedule name or device list; a given schedule whose
            stages, ``m`` or policy disagree with the balance, ``chunks`` or ``checkpoint``; duplicate layers; invalid
            skip connections (see :func:`gpipe.skip.verify_skippables`).
        ScheduleError: a given schedule is not valid (a deadlock shows its grid).
    """

    def __init__(self, module: nn.Sequential, balance: Sequence[int] | None = None, *,
                 devices: Sequence[Device] | None = None, chunks: int | None = None, checkpoint: str | None = None,
                 deferred_batch_norm: bool = False, record: bool = False, schedule: str | Schedule = "gpipe",
                 cpu_affinity: Sequence[Cores | None] | None = None,
                 switch_interval: float | None = DEFAULT_SWITCH_INTERVAL) -> None:
        super().__init__()
        # Note [one front-end] in gpipe.frontend: the arguments checked, then placed on the devices given
        count = None if devices is None or isinstance(devices, (str, bytes, int, torch.device)) else len(devices)
        spec = self._take(Arguments.check("GPipe", module, balance, chunks=chunks, checkpoint=checkpoint,
                                          schedule=schedule, deferred_batch_norm=deferred_batch_norm).on_devices(count))
        placement, n = spec.placement, spec.arguments.slots  # a partition per slot (Note [stage slots])
        placed = check_devices(devices, n, placement)
        if cpu_affinity is not None and not isinstance(cpu_affinity, (str, bytes, int)) \
                and len(cpu_affinity) == max(placement) + 1 < n:
            cpu_affinity = [list(cpu_affinity)[d] for d in placement]  # one per schedule device, as devices may be
        affinity = check_affinity(cpu_affinity, n)
        interval = check_switch_interval(switch_interval)
        copies = spec.arguments.copies
        originals = [nn.Sequential(layers).to(device)
                     for layers, device in zip(spec.stage_layers(), placed[:len(self.balance)], strict=True)]
        self.partitions = nn.ModuleList(originals)  # the model's own: Note [one model, two copies]
        self._copies = StageCopies(originals, placed, copies) if copies > 1 else None
        partitions = list(self._copies.partitions) if self._copies is not None else originals
        # what every step runs: Note [what a run is given] in gpipe.interpreter.pipeline
        self.pipeline = Pipeline.of(partitions, placed, spec.arguments.skip_layout, cpu_affinity=affinity,
                                    switch_interval=interval)
        self.record = record
        self.timeline: Timeline | None = None
        self._accumulators: dict[int, tuple[Tensor, Any]] = {}  # id(parameter) -> (it, its gradient accumulator)
        self.pipeline.workers(self.schedule)  # a placement whose workers' devices disagree fails here, not in a step

    @property
    def devices(self) -> list[torch.device]:
        """The device of each partition."""
        return list(self.pipeline.devices)

    @property
    def skip_layout(self) -> SkipLayout:
        """The partition of each skip connection's stash and pop."""
        return self.pipeline.skip_layout

    @property
    def cpu_affinity(self) -> list[frozenset[int] | None] | None:
        """The cores of each partition's worker (``None`` for one left unpinned); ``None``: no pinning."""
        affinity = self.pipeline.cpu_affinity
        return None if affinity is None else list(affinity)

    @property
    def switch_interval(self) -> float | None:
        """Seconds the interpreter lock may stay with one thread while workers run; ``None``: left alone."""
        return self.pipeline.switch_interval

    # -- nn.Sequential's face -------------------------------------------------------------------------

    def __len__(self) -> int:
        return sum(len(cast(nn.Sequential, p)) for p in self.partitions)

    def __iter__(self) -> Iterator[nn.Module]:
        for partition in self.partitions:
            yield from cast(nn.Sequential, partition)

    def __getitem__(self, index: int) -> nn.Module:
        layers = list(self)
        try:
            return layers[index]
        except IndexError:
            raise IndexError(f"layer index {index} out of range for {len(layers)} layers") from None

    def to(self, *args: Any, **kwargs: Any) -> GPipe:  # type: ignore[override]
        device, dtype, *_ = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None:
            raise TypeError("GPipe places its partitions itself and cannot be moved to a device; pass devices=[...] "
                            "when you build it (dtype casts such as .to(torch.float64) are allowed)")
        return cast(GPipe, super().to(*args, **kwargs))

    def cuda(self, device: Any = None) -> GPipe:
        raise TypeError("GPipe places its partitions itself and cannot be moved with .cuda(); pass devices=[...]")

    def cpu(self) -> GPipe:
        raise TypeError("GPipe places its partitions itself and cannot be moved with .cpu(); pass devices=[...]")

    # -- running --------------------------------------------------------------------------------------

    def forward(self, input: Any) -> Any:
        """Run the forward tasks on the micro-batches of ``input``; return the output on the last device."""
        was_tuple, tensors = as_tensors(input, "GPipe's input")
        batches = scatter(tensors, self.chunks)
        m = len(batches)
        params = [p for p in self.parameters() if p.requires_grad]
        train = torch.is_grad_enabled() and (bool(params) or any(t.requires_grad for t in tensors))
        mode = self.checkpoint if (train and self.training) else "never"
        if self._copies is not None:
            if train:
                raise RuntimeError(f"the {self.schedule_name!r} schedule runs copies of the stages, whose gradients "
                                   "are summed after its backward: train with pipe.step(input, target, loss_fn)")
            self._copies.sync()
            schedule = forwards_first(self.schedule_for(m, mode))  # Note [inference on copies] in gpipe.frontend
        else:  # inference by a given schedule: GPipe's forwards on its placement, for any m (Note [a given schedule])
            schedule = self.schedule_for(m, mode, "gpipe" if self.spec.arguments.given is not None and not train
                                         else None)
        if not schedule.forwards_first:  # Note [step]
            if train:
                raise RuntimeError(f"the {self.schedule_name!r} schedule interleaves forward and backward, so the "
                                   "loss must be known before the forward ends: train with pipe.step(input, target, "
                                   "loss_fn)")
            schedule = self.schedule_for(m, mode, "gpipe")  # inference: only forwards, in GPipe's order
        run = ThreadRun(self.pipeline, schedule, batches, was_tuple, train, self.record and train)
        run.execute_forward()
        if run.recorder is not None:
            run.recorder.pause()
        if not train:
            return run.gathered()
        try:  # the workers are parked for the backward (Note [parked workers] in gpipe.interpreter.parking)
            leaves = [t for t in tensors if t.requires_grad]
            run.input_requires_grad = [t.requires_grad for t in tensors]
            run.gradients.differentiable = leaves + [p for ps in run.gradients.params for p in ps]
            phony = _Wait.apply(self, run, *(run.gradients.differentiable or [torch.empty(0, requires_grad=True)]))
            outputs = _Gather.apply(run, self._nodes(leaves, run.gradients.differentiable[len(leaves):]), phony)
        except BaseException:
            run.cancel()
            raise
        return outputs if run.output_is_tuple else outputs[0]

    def step(self, input: Any, target: Any, loss_fn: Callable[..., Tensor], *,
             loss_reduction: str | None = None) -> Tensor:
        """Forward and backward of one mini-batch in one call, by this pipeline's schedule (GPipe, 1F1B, ...).

        The last partition computes ``loss_fn(output, target)`` on each micro-batch as soon as its forward ends,
        so a schedule may start a micro-batch's backward before the others' forwards: 1F1B needs this. The
        micro-batches' losses are scaled so that they add up to the plain model's loss on the whole batch, and
        the gradients with them (Note [an exact loss] in :mod:`gpipe.loss`): a ``torch.nn`` loss module's
        ``reduction`` decides (cross entropy and NLL divide by the class weight of the targets that count, as
        with ``ignore_index`` padding); any other callable is taken as a mean over rows unless
        ``loss_reduction="sum"``. Gradients accumulate into the parameters, and into an input that requires
        grad, as after ``loss.backward()``.

        Args:
            input: a tensor or a tuple of tensors, split along dim 0 into micro-batches.
            target: the same for the loss, split alike.
            loss_fn: ``loss_fn(output, target)`` returns a scalar tensor for one micro-batch.
            loss_reduction: ``"mean"`` (over rows) or ``"sum"``: how a callable that is not a ``torch.nn`` loss
                module combines its micro-batch losses; default ``"mean"``.

        Returns:
            The mini-batch's loss (detached), on the last device.

        Raises:
            ValueError: the target's batch size differs from the input's; a loss module with
                ``reduction="none"``; a ``loss_reduction`` other than ``"mean"`` or ``"sum"``, or one that
                contradicts the module's own.
            RuntimeError: grad is disabled, or the loss does not require grad (detached, or nothing it depends on
                requires grad), as ``loss.backward()`` raises; no gradient is written and the pipeline stays usable.
        """
        was_tuple, tensors = as_tensors(input, "GPipe's input")
        _, targets = as_tensors(target, "the target")
        batches = scatter(tensors, self.chunks)
        target_batches = scatter(targets, self.chunks)
        if targets[0].size(0) != tensors[0].size(0):
            raise ValueError(f"the target's batch size {targets[0].size(0)} differs from the input's "
                             f"{tensors[0].size(0)}")
        if not torch.is_grad_enabled():
            raise RuntimeError("pipe.step trains: call it with grad enabled (not under torch.no_grad())")
        # a later stage's input always requires grad (it takes the gradient back), so the last stage cannot tell
        if not any(t.requires_grad for t in tensors) and not any(p.requires_grad for p in self.parameters()):
            raise RuntimeError(NO_GRAD)
        mode = self.checkpoint if self.training else "never"
        plan = loss_plan(loss_fn, reduction_of(loss_fn, loss_reduction), targets, [b[0].size(0) for b in batches])
        run = ThreadRun(self.pipeline, self.schedule_for(len(batches), mode), batches, was_tuple, True, self.record,
                  (plan, target_batches))
        run.input_requires_grad = [t.requires_grad for t in tensors]
        if self._copies is not None:  # Note [one model, two copies] in gpipe.interpreter.copies
            self._copies.sync()
            try:
                run.execute_all()
            except BaseException:
                self._copies.drop()
                raise
            self._copies.reduce()
        else:
            run.execute_all()
        self._keep_timeline(run)
        leaves = [t for t in tensors if t.requires_grad]
        if leaves:  # the input's gradient, as loss.backward() leaves it (into x.grad, or on into x's own graph)
            grads = run.input_grads()
            torch.autograd.backward([t for t, g in zip(leaves, grads, strict=True) if g is not None],
                                    [g for g in grads if g is not None])
        return plan.total([run.losses[i] for i in range(len(batches))])

    def _nodes(self, leaves: Sequence[Tensor], params: Sequence[Tensor]) -> list[Any]:
        """The autograd nodes that receive the gradients of ``leaves`` and ``params`` (the parameters' kept from
        one step to the next: looking them up every step would put that work on the step's critical path)."""
        kept = {}  # only this step's parameters stay
        for p in params:
            entry = self._accumulators.get(id(p))
            kept[id(p)] = entry if entry is not None and entry[0] is p else (p, get_gradient_edge(p).node)
        self._accumulators = kept
        return [get_gradient_edge(t).node for t in leaves] + [kept[id(p)][1] for p in params]

    def _keep_timeline(self, run: ThreadRun) -> None:
        """After a run ended well: its measured timeline, if it recorded one, becomes :attr:`timeline`."""
        if run.timeline is not None:
            self.timeline = run.timeline


class _Wait(torch.autograd.Function):
    """The pipeline's node in the caller's graph: its inputs are the step's inputs and every parameter.

    Its backward waits for the workers and returns the inputs' gradients and, where the caller asked for
    parameter gradients through ``torch.autograd.grad``, theirs (Note [gradients the caller asked for] in
    :mod:`gpipe.autograd.gradients`).
    """

    @staticmethod
    def forward(ctx: Any, pipe: GPipe, run: ThreadRun, *inputs: Tensor) -> Tensor:  # type: ignore[override]
        ctx.pipe = pipe
        ctx.run = run
        ctx.parked = Parked(run)  # freed with this graph: a backward that never comes sends the workers away
        ctx.count = len(inputs)
        return torch.empty(0)

    @staticmethod
    def backward(ctx: Any, *grad: Tensor) -> Any:
        run: ThreadRun = ctx.run
        run.finish_backward()
        ctx.pipe._keep_timeline(run)
        if not run.gradients.differentiable:
            return None, None, None
        grads = run.input_grads()
        params = run.gradients.parameter_grads() if run.gradients.collect else [None] * (ctx.count - len(grads))
        return (None, None, *grads, *params)


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, run: ThreadRun, nodes: list[Any], phony: Tensor) -> Any:  # type: ignore[override]
        ctx.run = run
        ctx.nodes = nodes
        outputs = run.gathered_tensors()
        for t in outputs:
            if not t.is_floating_point() and not t.is_complex():
                ctx.mark_non_differentiable(t)
        return outputs

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> Any:
        if torch.is_grad_enabled():
            raise RuntimeError("GPipe does not support create_graph=True (a gradient of a gradient, as a gradient "
                               "penalty takes): each partition's backward runs on its own worker, outside the "
                               "caller's graph. Compute such a term on an un-pipelined copy of the model, or drop "
                               "create_graph")
        run: ThreadRun = ctx.run
        run.gradients.asked(_asked(ctx.nodes))
        run.start_backward(grads)
        return None, None, torch.empty(0)


def _asked(nodes: Sequence[Any]) -> list[bool] | None:
    """Which of the gradient ``nodes`` (of the inputs and parameters) the running backward reaches; None under
    ``torch.autograd.grad``.

    Autograd cannot tell, inside ``torch.autograd.grad``, whether it will reach a leaf; then every
    parameter gradient is computed and the engine keeps those it was asked for.
    """
    asked = []
    for node in nodes:
        try:
            asked.append(torch._C._will_engine_execute_node(node))
        except RuntimeError:  # a leaf under torch.autograd.grad
            return None
    return asked
