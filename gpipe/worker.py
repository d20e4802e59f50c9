"""The worker threads of one step: each device's task list in order, on a thread of its own.

:class:`Run` is one mini-batch through a pipeline (:class:`gpipe.pipeline.Pipeline`, which a :class:`gpipe.GPipe`
builds): one thread per device runs that device's tasks of the schedule (Note [the schedule drives both passes]
in :mod:`gpipe.pipe`), receiving its inputs from the previous stage's worker and sending its results on. A
recorded run's measured timeline is :attr:`Run.timeline` once it has ended; the ``GPipe`` keeps it.

Note [threads]: every worker sets its intra-op thread count to the caller's (``torch.get_num_threads()``
when the step starts). A fresh thread's OpenMP and MKL pools do not inherit ``torch.set_num_threads``:
left alone, each worker would start a pool as wide as the machine, and on a small CPU the workers' pools
would spin on each other's cores (steps several times slower).

Note [launch order]: a run starts its workers as fresh threads, and starting a thread takes
Python's interpreter lock, on both sides, for a while. The worker whose first task can run at once
(the first stage's in the forward phase, the last stage's in the backward phase) is started last, so
the others are already waiting on their inboxes and the main thread on them: started first, its first
task would trade the lock with the thread starts that follow (a small-layer forward was 40% slower).
Parked workers are woken in the same order.
The main thread then waits for one event, set by the last worker to end, rather than joining each
worker in turn (each join woke it, to take the lock, while the next worker computed).

Note [parked workers]: a training ``forward()`` starts the workers once, for both phases: after its
forward tasks each worker parks on an event of its own, and ``backward()`` wakes them (the last stage's
last) instead of starting fresh threads: starting two threads again, each a scheduler's wake-up on busy
cores, was on the critical path between the last forward and the first backward, which ``step()`` runs
back to back (``benchmarks/executor_speed.py`` times both entry points).
Parked workers hold nothing but the run: a failure, an interrupt, or the forward's graph freed before its
backward (:class:`Parked`, held by that graph) sends them away.

Note [hand-offs] in :mod:`gpipe.handoff`: results go to the next stage's inbox, and are copied on arrival; the
skip connections that cross partitions take their own way (:mod:`gpipe.skip.portal`).

Note [checkpointing]: a checkpointed forward runs under ``no_grad`` and keeps only its input; the
``R`` task recomputes it with grad right before the ``B`` task. Every random draw is identical
in both (see :mod:`gpipe.rng`).

Note [entering a partition]: a partition's input is a fresh leaf (its gradient is what goes back to the
previous stage). A partition that writes its input in place (``nn.ReLU(inplace=True)`` first) gets a
copy of it: the leaf keeps the values a recompute starts from, and the micro-batches of the first
stage, views of one batch that share a version counter, do not invalidate each other's saved tensors.
Whether it writes is learnt on a copy in its first training task; the others get an identity node
(``_Enter``), a non-leaf alias of the leaf, since autograd refuses in-place writes to a leaf that
requires grad. A partition that starts writing later, when checkpointed, is refused.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn

from gpipe import gil, rng
from gpipe.affinity import pinned
from gpipe.batchnorm import DeferredBatchNorm
from gpipe.gradients import Gradients
from gpipe.handoff import Inboxes, Stopped, device_context, moved
from gpipe.microbatch import as_tensors, gather
from gpipe.phase import checkpointing, recomputing
from gpipe.pipeline import Pipeline
from gpipe.recorder import Recorder
from gpipe.schedule import Op, Schedule, Task
from gpipe.skip.portal import Portals
from gpipe.skip.skippable import use_tracker
from gpipe.timeline import COMPUTE, COPY, Timeline

__all__ = ["Parked", "Run"]

Grads = tuple[Tensor | None, ...]


class Run:
    """One mini-batch through the pipeline: the forward phase now, the backward phase when autograd asks."""

    def __init__(self, pipeline: Pipeline, schedule: Schedule, batches: list[tuple[Tensor, ...]], input_is_tuple: bool,
                 train: bool, record: bool) -> None:
        self.pipeline = pipeline
        self.schedule = schedule
        self.batches = batches
        self.input_is_tuple = input_is_tuple
        self.train = train
        self.record = record
        self.n = schedule.n
        self.devices = pipeline.devices
        self.affinity = pipeline.cpu_affinity
        self.partitions = list(pipeline.partitions)
        self.layout = pipeline.skip_layout
        # Note [random state] in gpipe.rng: the partitions that run under the dispatch mode this step, and the
        # step's seed, drawn only when one of them may draw
        self.draws = pipeline.draws
        self.writes_input = pipeline.writes_input  # per partition, learnt in its first training task (None before)
        self.draw_plan = self.draws.plan()
        self.drew: list[set[int]] = [set() for _ in range(schedule.n)]  # the layers seen drawing
        self.step_seed = rng.step_seed() if any(p is None or p for p in self.draw_plan) else 0
        self.checkpoints = train and any(schedule.is_checkpointed(i) for i in range(schedule.m))
        self.outside: tuple[Any, ...] | None = None  # Python's and NumPy's random states when a phase starts
        self.gradients = Gradients(self.partitions)  # Note [gradients the caller asked for] in gpipe.gradients
        self.inboxes = Inboxes(len(schedule.tasks))
        self.error: BaseException | None = None
        self.error_lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.interval: float | None = None  # the switch interval this run holds while its workers run
        self.running = 0  # workers of the current phase still running
        self.finished = threading.Event()  # set by the last of them
        self.parked = False  # Note [parked workers]: the workers wait for the backward phase
        self.cancelled = False  # ... and were told to leave instead
        self.go = [threading.Event() for _ in schedule.tasks]  # per device: the backward phase may start
        self.leaves: dict[tuple[int, int], tuple[Tensor, ...]] = {}
        self.graphs: dict[tuple[int, int], tuple[Tensor, ...]] = {}
        self.outputs: dict[int, tuple[Tensor, ...]] = {}
        self.output_is_tuple = False
        self.tuple_between: dict[int, bool] = {}
        self.out_grads: dict[int, Grads] = {}
        self.in_grads: dict[int, Grads] = {}
        self.input_requires_grad: list[bool] = []
        self.skips = Portals(self.layout, train)  # the skips that cross partitions
        self.backward_started = False
        self.backward_done = False
        self.threads_per_worker = torch.get_num_threads()
        self.recorder = Recorder(pipeline, schedule, self.threads_per_worker) if record else None
        self.timeline: Timeline | None = None  # the recorder's, once the run has ended well
        self.loss: tuple[Callable[..., Tensor], list[Any], list[float]] | None = None  # set by GPipe.step
        self.losses: dict[int, Tensor] = {}

    # -- phases -----------------------------------------------------------------------------------------

    @property
    def phases(self) -> list[tuple[tuple[Task, ...], tuple[Task, ...]]]:
        """Each device's task list cut in two: its leading F tasks (``forward()``), then the rest (backward)."""
        cut = []
        for tasks in self.schedule.tasks:
            k = next((x for x, t in enumerate(tasks) if t.op is not Op.F), len(tasks))
            if any(t.op is Op.F for t in tasks[k:]):
                raise ValueError(f"schedule {self.schedule.name!r} interleaves forward and backward tasks on one "
                                 "device; forward() + backward() runs schedules whose forwards come first")
            cut.append((tasks[:k], tasks[k:]))
        return cut

    def execute_all(self) -> None:
        """Run every task of the schedule at once (:meth:`GPipe.step`): the last stage computes the loss."""
        for i in range(self.schedule.m):
            self.out_grads[i] = (None,)  # filled by the loss of F(i, n-1), see _call
        self.launch(self.schedule.tasks, first=self.schedule.device_of(0))
        self.finish()

    def execute(self, forward: bool) -> None:
        """Run the forward phase (training: the workers then park for the backward, Note [parked workers]) or,
        on fresh workers, the backward phase."""
        phases = self.phases
        if forward:
            later = [tasks[1] for tasks in phases] if self.train else None
            self.launch([tasks[0] for tasks in phases], first=self.schedule.device_of(0), later=later)
        else:
            self.launch([tasks[1] for tasks in phases], first=self.schedule.device_of(self.n - 1))
        self.join()

    def launch(self, task_lists: Sequence[Sequence[Task]], first: int,
               later: Sequence[Sequence[Task]] | None = None) -> None:
        """Start one worker thread per device on its task list; device ``first``'s thread last (Note [launch order]).
        With ``later``, each worker parks after its list until :meth:`resume` (Note [parked workers])."""
        self.threads = [threading.Thread(target=self._work, args=(d, [tasks] if later is None else [tasks, later[d]]),
                                         daemon=True, name=f"gpipe-worker-{d}")
                        for d, tasks in enumerate(task_lists)]
        self.parked = later is not None
        self._arm()
        for d, thread in enumerate(self.threads):
            if d != first:
                thread.start()
        self.threads[first].start()

    def _arm(self) -> None:
        """Before a phase's workers run: its count of workers, its end event, the switch interval, the outside RNGs."""
        # Note [switch interval] in gpipe.gil: until join() has seen the phase end
        interval = self.pipeline.switch_interval if len(self.threads) > 1 else None
        if interval is not None and self.interval is None:
            gil.enter(interval)
            self.interval = interval
        self.running = len(self.threads)
        self.finished = threading.Event()
        self.outside = rng.outside_state() if self.checkpoints else None

    def resume(self, first: int) -> None:
        """Wake the parked workers for their second task list; device ``first``'s last (Note [launch order])."""
        self.parked = False
        self._arm()
        for d, go in enumerate(self.go):
            if d != first:
                go.set()
        self.go[first].set()

    def cancel(self) -> None:
        """Send parked workers away: their backward will not come (Note [parked workers]). Safe from any thread."""
        if self.parked:
            self.cancelled = True
            for go in self.go:
                go.set()

    def join(self) -> None:
        """Wait for the phase's workers: one wake-up when the last one ends or parks (Note [launch order])."""
        try:
            while not self.finished.wait(timeout=0.1):
                pass
            if self.error is not None or not self.parked:
                for thread in self.threads:
                    thread.join()
        except BaseException as interrupt:  # KeyboardInterrupt while waiting: stop the workers, then re-raise
            self._fail(interrupt)
            for thread in self.threads:
                thread.join()
            raise
        finally:
            # parked workers wait idle, so the caller's code between the phases runs with its own interval
            if self.interval is not None and (self.finished.is_set() or not any(t.is_alive() for t in self.threads)):
                gil.leave(self.interval)
                self.interval = None
        if self.error is not None or not self.parked:
            self.threads = []
        if self.error is not None:
            raise self.error
        if self.outside is not None:
            rng.check_outside(self.outside)
        self.draws.learn(self.draw_plan, self.drew)

    def gathered_tensors(self) -> tuple[Tensor, ...]:
        return gather([self.outputs[i] for i in range(self.schedule.m)])

    def gathered(self) -> Any:
        outputs = self.gathered_tensors()
        return outputs if self.output_is_tuple else outputs[0]

    def start_backward(self, grads: Sequence[Tensor | None]) -> None:
        if self.backward_started:
            raise RuntimeError("this pipeline's forward was already run backward: GPipe frees each micro-batch's "
                               "graph as its backward runs, so retain_graph=True cannot run a second backward. Run "
                               "the forward again, or take every gradient in one call "
                               "(torch.autograd.grad(loss, [a, b]))")
        self.backward_started = True
        sizes = [self.outputs[i][0].size(0) for i in range(self.schedule.m)]
        pieces = [g.split(sizes, dim=0) if g is not None else [None] * len(sizes) for g in grads]
        for i in range(self.schedule.m):
            self.out_grads[i] = tuple(p[i] for p in pieces)

    def finish_backward(self) -> None:
        """Run the backward phase and wait for it: the caller's thread starts it only once it has nothing else
        to do in Python (Note [parked workers])."""
        if self.backward_done:
            return
        self.backward_done = True
        if self.recorder is not None:
            self.recorder.resume()
        if self.parked:
            self.resume(first=self.schedule.device_of(self.n - 1))
        else:
            self.launch([tasks[1] for tasks in self.phases], first=self.schedule.device_of(self.n - 1))
        self.finish()

    def finish(self) -> None:
        """Wait for the workers, commit deferred batch norm, make the timeline, drop the step's tensors."""
        try:
            self.join()
        finally:
            for partition in self.partitions:
                DeferredBatchNorm.commit_all(partition)
        if self.recorder is not None:
            self.timeline = self.recorder.timeline()
        self.release()

    def input_grads(self) -> list[Tensor | None]:
        """The gradient of each input that requires one, gathered over the micro-batches."""
        grads: list[Tensor | None] = []
        for k, needs in enumerate(self.input_requires_grad):
            if not needs:
                continue
            pieces = [self.in_grads[i][k] for i in range(self.schedule.m)]
            if all(p is None for p in pieces):
                grads.append(None)
                continue
            filled = [p if p is not None else torch.zeros_like(b[k]) for p, b in zip(pieces, self.batches, strict=True)]
            grads.append(torch.cat(filled) if len(filled) > 1 else filled[0])
        return grads

    def release(self) -> None:
        self.leaves.clear()
        self.graphs.clear()
        self.skips.release()

    # -- workers ----------------------------------------------------------------------------------------

    def _work(self, d: int, phases: list[Sequence[Task]]) -> None:
        """Run each task list of ``phases`` on device ``d``, parked between them (Note [parked workers])."""
        device = self.devices[d]
        counted = False  # this worker's end of the current phase was counted
        try:
            # Note [threads]: a fresh thread's OpenMP/MKL pools do not inherit the caller's thread count
            torch.set_num_threads(self.threads_per_worker)
            with device_context(device), pinned(self.affinity[d] if self.affinity else None):
                for k, phase in enumerate(phases):
                    if k:
                        self._done()
                        self.go[d].wait()
                        counted = self.parked  # woken without a resume(): no phase counts this worker
                        if self.cancelled or self.error is not None:
                            return
                    for task in phase:
                        if self.error is not None:
                            return
                        if task.op is Op.F:
                            self._forward(d, task)
                        elif task.op is Op.R:
                            self._recompute(d, task)
                        elif task.op is Op.B:
                            self._backward(d, task)
                        else:
                            raise NotImplementedError(f"GPipe does not run {task.op.name} tasks ({task})")
        except Stopped:
            pass
        except BaseException as error:
            self._fail(error)
        finally:
            if not counted:
                self._done()

    def _done(self) -> None:
        """This worker's part of the phase is over; the last one's wakes the caller."""
        with self.error_lock:
            self.running -= 1
            if not self.running:
                self.finished.set()

    def _fail(self, error: BaseException) -> None:
        with self.error_lock:
            if self.error is None:
                self.error = error
        self.inboxes.stop()
        for go in self.go:  # parked workers leave too
            go.set()

    def _send(self, stage: int, task: Task, payload: Any) -> None:
        self.inboxes.send(self.schedule.device_of(stage), task, payload)

    def _receive(self, d: int, task: Task) -> Any:
        return self.inboxes.receive(d, task)

    def _arrive(self, d: int, tensors: Sequence[Tensor | None], producer: Task, label: str = "") -> tuple[Any, ...]:
        """Bring ``tensors`` to device ``d`` (a copy only where they are elsewhere)."""
        device = self.devices[d]
        if all(t is None or t.device == device for t in tensors):
            return tuple(tensors)
        start = self.recorder.now(d, copy=True) if self.recorder else 0.0
        arrived = moved(tensors, device, self.pipeline.copy_stream(device) if device.type == "cuda" else None)
        if self.recorder is not None:
            self.recorder.span(d, COPY, producer, start, label=label)
        return arrived

    def _inputs(self, d: int, task: Task) -> tuple[Tensor, ...]:
        i, j = task.microbatch, task.stage
        if j == 0:
            return self._arrive(d, self.batches[i], task)
        previous = Task(Op.F, i, j - 1)
        return self._arrive(d, self._receive(d, previous), previous)

    def _call(self, d: int, task: Task, leaves: tuple[Tensor, ...], recompute: bool,
              checkpointed: bool = False) -> tuple[Tensor, ...]:
        i, j = task.microbatch, task.stage
        tracker = self.skips.tracker(d, i, j, recompute, self._arrive)
        writes = self.writes_input[j] if self.train else False
        if writes is not False:  # Note [entering a partition]: a copy, to be written (or learn whether it is)
            fed = tuple(t.clone() for t in leaves)
        elif torch.is_grad_enabled():
            fed = tuple(_Enter.apply(t) if t.requires_grad else t for t in leaves)
        else:
            fed = leaves
        versions = [t._version for t in fed]
        arg: Any = fed if (self.input_is_tuple if j == 0 else self.tuple_between[j - 1]) else fed[0]
        layers: list[Callable[[Any], Any]] = list(cast(nn.Sequential, self.partitions[j]))
        with_loss = j == self.n - 1 and self.loss is not None
        if with_loss:  # GPipe.step: the loss is the task's last layer, seeded like the others (gpipe.rng)
            layers.append(functools.partial(self._loss, d, task))
        with use_tracker(tracker):
            output = self.draws.forward(j, self.draw_plan[j], layers, arg, self.step_seed, i, self.devices[d],
                                        self.drew)
        changed = [k for k, (t, v) in enumerate(zip(fed, versions, strict=True)) if t._version != v]
        if writes is None and not recompute:
            self.writes_input[j] = bool(changed)
        elif changed and checkpointed and not writes:
            raise RuntimeError(
                f"partition {j} modified its input in place (input {changed[0]}) during a checkpointed forward, "
                "which its earlier steps did not, so its recompute would start from different values; make the "
                "in-place layer out-of-place (e.g. nn.ReLU(inplace=False)) or use checkpoint='never'")
        if with_loss:
            if not recompute:
                self.losses[i] = output.detach()
            if torch.is_grad_enabled():
                self.out_grads[i] = (torch.ones_like(output),)
            return (output,)
        was_tuple, outputs = as_tensors(output, f"the output of partition {j}")
        if j == self.n - 1:
            self.output_is_tuple = was_tuple
        else:
            self.tuple_between[j] = was_tuple  # written before the hand-off, so the next stage sees it
        return outputs

    def _loss(self, d: int, task: Task, output: Any) -> Tensor:
        """The weighted loss of micro-batch ``task.microbatch`` (:meth:`GPipe.step`), computed inside the task."""
        assert self.loss is not None
        i = task.microbatch
        was_tuple, outputs = as_tensors(output, f"the output of partition {task.stage}")
        loss_fn, targets, weights = self.loss
        target = self._arrive(d, (targets[i],), task)[0] if isinstance(targets[i], Tensor) else \
            self._arrive(d, targets[i], task)
        loss = loss_fn(outputs[0] if not was_tuple else outputs, target) * weights[i]
        if not isinstance(loss, Tensor) or loss.dim() != 0:
            raise TypeError("loss_fn must return a scalar tensor (a reduced loss), got "
                            f"{type(loss).__name__ if not isinstance(loss, Tensor) else tuple(loss.shape)}")
        return loss

    def _forward(self, d: int, task: Task) -> None:
        i, j = task.microbatch, task.stage
        inputs = self._inputs(d, task)
        recorder = self.recorder
        start = recorder.now(d) if recorder else 0.0
        ckpt = self.train and self.schedule.is_checkpointed(i)
        if self.train:
            leaves = tuple(t.detach().requires_grad_(t.requires_grad or (j > 0 and t.is_floating_point()))
                           for t in inputs)
            if ckpt:
                with torch.no_grad(), checkpointing():
                    outputs = self._call(d, task, leaves, recompute=False, checkpointed=True)
                self.leaves[(i, j)] = leaves
                if recorder:
                    recorder.hold(d, i, j, sum(t.numel() * t.element_size() for t in leaves))
            else:
                with torch.enable_grad(), (recorder.saved(d, i, j) if recorder else _nothing()):
                    outputs = self._call(d, task, leaves, recompute=False)
                self.leaves[(i, j)] = leaves
                self.graphs[(i, j)] = outputs
        else:
            with torch.no_grad():  # a new thread starts with grad enabled, whatever the caller's mode
                outputs = self._call(d, task, tuple(inputs), recompute=False)
        if recorder:
            recorder.span(d, COMPUTE, task, start)
        if j == self.n - 1:
            self.outputs[i] = tuple(t.detach() if self.train else t for t in outputs)
        else:
            self._send(j + 1, task, tuple(t.detach() for t in outputs))

    def _recompute(self, d: int, task: Task) -> None:
        i, j = task.microbatch, task.stage
        recorder = self.recorder
        start = recorder.now(d) if recorder else 0.0
        leaves = self.leaves[(i, j)]
        with torch.enable_grad(), recomputing(), (recorder.saved(d, i, j) if recorder else _nothing()):
            self.graphs[(i, j)] = self._call(d, task, leaves, recompute=True)
        if recorder:
            recorder.span(d, COMPUTE, task, start)

    def _backward(self, d: int, task: Task) -> None:
        i, j = task.microbatch, task.stage
        if j == self.n - 1:
            grads = self._arrive(d, self.out_grads[i], Task(Op.F, i, j))
        else:
            producer = Task(Op.B, i, j + 1)
            grads = self._arrive(d, self._receive(d, producer), producer)
        outputs = list(self.graphs.pop((i, j)))
        grads_l = list(grads)
        for key, stashed in self.skips.stash_graph.pop((i, j), {}).items():
            grad = self.skips.portal_grad.pop((i, key), None)
            if grad is not None:
                consumer = Task(Op.B, i, self.layout.popped_in[key])
                grads_l.append(self._arrive(d, (grad,), consumer, label="skip")[0])
                outputs.append(stashed)
        recorder = self.recorder
        start = recorder.now(d) if recorder else 0.0
        pairs = [(o, g) for o, g in zip(outputs, grads_l, strict=True) if g is not None and o.requires_grad]
        leaves = self.leaves.pop((i, j))
        popped = self.skips.popped.pop((i, j), {})
        found = iter(self.gradients.differentiate(j, pairs,
                                                  [t for t in leaves if t.requires_grad] + list(popped.values())))
        result = tuple(next(found) if t.requires_grad else None for t in leaves)
        for key in popped:
            self.skips.portal_grad[(i, key)] = next(found)
        if recorder:
            recorder.span(d, COMPUTE, task, start)
            recorder.free(d, i, j)
        if j == 0:
            self.in_grads[i] = result
        else:
            self._send(j - 1, task, result)


class Parked:
    """Held by a training forward's autograd graph: freed before its backward ran, it sends the run's parked
    workers away (Note [parked workers])."""

    __slots__ = ("run",)

    def __init__(self, run: Run) -> None:
        self.run = run

    def __del__(self) -> None:
        self.run.cancel()


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
