"""Pipeline schedules as immutable data: tasks, per-device task lists, one registry of generators, one validator.

This package is pure Python (no torch) and is the language that both the executor (:mod:`gpipe`) and the
simulator (:mod:`sim`) speak. A :class:`Schedule` says *what* runs *where* and *in which order*; it never
says *when*. The simulator predicts when, the executor measures when, and both answer with a
:class:`gpipe.timeline.Timeline`.

Vocabulary (after Huang et al., 2019, GPipe; Kim et al., 2020, torchgpipe)::

    m  micro-batches, indexed i = 0 .. m-1
    n  stages (partitions), indexed j = 0 .. n-1

    F(i, j)  forward of micro-batch i on stage j
    R(i, j)  recompute of a checkpointed forward, run right before its backward
    B(i, j)  backward of micro-batch i on stage j
    W(i, j)  weight gradient, for schedules that split the backward (zero-bubble)

One concept per module, each importing only those above it::

    task.py             Op, Task and their text form ("F2@1"), checkpoint policies, what a task waits for
    grid.py             the step x device grid, the picture of a schedule
    validator.py        ScheduleError and the one validator (linear in the tasks)
    schedule.py         Schedule: per-device task lists, shape and stage placement
    collector.py        collector_paused, for building millions of records
    placement.py        stage placement and per-stage orders merged per device, for generators
    registry.py         SCHEDULES: every generator by name, with what it does and needs; register()
    fill_drain.py       gpipe(): GPipe's fill-drain, and clock_cycles()
    pipedream_flush.py  one_f_one_b(): 1F1B
    zero_bubble.py      zb_h1(), zb_v() and its layout v_shape(): zero-bubble schedules (B and W split)

A new schedule is one generator, registered once (:mod:`gpipe.schedule.registry`)::

    @register("my-schedule", "what it does, in one line", constraints="what it needs, in one line")
    def my_schedule(m, n, checkpoint="never", placement=None) -> Schedule: ...

and ``GPipe(..., schedule="my-schedule")``, :func:`sim.planning.plan.plan` and ``gpipe-sim simulate --schedule
my-schedule`` run it.
"""

from gpipe.schedule.collector import collector_paused
from gpipe.schedule.fill_drain import clock_cycles, gpipe
from gpipe.schedule.grid import step_grid
from gpipe.schedule.pipedream_flush import one_f_one_b
from gpipe.schedule.registry import SCHEDULES, Layout, ScheduleKind, looped, register, schedule_kind, unregister
from gpipe.schedule.schedule import Schedule
from gpipe.schedule.task import CHECKPOINT_MODES, Checkpoint, Op, Task, checkpointed, parse_tasks
from gpipe.schedule.validator import ScheduleError
from gpipe.schedule.zero_bubble import v_shape, zb_h1, zb_v

__all__ = [
    "CHECKPOINT_MODES",
    "SCHEDULES",
    "Checkpoint",
    "Layout",
    "Op",
    "Schedule",
    "ScheduleError",
    "ScheduleKind",
    "Task",
    "checkpointed",
    "clock_cycles",
    "collector_paused",
    "gpipe",
    "looped",
    "one_f_one_b",
    "parse_tasks",
    "register",
    "schedule_kind",
    "step_grid",
    "unregister",
    "v_shape",
    "zb_h1",
    "zb_v",
]
