"""The simulator: run a schedule on a cost model as a SimPy discrete-event simulation and return its Timeline.

One SimPy process per device (:mod:`sim.core.device`) walks that device's task list in order, each task
waiting for what it depends on (Note [dependencies] in :mod:`gpipe.schedule.task`) and then holding the
device's compute stream for its cost::

    task seconds = stage seconds * cost.scale(i) + the runner's host seconds (+ first seconds)

Copies follow from the dependencies (:mod:`sim.core.copies`), memory from what each in-flight micro-batch keeps
(:mod:`sim.core.memory`). The docs page *The simulator's model of a device* says what this assumes and what
it leaves out; :class:`SimConfig` (:mod:`sim.core.config`) switches the executor behaviours it models.
"""

from __future__ import annotations

from dataclasses import replace

from gpipe.schedule import Schedule, collector_paused
from gpipe.schedule.timeline import Timeline
from sim.core.collectives import Gather, add_collectives
from sim.core.config import DEFAULT_CONFIG, SimConfig
from sim.core.cost import CostModel
from sim.core.device import device
from sim.core.overlap import check_pairs
from sim.core.run import Run

__all__ = ["simulate"]


def simulate(schedule: Schedule, cost: CostModel, config: SimConfig = DEFAULT_CONFIG) -> Timeline:
    """Predict when every task and copy of ``schedule`` runs under ``cost``.

    Args:
        schedule: what runs where, in which order; validated first.
        cost: per-stage costs; ``cost.n`` must equal ``schedule.n``.
        config: the switches of :class:`~sim.core.config.SimConfig`.

    Returns:
        A new :class:`~gpipe.schedule.timeline.Timeline` (``source="simulated"``): one compute span per task,
        one span per copy that takes time, and memory samples per device.

    Raises:
        ScheduleError: the schedule is invalid, or it stalls under ``config`` (e.g. lockstep).
        ValueError: the cost model does not fit the schedule, or the schedule's overlapped pairs meet a switch
            they are not modelled with (:func:`sim.core.overlap.check_pairs`).
    """
    with collector_paused():  # Note [gc] in gpipe.schedule.collector
        schedule.validate()
        if cost.n != schedule.n:
            copies = " (its stages are copies: sim.core.cost.copied_stages makes a model's costs theirs)" \
                if schedule.copies > 1 else ""
            raise ValueError(f"the cost model has {cost.n} stages but the schedule has {schedule.n}{copies}")
        if config.lockstep_forward and schedule.copies > 1:
            raise ValueError(f"lockstep_forward models torchgpipe's clock cycles along one route of the stages; "
                             f"schedule {schedule.name!r} has {schedule.copies} copies of them")
        if cost.microbatch_scale and len(cost.microbatch_scale) != schedule.m:
            raise ValueError(f"the cost model scales {len(cost.microbatch_scale)} micro-batches but the schedule "
                             f"has {schedule.m}")
        if config.asynchronous and max(config.asynchronous) >= schedule.num_devices:
            raise ValueError(f"SimConfig.asynchronous names device {max(config.asynchronous)}, but the schedule "
                             f"has {schedule.num_devices} devices")
        if config.shared_streams is not None and len(config.shared_streams) != schedule.num_devices:
            raise ValueError(f"SimConfig.shared_streams has {len(config.shared_streams)} entries for a schedule of "
                             f"{schedule.num_devices} devices")
        return run_validated(schedule, cost, config)


def run_validated(schedule: Schedule, cost: CostModel, config: SimConfig) -> Timeline:
    """:func:`simulate` of a schedule and cost model already checked (benchmarks time the simulation alone)."""
    collectives = [stage.collectives for stage in cost.stages]
    if any(c is not None for c in collectives) and not any(c is not None and c.gather is not Gather.NEVER
                                                            for c in collectives):
        # Note [collectives after the fact] in sim.core.collectives: nothing waits for them
        plain = replace(cost, stages=tuple(replace(stage, collectives=None) for stage in cost.stages))
        return add_collectives(run_validated(schedule, plain, config), schedule, collectives, config.overlap_pairs)
    run = Run(schedule, cost, config)
    check_pairs(run)
    if run.comms is not None and not run.local_clocks():
        raise ValueError("stages that gather their parameters (StageCollectives.gather) are simulated on the plain "
                         "path only: copy streams, synchronous devices, no shared cores or streams, no lockstep, one "
                         "phase")
    for d in range(run.devices):
        run.env.process(device(run, d))
    run.env.run()
    local = run.local_clocks()  # Note [local clocks] in sim.core.device: each device's own, or SimPy's
    while not run.done() and any(run.deferred):  # Note [fork/join]: stalled on a held-back copy
        run.release_deferred(max(run.clock) if local else run.env.now)
        run.env.run()
    return run.timeline()
