"""The shared language: schedules as immutable data (tasks, per-device task lists, one registry, one validator),
the timelines that say when each task ran, and their plots.

This package is pure Python (no torch) and is the language that both the executor (:mod:`gpipe`) and the
simulator (:mod:`sim`) speak. A :class:`Schedule` says *what* runs *where* and *in which order*; it never
says *when*. The simulator predicts when, the executor measures when, and both answer with a
:class:`gpipe.schedule.timeline.Timeline`.

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
    placement.py        stage placement, the V layout v_shape(), per-stage orders merged per device
    registry.py         SCHEDULES: every generator by name, with what it does, needs and takes; register()
    fill_drain.py       gpipe(): GPipe's fill-drain, and clock_cycles()
    pipedream_flush.py  one_f_one_b(): 1F1B
    pipelining.py       torch.distributed.pipelining's per-rank actions ("0F1") and CSV, both ways
    text.py             the project's own text form of a schedule (a header, a line per device), both ways
    virtual_stages.py   interleaved_one_f_one_b(), looped_bfs(): several stages per device, placed looped
    zero_bubble.py      zb_h1(), zb_h2(), zb_v(): zero-bubble schedules (B and W split)
    dualpipe.py         dualpipe_v(), dualpipe(): DeepSeek's DualPipeV and two-direction DualPipe, overlapped pairs
    size.py             schedule_bytes(), check_schedule_size(): a shape's memory, checked before it is built
    saved.py            held_bytes(): what each task keeps for backward and frees, the one saved-bytes rule
    search.py           search(): the fastest schedule found for per-stage costs under a memory limit, beside
                        every named one's makespan (its parts: search_costs, _timing, _greedy, _solver)
    timeline.py         Timeline: when each task ran or is predicted to run, the one answer of both halves
    plot.py             a timeline drawn, a device per row (matplotlib)

A new schedule is one generator, registered once (:mod:`gpipe.schedule.registry`)::

    @register("my-schedule", "what it does, in one line", constraints="what it needs, in one line")
    def my_schedule(m, n, checkpoint="never", placement=None) -> Schedule: ...

and ``GPipe(..., schedule="my-schedule")``, :func:`sim.planning.plan.plan` and ``gpipe-sim simulate --schedule
my-schedule`` run it. A knob of a generator (a keyword parameter) rides in the name as an option,
``"interleaved-1f1b:round=8"``, once declared: ``register(..., options={"round": "round_size"})``.
"""

from gpipe.schedule.collector import collector_paused
from gpipe.schedule.fill_drain import clock_cycles, gpipe
from gpipe.schedule.grid import step_grid
from gpipe.schedule.pipedream_flush import one_f_one_b
from gpipe.schedule.pipelining import from_pipelining, read_pipelining_csv, to_pipelining, write_pipelining_csv
from gpipe.schedule.placement import v_shape
from gpipe.schedule.registry import SCHEDULES, Layout, ScheduleKind, looped, register, schedule_kind, unregister
from gpipe.schedule.schedule import Schedule
from gpipe.schedule.search import SearchResult, StageCosts, search
from gpipe.schedule.size import available_bytes, check_schedule_size, schedule_bytes
from gpipe.schedule.task import CHECKPOINT_MODES, Checkpoint, Op, Task, checkpointed, parse_tasks
from gpipe.schedule.text import parse_schedule, read_schedule, schedule_text, write_schedule
from gpipe.schedule.validator import ScheduleError
from gpipe.schedule.virtual_stages import interleaved_one_f_one_b, looped_bfs
from gpipe.schedule.zero_bubble import zb_h1, zb_h2, zb_v

# isort: split
from gpipe.schedule.dualpipe import dualpipe, dualpipe_v  # registers last (Note [one registry])

# isort: split
from gpipe.schedule.plot import plot_side_by_side, plot_timeline  # matplotlib only when a chart is drawn
from gpipe.schedule.timeline import COMPUTE, COPY, MemorySample, Span, Timeline
from gpipe.schedule.trace import chrome_trace, write_chrome_trace

__all__ = [
    "CHECKPOINT_MODES",
    "COMPUTE",
    "COPY",
    "SCHEDULES",
    "Checkpoint",
    "Layout",
    "MemorySample",
    "Op",
    "Schedule",
    "ScheduleError",
    "ScheduleKind",
    "SearchResult",
    "Span",
    "StageCosts",
    "Task",
    "Timeline",
    "available_bytes",
    "check_schedule_size",
    "checkpointed",
    "chrome_trace",
    "clock_cycles",
    "collector_paused",
    "dualpipe",
    "dualpipe_v",
    "from_pipelining",
    "gpipe",
    "interleaved_one_f_one_b",
    "looped",
    "looped_bfs",
    "one_f_one_b",
    "parse_schedule",
    "parse_tasks",
    "plot_side_by_side",
    "plot_timeline",
    "read_pipelining_csv",
    "read_schedule",
    "register",
    "schedule_bytes",
    "schedule_kind",
    "schedule_text",
    "search",
    "step_grid",
    "to_pipelining",
    "unregister",
    "v_shape",
    "write_chrome_trace",
    "write_pipelining_csv",
    "write_schedule",
    "zb_h1",
    "zb_h2",
    "zb_v",
]
