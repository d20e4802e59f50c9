"""The buyer's question: per device type, the cheapest configuration that reaches a target throughput and fits.

Note [cheapest]: a buyer who needs ``target`` samples per second pays per GPU-hour, so among the rows that fit and
reach the target the cheapest is the one with the fewest GPUs (the price per GPU-hour is the device's); of equal
GPU counts, the fastest (it is then also the cheapest per million samples). Cost per million samples is reported
beside it, at the configuration's own throughput.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.planning.plan import Plan, PlanRow

__all__ = ["Answer", "answer", "cheapest", "plot_answer"]


def cheapest(result: Plan, target: float) -> PlanRow | None:
    """The cheapest row of ``result`` that fits and reaches ``target`` samples/s (Note [cheapest]); ``None``: none."""
    rows = [r for r in result.rows if r.fits and r.throughput >= target]
    return min(rows, key=lambda r: (r.gpus, -r.throughput, r.peak_memory_bytes), default=None)


@dataclass(frozen=True)
class Answer:
    """One device type's answer: its plan, and its cheapest row reaching the target (``None``: none does)."""

    plan: Plan
    target: float
    row: PlanRow | None

    @property
    def dollars_per_hour(self) -> float | None:
        price = self.plan.price_per_gpu_hour
        return None if self.row is None or price is None else self.row.gpus * price

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.plan.device, "target_throughput": self.target,
                "price_per_gpu_hour": self.plan.price_per_gpu_hour, "dollars_per_hour": self.dollars_per_hour,
                "row": self.row.to_dict() if self.row is not None else None}


def answer(plans: Sequence[Plan], target: float) -> list[Answer]:
    """:func:`cheapest` of each plan, cheapest device first (per hour; no answer last).

    Raises:
        ValueError: a target that is not a number above 0.
    """
    if not target > 0 or target == float("inf"):
        raise ValueError(f"the target throughput must be a finite number of samples/s above 0, got {target}")
    out = [Answer(p, target, cheapest(p, target)) for p in plans]
    return sorted(out, key=lambda a: (a.row is None, a.dollars_per_hour or 0.0))


def plot_answer(answers: Sequence[Answer], path: str | Path | None = None) -> Any:
    """Throughput and cost per million samples of the fastest fitting row, against GPU count, per device type."""
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6, 6), sharex=True)
    for a in answers:
        best: dict[int, PlanRow] = {}
        for r in a.plan.rows:
            if r.fits and (r.gpus not in best or r.throughput > best[r.gpus].throughput):
                best[r.gpus] = r
        xs = sorted(best)
        line = top.plot(xs, [best[x].throughput for x in xs], marker="o", label=a.plan.device)[0]
        if a.plan.price_per_gpu_hour is not None:
            bottom.plot(xs, [best[x].cost_per_million for x in xs], marker="o", color=line.get_color())
        if a.row is not None:
            top.plot([a.row.gpus], [a.row.throughput], marker="*", markersize=14, color=line.get_color())
    if answers:
        top.axhline(answers[0].target, color="grey", linestyle="--", label="target")
    top.set_ylabel("samples / s")
    bottom.set_ylabel("$ per million samples")
    bottom.set_xlabel("GPUs")
    top.set_xscale("log", base=2)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    top.legend()
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return fig
