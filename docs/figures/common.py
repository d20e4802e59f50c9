"""What the page modules share: the simulator in the few shapes the pages use, the teaching cost model, and
the writing of numbers, tables and PNGs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpipe.schedule import Schedule
from gpipe.schedule.timeline import Timeline
from sim.core.cost import CostModel

#: The repository.
ROOT = Path(__file__).resolve().parents[2]
MiB = 2**20
DPI = 100


def simulate(schedule: Schedule, cost: CostModel, **config: Any) -> Timeline:
    """:func:`sim.core.engine.simulate` with ``SimConfig(**config)``."""
    from sim.core.config import SimConfig
    from sim.core.engine import simulate as run

    return run(schedule, cost, config=SimConfig(**config))


def per_microbatch(n: int, m: int, total_forward: float = 4e-3, total_backward: float = 8e-3,
                   **kwargs: Any) -> CostModel:
    """Uniform stages whose forward (backward) of the whole mini-batch takes ``total_forward``
    (``total_backward``) seconds, cut into ``m`` micro-batches; copies free unless ``kwargs`` say."""
    return CostModel.uniform(n, total_forward / m, total_backward / m, **kwargs)


#: The teaching example of the checkpointing and 1F1B pages: per micro-batch and stage.
TEACH = {"forward": 1e-3, "backward": 2e-3, "saved_bytes": 64 * MiB, "checkpoint_bytes": 8 * MiB}


def teach_cost(n: int = 4, **overrides: Any) -> CostModel:
    kw: dict[str, Any] = {**TEACH, **overrides}
    return CostModel.uniform(n, kw.pop("forward"), kw.pop("backward"), **kw)


def millis(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    align = [" :--- "] + [" ---: "] * (len(header) - 1)  # labels left, numbers right
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def save(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def memory_curve(tl: Timeline, device: int) -> tuple[list[float], list[float]]:
    """Times (ms) and MiB of ``device``'s memory samples as a step function from 0 to the makespan.

    Of several samples at one instant (a backward frees as the next recompute allocates) the last counts.
    """
    xs, ys = [0.0], [0.0]
    for t, b in tl.memory_series(device):
        x = (t - tl.start) * 1e3
        if xs and xs[-1] == x:
            xs.pop()
            ys.pop()
        xs.append(x)
        ys.append(b / MiB)
    xs.append(tl.makespan * 1e3)
    ys.append(ys[-1])
    return xs, ys
