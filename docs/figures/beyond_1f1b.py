"""The figures and table of "Beyond 1F1B" (docs/concepts/beyond-1f1b.md); its other numbers are
``docs/teaching_numbers.py``'s, on the same cost model (:func:`teaching_numbers.beyond_cost`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import teaching_numbers as tn

from figures import figure, markdown
from figures.common import MiB, md_table, millis, save, simulate
from gpipe.schedule import Schedule
from gpipe.schedule.plot import plot_side_by_side
from gpipe.schedule.timeline import Timeline
from sim.core.cost import CostModel

#: The "Beyond 1F1B" page: every registered schedule on the same four devices and eight micro-batches. A device's
#: share of the model costs 1 ms forward, 1 ms input gradient and 1 ms weight gradient per micro-batch, and keeps
#: 64 MiB per micro-batch for backward; a schedule with v stages per device gives each stage 1/v of that.
BEYOND_P, BEYOND_M, BEYOND_V = 4, 8, 2


def beyond_schedules() -> list[tuple[str, Schedule, Timeline]]:
    """Each registered schedule that takes (p=4, m=8) with its simulated timeline, in registration order."""
    from gpipe.schedule import SCHEDULES

    cost = tn.beyond_cost  # the page's costs, one source for its figures and numbers
    out = []
    for name, kind in SCHEDULES.items():
        v = 1 if kind.place is None else BEYOND_V
        try:
            schedule = kind(BEYOND_M, BEYOND_P * v, "never", devices=BEYOND_P).validate()
        except ValueError:
            continue
        out.append((name, schedule, simulate(schedule, cost(schedule))))
    return out


# --8<-- [start:beyond_1f1b]
@figure("beyond_1f1b.png")
def beyond_1f1b(path: Path) -> None:
    runs = beyond_schedules()
    titles = [f"{name}: {s.n} stages on {s.num_devices} devices, makespan {millis(tl.makespan)}"
              for name, s, tl in runs]
    save(plot_side_by_side([tl for _, _, tl in runs], titles=titles, labels=False), path)
# --8<-- [end:beyond_1f1b]


# --8<-- [start:communication_marks]
def communication_marks(ax: Any, tl: Timeline, schedule: Schedule, cost: CostModel) -> None:
    """Over a Gantt row per device: each pair's forward in the upper half of its row and its backward in the lower,
    and every phase a task spends on the network hatched (Note [communication] in :mod:`sim.core.cost`)."""
    from gpipe.schedule.plot import COLOURS
    from sim.core.sharing import TALKING, phased_pair_ends, task_phases

    spans = {s.task: s for s in tl.compute_spans()}

    def phases(task: Any) -> Any:
        stage, op = cost.stages[task.stage], task.op.value
        compute = {"F": stage.forward, "B": stage.backward, "R": stage.recompute_seconds, "W": stage.weight}[op]
        return task_phases(compute, 0.0 if op == "W" else stage.communication, op == "B")

    def bar(start: float, end: float, y: float, height: float, **style: Any) -> None:
        ax.broken_barh([(start - tl.start, end - start)], (y, height), **style)

    partner = {**dict(schedule.pairs), **{b: a for a, b in schedule.pairs}}
    upper = {a for a, _ in schedule.pairs}
    for a, b in schedule.pairs:
        sa, sb = spans[a], spans[b]
        bar(sa.start, max(sa.end, sb.end), sa.device - 0.4, 0.8, facecolors="white", linewidth=0)
        for task, top in ((a, -0.4), (b, 0.0)):
            bar(spans[task].start, spans[task].end, sa.device + top, 0.4, facecolors=COLOURS[task.op.value],
                edgecolors="white", linewidth=0.5)
    for task, s in spans.items():  # a pair's phases end as sim.core.sharing computes them, one at a time
        mine, other = phases(task), phases(partner[task]) if task in partner else None
        y, height = (s.device - 0.4, 0.8) if other is None else (s.device - (0.4 if task in upper else 0.0), 0.4)
        begin = s.start
        for k, (use, seconds) in enumerate(mine):
            end = begin + seconds if other is None else phased_pair_ends(s.start, mine[:k + 1], other)[0]
            if use == TALKING:
                bar(begin, end, y, height, facecolors="none", edgecolors="white", hatch="////", linewidth=0)
            begin = end
# --8<-- [end:communication_marks]


# --8<-- [start:dualpipe_communication]
@figure("dualpipe_communication.png")
def dualpipe_communication(path: Path) -> None:
    from gpipe.schedule import SCHEDULES

    runs = {x: (zbv, dpv) for x, zbv, dpv in tn.communication_runs(simulate)}
    panels = []
    for x in (0.0, tn.EXPENSIVE):
        for name, tl in zip(("zb-v", "dualpipe-v"), runs[x], strict=True):
            panels.append((name, x, tl))
    fig = plot_side_by_side([tl for _, _, tl in panels], labels=False, titles=[
        f"{name}, communication {x * 1e3:g} ms per F and B: makespan {millis(tl.makespan)}" for name, x, tl in panels])
    for ax, (name, x, tl) in zip(fig.axes, panels, strict=False):
        schedule = SCHEDULES[name](BEYOND_M, 2 * BEYOND_P, "never", devices=BEYOND_P)
        communication_marks(ax, tl, schedule, tn.beyond_cost(schedule, x))
    fig.axes[len(panels) - 1].set_xlabel("seconds.   Hatched: a task waiting on the network; an overlapped pair: its "
                                         "forward above, its backward below")
    save(fig, path)
# --8<-- [end:dualpipe_communication]


# --8<-- [start:across_steps]
@figure("across_steps.png")
def across_steps(path: Path) -> None:
    runs = tn.across_steps(simulate, BEYOND_P, BEYOND_M)  # two steps, no barrier between them (Note [across steps])
    fig = plot_side_by_side([two for _, _, two in runs], labels=False, titles=[
        f"{name}, two steps: {millis(two.makespan)}; with a barrier between them {millis(2 * one.makespan)} "
        f"(dashed)" for name, one, two in runs])
    for ax, (_, one, two) in zip(fig.axes, runs, strict=False):
        for s in two.compute_spans():  # the second step's tasks hatched
            if s.task.microbatch >= BEYOND_M:
                ax.broken_barh([(s.start - two.start, s.end - s.start)], (s.device - 0.4, 0.8), facecolors="none",
                               edgecolors="white", hatch="////", linewidth=0)
        for x in (one.makespan, 2 * one.makespan):
            ax.axvline(x, color="black", lw=1, ls="--")
    fig.axes[len(runs) - 1].set_xlabel("seconds.   Hatched: the second step's tasks")
    save(fig, path)
# --8<-- [end:across_steps]


# --8<-- [start:bubble_memory]
@figure("bubble_memory.png")
def bubble_memory(path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for ax, p in zip(axes, (4, 8), strict=True):
        points: dict[tuple[float, float], list[str]] = {}
        for name, _, tl in tn.frontier(simulate, p):
            points.setdefault((tn.peak_a(tl), tl.bubble_fraction()), []).append(name)
        for k, ((memory, bubble), names) in enumerate(sorted(points.items())):
            searched = "searched" in names
            ax.plot(memory, bubble, "o", ms=11 if searched else 6, mfc="none" if searched else "#4c72b0",
                    color="#4c72b0")
            ax.annotate(", ".join(names), (memory, bubble), xytext=(6, 7 if k % 2 else -11),
                        textcoords="offset points", fontsize=7)
        ax.set_ylim(0, max(bubble for _, bubble in points) * 1.12)
        ax.axvline(p, color="grey", lw=0.8, ls="--")
        ax.text(p, 0.005, f" 1F1B's memory, {p} A", fontsize=8, color="grey")
        ax.set_xlabel("peak activations on the fullest device (A: one micro-batch of a device's share)")
        ax.set_ylabel("bubble fraction")
        ax.set_xlim(0, 2 * p + 3)
        ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda y, _: f"{y:.0%}"))
        ax.grid(alpha=0.3)
        ax.set_title(f"p = {p}, m = {2 * p}, equal stages, free copies", fontsize=10)
    fig.tight_layout()
    save(fig, path)
# --8<-- [end:bubble_memory]


@markdown
def beyond_fragments() -> dict[str, str]:
    rows = []
    for name, schedule, tl in beyond_schedules():
        rows.append([f"`{name}`", str(schedule.n), millis(tl.makespan), f"{tl.bubble_fraction():.1%}"]
                    + [f"{tl.peak_memory(d) / MiB:.0f}" for d in range(BEYOND_P)])
    table = md_table(["schedule", "stages", "makespan", "bubble"] + [f"peak MiB, dev {d}" for d in range(BEYOND_P)],
                     rows)
    return {"beyond_table": table}
