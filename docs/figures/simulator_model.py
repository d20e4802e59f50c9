"""The figure of "The simulator's model of a device" (docs/concepts/simulator-model.md)."""

from __future__ import annotations

from pathlib import Path

from figures import figure
from figures.common import millis, save, simulate, teach_cost
from gpipe.schedule import gpipe
from gpipe.schedule.plot import plot_side_by_side


# --8<-- [start:overheads]
@figure("overheads.png")
def overheads(path: Path) -> None:
    from sim.calibration.host import Overheads, with_overheads

    ideal = teach_cost(n=2)
    real = with_overheads(ideal, Overheads(task=0.2e-3, handoff=0.3e-3, contention=0.5))
    tls = [simulate(gpipe(4, 2, "never"), c) for c in (ideal, real)]
    titles = [f"ideal: makespan {millis(tls[0].makespan)}",
              f"task overhead 0.2 ms, hand-off 0.3 ms, contention 0.5: makespan {millis(tls[1].makespan)}"]
    save(plot_side_by_side(tls, titles=titles), path)
# --8<-- [end:overheads]
