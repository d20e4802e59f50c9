"""The simulator: run a schedule on a cost model as a SimPy discrete-event simulation and return its Timeline.

One SimPy process per device walks that device's task list in order (Note [dependencies] in
:mod:`gpipe.schedule.task` says what each task waits for) and holds its compute stream for the task's cost::

    task seconds = stage cost * cost.scale(i) + host seconds
    stage cost   = F: forward_seconds(checkpointed), B: backward, R: recompute_seconds, W: weight
    host seconds = overheads.task
                   + the stage's own host seconds of that kind of task: stage.host_forward
                     (F not checkpointed, R), host_nograd (checkpointed F), host_backward (B, W)
                     (Note [stage extras] in sim.calibration.extras)
                   + for a grad-enabled forward (F not checkpointed, R): overheads.recording
                     + stage.saved_tensors * overheads.per_saved_tensor (unless forward_recorded)
                   + for a backward: stage.saved_tensors * overheads.per_unpacked_tensor
                     (unless backward_recorded)
                   + for a device's first task (and, with two phases, the first of its backward
                     phase): stage.thread_start

Note [host costs]: an executor costs host time beyond its kernels, which does not scale with the
micro-batch: every task's bookkeeping (``task``), and, while it records a timeline, the saved-tensor
hooks that count the bytes each grad-enabled forward keeps (``recording`` per task, and
``per_saved_tensor`` for every tensor autograd saves: ``StageCost.saved_tensors`` per stage; the
backward gets each back through an unpack hook, ``per_unpacked_tensor``; a stage whose
``forward_recorded`` and ``backward_recorded`` seconds were measured with the hooks on uses those
instead of its plain seconds and the per-tensor estimate), and the first task on a fresh worker
thread (``StageCost.thread_start``): an executor that starts its workers for each phase (Note [two
phases]) pays it at the start of each.

Note [copies]: a dependency produced on another device travels as a copy, issued when its producer
ends: the activation of F(i, j) to stage j+1 (``stages[j].send_bytes`` bytes), the gradient of B(i, j)
to stage j-1 (``stages[j-1].send_bytes``: it is as large as that activation). A copy takes
``cost.copy_seconds`` when that is set, else ``config.link.transfer_seconds(bytes)``, else nothing;
``cost.overheads.handoff`` is added to every cross-device hand-off as latency after the copy (it
delays the consumer but does not occupy the link). Copies are serialised FIFO per *directed* device
pair (src -> dst): links are full duplex, so activations going down and gradients coming back do not
wait for each other, while two activations on one pair queue in issue order. Each copy is recorded as
a span on the receiving device, stream ``"copy"``, with ``task`` = the producing task; a copy that
takes zero seconds leaves no span (it changes no time).

Note [no copy streams]: with ``copy_streams=False`` a copy runs on the default stream, as a
cross-device ``tensor.to()`` does without torchgpipe's copy streams: it starts once the compute
streams of *both* sender and receiver are free and holds both for its duration (both streams are
acquired in device order, so two opposite copies cannot deadlock). It is recorded on the receiver,
stream ``"copy"``, with ``label="on-compute"``; it blocked the sender's stream for the same interval.
A zero-second copy synchronises nothing.

Note [fork/join]: torchgpipe (Kim et al., 2020, section 3.2.1) adds Fork/Join "phony" dependencies
because PyTorch's autograd engine does not know the order the pipeline needs: it runs whatever node is
ready, so the copy that sends B(i, j)'s gradient to device j-1 may run only after the next backward
computation on device j, and device j-1 idles meanwhile. ``enforce_backward_order=False`` models that
ablation: each outgoing gradient copy of a backward task is issued when the device's *next* backward
task ends (the device's last backward issues its copy at once). It is a model of the worst case the
paper describes, not of autograd's exact queue order. When stages share a device, that next backward
may itself wait for the held-back gradient (B(i, 2) -> B(i, 1) -> B(i, 0) with stages 0 and 2 on one
device); autograd would then run the copy, since nothing else is ready, so a held-back copy is issued
at the latest when the simulation can make no other progress.

Note [lockstep]: torchgpipe's host loop runs the forward in clock cycles (``clock_cycles(m, n)``) and
waits for every task of a cycle before it starts the next; ``lockstep_forward=True`` makes F(i, j)
(cycle k = i + j) wait until every forward task of cycle k-1 has ended.

Note [two phases]: ``backward_after_forward=True`` models an executor whose ``forward()`` runs every
forward task and returns the gathered output before ``loss.backward()`` starts the backward phase
(GPipe's API, :mod:`gpipe.pipe`): each device's tasks after its leading forwards (its R, B and W tasks)
wait until the step's last forward has ended plus ``cost.overheads.turnaround`` (joining the forward
workers and starting the backward ones). A recompute then no longer runs during the forward phase.
Only schedules whose devices run all their forwards first can be split so (GPipe's; not 1F1B's).

Note [gap]: ``cost.overheads.gap`` is host time a worker spends between two of its tasks, outside both
spans (taking the next task's inputs, sending the previous one's results): a device's next task starts
no earlier than ``gap`` after its previous one ended. Its first task starts no earlier than ``cost.overheads.launch``
(the executor cutting the mini-batch and starting its workers). A consumer that waited for a hand-off starts at
``max(previous end + gap, arrival)``: ``handoff`` already covers the producer's sending and the
consumer's waking.

Note [asynchronous devices]: on a CUDA device the worker thread only queues kernels on a stream and runs
ahead of them, so host time and kernel time overlap instead of adding up. For a device in
``config.asynchronous`` each task has *host seconds* H (Note [host costs], with ``thread_start``) and
*kernel seconds* K (the stage cost, scaled), and the device keeps two clocks. H also holds the host's
time to launch the task's kernels (``StageCost.issue_forward``, ``issue_nograd``, ``issue_backward``:
the profiler's ``..._issue_seconds``, Note [issue seconds] in :mod:`gpipe.profile_timing`), which does not
scale with the micro-batch here either::

    issue = max(host's previous issue end + gap (launch for the first task), host arrival of each input,
                the backward phase's opening on the host: Note [two phases])
    start = max(stream free, stream arrival of each input, issue)
    end   = max(start + K, issue + H)

The span is ``[start, end]``: what CUDA events recorded on the stream around the task's kernels show (the
stream reaches the first event no earlier than the host records it, and the last no earlier than the
host's work ends). An input from another device reaches the consumer's host at the producer's ``issue +
H`` plus ``handoff`` (the hand-off queue between the threads) and its stream at the producer's ``end``
plus the copy (the stream waits for an event, not for the host). The backward phase opens on the host
``turnaround`` after the latest forward's ``issue + H``; the device's stream may still be running the
forward kernels then. With every host term zero an asynchronous device is a synchronous one, exactly.
``gap`` is host time here, between one task's ``issue + H`` and the next one's issue. Not modelled:
the host blocking on a full launch queue, and kernels of one task overlapping the next on the stream.

``config.shared_streams`` gives each device the stream it issues to: devices with the same id (several
partitions on one GPU, whose workers all use that GPU's current stream) run their tasks one at a time,
in the order they reach the stream. Copies between them take no time (the executor hands tensors over).

Note [contention]: devices that share CPU cores slow each other: while k devices compute, each
progresses at rate 1 / (1 + contention * (k - 1)), exactly (processor sharing, :mod:`sim.core.sharing`),
through its stage seconds (Note [host seconds share nothing]). Copies do not count as computing.
With contention 0 the plain path runs.

Note [pairwise contention]: how much two tasks slow each other depends on what they are: on CPU
devices two forwards of small layers serialise on Python's global interpreter lock while two
backwards (autograd's C++ engine) hardly meet. ``cost.overheads.pairs`` holds measured slowdowns per
pair of (task kind, stage); when it is given, a task ``x`` running beside the set ``Y`` progresses at
``1 / (1 + sum over y in Y of c(x, y))``, with ``c`` from the pairs (``contention`` for a pair not
listed), again exactly, recomputed whenever a task starts or ends. Pairs are measured two at a time,
so for three or more tasks at once the sum is a model, not a measurement; it does not know how many
cores there are.

Note [host seconds share nothing]: contention stretches a task's stage seconds, not its host seconds
(Note [host costs], with ``thread_start``): ``SharedCores.run(seconds, key, host)``, so beside a
steady set ``Y`` a task takes ``host + stage seconds * (1 + sum c)``; it still slows the others for
its whole span. ``contention`` and the pairs are measured on loops of the stage's work alone
(:mod:`sim.calibration.primitives`, :mod:`sim.calibration.pairs`, rebased to the profiled seconds: Note [pair baselines]
there) and say how many seconds sharing adds to *that* work; the executor's bookkeeping, its
stage-alone extras (:mod:`sim.calibration.extras`) and a fresh thread's start were never in those loops, and
stretching them by the same ``c`` added seconds nobody measured. It is also what the interpreter
does on two cores: a worker in pure Python keeps the global interpreter lock for its few hundred
microseconds and runs at its own speed, while the other stage, if it needs the lock, waits. On
``mlp`` (64 x (Linear(64, 64), ReLU) per stage) the host seconds are 10-15% of a grad-enabled
forward and ``c(F, F)`` is about 2.5, so the old rule added ``c`` times their 0.2-0.3 ms to every
overlapped forward. Re-simulating ten short recorded ``mlp`` runs (2-16 micro-batches, every
policy) took their mean makespan error from +5.4% to +2.3% (no checkpointing: +3.2% to +1.0%);
``conv``'s 40-200 ms tasks moved by under 0.1 point.

Note [memory]: per device, the bytes saved for backward (model state excluded, it is in
``meta["model_state_bytes"]``): the end of F(i, j) adds ``saved_bytes`` (or ``checkpoint_bytes``, the
stage input, for a checkpointed micro-batch); the start of R(i, j) adds ``saved_bytes`` (the
recomputed activations); the end of B(i, j) frees all that (i, j) held (the end of W(i, j) instead,
when the schedule splits the weight gradient, which still needs them). Bytes scale with
``cost.scale(i)``. One sample at t=0 per device and one at every change.

Note [local clocks]: on the plain path (no contention, copy streams, no lockstep, one phase) a device
process keeps its own clock instead of a SimPy timeout per task, and yields to SimPy only to wait for
an input whose copy is not issued yet; times are passed to the copy and memory helpers explicitly. Copy
times are fixed when issued and each directed pair's copies come from one process in its task order,
so every time is the one the SimPy path computes, bit for bit: a consumer that reaches an input before
its copy was issued (``issued[slot]`` later than its clock) moves to that issue time first, as the SimPy
path wakes then, and ``t + (arrival - t)`` reproduces a SimPy ``timeout(arrival - now)``. A stall
(Note [fork/join]) releases held copies at the latest clock of a blocked or finished device, the time
SimPy would have reached. With free copies (0 seconds, no hand-off) a copy just sets its arrival.

Note [span order]: the Timeline lists compute spans device by device in task order, then copy spans
by sending device in issue order; memory samples device by device (the t=0 sample first), so the
order does not depend on how SimPy interleaved the processes.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from itertools import chain
from typing import Any

import simpy

from gpipe.schedule import Op, Schedule, ScheduleError, Task, collector_paused
from gpipe.timeline import COMPUTE, COPY, MemorySample, Span, Timeline
from sim.core.cost import CostModel, StageCost
from sim.core.link import LinkSpec
from sim.core.sharing import SharedCores

__all__ = ["DEFAULT_CONFIG", "ON_COMPUTE", "SimConfig", "simulate"]

ON_COMPUTE = "on-compute"  # label of a copy that ran on the compute streams (Note [no copy streams])

_F, _B, _R, _W = 0, 1, 2, 3
_OPCODE = {Op.F: _F, Op.B: _B, Op.R: _R, Op.W: _W}


@dataclass(frozen=True)
class SimConfig:
    """Switches of the simulation (the defaults model torchgpipe on GPUs with copy streams).

    Attributes:
        link: prices copies when the cost model has no fixed ``copy_seconds``; ``None``: copies free.
        copy_streams: copies overlap compute (torchgpipe's copy streams); ``False``: Note [no copy streams].
        enforce_backward_order: fork/join dependencies hold; ``False``: Note [fork/join].
        lockstep_forward: the host waits for each forward clock cycle; Note [lockstep].
        backward_after_forward: the backward phase starts after every forward; Note [two phases].
        asynchronous: the devices whose worker queues work on a stream and runs ahead of it (CUDA
            devices); Note [asynchronous devices].
        shared_streams: one id per device, the compute stream it issues to: devices with the same id
            (partitions on one GPU) run their tasks one at a time; ``None``: a stream each.
    """

    link: LinkSpec | None = None
    copy_streams: bool = True
    enforce_backward_order: bool = True
    lockstep_forward: bool = False
    backward_after_forward: bool = False
    asynchronous: frozenset[int] = frozenset()
    shared_streams: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.link is not None and not isinstance(self.link, LinkSpec):
            raise TypeError(f"SimConfig.link must be a LinkSpec or None, got {type(self.link).__name__}")
        object.__setattr__(self, "asynchronous", frozenset(self.asynchronous))
        if any(not isinstance(d, int) or d < 0 for d in self.asynchronous):
            raise ValueError(f"SimConfig.asynchronous holds device indices, got {sorted(self.asynchronous)}")


DEFAULT_CONFIG = SimConfig()


def simulate(schedule: Schedule, cost: CostModel, config: SimConfig = DEFAULT_CONFIG) -> Timeline:
    """Predict when every task and copy of ``schedule`` runs under ``cost``.

    Args:
        schedule: what runs where, in which order; validated first.
        cost: per-stage costs; ``cost.n`` must equal ``schedule.n``.
        config: the switches of :class:`SimConfig`.

    Returns:
        A new :class:`~gpipe.timeline.Timeline` (``source="simulated"``): one compute span per task,
        one span per copy that takes time, and memory samples per device (see the module notes).

    Raises:
        ScheduleError: the schedule is invalid, or it stalls under ``config`` (e.g. lockstep).
        ValueError: the cost model does not fit the schedule.
    """
    with collector_paused():  # Note [gc] in gpipe.schedule.collector
        schedule.validate()
        if cost.n != schedule.n:
            raise ValueError(f"the cost model has {cost.n} stages but the schedule has {schedule.n}")
        if cost.microbatch_scale and len(cost.microbatch_scale) != schedule.m:
            raise ValueError(f"the cost model scales {len(cost.microbatch_scale)} micro-batches but the schedule "
                             f"has {schedule.m}")
        if config.asynchronous and max(config.asynchronous) >= schedule.num_devices:
            raise ValueError(f"SimConfig.asynchronous names device {max(config.asynchronous)}, but the schedule "
                             f"has {schedule.num_devices} devices")
        if config.shared_streams is not None and len(config.shared_streams) != schedule.num_devices:
            raise ValueError(f"SimConfig.shared_streams has {len(config.shared_streams)} entries for a schedule of "
                             f"{schedule.num_devices} devices")
        return _Run(schedule, cost, config).timeline()


_Tables = tuple[list[list[list[tuple[int, ...]]]], list[list[list[tuple[tuple[int, int], ...]]]], int]


def _remote_tables(schedule: Schedule, splits: bool) -> _Tables:
    """Which dependencies cross devices, per ``[checkpointed][opcode][stage]`` (so not per task).

    A copy of a producer's result to one device has a *slot*, an index into a flat array: slot =
    ``offset + i * stride`` for micro-batch ``i``, where ``stride = n * fanout`` and ``fanout`` is the
    largest number of devices one result goes to. Returns ``(inputs, outputs, fanout)``:

    - ``inputs[c][op][j]``: the slot offsets task ``(op, i, j)`` waits for, when micro-batch ``i`` is
      checkpointed (``c=1``) or not;
    - ``outputs[c][op][j]``: ``(device, slot offset)`` of each copy of that task's result.

    The tables ask :meth:`Schedule.dependencies` itself, once per class, on a representative
    micro-batch: Note [dependencies] makes every dependency one of the same micro-batch that depends
    on ``i`` only through whether it is checkpointed (the first half is checked here).
    """
    m, n, place = schedule.m, schedule.n, schedule.placement
    found: dict[tuple[int, int, int], list[tuple[int, int]]] = {}  # (c, op, j) -> remote (op, stage) deps
    dsts: dict[tuple[int, int, int], list[int]] = {}  # (c, op, j) -> devices that need that result
    for c in (0, 1):
        i = next((k for k in range(m) if schedule.is_checkpointed(k) == bool(c)), None)
        if i is None:
            continue
        for op in [Op.F, Op.B] + ([Op.R] if c else []) + ([Op.W] if splits else []):
            for j in range(n):
                for dep in schedule.dependencies(Task(op, i, j)):
                    if dep.microbatch != i:
                        raise NotImplementedError(f"{Task(op, i, j)} depends on {dep}, of another micro-batch; "
                                                  "the simulator handles same-micro-batch dependencies only")
                    if place[dep.stage] != place[j]:
                        found.setdefault((c, _OPCODE[op], j), []).append((_OPCODE[dep.op], dep.stage))
                        to = dsts.setdefault((c, _OPCODE[dep.op], dep.stage), [])
                        if place[j] not in to:
                            to.append(place[j])
    fanout = max([len(v) for v in dsts.values()] + [1])

    def offset(c: int, op: int, j: int, device: int) -> int:
        return (op * m * n + j) * fanout + dsts[(c, op, j)].index(device)

    inputs = [[[tuple(offset(c, dop, dj, place[j]) for dop, dj in found.get((c, op, j), ())) for j in range(n)]
               for op in range(4)] for c in (0, 1)]
    outputs = [[[tuple((dev, offset(c, op, j, dev)) for dev in dsts.get((c, op, j), ())) for j in range(n)]
                for op in range(4)] for c in (0, 1)]
    return inputs, outputs, fanout


def _host_seconds(cost: CostModel, checkpointed: bool, op: int, stage: StageCost) -> float:
    """Note [host costs]: the executor's host seconds of one task, which do not scale with the micro-batch."""
    o = cost.overheads
    seconds = o.task
    if op == _R or (op == _F and not checkpointed):  # a grad-enabled forward: recorded through saved-tensor hooks
        seconds += o.recording + stage.host_forward
        if stage.forward_recorded is None:  # else the hooks are in the measured seconds (_stage_seconds)
            seconds += stage.saved_tensors * o.per_saved_tensor
    elif op == _F:
        seconds += stage.host_nograd
    elif op in (_B, _W):
        seconds += stage.host_backward
        if op == _B and stage.backward_recorded is None:  # every saved tensor comes back through the unpack hook
            seconds += stage.saved_tensors * o.per_unpacked_tensor
    return seconds


def _issue_seconds(checkpointed: bool, op: int, stage: StageCost) -> float:
    """Note [asynchronous devices]: host seconds an asynchronous device's worker takes to launch a task."""
    if op == _R or (op == _F and not checkpointed):
        return stage.issue_forward
    return stage.issue_nograd if op == _F else stage.issue_backward


def _stage_seconds(stage: StageCost, checkpointed: bool, op: int) -> float:
    """Seconds of one task at micro-batch scale 1: Note [host costs] for the measured recorded seconds."""
    if op == _F:
        if not checkpointed and stage.forward_recorded is not None:
            return stage.forward_recorded
        return stage.forward_seconds(checkpointed)
    if op == _R:
        return stage.recompute_seconds if stage.forward_recorded is None else stage.forward_recorded
    if op == _B:
        return stage.backward if stage.backward_recorded is None else stage.backward_recorded
    return stage.weight


_KIND = {_F: "F", _R: "F", _B: "B", _W: "B"}  # Note [pairwise contention]; a checkpointed F is "Fc"


_OP_F, _OP_B, _OP_R = Op.F, Op.B, Op.R
_Copy = tuple[Task, int, int, int, tuple[tuple[int, int], ...]]  # (producer, opcode, i, j, destination devices)


class _Run:
    """One simulation: the SimPy environment, one process per device, and what they record."""

    def __init__(self, schedule: Schedule, cost: CostModel, config: SimConfig) -> None:
        self.schedule, self.cost, self.config = schedule, cost, config
        self.env = simpy.Environment()
        m, n, devices = schedule.m, schedule.n, schedule.num_devices
        self.m, self.n, self.devices = m, n, devices
        self.scales = [cost.scale(i) for i in range(m)]
        self.checkpointed = [int(schedule.is_checkpointed(i)) for i in range(m)]
        # a valid schedule has a W task for every (i, j) or for none, so device 0's list tells
        splits = any(t.op is Op.W for t in schedule.tasks[0])
        inputs, outputs, fanout = _remote_tables(schedule, splits)
        self.stride = n * fanout
        # table[c][op][j]: (slot offsets waited for, copies sent, seconds at scale 1, host seconds); the
        # seconds include the host seconds (Note [host costs]) unless micro-batches scale (then the
        # process scales the stage seconds and adds the host seconds, which do not scale)
        host = [[[_host_seconds(cost, c == 1, op, s) for s in cost.stages] for op in range(4)] for c in (0, 1)]
        self.table = [[[(inputs[c][op][j], outputs[c][op][j],
                         _stage_seconds(s, c == 1, op) + (0.0 if cost.microbatch_scale else host[c][op][j]),
                         host[c][op][j])
                        for j, s in enumerate(cost.stages)] for op in range(4)] for c in (0, 1)]
        self.issue = [[[_issue_seconds(c == 1, op, s) for s in cost.stages] for op in range(4)] for c in (0, 1)]
        self.handoff = cost.overheads.handoff
        self.scaled = bool(cost.microbatch_scale)
        # copy seconds of the result of (op, j) at scale 1 (only F and B results travel)
        self.copy_table = [[self._copy_seconds(op, 0, j, 1.0) for j in range(n)] for op in range(4)]
        # Note [span order]: compute spans per device (one per task, in task order), copy spans per sending
        # device (in issue order), memory samples per device (one at t=0, then in time order)
        self.spans: list[list[Span]] = [[] for _ in range(devices)]
        self.copies: list[list[Span]] = [[] for _ in range(devices)]
        self.memory: list[list[MemorySample]] = [[MemorySample(d, 0.0, 0)] for d in range(devices)]
        self.track_memory = any(s.saved_bytes or s.checkpoint_bytes for s in cost.stages)
        self.held: dict[int, int] = {}  # i * n + j -> bytes micro-batch i keeps on stage j
        self.current = [0] * devices  # bytes saved for backward per device, now
        self.frees_at = _W if splits else _B
        # arrival[slot]: when a copy's result is usable on its device (copy end + hand-off), see _remote_tables;
        # slots run op by op, and only the ops up to the last whose results travel (F and B) need them
        travelling = 1 + max((op for c in (0, 1) for op in range(4) if any(outputs[c][op])), default=-1)
        slots = travelling * m * n * fanout
        self.arrival: list[float | None] = [None] * slots
        self.issued = [0.0] * slots  # issued[slot]: when that copy was issued (Note [local clocks])
        self.clock = [0.0] * devices  # Note [local clocks]: each device's time when it last blocked or finished
        self.waiting: dict[int, simpy.Event] = {}  # slot -> event of a consumer that already waits for it
        self.link_free = [[0.0] * devices for _ in range(devices)]  # [src][dst]: when its last copy ends
        self.free_copies = (cost.copy_seconds == 0.0 or (cost.copy_seconds is None and config.link is None)) \
            and not self.handoff
        self.streams = None if config.copy_streams else [simpy.Resource(self.env, 1) for _ in range(devices)]
        # Note [asynchronous devices]: a compute stream shared by several devices, and each slot's host arrival
        self.shared: list[simpy.Resource | None] = [None] * devices
        if config.shared_streams is not None:
            groups: dict[int, list[int]] = {}
            for d, g in enumerate(config.shared_streams):
                groups.setdefault(g, []).append(d)
            for members in groups.values():
                if len(members) > 1:
                    resource = simpy.Resource(self.env, 1)
                    for d in members:
                        self.shared[d] = resource
        self.host_arrival = [0.0] * slots
        self.host_end = [0.0] * devices  # an asynchronous device's host time after its last task
        self.phase_open = 0.0  # Note [two phases]: host time the backward phase opens (once the forwards are done)
        self.cores = SharedCores(self.env, cost.overheads.contention,
                                 (((a, j), (b, k), c) for a, j, b, k, c in cost.overheads.pairs)) \
            if cost.overheads.pairs or cost.overheads.contention > 0 else None
        # Note [lockstep]: forward tasks left per clock cycle, and the events of cycles someone waits for
        self.forward_left = [min(k + 1, m, n, m + n - 1 - k) for k in range(m + n - 1)]
        self.cycle_done: dict[int, simpy.Event] = {}
        self.tasks = sum(map(len, schedule.tasks))
        self.deferred: list[list[_Copy]] = [[] for _ in range(devices)]  # Note [fork/join]: copies held back
        # Note [two phases]: each device's forward prefix, the forwards left, and the backward phase's start
        self.prefix = [next((k for k, t in enumerate(ts) if t.op is not Op.F), len(ts)) for ts in schedule.tasks] \
            if config.backward_after_forward else [0] * devices  # (only two phases need it)
        if config.backward_after_forward:
            for d, ts in enumerate(schedule.tasks):
                late = next((t for t in ts[self.prefix[d]:] if t.op is Op.F), None)
                if late is not None:
                    raise ScheduleError(f"backward_after_forward needs every device to run its forwards first, but "
                                        f"device {d} of schedule {schedule.name!r} runs {late} after a backward task")
        self.forwards_left = sum(self.prefix)
        self.backward_phase: simpy.Event = self.env.event()
        if config.backward_after_forward and not self.forwards_left:
            self.backward_phase.succeed()

    def local_clocks(self) -> bool:
        """Whether the run takes the plain path, :meth:`_device_fast` (Note [local clocks]); the same times as
        :meth:`_device`, which tests/sim/test_engine_properties.py checks over random schedules and costs."""
        config = self.config
        return self.cores is None and config.copy_streams and not config.lockstep_forward \
            and not config.backward_after_forward and not config.asynchronous and not any(self.shared)

    def timeline(self) -> Timeline:
        fast = self.local_clocks()
        for d in range(self.devices):
            self.env.process(self._device_fast(d) if fast else self._device(d))
        self.env.run()
        while sum(map(len, self.spans)) < self.tasks and any(self.deferred):
            self._release_deferred(max(self.clock) if fast else self.env.now)
            self.env.run()
        if sum(map(len, self.spans)) < self.tasks:
            done = [len(s) for s in self.spans]
            stuck = [ts[k] for ts, k in zip(self.schedule.tasks, done, strict=True) if k < len(ts)]
            why = " (lockstep_forward: a forward waits for a clock cycle that waits for it)" \
                if self.config.lockstep_forward else ""
            raise ScheduleError(f"schedule {self.schedule.name!r} stalls in the simulation{why}: "
                                f"devices wait at {', '.join(map(str, stuck))}")
        schedule, cost, config = self.schedule, self.cost, self.config
        meta: dict[str, Any] = {
            "schedule": schedule.name, "m": schedule.m, "n": schedule.n, "checkpoint": schedule.checkpoint,
            "placement": list(schedule.placement),
            "model_state_bytes": [sum(cost.stages[j].model_state_bytes for j in schedule.stages_on(d))
                                  for d in range(self.devices)],
            "link": config.link.name if config.link is not None else None, "copy_seconds": cost.copy_seconds,
            "copy_streams": config.copy_streams, "enforce_backward_order": config.enforce_backward_order,
            "lockstep_forward": config.lockstep_forward, "backward_after_forward": config.backward_after_forward,
            "asynchronous": sorted(config.asynchronous),
            "shared_streams": list(config.shared_streams) if config.shared_streams is not None else None,
            "overheads": {"task": cost.overheads.task, "handoff": cost.overheads.handoff,
                          "contention": cost.overheads.contention, "gap": cost.overheads.gap,
                          "turnaround": cost.overheads.turnaround, "launch": cost.overheads.launch,
                          "recording": cost.overheads.recording,
                          "per_saved_tensor": cost.overheads.per_saved_tensor,
                          "per_unpacked_tensor": cost.overheads.per_unpacked_tensor,
                          "pairs": [list(p) for p in cost.overheads.pairs]},
        }
        spans = (*chain.from_iterable(self.spans), *chain.from_iterable(self.copies))
        return Timeline(spans, tuple(chain.from_iterable(self.memory)), self.devices, "simulated", meta)

    # -- the device process ------------------------------------------------------------------------

    def _device(self, d: int) -> Generator[simpy.Event, Any, None]:
        """Walk device ``d``'s task list: wait for inputs, hold the compute stream, send results on."""
        env = self.env
        timeout, new_event = env.timeout, env.event
        checkpointed, table, scales = self.checkpointed, self.table, self.scales
        scaled = self.scaled
        arrival, waiting, append_span, stride = self.arrival, self.waiting, self.spans[d].append, self.stride
        lockstep, forward_left, fork_join = self.config.lockstep_forward, self.forward_left, \
            self.config.enforce_backward_order
        stream, cores, track_memory = self.streams[d] if self.streams is not None else None, self.cores, \
            self.track_memory
        tasks = self.schedule.tasks[d]
        backward_left = 0 if fork_join else sum(1 for t in tasks if t.op is _OP_B)
        gap, free_at = self.cost.overheads.gap, self.cost.overheads.launch  # Note [gap]
        two_phases, prefix = self.config.backward_after_forward, self.prefix[d]
        asynchronous, shared, host_arrival = d in self.config.asynchronous, self.shared[d], self.host_arrival
        for k, task in enumerate(tasks):
            o, i, j = task.op, task.microbatch, task.stage
            op = _F if o is _OP_F else _B if o is _OP_B else _R if o is _OP_R else _W
            waits, sends, seconds, host = table[checkpointed[i]][op][j]
            issue = free_at  # Note [asynchronous devices]: when this device's host can issue the task
            for offset in waits:  # results from other devices
                slot = offset + i * stride
                at = arrival[slot]
                if at is None:
                    event = waiting[slot] = new_event()
                    yield event
                    at = arrival[slot]
                    assert at is not None
                if at > env.now:
                    yield timeout(at - env.now)
                if host_arrival[slot] > issue:
                    issue = host_arrival[slot]
            if lockstep and op == _F and i + j and forward_left[i + j - 1]:
                yield self._cycle_event(i + j - 1)
            if two_phases and k >= prefix:  # Note [two phases]
                if not self.backward_phase.triggered:
                    yield self.backward_phase
                if self.phase_open > issue:
                    issue = self.phase_open
            if scaled:
                kernels = seconds * scales[i]
                seconds = kernels + host
            else:
                kernels = seconds - host
            if k == 0 or (two_phases and k == prefix):  # a fresh worker thread's first task
                seconds += self.cost.stages[j].thread_start
                host += self.cost.stages[j].thread_start
            if asynchronous:  # the host issues for its host seconds; the stream runs the kernels, no earlier
                issued_by = issue + host + self.issue[checkpointed[i]][op][j]
                if issue > env.now:
                    yield timeout(issue - env.now)
                if two_phases and op == _F:
                    self._forward_done(issued_by)
            elif free_at > env.now:
                yield timeout(free_at - env.now)
            held = None
            if shared is not None:
                held = shared.request()
                yield held
            request = None
            if stream is not None:
                request = stream.request()
                yield request
            if track_memory and op == _R:
                self._hold(d, i, j, self.cost.stages[j].saved_bytes, env.now)
            start = env.now
            if asynchronous:
                end = start + kernels
                yield timeout((issued_by if issued_by > end else end) - start)
                self.host_end[d] = issued_by
            elif cores is None:
                yield timeout(seconds)
            else:  # Note [host seconds share nothing]
                yield cores.run(seconds, (_KIND[op] if op != _F or not checkpointed[i] else "Fc", j), host)
            if stream is not None and request is not None:
                stream.release(request)
            if shared is not None and held is not None:
                shared.release(held)
            append_span(Span(d, COMPUTE, task, start, env.now))
            if asynchronous:
                free_at = issued_by + gap
            elif gap:
                free_at = env.now + gap
            if two_phases and op == _F and not asynchronous:
                self._forward_done(env.now)
            if track_memory:
                self._memory_after(d, op, i, j, env.now)
            if lockstep and op == _F:
                forward_left[i + j] -= 1
                if not forward_left[i + j] and i + j in self.cycle_done:
                    self.cycle_done.pop(i + j).succeed()
            if op == _B and not fork_join:  # Note [fork/join]
                backward_left -= 1
                send, self.deferred[d] = self.deferred[d], []
                if sends:
                    (self.deferred[d] if backward_left else send).append((task, op, i, j, sends))
            elif sends:
                send = [(task, op, i, j, sends)]
            else:
                continue
            for copy in send:
                if stream is None:
                    self._copy_on_streams(d, env.now, *copy)
                else:
                    yield from self._copy_on_compute(d, *copy)

    def _device_fast(self, d: int) -> Generator[simpy.Event, Any, None]:
        """:meth:`_device` on the plain path (Note [local clocks]): the same times, from a local clock."""
        new_event = self.env.event
        checkpointed, table, scales, scaled = self.checkpointed, self.table, self.scales, self.scaled
        arrival, issued, waiting, stride = self.arrival, self.issued, self.waiting, self.stride
        append_span, track_memory, free_copies = self.spans[d].append, self.track_memory, self.free_copies
        fork_join, stages, copy = self.config.enforce_backward_order, self.cost.stages, self._copy_on_streams
        tasks = self.schedule.tasks[d]
        backward_left = 0 if fork_join else sum(1 for t in tasks if t.op is _OP_B)
        gap, free_at = self.cost.overheads.gap, self.cost.overheads.launch  # Note [gap]
        held, current, mem_append, frees_at, n = self.held, self.current, self.memory[d].append, self.frees_at, self.n
        t = 0.0  # this device's time
        for k, task in enumerate(tasks):
            o, i, j = task.op, task.microbatch, task.stage
            op = _F if o is _OP_F else _B if o is _OP_B else _R if o is _OP_R else _W
            waits, sends, seconds, host = table[checkpointed[i]][op][j]
            for offset in waits:  # results from other devices
                slot = offset + i * stride
                at = arrival[slot]
                if at is None:  # not issued yet: wait for it
                    self.clock[d] = t
                    event = waiting[slot] = new_event()
                    yield event
                    at = arrival[slot]
                    assert at is not None
                if free_copies:  # usable when issued
                    if at > t:
                        t = at
                    continue
                issued_at = issued[slot]
                if issued_at > t:  # _device would have waited for the copy until it was issued
                    t = issued_at
                if at > t:
                    t = t + (at - t)  # as a SimPy timeout(at - now) computes it
            if free_at > t:
                t = t + (free_at - t)
            if track_memory and op == _R:
                self._hold(d, i, j, stages[j].saved_bytes, t)
            if scaled:
                seconds = seconds * scales[i] + host
            if k == 0:  # a fresh worker thread's first task
                seconds += stages[j].thread_start
            start, t = t, t + seconds
            append_span(Span(d, COMPUTE, task, start, t))
            if gap:
                free_at = t + gap
            if track_memory:  # inline _memory_after
                if op == _F:
                    nbytes = stages[j].checkpoint_bytes if checkpointed[i] else stages[j].saved_bytes
                    if scaled:
                        nbytes = round(nbytes * scales[i])
                    if nbytes:
                        key = i * n + j
                        held[key] = held.get(key, 0) + nbytes
                        current[d] += nbytes
                        mem_append(MemorySample(d, t, current[d]))
                elif op == frees_at:
                    freed = held.pop(i * n + j, 0)
                    if freed:
                        current[d] -= freed
                        mem_append(MemorySample(d, t, current[d]))
            if op == _B and not fork_join:  # Note [fork/join]
                backward_left -= 1
                send, self.deferred[d] = self.deferred[d], []
                if sends:
                    (self.deferred[d] if backward_left else send).append((task, op, i, j, sends))
                for c in send:
                    copy(d, t, *c)
            elif sends:
                if free_copies:  # inline _copy_on_streams: usable at once
                    base = i * stride
                    for _dst, offset in sends:
                        arrival[offset + base] = t
                        if waiting:
                            woken = waiting.pop(offset + base, None)
                            if woken is not None:
                                woken.succeed()
                else:
                    copy(d, t, task, op, i, j, sends)
        self.clock[d] = t

    def _forward_done(self, host_end: float) -> None:
        """Note [two phases]: after the step's last forward, the backward phase opens ``turnaround`` later.

        ``host_end``: when the forward's host work ended (its end on a synchronous device; Note
        [asynchronous devices]); the phase opens ``turnaround`` after the latest of them."""
        self.forwards_left -= 1
        if host_end + self.cost.overheads.turnaround > self.phase_open:
            self.phase_open = host_end + self.cost.overheads.turnaround
        if not self.forwards_left:
            now, turnaround = self.env.now, self.cost.overheads.turnaround
            delay = turnaround if self.phase_open == now + turnaround else self.phase_open - now
            if delay > 0:
                self.env.timeout(delay).callbacks.append(self._open_backward_phase)
            else:
                self.backward_phase.succeed()

    def _open_backward_phase(self, _event: simpy.Event) -> None:
        self.backward_phase.succeed()

    def _release_deferred(self, now: float) -> None:
        """Issue every held-back gradient copy at ``now``: the simulation stalled waiting for one of them."""
        for d, held in enumerate(self.deferred):
            self.deferred[d] = []
            for copy in held:
                if self.streams is None:
                    self._copy_on_streams(d, now, *copy)
                else:
                    self.env.process(self._copy_on_compute(d, *copy))

    def _cycle_event(self, cycle: int) -> simpy.Event:
        event = self.cycle_done.get(cycle)
        if event is None:
            event = self.cycle_done[cycle] = self.env.event()
        return event

    # -- copies (Note [copies], Note [no copy streams]) ----------------------------------------------

    def _copy_seconds(self, op: int, i: int, j: int, scale: float | None = None) -> float:
        """Seconds of a copy of the result of ``(op, i, j)`` (Note [copies])."""
        cost, link = self.cost, self.config.link
        if cost.copy_seconds is not None:
            return cost.copy_seconds
        if link is None:
            return 0.0
        if scale is None:
            if not self.scaled:
                return self.copy_table[op][j]
            scale = self.scales[i]
        stage = j if op == _F else j - 1 if op == _B and j > 0 else -1
        return link.transfer_seconds(cost.stages[stage].send_bytes * scale if stage >= 0 else 0)

    def _hand_off(self, src: int) -> tuple[float, float | None]:
        """Note [asynchronous devices]: what follows a copy from ``src``: the seconds its consumer's stream waits
        after the copy (``handoff`` for a synchronous producer, whose host is its stream), and when the consumer's
        host has it (``None``: when the stream has it; else the producer's host end plus ``handoff``)."""
        if src in self.config.asynchronous:
            return 0.0, self.host_end[src] + self.handoff
        return self.handoff, None

    def _deliver(self, slot: int, at: float, host_at: float) -> None:
        self.arrival[slot] = at
        self.host_arrival[slot] = host_at
        event = self.waiting.pop(slot, None)
        if event is not None:
            event.succeed()

    def _copy_on_streams(self, src: int, now: float, task: Task, op: int, i: int, j: int,
                         dsts: tuple[tuple[int, int], ...]) -> None:
        """Send ``task``'s result on copy streams at time ``now``: FIFO per directed pair, so each copy starts
        when it is issued (now) or when the pair's previous copy ends; computed at issue time, no process needed."""
        arrival, waiting, issued, base = self.arrival, self.waiting, self.issued, i * self.stride
        handoff, host_at = self._hand_off(src)
        if self.free_copies:  # nothing to queue: usable at once (Note [local clocks])
            for _dst, offset in dsts:
                arrival[offset + base] = now
                self.host_arrival[offset + base] = now if host_at is None else host_at
                if waiting:
                    event = waiting.pop(offset + base, None)
                    if event is not None:
                        event.succeed()
            return
        seconds = self._copy_seconds(op, i, j) if self.scaled else self.copy_table[op][j]
        free = self.link_free[src]
        for dst, offset in dsts:
            start = free[dst]
            if start < now:
                start = now
            end = free[dst] = start + seconds
            if seconds > 0:
                self.copies[src].append(Span(dst, COPY, task, start, end))
            arrival[offset + base] = end + handoff
            self.host_arrival[offset + base] = end + handoff if host_at is None else host_at
            issued[offset + base] = now
            if waiting:
                event = waiting.pop(offset + base, None)
                if event is not None:
                    event.succeed()

    def _copy_on_compute(self, src: int, task: Task, op: int, i: int, j: int,
                         dsts: tuple[tuple[int, int], ...]) -> Generator[simpy.Event, Any, None]:
        """Send ``task``'s result on the compute streams of sender and receiver, taken in device order."""
        assert self.streams is not None
        seconds = self._copy_seconds(op, i, j)
        handoff, host_at = self._hand_off(src)
        for dst, offset in dsts:
            if seconds > 0:
                first, second = (self.streams[k] for k in sorted((src, dst)))
                with first.request() as hold_first:
                    yield hold_first
                    with second.request() as hold_second:
                        yield hold_second
                        start = self.env.now
                        yield self.env.timeout(seconds)
                self.copies[src].append(Span(dst, COPY, task, start, self.env.now, ON_COMPUTE))
            at = self.env.now + handoff
            self._deliver(offset + i * self.stride, at, at if host_at is None else host_at)

    # -- memory (Note [memory]) --------------------------------------------------------------------

    def _hold(self, d: int, i: int, j: int, nbytes: int, now: float) -> None:
        if self.scaled:
            nbytes = round(nbytes * self.scales[i])
        if nbytes:
            key = i * self.n + j
            self.held[key] = self.held.get(key, 0) + nbytes
            self.current[d] += nbytes
            self.memory[d].append(MemorySample(d, now, self.current[d]))

    def _memory_after(self, d: int, op: int, i: int, j: int, now: float) -> None:
        if op == _F:
            stage = self.cost.stages[j]
            self._hold(d, i, j, stage.checkpoint_bytes if self.checkpointed[i] else stage.saved_bytes, now)
        elif op == self.frees_at:
            freed = self.held.pop(i * self.n + j, 0)
            if freed:
                self.current[d] -= freed
                self.memory[d].append(MemorySample(d, now, self.current[d]))
