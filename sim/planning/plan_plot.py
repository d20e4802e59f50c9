"""Plots of a capacity plan: throughput against GPU count, memory per device against chunks (matplotlib, lazily)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.planning.plan import Plan, PlanRow

__all__ = ["plot_memory", "plot_throughput"]

GiB = 2**30


def _pyplot(path: str | Path | None) -> Any:
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def plot_throughput(result: Plan, path: str | Path | None = None) -> Any:
    """Throughput of the fastest configuration that fits, against GPU count, one line per schedule.

    Args:
        result: a plan from :func:`sim.planning.plan.plan`.
        path: where to save a PNG; nothing is saved when ``None``.

    Returns:
        The matplotlib figure.
    """
    plt = _pyplot(path)
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in sorted({r.schedule for r in result.rows}):
        best: dict[int, float] = {}
        for r in result.rows:
            if r.fits and r.schedule == name:
                best[r.gpus] = max(best.get(r.gpus, 0.0), r.throughput)
        xs = sorted(best)
        ax.plot(xs, [best[x] for x in xs], marker="o", label=name)
    if result.best is not None:
        ax.plot([result.best.gpus], [result.best.throughput], marker="*", markersize=14, color="crimson",
                linestyle="none", label="best")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("samples / s")
    ax.set_title(f"{result.model or 'model'}, batch {result.batch}, {result.device}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return fig


def plot_memory(result: Plan, row: PlanRow | None = None, path: str | Path | None = None) -> Any:
    """Memory per device (model state + peak activations) against chunks.

    Follows the rows with the GPUs, stages, schedule, stages per device and checkpoint policy of ``row``.

    Args:
        result: a plan from :func:`sim.planning.plan.plan`.
        row: the configuration to follow; default the fastest pipelined one (more than one stage) that
            fits, else the best, else the first.
        path: where to save a PNG; nothing is saved when ``None``.

    Returns:
        The matplotlib figure, or ``None`` when the plan has no rows.
    """
    if row is None:
        piped = [r for r in result.rows if r.fits and r.stages > 1]
        row = max(piped, key=lambda r: r.throughput) if piped else result.best
        row = row or (result.rows[0] if result.rows else None)
    if row is None:
        return None
    plt = _pyplot(path)
    key = (row.gpus, row.stages, row.schedule, row.virtual, row.checkpoint)
    same = sorted((r for r in result.rows if (r.gpus, r.stages, r.schedule, r.virtual, r.checkpoint) == key),
                  key=lambda r: r.chunks)
    fig, ax = plt.subplots(figsize=(6, 4))
    for j in range(row.stages):
        ax.plot([r.chunks for r in same], [r.memory_bytes[j] / GiB for r in same], marker="o", label=f"device {j}")
    ax.axhline(result.device_memory_bytes / GiB, color="crimson", linestyle="--", label=f"{result.device} memory")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("chunks (micro-batches)")
    ax.set_ylabel("GiB per device")
    virtual = f" ({row.virtual} stages each)" if row.virtual > 1 else ""
    ax.set_title(f"{row.stages} devices{virtual} x {row.replicas} replicas, {row.schedule}, "
                 f"checkpoint {row.checkpoint}",
                 fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return fig
