"""The worker threads of one step: each schedule device's task list in order, on a thread of its own.

:class:`ThreadRun` is one mini-batch through a pipeline (:class:`gpipe.interpreter.pipeline.Pipeline`, which a
:class:`gpipe.GPipe` builds), and the driver's side of it: it starts one thread per schedule device, each running a
:class:`gpipe.interpreter.worker.Worker` on that device's tasks (Note [the schedule drives both passes] in
:mod:`gpipe.pipe`), over the in-process transport (:class:`gpipe.transport.inprocess.InProcess`); it sends the
micro-batches, targets and output gradients in and collects the outputs, losses and input gradients the workers send
back. A recorded run's measured timeline is :attr:`ThreadRun.timeline` once it has ended; the ``GPipe`` keeps it.

Note [threads]: every worker sets its intra-op thread count to the caller's (``torch.get_num_threads()``
when the step starts). A fresh thread's OpenMP and MKL pools do not inherit ``torch.set_num_threads``:
left alone, each worker would start a pool as wide as the machine, and on a small CPU the workers' pools
would spin on each other's cores (steps several times slower).

Note [launch order]: a run starts its workers as fresh threads, and starting a thread takes
Python's interpreter lock, on both sides, for a while. The worker whose first task can run at once
(the first stage's in the forward phase, the last stage's in the backward phase) is started last, so
the others are already waiting on their inboxes and the main thread on them: started first, its first
task would trade the lock with the thread starts that follow, which delays a forward of small layers most.
Parked workers (Note [parked workers] in :mod:`gpipe.interpreter.parking`) are woken in the same order.
The main thread then waits for one event, set by the last worker to end, rather than joining each
worker in turn (each join would wake it, to take the lock, while the next worker computes).

Note [interrupts]: a Ctrl-C while the caller starts a phase's workers or waits for them stops them
(:meth:`ThreadRun._fail`: waiting workers leave at once, busy ones after their current task; :meth:`ThreadRun.join`
takes the start, so an interrupt in the middle of it stops the workers already started) and waits at most
:data:`STOP_SECONDS` in all for them. A worker still in a task then (a layer that hangs) cannot be stopped from
outside: it is abandoned, a daemon thread that ends after its task returns, and the ``KeyboardInterrupt`` that
reaches the caller names its thread, device and task. Everything the step set is restored without it (the
switch interval).

Note [abandoned at exit]: the interpreter's exit waits for the workers a step abandoned, and a second Ctrl-C stops
the wait. An interpreter that finalizes while a daemon thread is inside a torch operation aborts the process
(``terminate called without an active exception``, SIGABRT) when the operation returns, so an uncaught Ctrl-C in the
middle of a long operation would end in a crash rather than exit status 130. The abandoned worker's step is
stopped, so it ends as soon as its task returns.

Note [where a fault happened]: an exception raised in a task reaches the caller as itself (same type, message
and traceback), with a note (``BaseException.add_note``, Python 3.11+) naming the task, its stage, micro-batch
and device and the worker's thread, as the distributed executor's report names rank, stage and task.
"""

from __future__ import annotations

import atexit
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from gpipe.autograd import rng
from gpipe.autograd.gradients import Gradients
from gpipe.batchnorm import DeferredBatchNorm
from gpipe.interpreter import gil
from gpipe.interpreter.affinity import pinned
from gpipe.interpreter.parking import Gate
from gpipe.interpreter.pipeline import Pipeline
from gpipe.interpreter.recorder import Recorder
from gpipe.interpreter.worker import Step, Worker
from gpipe.loss import LossPlan
from gpipe.microbatch import gather
from gpipe.schedule import Op, Schedule, Task
from gpipe.schedule.timeline import Timeline
from gpipe.transport.base import DRIVER, Message, Stopped
from gpipe.transport.inprocess import InProcess, device_context

__all__ = ["STOP_SECONDS", "Loss", "ThreadRun"]

_log = logging.getLogger(__name__)

STOP_SECONDS = 1.0
"""After an interrupt, how long in all the caller waits for the workers to stop (Note [interrupts])."""

Loss = tuple[LossPlan, list[tuple[Tensor, ...]]]
""":meth:`gpipe.GPipe.step`'s loss (what the last stage computes: :mod:`gpipe.loss`) and each micro-batch's target."""


class ThreadRun:
    """One mini-batch through the pipeline: the forward phase now, the backward phase when autograd asks."""

    def __init__(self, pipeline: Pipeline, schedule: Schedule, batches: list[tuple[Tensor, ...]], input_is_tuple: bool,
                 train: bool, record: bool, loss: Loss | None = None) -> None:
        self.pipeline = pipeline
        self.schedule = schedule
        self.batches = batches
        self.input_is_tuple = input_is_tuple
        self.train = train
        self.record = record
        self.n = schedule.n
        devices, self.affinity = pipeline.workers(schedule)  # per schedule device (Note [placed stages])
        self.partitions = list(pipeline.partitions)
        # Note [random state] in gpipe.autograd.rng: the partitions that run under the dispatch mode this step, and the
        # step's seed, drawn only when one of them may draw
        self.draws = pipeline.draws
        self.draw_plan = self.draws.plan()
        self.drew: list[set[int]] = [set() for _ in range(schedule.n)]  # the layers seen drawing
        self.step_seed = rng.step_seed() if any(p is None or p for p in self.draw_plan) else 0
        self.checkpoints = train and any(schedule.is_checkpointed(i) for i in range(schedule.m))
        self.outside: tuple[Any, ...] | None = None  # Python's and NumPy's random states when a phase starts
        self.gradients = Gradients(self.partitions, pipeline.split_plans)  # Note [gradients the caller asked for]
        self.error: BaseException | None = None
        self.error_lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.current: list[Task | None] = [None] * len(devices)  # each worker's task now (where it failed, or hangs)
        self.interval: float | None = None  # the switch interval this run holds while its workers run
        self.running = 0  # workers of the current phase still running
        self.finished = threading.Event()  # set by the last of them
        self.gate = Gate(len(devices))  # Note [parked workers] in gpipe.interpreter.parking
        self.outputs: dict[int, tuple[Tensor, ...]] = {}  # driver-side: what the last stage sent back
        self.output_is_tuple = False
        self.input_requires_grad: list[bool] = []
        self.backward_started = False
        self.backward_done = False
        self.threads_per_worker = torch.get_num_threads()
        self.recorder = Recorder(pipeline, schedule, self.threads_per_worker, devices) if record else None
        self.timeline: Timeline | None = None  # the recorder's, once the run has ended well
        self.loss = loss
        self.losses: dict[int, Tensor] = {}
        self.transport = InProcess(pipeline, schedule, self.recorder)
        step = Step(pipeline, schedule, train, self.recorder, self.draw_plan, self.step_seed, self.drew,
                    self.gradients, None if loss is None else loss[0])
        self.workers = [Worker(step, d, device, self.transport) for d, device in enumerate(devices)]

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
        assert self.loss is not None
        self._send_inputs()
        for i, target in enumerate(self.loss[1]):
            last = self.schedule.route(i)[-1]  # Note [stage slots] in gpipe.schedule.schedule
            self.transport.send(last, (Task(Op.F, i, last), "target"), Message(target, len(target) > 1))
        self.finish(functools.partial(self.launch, self.schedule.tasks, self.schedule.device_of(0)))
        for i in range(self.schedule.m):
            last = self.schedule.route(i)[-1]
            self.losses[i] = self.transport.receive(DRIVER, (Task(Op.F, i, last), "loss")).tensors[0]  # type: ignore[assignment]

    def execute_forward(self) -> None:
        """Run every device's leading forwards (``forward()``); the outputs come back to :attr:`outputs`. In
        training the workers then park for the backward (Note [parked workers] in :mod:`gpipe.interpreter.parking`)."""
        self._send_inputs()
        phases = self.phases
        later = [tasks[1] for tasks in phases] if self.train else None
        self.join(functools.partial(self.launch, [tasks[0] for tasks in phases], self.schedule.device_of(0), later))
        for i in range(self.schedule.m):
            last = self.schedule.route(i)[-1]
            tensors, self.output_is_tuple = self.transport.receive(DRIVER, (Task(Op.F, i, last), "output"))
            self.outputs[i] = tensors  # type: ignore[assignment]

    def _send_inputs(self) -> None:
        for i, batch in enumerate(self.batches):
            first = self.schedule.route(i)[0]
            self.transport.send(first, (Task(Op.F, i, first), "input"), Message(batch, self.input_is_tuple))

    def launch(self, task_lists: Sequence[Sequence[Task]], first: int,
               later: Sequence[Sequence[Task]] | None = None) -> None:
        """Start one worker thread per device on its task list; device ``first``'s thread last (Note [launch order]).
        With ``later``, each worker parks after its list until :meth:`resume` (Note [parked workers])."""
        self.threads = [threading.Thread(target=self._work, args=(d, [tasks] if later is None else [tasks, later[d]]),
                                         daemon=True, name=f"gpipe-worker-{d}")
                        for d, tasks in enumerate(task_lists)]
        self.gate.parked = later is not None
        self._arm()
        for d, thread in enumerate(self.threads):
            if d != first:
                thread.start()
        self.threads[first].start()

    def _arm(self) -> None:
        """Before a phase's workers run: its count of workers, its end event, the switch interval, the outside RNGs."""
        # Note [switch interval] in gpipe.interpreter.gil: until join() has seen the phase end
        interval = self.pipeline.switch_interval if len(self.threads) > 1 else None
        if interval is not None and self.interval is None:
            gil.enter(interval)
            self.interval = interval
        self.running = len(self.threads)
        self.finished = threading.Event()
        self.outside = rng.outside_state() if self.checkpoints else None

    def resume(self, first: int) -> None:
        """Wake the parked workers for the backward phase; device ``first``'s last (Note [launch order])."""
        self.gate.parked = False  # before _arm: a worker woken now is counted in the new phase
        self._arm()
        self.gate.open(first)

    def cancel(self) -> None:
        """Send parked workers away: their backward will not come (Note [parked workers]). Safe from any thread."""
        self.gate.cancel()

    def join(self, start: Callable[[], None]) -> None:
        """Start a phase's workers (``start``: :meth:`launch` or :meth:`resume`) and wait for them: one wake-up when
        the last one ends or parks (Note [launch order]). An interrupt from the first thread start on, or a failure,
        stops them all (Note [interrupts])."""
        try:
            start()
            while not self.finished.wait(timeout=0.1):
                pass
            if self.error is not None or not self.gate.parked:
                for thread in self.threads:
                    thread.join()
                self.threads = []
            if self.error is not None:
                raise self.error
            if self.outside is not None:
                rng.check_outside(self.outside)
        except BaseException as error:
            if error is not self.error:  # raised on the caller's thread (a Ctrl-C, a check): stop the workers
                self._fail(error)
                self._abandon(error)
            raise
        finally:
            # the workers ended, parked (they wait idle: the caller's code between the phases runs with its own
            # interval) or were abandoned (Note [interrupts]): the interval is the caller's again
            if self.interval is not None:
                gil.leave(self.interval)
                self.interval = None
        self.draws.learn(self.draw_plan, self.drew)

    def _abandon(self, interrupt: BaseException) -> None:
        """Wait at most :data:`STOP_SECONDS` in all for the stopped workers; name those still running in
        ``interrupt`` (Note [interrupts])."""
        deadline = time.monotonic() + STOP_SECONDS
        for thread in self.threads:
            if thread.ident is not None:  # started (an interrupt may come in the middle of launch())
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
        stuck = [d for d, thread in enumerate(self.threads) if thread.is_alive()]
        if not stuck:
            return
        places = "; ".join(self._place(d, self.current[d]) for d in stuck)
        _join_at_exit([self.threads[d] for d in stuck], places)
        within = f"within {STOP_SECONDS:g} s"
        if len(stuck) == 1:
            left = (f"a worker did not stop {within} and is left running (a daemon thread, which ends when its task "
                    "returns; the interpreter's exit waits for it)")
        else:
            left = (f"{len(stuck)} workers did not stop {within} and are left running (daemon threads, which end when "
                    "their tasks return; the interpreter's exit waits for them)")
        text = f"the step was interrupted, but {left}: {places}"
        if isinstance(interrupt, KeyboardInterrupt) and not interrupt.args:
            interrupt.args = (text,)
        else:
            _note(interrupt, text)

    def _place(self, d: int, task: Task | None) -> str:
        """Where worker ``d`` is: its task (stage, micro-batch), device and thread."""
        doing = "between tasks" if task is None else \
            f"task {task} (stage {task.stage}, micro-batch {task.microbatch})"
        return f"{doing} on {self.workers[d].device}, worker thread gpipe-worker-{d}"

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
            last = self.schedule.route(i)[-1]
            self.transport.send(last, (Task(Op.F, i, last), "grad"), Message(tuple(p[i] for p in pieces)))

    def finish_backward(self) -> None:
        """Run the backward phase and wait for it: the caller's thread starts it only once it has nothing else
        to do in Python (Note [parked workers] in :mod:`gpipe.interpreter.parking`)."""
        if self.backward_done:
            return
        self.backward_done = True
        if self.recorder is not None:
            self.recorder.resume()
        first = self.schedule.device_of(self.n - 1)
        if self.gate.parked:
            self.finish(functools.partial(self.resume, first))
        else:
            self.finish(functools.partial(self.launch, [tasks[1] for tasks in self.phases], first))

    def finish(self, start: Callable[[], None]) -> None:
        """Run a phase (:meth:`join`), commit deferred batch norm, make the timeline, drop the step's tensors."""
        try:
            self.join(start)
        finally:
            for partition in self.partitions:
                DeferredBatchNorm.commit_all(partition)
        if self.recorder is not None:
            self.timeline = self.recorder.timeline()
        self.release()

    def input_grads(self) -> list[Tensor | None]:
        """The gradient of each input that requires one, gathered over the micro-batches."""
        grads: list[Tensor | None] = []
        in_grads = [self.transport.receive(DRIVER, (Task(Op.B, i, self.schedule.route(i)[0]), "input-grad")).tensors
                    for i in range(self.schedule.m)]
        for k, needs in enumerate(self.input_requires_grad):
            if not needs:
                continue
            pieces = [in_grads[i][k] for i in range(self.schedule.m)]
            if all(p is None for p in pieces):
                grads.append(None)
                continue
            filled = [p if p is not None else torch.zeros_like(b[k]) for p, b in zip(pieces, self.batches, strict=True)]
            grads.append(torch.cat(filled) if len(filled) > 1 else filled[0])
        return grads

    def release(self) -> None:
        for worker in self.workers:
            worker.release()

    # -- workers ----------------------------------------------------------------------------------------

    def _work(self, d: int, phases: list[Sequence[Task]]) -> None:
        """Run each task list of ``phases`` on device ``d``, parked between them (Note [parked workers])."""
        worker = self.workers[d]
        counted = False  # this worker's end of the current phase was counted
        try:
            # Note [threads]: a fresh thread's OpenMP/MKL pools do not inherit the caller's thread count
            torch.set_num_threads(self.threads_per_worker)
            with device_context(worker.device), pinned(self.affinity[d] if self.affinity else None):
                for k, tasks in enumerate(phases):
                    if k:
                        self._done()
                        # woken without a resume(): the forward phase counted it, and no later phase will
                        counted = not self.gate.wait(d)
                        if counted or self.error is not None:
                            return
                    for task in tasks:
                        if self.error is not None:
                            return
                        self.current[d] = task
                        worker.run(task)
                    self.current[d] = None
        except Stopped:
            pass
        except BaseException as error:
            failed = self.current[d]
            if failed is not None:  # Note [where a fault happened]
                _note(error, f"raised in {self._place(d, failed)}")
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
        self.transport.stop()
        self.gate.release()  # parked workers leave too


def _join_at_exit(threads: list[threading.Thread], places: str) -> None:
    """The interpreter's exit waits for abandoned ``threads``; a Ctrl-C stops the wait (Note [abandoned at exit])."""

    def join() -> None:
        alive = [thread for thread in threads if thread.is_alive()]
        if not alive:
            return
        _log.warning("exiting once the abandoned pipeline workers' tasks return (Ctrl-C again to exit now): %s",
                     places)
        try:
            for thread in alive:
                thread.join()
        except KeyboardInterrupt:  # the second Ctrl-C: exit now, as before this wait
            pass

    atexit.register(join)


def _note(error: BaseException, text: str) -> None:
    """Add ``text`` to ``error``'s notes, once (Python 3.11+; before, ``error`` is left as it is)."""
    if hasattr(error, "add_note") and text not in getattr(error, "__notes__", ()):
        error.add_note(text)
