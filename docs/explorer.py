"""The schedule explorer's data: the simulator's timelines over a grid of settings, exported for the browser.

The page ``docs/explorer.md`` and its script ``docs/js/explorer.js`` draw whichever timeline the reader's
controls select; every number and bar comes from :func:`grid`, simulated when the site is built, so the page has
no second implementation of a schedule. :func:`write` keeps the result as ``docs/img/generated/explorer-data.js``
(a script that sets ``window.EXPLORER``, so the page also works from ``file://``), redrawn when a source changed.

Note [units]: a forward costs 1 unit, so times are exact small numbers; a schedule that splits the backward gives
``B`` and ``W`` half the backward each, and one with two stages per device gives each stage half the work.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from gpipe.schedule import SCHEDULES
from sim.core.config import SimConfig
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate

__all__ = ["AXES", "grid", "key", "write"]

#: The controls and their values (Note [units]): checkpointing policy, devices, micro-batches, backward and
#: copy time in forwards.
AXES: dict[str, tuple[Any, ...]] = {
    "schedule": tuple(SCHEDULES),
    "p": (2, 4),
    "m": (2, 4, 8),
    "backward": (1.0, 2.0),
    "copy": (0.0, 0.5),
    "checkpoint": ("never", "except_last", "always"),
}
V = 2  # stages per device for a schedule with a layout
SAVED, INPUT = 8, 2  # memory units one device's share keeps per micro-batch: all it saves, or its input


def key(**setting: Any) -> str:
    """The grid's key of one setting: its values in :data:`AXES` order, joined by ``|``."""
    return "|".join(str(setting[name]) for name in AXES)


def _run(schedule_name: str, p: int, m: int, backward: float, copy: float, checkpoint: str) -> dict[str, Any] | None:
    kind = SCHEDULES[schedule_name]
    v = 1 if kind.place is None else V
    try:
        schedule = kind(m, p * v, checkpoint, devices=p).validate()  # type: ignore[arg-type]
    except ValueError:
        return None  # a shape this schedule does not take (the page says so)
    split = schedule.splits_weight_gradient
    b = backward / v
    stage = StageCost(forward=1.0 / v, backward=b / 2 if split else b, weight=b / 2 if split else 0.0,
                      saved_bytes=SAVED // v, checkpoint_bytes=INPUT // v)
    tl = simulate(schedule, CostModel((stage,) * schedule.n, copy_seconds=copy), config=SimConfig())
    spans = [[s.device, s.task.op.value if s.stream == "compute" else "C", s.task.microbatch,
              round(s.start - tl.start, 4), round(s.end - tl.start, 4)] for s in tl.spans]
    memory = [[[round(t - tl.start, 4), round(x, 3)] for t, x in tl.memory_series(d)] for d in range(p)]
    return {"makespan": round(tl.makespan, 4), "bubble": round(tl.bubble_fraction(), 4),
            "peak": [round(tl.peak_memory(d), 3) for d in range(p)], "stages": schedule.n, "spans": spans,
            "memory": memory}


def grid() -> dict[str, Any]:
    """Every setting of :data:`AXES` simulated: ``{"axes": ..., "runs": {key: run or None}}``."""
    runs = {}
    for values in itertools.product(*AXES.values()):
        setting = dict(zip(AXES, values, strict=True))
        runs[key(**setting)] = _run(*values)
    return {"axes": {k: [str(x) for x in v] for k, v in AXES.items()}, "saved": SAVED, "input": INPUT, "runs": runs}


def write(out: Path, stamp: str) -> Path:
    """Write ``explorer-data.js`` into ``out`` unless it is there for the same ``stamp`` (of the sources)."""
    path = out / "explorer-data.js"
    head = f"// stamp {stamp}\n"
    if path.exists() and path.read_text(encoding="utf-8").startswith(head):
        return path
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(head + "window.EXPLORER = " + json.dumps(grid(), separators=(",", ":")) + ";\n",
                    encoding="utf-8")
    return path
