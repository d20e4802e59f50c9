"""The two-direction DualPipe of "Beyond 1F1B" (docs/concepts/beyond-1f1b.md): its Gantt beside DualPipe-V's, and
its idle time in the simulator against the DeepSeek-V3 report's Table 2 (arXiv 2412.19437)."""

from __future__ import annotations

from pathlib import Path

from figures import figure, markdown
from figures.beyond_1f1b import communication_marks
from figures.common import md_table, millis, save, simulate
from gpipe.schedule import Schedule, dualpipe, dualpipe_v
from gpipe.schedule.plot import plot_side_by_side
from gpipe.schedule.timeline import Timeline
from sim.core.cost import CostModel, StageCost

#: The Gantt's pipeline: 4 devices, 8 micro-batches; a stage of one copy costs 1 ms forward, 1 ms input gradient and
#: 0.5 ms weight gradient per micro-batch (DualPipe-V's stages, half the model's depth each, half of that).
P, M, COSTS = 4, 8, (1e-3, 1e-3, 0.5e-3)
#: The table's costs ``(t_f, t_b, t_w)`` in ms: three of tests/test_dualpipe_two_way.py's, where Table 2's count is
#: exact with pairs in turn, and the equal costs of the rest of the page.
TABLE_COSTS = ((1.0, 1.0, 0.5), (1.5, 1.0, 0.5), (2.0, 2.0, 1.0), (1.0, 1.0, 1.0))


def table2(p: int, f: float, b: float, w: float) -> float:
    """DualPipe's bubble in the DeepSeek-V3 report's Table 2, ``(p/2 − 1)·(F&B + B − 3W)``, with the overlapped
    pair ``F&B`` counted as its two tasks in turn, ``F + B``."""
    return (p / 2 - 1) * ((f + b) + b - 3 * w)


def two_way_cost(schedule: Schedule, f: float, b: float, w: float) -> CostModel:
    """Every slot of ``schedule`` a whole stage of one copy, ``f``, ``b`` and ``w`` seconds per micro-batch."""
    return CostModel((StageCost(f, b, weight=w),) * schedule.n, copy_seconds=0.0)


def idle(timeline: Timeline, p: int) -> float:
    """The longest time a device of ``p`` waits in the step (DualPipe's are all equal)."""
    return max(timeline.makespan - timeline.busy(d) for d in range(p))


def bubble_rows() -> list[tuple[int, tuple[float, float, float], float, float, float]]:
    """``(p, (t_f, t_b, t_w), Table 2's bubble, the simulator's with pairs in turn, with pairs sharing the device)``
    at ``m = 2p`` for each of :data:`TABLE_COSTS` on 4 and 8 devices, in ms."""
    out = []
    for p in (4, 8):
        schedule = dualpipe(2 * p, 2 * p)
        for costs in TABLE_COSTS:
            cost = two_way_cost(schedule, *costs)
            runs = [idle(simulate(schedule, cost, overlap_pairs=overlap), p) for overlap in (False, True)]
            out.append((p, costs, table2(p, *costs), runs[0], runs[1]))
    return out


def gantt_runs() -> list[tuple[Schedule, CostModel, Timeline]]:
    """DualPipe and DualPipe-V on :data:`P` devices, :data:`M` micro-batches, the same work per device: each of
    DualPipe's slots a whole stage (:data:`COSTS`), each of DualPipe-V's ``2p`` stages half of one."""
    f, b, w = COSTS
    two_way, v = dualpipe(M, 2 * P), dualpipe_v(M, 2 * P)
    runs = [(two_way, two_way_cost(two_way, f, b, w)), (v, two_way_cost(v, f / 2, b / 2, w / 2))]
    return [(s, cost, simulate(s, cost)) for s, cost in runs]


def page_numbers() -> dict[str, str]:
    """The numbers the DualPipe section of the page states (tests/docs/test_moe_page.py finds each)."""
    (_, _, two_way), (_, _, v) = gantt_runs()
    work, (f, b, w) = M * sum(COSTS), (x * 1e3 for x in COSTS)
    return {"two way": f"{millis(two_way.makespan)}", "v": f"{millis(v.makespan)}",
            "work": f"{work * 1e3:g} ms of work", "two way idle": f"idles {idle(two_way, P) * 1e3:g} ms",
            "v idle": f"DualPipe-V's {idle(v, P) * 1e3:g} ms",
            "table 2": f"`({P}/2 − 1)·({f + b:g} + {b:g} − {3 * w:g}) = {table2(P, f, b, w):g}` ms"}


# --8<-- [start:dualpipe_two_way]
@figure("dualpipe_two_way.png")
def dualpipe_two_way(path: Path) -> None:
    runs = gantt_runs()  # DualPipe, two copies, beside DualPipe-V, the same work per device
    timelines = [tl for _, _, tl in runs]
    fig = plot_side_by_side(timelines, labels=False, titles=[
        f"{s.name}: {s.n} {'slots, 2 copies of ' + str(s.stages) + ' stages' if s.copies > 1 else 'stages in a V'} "
        f"on {P} devices, makespan {millis(tl.makespan)}" for s, _, tl in runs])
    for ax, (s, cost, tl) in zip(fig.axes, runs, strict=False):
        communication_marks(ax, tl, s, cost)  # an overlapped pair: its forward above, its backward below
        paired = {task: k for pair in s.pairs for k, task in enumerate(pair)}
        for span in tl.compute_spans():  # each task's micro-batch, in its half of the row when it is paired
            y = span.device + (0.0 if span.task not in paired else (-0.2, 0.2)[paired[span.task]])
            ax.text((span.start + span.end) / 2 - tl.start, y, str(span.task.microbatch), ha="center", va="center",
                    fontsize=6 if span.task in paired else 7, color="white")
    fig.axes[len(runs) - 1].set_xlabel("seconds.   An overlapped pair: its forward above, its backward below")
    save(fig, path)
# --8<-- [end:dualpipe_two_way]


@markdown
def dualpipe_fragments() -> dict[str, str]:
    rows = [[str(p), str(2 * p), " / ".join(f"{x:g}" for x in costs), f"{t2:g}", f"{turn:g}", f"{paired:g}"]
            for p, costs, t2, turn, paired in bubble_rows()]
    return {"dualpipe_table2": md_table(["p", "m", "t_f / t_b / t_w (ms)", "Table 2 (ms)",
                                         "simulated, pairs in turn (ms)", "simulated, pairs sharing (ms)"], rows)}
