"""The figures and table of "Checkpointing" (docs/concepts/checkpointing.md)."""

from __future__ import annotations

from pathlib import Path

from figures import figure, markdown
from figures.common import MiB, md_table, memory_curve, millis, save, simulate, teach_cost
from gpipe.schedule import Checkpoint, gpipe
from gpipe.schedule.plot import plot_timeline

POLICIES: tuple[Checkpoint, ...] = ("never", "except_last", "always")


# --8<-- [start:checkpoint_memory]
@figure("checkpoint_memory.png")
def checkpoint_memory(path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    for policy, colour in zip(POLICIES, ("#dd8452", "#4c72b0", "#55a868"), strict=True):
        tl = simulate(gpipe(8, 4, policy), teach_cost())
        xs, ys = memory_curve(tl, 0)
        ax.step(xs, ys, where="post", color=colour, lw=1.6,
                label=f"checkpoint={policy}: peak {tl.peak_memory(0) / MiB:.0f} MiB, step {millis(tl.makespan)}")
    ax.set_xlabel("ms")
    ax.set_ylabel("MiB saved for backward (device 0)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Memory against time on device 0: GPipe, n=4, m=8", fontsize=10)
    fig.tight_layout()
    save(fig, path)
# --8<-- [end:checkpoint_memory]


# --8<-- [start:checkpoint_gantt]
@figure("checkpoint_gantt.png")
def checkpoint_gantt(path: Path) -> None:
    tl = simulate(gpipe(8, 4, "except_last"), teach_cost())
    save(plot_timeline(tl, title=f"GPipe, n=4, m=8, checkpoint=except_last: makespan {millis(tl.makespan)}"), path)
# --8<-- [end:checkpoint_gantt]


@markdown
def checkpointing_fragments() -> dict[str, str]:
    rows = []
    for policy in POLICIES:
        tl = simulate(gpipe(8, 4, policy), teach_cost())
        recompute = sum(s.duration for s in tl.compute_spans() if s.task.op.value == "R")
        rows.append([f"`{policy}`", millis(tl.makespan), f"{tl.peak_memory(0) / MiB:.0f} MiB",
                     f"{max(tl.peak_memory(d) for d in range(tl.num_devices)) / MiB:.0f} MiB",
                     millis(recompute)])
    return {"checkpoint_table": md_table(
        ["checkpoint", "makespan", "peak, device 0", "peak, any device", "recompute, all devices"], rows)}
