"""The home page's figure (docs/index.md): GPipe on four devices as the simulator draws it."""

from __future__ import annotations

from pathlib import Path

from figures import figure
from figures.common import millis, per_microbatch, save, simulate
from gpipe.schedule import gpipe
from gpipe.schedule.plot import plot_timeline


# --8<-- [start:home_gantt]
@figure("home_gantt.png")
def home_gantt(path: Path) -> None:
    tl = simulate(gpipe(8, 4, "never"), per_microbatch(4, 8))
    save(plot_timeline(tl, title=f"GPipe, n=4, m=8: makespan {millis(tl.makespan)}, "
                                 f"bubble {tl.bubble_fraction():.0%}"), path)
# --8<-- [end:home_gantt]
