"""One simulation's state: the SimPy environment, the per-task tables, and what the device processes share.

:mod:`sim.core.device` holds the device processes that walk it, :mod:`sim.core.engine` starts them.
"""

from __future__ import annotations

from itertools import chain
from typing import Any

import simpy

from gpipe.schedule import Op, Schedule, ScheduleError, Task
from gpipe.schedule.timeline import Span, Timeline
from sim.core.collectives import CommStream
from sim.core.config import SimConfig
from sim.core.copies import Copies, Sends
from sim.core.cost import CostModel
from sim.core.memory import Memory
from sim.core.sharing import SharedCores
from sim.core.tables import B, communication_table, remote_tables, task_table

__all__ = ["Copy", "Run"]

Copy = tuple[Task, int, int, int, Sends]  # (producer, opcode, i, j, destination devices)


class Run:
    """One simulation: the SimPy environment, the tables, the copies, the memory, and what the devices record."""

    def __init__(self, schedule: Schedule, cost: CostModel, config: SimConfig) -> None:
        self.schedule, self.cost, self.config = schedule, cost, config
        self.env = simpy.Environment()
        m, n, devices = schedule.m, schedule.n, schedule.num_devices
        self.m, self.n, self.devices = m, n, devices
        self.scales = [cost.scale(i) for i in range(m)]
        self.scaled = bool(cost.microbatch_scale)
        self.checkpointed = [int(schedule.is_checkpointed(i)) for i in range(m)]
        # a valid schedule has a W task for every (i, j) or for none, so device 0's list tells
        splits = any(t.op is Op.W for t in schedule.tasks[0])
        inputs, outputs, fanout = remote_tables(schedule, splits)
        self.stride = n * fanout
        runner = cost.runner
        self.table = task_table(cost, inputs, outputs)
        self.communication = communication_table(cost)  # Note [communication] in sim.core.cost: [op][j], scale 1
        self.issue = [[[runner.issue_seconds(op, j, c == 1) for j in range(n)] for op in (Op.F, Op.B, Op.R, Op.W)]
                      for c in (0, 1)]
        self.first = [runner.first_seconds(j) for j in range(n)]  # a fresh worker thread's first task
        self.gap, self.launch, self.turnaround = runner.gap, runner.launch, runner.turnaround
        # Note [span order]: compute spans per device (one per task, in task order), copy spans per sending
        # device (in issue order), memory samples per device (one at t=0, then in time order)
        self.spans: list[list[Span]] = [[] for _ in range(devices)]
        self.talks: list[list[Span]] = [[] for _ in range(devices)]  # all-to-all spans (sim.core.overlap)
        self.memory = Memory(cost.stages, devices, self.checkpointed, self.scales if self.scaled else None, splits)
        self.streams = None if config.copy_streams else [simpy.Resource(self.env, 1) for _ in range(devices)]
        self.host_end = [0.0] * devices  # an asynchronous device's host time after its last task
        # slots run op by op, and only the ops up to the last whose results travel (F and B) need them
        travelling = 1 + max((op for c in (0, 1) for op in range(4) if any(outputs[c][op])), default=-1)
        self.copies = Copies(self.env, cost, config.link, self.scales, travelling * m * n * fanout, self.stride,
                             devices, config.asynchronous, self.host_end, self.streams, config.stage_links)
        collectives = [stage.collectives for stage in cost.stages]
        self.comms = [CommStream(schedule, collectives, d) for d in range(devices)] \
            if any(c is not None for c in collectives) else None  # each device's communication stream
        self.clock = [0.0] * devices  # Note [local clocks]: each device's time when it last blocked or finished
        # a compute stream shared by several devices (Note [asynchronous devices])
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
        self.phase_open = 0.0  # Note [two phases]: host time the backward phase opens (once the forwards are done)
        self.cores = SharedCores(self.env, runner.contention, (((a, j), (b, k), c) for a, j, b, k, c in runner.pairs)) \
            if runner.pairs or runner.contention > 0 else None
        # Note [lockstep]: forward tasks left per clock cycle, and the events of cycles someone waits for
        self.forward_left = [min(k + 1, m, n, m + n - 1 - k) for k in range(m + n - 1)]
        self.cycle_done: dict[int, simpy.Event] = {}
        self.tasks = sum(map(len, schedule.tasks))
        # Note [overlapped pairs] in gpipe.schedule.schedule: where each device's pairs start (sim.core.overlap)
        self.pair_starts = schedule.pair_starts if schedule.pairs and config.overlap_pairs else (frozenset(),) * devices
        self.deferred: list[list[Copy]] = [[] for _ in range(devices)]  # Note [fork/join]: copies held back
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
        """Whether the run is on the plain path, where each device keeps its own clock (Note [local clocks] in
        :mod:`sim.core.device`): no shared cores, copy streams, no lockstep, one phase, synchronous devices and a
        compute stream each."""
        config = self.config
        return self.cores is None and config.copy_streams and not config.lockstep_forward \
            and not config.backward_after_forward and not config.asynchronous and not any(self.shared)

    def done(self) -> bool:
        return sum(map(len, self.spans)) >= self.tasks

    def forward_done(self, host_end: float) -> None:
        """Note [two phases]: after the step's last forward, the backward phase opens ``turnaround`` later.

        ``host_end``: when the forward's host work ended (its end on a synchronous device; Note
        [asynchronous devices]); the phase opens ``turnaround`` after the latest of them."""
        self.forwards_left -= 1
        if host_end + self.turnaround > self.phase_open:
            self.phase_open = host_end + self.turnaround
        if not self.forwards_left:
            now, turnaround = self.env.now, self.turnaround
            delay = turnaround if self.phase_open == now + turnaround else self.phase_open - now
            if delay > 0:
                self.env.timeout(delay).callbacks.append(self._open_backward_phase)
            else:
                self.backward_phase.succeed()

    def _open_backward_phase(self, _event: simpy.Event) -> None:
        self.backward_phase.succeed()

    def copies_due(self, d: int, task: Task, op: int, i: int, j: int, sends: Sends, backward_left: int,
                   fork_join: bool) -> tuple[list[Copy], int]:
        """The copies device ``d`` issues as ``task`` ends, and the backwards it has left.

        Note [fork/join] (in :mod:`sim.core.device`): without it, a backward's gradient copies are held back
        until the device's next backward ends (its last backward's go at once); with it, a task's copies go
        when it ends."""
        if op == B and not fork_join:
            backward_left -= 1
            send, self.deferred[d] = self.deferred[d], []
            if sends:
                (self.deferred[d] if backward_left else send).append((task, op, i, j, sends))
            return send, backward_left
        return ([(task, op, i, j, sends)] if sends else []), backward_left

    def release_deferred(self, now: float) -> None:
        """Issue every held-back gradient copy at ``now``: the simulation stalled waiting for one of them.

        Note [fork/join]: autograd would run such a copy once nothing else is ready, so a held-back copy is
        issued at the latest when the simulation can make no other progress."""
        for d, held in enumerate(self.deferred):
            self.deferred[d] = []
            for copy in held:
                if self.streams is None:
                    self.copies.on_streams(d, now, *copy)
                else:
                    self.env.process(self.copies.on_compute(d, *copy))

    def cycle_event(self, cycle: int) -> simpy.Event:
        event = self.cycle_done.get(cycle)
        if event is None:
            event = self.cycle_done[cycle] = self.env.event()
        return event

    def timeline(self) -> Timeline:
        """The Timeline of a finished run (:class:`ScheduleError` if a device never finished its tasks)."""
        schedule, cost, config = self.schedule, self.cost, self.config
        if not self.done():
            done = [len(s) for s in self.spans]
            stuck = [ts[k] for ts, k in zip(schedule.tasks, done, strict=True) if k < len(ts)]
            why = " (lockstep_forward: a forward waits for a clock cycle that waits for it)" \
                if config.lockstep_forward else ""
            raise ScheduleError(f"schedule {schedule.name!r} stalls in the simulation{why}: "
                                f"devices wait at {', '.join(map(str, stuck))}")
        runner = cost.runner
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
            "runner": {"handoff": runner.handoff, "gap": runner.gap, "launch": runner.launch,
                       "turnaround": runner.turnaround, "contention": runner.contention,
                       "pairs": [list(p) for p in runner.pairs]},
        }
        if schedule.copies > 1:  # Note [stage slots] in gpipe.schedule.schedule: model_state_bytes counts each copy
            meta["copies"] = schedule.copies
        spans = (*chain.from_iterable(self.spans), *chain.from_iterable(self.copies.spans),
                 *chain.from_iterable(self.talks),
                 *(chain.from_iterable(c.spans for c in self.comms) if self.comms is not None else ()))
        return Timeline(spans, tuple(chain.from_iterable(self.memory.samples)), self.devices, "simulated", meta)
