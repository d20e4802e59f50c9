"""The schedule explorer's data: the simulator's timelines over a grid of settings, exported for the browser.

The page ``docs/explorer.md`` and its script ``docs/js/explorer.js`` draw whichever timeline the reader's
controls select; every number and bar comes from :func:`pack`, simulated when the site is built, so the page has
no second implementation of a schedule. :func:`write` keeps an index (``explorer-data.js``: the axes and each
schedule's pack file) and one pack per schedule (``explorer-NAME.js``, the page loads the one it shows), as
scripts that set ``window.EXPLORER`` and ``window.EXPLORER_PACKS`` (so the page also works from ``file://``).

Note [units]: a device's share of the model takes 1 forward; with ``v`` stages per device each stage takes
``1/v`` of it (forward, backward, recompute), a split backward gives ``W`` the chosen share and ``B`` the rest,
and a copy takes the chosen time whatever ``v`` (a stage boundary carries the same activation). Every time is a
whole number of ``1/TICKS`` forwards, checked, so a pack stores integers. Memory: a device's share keeps
``SAVED`` per micro-batch (each stage ``SAVED/v``), a checkpointed stage its input, ``INPUT``.
"""

from __future__ import annotations

import base64
import gzip
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np

from gpipe.schedule import SCHEDULES, Schedule, Task
from gpipe.timeline import COMPUTE, Timeline
from sim.core.config import SimConfig
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate

__all__ = ["INPUT", "MAX_STAGES", "SAVED", "SHAPE", "TICKS", "TIMES", "pack", "run", "shape", "write"]

#: The settings that make a schedule (the generator's arguments); a setting it refuses has no runs.
SHAPE: dict[str, tuple[Any, ...]] = {
    "p": (2, 3, 4, 6, 8),
    "v": (1, 2, 3, 4),
    "m": (1, 2, 3, 4, 6, 8, 12, 16),
    "checkpoint": ("never", "except_last", "always"),
}
#: The costs, in forwards (Note [units]): the backward, W's share of it (schedules that split it), a copy.
TIMES: dict[str, tuple[float, ...]] = {
    "backward": (1.0, 2.0, 3.0),
    "weight": (0.25, 0.5, 0.75),
    "copy": (0.0, 0.25, 1.0),
}
MAX_STAGES = 16  # p * v: the grid's bound, so the site builds in seconds (Note [grid])
TICKS = 480  # time unit: 1/TICKS of a forward, so 1/v, halves, quarters, tenths and their products are whole
SAVED, INPUT = 48, 6  # memory units one device's share keeps per micro-batch, and one stage's input

# Note [grid]: the cost of the build is the number of runs times their tasks: the shapes multiply the times
# (9 settings, 27 with W's share), so the time axes stay short, and the grid stops at MAX_STAGES stages (p = 8
# with v = 4 would be the largest and slowest runs). A pack stores integers as deltas and is gzipped
# (:func:`write`): a few hundred kB per schedule.


def shape(name: str, p: int, v: int, m: int, checkpoint: str) -> Schedule | str:
    """The schedule ``name`` builds for this shape (``p * v`` stages on ``p`` devices), or why not: the
    generator's (or its layout's) refusal, or the grid's bound."""
    if p * v > MAX_STAGES:
        return (f"the explorer simulated up to {MAX_STAGES} stages, not p * v = {p * v}; the simulator takes any: "
                f"gpipe-sim simulate --schedule {name} --devices {p} --stages {p * v} --chunks {m}")
    try:
        return SCHEDULES[name](m, p * v, checkpoint, devices=p).validate()  # type: ignore[arg-type]
    except ValueError as refused:
        return str(refused)


def run(schedule: Schedule, v: int, backward: float, weight: float, copy: float) -> Timeline:
    """The simulator's timeline of ``schedule`` (built with ``v`` stages per device) at these times (Note [units])."""
    b = backward / v
    split = schedule.splits_weight_gradient
    stage = StageCost(forward=1.0 / v, backward=b * (1 - weight) if split else b, weight=b * weight if split else 0.0,
                      saved_bytes=SAVED // v, checkpoint_bytes=INPUT)
    return simulate(schedule, CostModel((stage,) * schedule.n, copy_seconds=copy), config=SimConfig())


def _whole(segments: list[list[float]]) -> list[list[int]]:
    """Each list of times (forwards) in ticks, as deltas within the list (small numbers that pack well); a time
    off the tick grid is a ``ValueError`` (Note [units]). One array pass for a whole run."""
    flat = np.asarray([x for seg in segments for x in seg], dtype=float) * TICKS
    ticks = np.rint(flat)
    if len(flat) and np.abs(flat - ticks).max() > 1e-6:
        raise ValueError(f"a time is not a whole number of 1/{TICKS} forwards: choose grid times that are")
    deltas = np.diff(ticks, prepend=0.0)
    bounds = np.cumsum([0] + [len(seg) for seg in segments])
    deltas[bounds[:-1][np.diff(bounds) > 0]] = ticks[bounds[:-1][np.diff(bounds) > 0]]  # each list from 0
    out = deltas.astype(int).tolist()
    return [out[i:j] for i, j in zip(bounds[:-1], bounds[1:], strict=True)]


def _encode(tl: Timeline, copies: list[list[Task]]) -> dict[str, Any]:
    """One run in a pack: makespan in ticks, bubble, peaks, and per device the start/end ticks of its compute
    spans in task order, of its copies in ``copies``' order, and the times and values of its memory samples."""
    p, t0 = tl.num_devices, tl.start
    compute: list[list[float]] = [[] for _ in range(p)]
    arrived: list[dict[Task, tuple[float, float]]] = [{} for _ in range(p)]
    for s in tl.spans:
        if s.stream == COMPUTE:
            compute[s.device] += (s.start - t0, s.end - t0)
        else:
            arrived[s.device][s.task] = (s.start - t0, s.end - t0)
    if [len(a) for a in arrived] != [len(c) for c in copies]:
        raise ValueError("the copies differ between runs of one shape; a pack stores one copy order per shape")
    sent = [[t for task in copies[d] for t in arrived[d][task]] for d in range(p)]  # KeyError: other copies
    series = [tl.memory_series(d) for d in range(p)]
    times = _whole([[tl.makespan]] + compute + sent + [[t - t0 for t, _ in s] for s in series])
    return {"t": times[0][0], "b": round(tl.bubble_fraction(), 4), "k": [tl.peak_memory(d) for d in range(p)],
            "s": times[1:p + 1], "c": times[p + 1:2 * p + 1],
            "y": [[ts, [int(x) for _, x in s]] for ts, s in zip(times[2 * p + 1:], series, strict=True)]}


def _copies_of(tl: Timeline) -> list[list[Task]]:
    """The copies each device receives, by the task whose result they carry, in a fixed order."""
    arrived: list[list[Task]] = [[] for _ in range(tl.num_devices)]
    for s in tl.spans:
        if s.stream != COMPUTE:
            arrived[s.device].append(s.task)
    return [sorted(a, key=str) for a in arrived]


def pack(name: str) -> dict[str, Any]:
    """Every setting of :data:`SHAPE` and :data:`TIMES` that schedule ``name`` takes, simulated.

    Returns ``{"shapes": {"p|v|m|checkpoint": refusal or shape}, "runs": {"p|v|m|checkpoint|b|w|c": run}}``:
    a shape holds each device's tasks (their text form, in order), the copies it receives and whether ``W`` is
    split from ``B`` (else the run key's ``w`` is ``-``); a run is :func:`_encode`'s.
    """
    shapes: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    for p, v, m, checkpoint in itertools.product(*SHAPE.values()):
        made = shape(name, p, v, m, checkpoint)
        at = f"{p}|{v}|{m}|{checkpoint}"
        if isinstance(made, str):
            shapes[at] = made
            continue
        split = made.splits_weight_gradient
        copies: list[list[Task]] | None = None
        for backward, weight, copy in itertools.product(*TIMES.values()):
            if not split and weight != TIMES["weight"][0]:
                continue
            tl = run(made, v, backward, weight, copy)
            if copies is None and copy > 0:
                copies = _copies_of(tl)
            runs[f"{at}|{backward}|{weight if split else '-'}|{copy}"] = _encode(tl, copies if copy > 0 else [[]] * p)
        shapes[at] = {"tasks": [" ".join(str(t) for t in tasks) for tasks in made.tasks], "stages": made.n,
                      "copies": [" ".join(map(str, c)) for c in copies or []], "split": split}
    return {"shapes": shapes, "runs": runs}


def index() -> dict[str, Any]:
    """What the page needs before any pack: the axes, the units, each schedule's lines and pack file."""
    axes = {"schedule": tuple(SCHEDULES), **SHAPE, **TIMES}
    return {"axes": {k: [str(x) for x in values] for k, values in axes.items()},
            "ticks": TICKS, "saved": SAVED, "input": INPUT,
            "schedules": {name: {"description": kind.description, "constraints": kind.constraints,
                                 "layout": kind.place is not None, "pack": f"explorer-{name}.js"}
                          for name, kind in SCHEDULES.items()}}


def write(out: Path, stamp: str) -> list[Path]:
    """Write ``explorer-data.js`` (the :func:`index`) and one ``explorer-NAME.js`` per schedule (its :func:`pack`,
    gzipped JSON in base64, which the page inflates with the browser's ``DecompressionStream``) into ``out``,
    unless they are all there for the same ``stamp`` (of the sources); returns the paths."""
    head = f"// stamp {stamp}\n"
    paths = [out / "explorer-data.js"] + [out / f"explorer-{name}.js" for name in SCHEDULES]
    if all(p.exists() and p.read_text(encoding="utf-8").startswith(head) for p in paths):
        return paths
    out.mkdir(parents=True, exist_ok=True)
    for name, path in zip(SCHEDULES, paths[1:], strict=True):
        raw = json.dumps(pack(name), separators=(",", ":")).encode()
        text = base64.b64encode(gzip.compress(raw, compresslevel=6, mtime=0)).decode()
        path.write_text(f"{head}(window.EXPLORER_PACKS = window.EXPLORER_PACKS || {{}})[{json.dumps(name)}] = "
                        f'"{text}";\n', encoding="utf-8")
    paths[0].write_text(head + "window.EXPLORER = " + json.dumps(index(), separators=(",", ":")) + ";\n",
                        encoding="utf-8")  # last: an index with this stamp means every pack is written
    return paths
