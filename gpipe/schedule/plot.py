"""Gantt charts of timelines (matplotlib, imported only when a chart is drawn)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpipe.schedule.timeline import ALL_TO_ALL, COLLECTIVE, COMPUTE, Span, Timeline

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["COLOURS", "NAMES", "drawn_kinds", "plot_side_by_side", "plot_timeline"]

#: One colour per kind of span; bubbles are the white space between them.
COLOURS: dict[str, str] = {
    "F": "#4c72b0",  # forward: blue
    "B": "#dd8452",  # backward: orange
    "R": "#55a868",  # recompute: green
    "W": "#c44e52",  # weight gradient: red
    "copy": "#8c8c8c",  # copies: grey
    "collective": "#8172b3",  # data-parallel collectives: purple
    ALL_TO_ALL: "#da8bc3",  # a task's all-to-all (Note [communication spans] in sim.core.overlap): pink
}


def _kind(s: Span) -> str:
    """The key of :data:`COLOURS` a span is drawn in."""
    if s.stream == COMPUTE:
        return s.task.op.value
    if s.stream == COLLECTIVE:
        return ALL_TO_ALL if s.label.startswith(ALL_TO_ALL + " ") else "collective"
    return "copy"


# Note [one collection per colour]: a chart's bars are drawn as one collection per row and colour, not one
# artist per span: matplotlib's cost is per artist, so a searched timeline of 48,000 spans draws in about a
# second, not minutes, and its artists stay bounded by rows x colours (plus the labels, which fit the width).
def _draw(ax: Axes, timeline: Timeline, origin: float, title: str, labels: bool) -> None:
    rows = _rows(timeline)
    y_of = {r: k for k, r in enumerate(rows)}
    makespan = timeline.makespan or 1.0
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for s in timeline.spans:
        y = y_of[(s.device, s.stream)]
        bars.setdefault((y, COLOURS[_kind(s)]), []).append((s.start - origin, s.duration))
        if labels and s.stream == COMPUTE and s.duration > makespan / 60:
            ax.text(s.start - origin + s.duration / 2, y, f"{s.task.microbatch}", ha="center", va="center",
                    fontsize=7, color="white")
    for (y, colour), xranges in bars.items():  # Note [one collection per colour]
        height = 0.8 if rows[y][1] == COMPUTE else 0.5
        ax.broken_barh(xranges, (y - height / 2, height), facecolors=colour, edgecolors="white", linewidth=0.5)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"dev {d}" if st == COMPUTE else f"dev {d} {st}" for d, st in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)


def _rows(timeline: Timeline) -> list[tuple[int, str]]:
    """The chart's rows: each device's compute stream, then its other streams by name (one pass over the spans)."""
    streams: dict[int, set[str]] = {d: set() for d in range(timeline.num_devices)}
    for s in timeline.spans:
        streams[s.device].add(s.stream)
    return [(d, st) for d in range(timeline.num_devices) for st in (COMPUTE, *sorted(streams[d] - {COMPUTE}))]


#: The legend's word for each kind of span.
NAMES: dict[str, str] = {"F": "forward", "B": "backward", "R": "recompute", "W": "weight grad", "copy": "copy",
                         "collective": "collective", ALL_TO_ALL: "all-to-all"}


def drawn_kinds(timelines: Sequence[Timeline]) -> list[str]:
    """The kinds of span (keys of :data:`COLOURS`) that ``timelines`` hold, in the legend's order.

    The legend lists these and no others: a chart without copies or weight gradients does not name them.
    """
    kinds = {_kind(s) for t in timelines for s in t.spans}
    return [k for k in COLOURS if k in kinds]


def _legend(fig: Figure, timelines: Sequence[Timeline]) -> None:
    from matplotlib.patches import Patch

    kinds = drawn_kinds(timelines)
    if kinds:
        fig.legend(handles=[Patch(color=COLOURS[k], label=NAMES[k]) for k in kinds], loc="lower center",
                   ncol=len(kinds), fontsize=8, frameon=False)


def plot_timeline(timeline: Timeline, path: str | Path | None = None, *, title: str | None = None,
                  ax: Axes | None = None, labels: bool = True) -> Any:
    """Draw ``timeline`` as a Gantt chart: one row per device stream, micro-batch numbers on the bars.

    Args:
        timeline: what to draw.
        path: where to save a PNG; nothing is saved when ``None``.
        title: the chart's title (default: makespan and bubble fraction).
        ax: an existing matplotlib axes to draw into (then ``path`` is ignored).
        labels: write the micro-batch index on each compute bar.

    Returns:
        The matplotlib figure.
    """
    import matplotlib

    if ax is None and path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    title = title or f"{timeline.source or 'timeline'}: makespan {timeline.makespan:.4g} s, " \
                     f"bubble {timeline.bubble_fraction():.1%}"
    if ax is not None:
        _draw(ax, timeline, timeline.start, title, labels)
        return ax.figure
    fig, ax2 = plt.subplots(figsize=(10, 1.0 + 0.35 * max(len(_rows(timeline)), 2)))
    _draw(ax2, timeline, timeline.start, title, labels)
    ax2.set_xlabel("seconds")
    _legend(fig, [timeline])
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    if path is not None:
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return fig


def plot_side_by_side(timelines: Sequence[Timeline], path: str | Path | None = None, *,
                      titles: Sequence[str] | None = None, labels: bool = True) -> Any:
    """Draw several timelines one above the other on one shared time axis (predicted above measured).

    Each timeline is drawn from its own start, so they line up at zero.
    """
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    titles = list(titles) if titles is not None else [
        f"{t.source or 'timeline'}: makespan {t.makespan:.4g} s, bubble {t.bubble_fraction():.1%}" for t in timelines]
    heights = [1 + len(_rows(t)) for t in timelines]
    fig, axes = plt.subplots(len(timelines), 1, sharex=True, figsize=(10, 1.2 + 0.35 * sum(heights)),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, tl, title in zip(axes[:, 0], timelines, titles, strict=True):
        _draw(ax, tl, tl.start, title, labels)
    axes[-1, 0].set_xlabel("seconds")
    _legend(fig, timelines)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    if path is not None:
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return fig
