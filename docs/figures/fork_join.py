"""The figure and table of "Fork/join and backward order" (docs/concepts/fork-join.md)."""

from __future__ import annotations

from pathlib import Path

from figures import figure, markdown
from figures.common import md_table, millis, save, simulate, teach_cost
from figures.copy_streams import COPY
from gpipe.schedule import gpipe
from gpipe.schedule.plot import plot_side_by_side


# --8<-- [start:fork_join]
@figure("fork_join.png")
def fork_join(path: Path) -> None:
    tls = [simulate(gpipe(8, 4, "never"), teach_cost(), enforce_backward_order=e) for e in (False, True)]
    titles = [f"{label}: makespan {millis(t.makespan)}" for label, t in
              zip(("backward order not enforced (no fork/join)", "fork/join: backward order enforced"), tls,
                  strict=True)]
    save(plot_side_by_side(tls, titles=titles), path)
# --8<-- [end:fork_join]


@markdown
def fork_join_fragments() -> dict[str, str]:
    rows = []
    for copy in (0.0, COPY):
        for enforce in (False, True):
            tl = simulate(gpipe(8, 4, "never"), teach_cost(copy_seconds=copy), enforce_backward_order=enforce)
            rows.append([millis(copy), "fork/join" if enforce else "not enforced", millis(tl.makespan),
                         f"{tl.bubble_fraction():.1%}"])
    return {"fork_join_table": md_table(["copy time", "backward order", "makespan", "bubble"], rows)}
