"""The figures and table of "Micro-batches and the bubble" (docs/concepts/bubble.md)."""

from __future__ import annotations

from pathlib import Path

from figures import figure, markdown
from figures.common import md_table, millis, per_microbatch, save, simulate
from gpipe.schedule import gpipe
from gpipe.schedule.plot import plot_side_by_side


def bubble_formula(m: int, n: int) -> float:
    """GPipe's bubble fraction with equal stages and free copies: ``(n - 1) / (m + n - 1)``."""
    return (n - 1) / (m + n - 1)


BUBBLE_MS = (1, 2, 4, 8)


# --8<-- [start:bubble_gantt]
@figure("bubble_gantt.png")
def bubble_gantt(path: Path) -> None:
    tls = [simulate(gpipe(m, 4, "never"), per_microbatch(4, m)) for m in BUBBLE_MS]
    titles = [f"m={m}: makespan {millis(t.makespan)}, bubble {t.bubble_fraction():.1%} "
              f"(formula {bubble_formula(m, 4):.1%})" for m, t in zip(BUBBLE_MS, tls, strict=True)]
    save(plot_side_by_side(tls, titles=titles, labels=False), path)
# --8<-- [end:bubble_gantt]


# --8<-- [start:bubble_vs_m]
@figure("bubble_vs_m.png")
def bubble_vs_m(path: Path) -> None:
    import matplotlib.pyplot as plt

    ms = list(range(1, 33))
    fig, ax = plt.subplots(figsize=(7, 4))
    for n, colour in zip((2, 4, 8), ("#4c72b0", "#dd8452", "#55a868"), strict=True):
        ax.plot(ms, [bubble_formula(m, n) for m in ms], color=colour, label=f"n={n}: (n-1)/(m+n-1)")
        sampled = [1, 2, 4, 8, 16, 32]
        sim_b = [simulate(gpipe(m, n, "never"), per_microbatch(n, m)).bubble_fraction() for m in sampled]
        ax.plot(sampled, sim_b, "o", color=colour, label=f"n={n}: simulated")
    ax.set_xscale("log", base=2)
    ax.set_xticks([1, 2, 4, 8, 16, 32], ["1", "2", "4", "8", "16", "32"])
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("bubble fraction")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    ax.set_title("GPipe's bubble against the number of micro-batches", fontsize=10)
    fig.tight_layout()
    save(fig, path)
# --8<-- [end:bubble_vs_m]


@markdown
def bubble_fragments() -> dict[str, str]:
    rows = []
    for m in BUBBLE_MS + (16, 32):
        tl = simulate(gpipe(m, 4, "never"), per_microbatch(4, m))
        closed = (m + 3) * (4e-3 + 8e-3) / m
        rows.append([str(m), millis(tl.makespan), millis(closed), f"{tl.bubble_fraction():.1%}",
                     f"{bubble_formula(m, 4):.1%}"])
    return {"bubble_table": md_table(
        ["m", "simulated makespan", "(m+n-1)(t_f+t_b)", "simulated bubble", "(n-1)/(m+n-1)"], rows)}
