"""The figure of "Skip connections and portals" (docs/concepts/skip-connections.md); its table is the ablation's
(:mod:`figures.ablation`)."""

from __future__ import annotations

from pathlib import Path

from figures import figure
from figures.common import millis, save, simulate
from gpipe.schedule import gpipe
from gpipe.schedule.plot import plot_side_by_side


# --8<-- [start:skip_portals]
@figure("skip_portals.png")
def skip_portals(path: Path) -> None:
    from sim.ablation.counted import counted_unet

    unet = counted_unet()
    sched = gpipe(unet.chunks, unet.devices, unet.checkpoint)
    tls = [simulate(sched, unet.cost(portals=p), link=unet.link) for p in (False, True)]
    titles = [f"{label}: makespan {millis(t.makespan)}" for label, t in
              zip(("skips through every stage (no portals)", "portals: skips sent directly"), tls, strict=True)]
    save(plot_side_by_side(tls, titles=titles, labels=False), path)
# --8<-- [end:skip_portals]
