"""The figure, grids and table of "1F1B and GPipe memory" (docs/concepts/1f1b.md)."""

from __future__ import annotations

from pathlib import Path

from figures import figure, markdown
from figures.common import MiB, md_table, memory_curve, millis, save, simulate, teach_cost
from gpipe.schedule import Schedule, gpipe, one_f_one_b
from gpipe.schedule.plot import plot_timeline


# --8<-- [start:onefoneb]
@figure("onefoneb.png")
def onefoneb(path: Path) -> None:
    import matplotlib.pyplot as plt

    cost = teach_cost()
    tls = {"GPipe": simulate(gpipe(8, 4, "never"), cost), "1F1B": simulate(one_f_one_b(8, 4, "never"), cost)}
    fig, axes = plt.subplots(2, 2, figsize=(12, 6), sharex=True, gridspec_kw={"height_ratios": [1.2, 1]})
    for col, (name, tl) in enumerate(tls.items()):
        plot_timeline(tl, ax=axes[0, col], title=f"{name}: makespan {millis(tl.makespan)}")
        for d in range(tl.num_devices):
            xs, ys = memory_curve(tl, d)
            axes[1, col].step([x / 1e3 for x in xs], ys, where="post", lw=1.4, label=f"dev {d}")
        axes[1, col].set_xlabel("seconds")
        axes[1, col].set_ylabel("MiB saved for backward")
        axes[1, col].grid(alpha=0.3)
        axes[1, col].legend(fontsize=7, ncol=4)
    fig.tight_layout()
    save(fig, path)
# --8<-- [end:onefoneb]


def grids_side_by_side(schedules: dict[str, Schedule]) -> str:
    """The schedules' unit-step grids (:meth:`Schedule.grid`) beside one another, each headed by its name, its
    step count and the most micro-batches device 0 holds for backward at once."""
    columns = []
    for name, schedule in schedules.items():
        lines = schedule.grid().splitlines()
        held = peak = 0
        for task in schedule.tasks[0]:
            held += {"F": 1, "B": -1}.get(task.op.value, 0)
            peak = max(peak, held)
        columns.append([f"{name}: {len(lines) - 1} steps, dev0 holds {peak}"] + lines)
    widths = [max(len(line) for line in col) for col in columns]
    rows = max(len(col) for col in columns)
    lines = ["     ".join((col[r] if r < len(col) else "").ljust(w) for col, w in zip(columns, widths, strict=True))
             for r in range(rows)]
    return "\n".join(line.rstrip() for line in lines)


@markdown
def one_f_one_b_fragments() -> dict[str, str]:
    rows = []
    cost = teach_cost()
    for name, sched in (("GPipe", gpipe(8, 4, "never")), ("1F1B", one_f_one_b(8, 4, "never"))):
        tl = simulate(sched, cost)
        rows.append([name, millis(tl.makespan), f"{tl.bubble_fraction():.1%}"]
                    + [f"{tl.peak_memory(d) / MiB:.0f}" for d in range(tl.num_devices)])
    return {
        "grid_1f1b_m4_n3": one_f_one_b(4, 3).grid(),
        "grids_gpipe_1f1b_m3_n2": grids_side_by_side(
            {"GPipe": gpipe(3, 2, "never"), "1F1B": one_f_one_b(3, 2, "never")}),
        "onefoneb_table": md_table(["schedule", "makespan", "bubble"] + [f"peak MiB, dev {d}" for d in range(4)],
                                   rows),
    }
