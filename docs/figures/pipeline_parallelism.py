"""The figure and tables of "Pipeline and model parallelism" (docs/concepts/pipeline-parallelism.md)."""

from __future__ import annotations

from pathlib import Path

from figures import figure, markdown
from figures.common import md_table, millis, per_microbatch, save, simulate
from gpipe.schedule import gpipe
from gpipe.schedule.plot import plot_side_by_side


# --8<-- [start:mp_vs_pp]
@figure("mp_vs_pp.png")
def mp_vs_pp(path: Path) -> None:
    tls = [simulate(gpipe(m, 4, "never"), per_microbatch(4, m)) for m in (1, 8)]
    titles = [f"{label}: makespan {millis(t.makespan)}, each device busy {1 - t.bubble_fraction():.0%}"
              for label, t in zip(("model parallelism, m=1", "pipeline, m=8"), tls, strict=True)]
    save(plot_side_by_side(tls, titles=titles), path)
# --8<-- [end:mp_vs_pp]


@markdown
def pipeline_parallelism_fragments() -> dict[str, str]:
    rows = []
    for m in (1, 8):
        tl = simulate(gpipe(m, 4, "never"), per_microbatch(4, m))
        rows.append([str(m), millis(tl.makespan), f"{tl.bubble_fraction():.1%}", f"{1 - tl.bubble_fraction():.1%}"])
    return {"grid_m4_n3": gpipe(4, 3, "never").grid(),
            "mp_vs_pp_table": md_table(["m", "makespan", "bubble", "busy per device"], rows)}
