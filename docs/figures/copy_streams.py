"""The figures and table of "Copy streams and overlap" (docs/concepts/copy-streams.md)."""

from __future__ import annotations

from pathlib import Path

from figures import figure, markdown
from figures.common import TEACH, MiB, md_table, millis, save, simulate, teach_cost
from gpipe.schedule import gpipe
from gpipe.schedule.plot import plot_side_by_side

COPY = 0.5e-3  # seconds per copy in the copy-stream figures


# --8<-- [start:copy_streams]
@figure("copy_streams.png")
def copy_streams(path: Path) -> None:
    cost = teach_cost(copy_seconds=COPY)
    tls = [simulate(gpipe(8, 4, "never"), cost, copy_streams=s) for s in (True, False)]
    titles = [f"{label}: makespan {millis(t.makespan)}" for label, t in
              zip(("copies on copy streams", "copies on the compute stream"), tls, strict=True)]
    save(plot_side_by_side(tls, titles=titles), path)
# --8<-- [end:copy_streams]


#: Activation bytes per micro-batch in the link comparison.
LINK_BYTES = 16 * MiB


LINK_NAMES = ("nvlink2", "pcie5-x16", "pcie4-x16", "pcie3-x16", "ethernet-100g")


# --8<-- [start:copy_latency]
@figure("copy_latency.png")
def copy_latency(path: Path) -> None:
    import matplotlib.pyplot as plt

    from sim.planning.hardware.catalog import get_link

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4))
    copies = [k * 0.25e-3 for k in range(0, 13)]
    for streams, colour in ((True, "#4c72b0"), (False, "#dd8452")):
        spans = [simulate(gpipe(8, 4, "never"), teach_cost(copy_seconds=c), copy_streams=streams).makespan
                 for c in copies]
        a.plot([c * 1e3 for c in copies], [s * 1e3 for s in spans], "o-", color=colour, ms=3,
               label="copy streams" if streams else "copies on the compute stream")
    a.axvline(TEACH["forward"] * 1e3, color="grey", lw=0.5, ls=":")
    a.set_xlabel("seconds per copy (ms): latency + bytes / bandwidth")
    a.set_ylabel("makespan (ms)")
    a.set_title("Step time against copy time (forward 1 ms, backward 2 ms)", fontsize=10)
    a.grid(alpha=0.3)
    a.legend(fontsize=8)

    links = [get_link(name) for name in LINK_NAMES]
    cost = teach_cost(send_bytes=LINK_BYTES, copy_seconds=None)  # copies priced by the link
    xs = range(len(links))
    w = 0.38
    for k, (streams, colour) in enumerate(((True, "#4c72b0"), (False, "#dd8452"))):
        spans = [simulate(gpipe(8, 4, "never"), cost, link=link, copy_streams=streams).makespan for link in links]
        b.bar([x + (k - 0.5) * w for x in xs], [s * 1e3 for s in spans], w, color=colour,
              label="copy streams" if streams else "compute stream")
    b.axhline(simulate(gpipe(8, 4, "never"), teach_cost()).makespan * 1e3, color="grey", lw=0.8, ls="--",
              label="free copies")
    b.set_xticks(list(xs), [f"{link.name}\n{link.transfer_seconds(LINK_BYTES) * 1e3:.2f} ms/copy" for link in links],
                 fontsize=8)
    b.set_ylabel("makespan (ms)")
    b.set_title(f"Catalog links, {LINK_BYTES // MiB} MiB per activation", fontsize=10)
    b.grid(axis="y", alpha=0.3)
    b.legend(fontsize=8)
    fig.suptitle("GPipe, n=4, m=8", fontsize=10)
    fig.tight_layout()
    save(fig, path)
# --8<-- [end:copy_latency]


@markdown
def copy_streams_fragments() -> dict[str, str]:
    cost = teach_cost(copy_seconds=COPY)
    free = simulate(gpipe(8, 4, "never"), teach_cost())
    rows = [["no copy cost", millis(free.makespan), f"{free.bubble_fraction():.1%}"]]
    for streams in (True, False):
        tl = simulate(gpipe(8, 4, "never"), cost, copy_streams=streams)
        rows.append(["copy streams" if streams else "compute stream", millis(tl.makespan),
                     f"{tl.bubble_fraction():.1%}"])
    return {"copy_streams_table": md_table(["copies", "makespan", "bubble"], rows)}
