"""The schedule explorer's data: the simulator's timelines over a grid of settings, exported for the browser.

The page ``docs/explorer.md`` and its script ``docs/js/explorer.js`` draw whichever timeline the reader's
controls select; every number and bar comes from :func:`pack`, simulated when the site is built, so the page has
no second implementation of a schedule. :func:`write` keeps an index (``explorer-data.js``: the axes and each
schedule's pack file) and one pack per schedule (``explorer-NAME.js``, the page loads the one it shows), as
scripts that set ``window.EXPLORER`` and ``window.EXPLORER_PACKS`` (so the page also works from ``file://``).
Beside the registered schedules sit the search's (:data:`SEARCHED`), and beside each simulated number the
schedule's closed form where it has one (:func:`form`), with the assumptions of the form that a setting breaks.

Note [units]: a device's share of the model takes 1 forward, which the page shows as 1 ms (the unit of the
"Beyond 1F1B" page's examples), so its axes, ticks and text share one unit. With ``v`` stages per device each
stage takes ``1/v`` of it (forward, backward, recompute), a split backward gives ``W`` the chosen share and ``B``
the rest, the first and the last stage take ``ends`` times a middle one's (:func:`stage_times`), and a copy takes
the chosen time whatever ``v`` (a stage boundary carries the same activation). Every time is a whole number of
``1/TICKS`` forwards, checked, so a pack stores integers. Memory: a device's share keeps ``SAVED`` per
micro-batch (each stage ``SAVED/v``), a checkpointed stage its input, ``INPUT``.

Note [run keys]: a shape's key is its :data:`SHAPE` values and a run's key the shape's and then its :data:`TIMES`
values, joined by ``|`` in the order of those dicts (``-`` for W's share of a schedule that does not split); the
index names both orders, the controls' labels and their first values, so a new cost axis is one more entry in
:data:`TIMES` (and :func:`stage_times`), read by the page without a change there.
"""

from __future__ import annotations

import base64
import gzip
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from gpipe.schedule import SCHEDULES, Schedule, SearchResult, StageCosts, Task, search
from gpipe.schedule.search_timing import peak_memory
from gpipe.schedule.timeline import COMPUTE, COPY, Timeline
from sim.core.config import SimConfig
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate

__all__ = ["FORMS", "INPUT", "MAX_STAGES", "NAMES", "SAVED", "SEARCHED", "SHAPE", "TICKS", "TIMES", "broken", "form",
           "pack", "run", "searched", "shape", "stage_times", "write"]

#: The settings that make a schedule (the generator's arguments); a setting it refuses has no runs.
SHAPE: dict[str, tuple[Any, ...]] = {
    "p": (2, 3, 4, 6, 8),
    "v": (1, 2, 3, 4),
    "m": (1, 2, 3, 4, 6, 8, 12, 16),
    "checkpoint": ("never", "except_last", "always"),
}
#: The costs, in forwards (Note [units]): the backward, W's share of it (schedules that split it), a copy, and
#: the first and last stage's cost against a middle one's.
TIMES: dict[str, tuple[float, ...]] = {
    "backward": (1.0, 2.0, 3.0),
    "weight": (0.25, 0.5, 0.75),
    "copy": (0.0, 0.25, 1.0),
    "ends": (1.0, 1.5, 2.0),
    "comm": (0.0, 0.5, 1.0),
}
#: What the page calls each axis, and where its control starts.
LABELS = {"schedule": "schedule", "p": "devices p", "v": "stages per device v", "m": "micro-batches m",
          "checkpoint": "checkpoint", "backward": "backward / forward", "weight": "W's share of the backward",
          "copy": "copy / forward", "ends": "first and last stage / middle stage",
          "comm": "communication in each F and B / forward"}
START = {"schedule": "gpipe", "p": "4", "v": "1", "m": "8", "checkpoint": "never", "backward": "2.0", "weight": "0.5",
         "copy": "0.0", "ends": "1.0", "comm": "0.0"}
MAX_STAGES = 16  # p * v: the grid's bound, so the site builds in seconds (Note [grid])
TICKS = 480  # time unit: 1/TICKS of a forward, so 1/v, halves, quarters, tenths and their products are whole
SAVED, INPUT = 48, 6  # memory units one device's share keeps per micro-batch, and one stage's input

#: The searched schedules: each searches the placement of a registered schedule, under the peak memory that
#: schedule has at the same shape (Note [searched]).
SEARCHED = {"searched": "interleaved-1f1b", "searched-v": "zb-v"}
#: The cost values the search runs at, the other axes taking all of theirs, and its most stages per device
#: (Note [grid]).
SEARCH_TIMES: dict[str, tuple[float, ...]] = {"backward": (2.0,), "weight": (0.5,), "comm": (0.0,)}
SEARCH_MAX_V = 2
ENDS_BACKWARD = 2.0  # end-stage factors above 1 run at this backward only (Note [grid])
#: Communication above 0 runs at these settings only (Note [grid]): equal stages, free copies, no checkpointing.
COMM_AT = {"backward": 2.0, "weight": 0.5, "copy": 0.0, "ends": 1.0}
NAMES = (*SCHEDULES, *SEARCHED)

# Note [grid]: the cost of the build is the number of runs times their tasks: the shapes multiply the times, so
# the time axes stay short, the grid stops at MAX_STAGES stages, and the end stages' factors other than 1 run
# with checkpoint "never" and a backward of ENDS_BACKWARD forwards only. A search costs some ten simulations
# (nine greedy orders and every registered schedule priced), so the searched schedules run at one backward and
# one W share (SEARCH_TIMES: a middle stage's F, B and W equal, where the zero-bubble forms hold), every copy
# time and end factor, and up to SEARCH_MAX_V stages per device (the V's two). A pack stores integers as deltas
# and is gzipped (:func:`write`): a few hundred kB to about a MB and a half per schedule. Communication inside a
# task (Note [communication] in sim.core.cost: what DualPipe-V's pairs hide) runs above 0 only with checkpoint
# "never" and the other costs at COMM_AT, the one slice a student needs to see DualPipe-V pull ahead of ZB-V; the
# search prices no communication, so the searched schedules run without it.

# Note [searched]: the search (:func:`gpipe.schedule.search`, its greedy heuristic: fast and deterministic) gets
# the run's own stage times (end stages included) and copy time and, as its memory limit, the most any device
# holds in the 1F1B-family schedule of that placement (interleaved 1F1B looped, 1F1B at v = 1; ZB-V in the V), so
# it answers "how fast within 1F1B's memory". Its schedule is simulated like any other; its lower bound is the
# search's (no schedule is faster under the search's timing, which counts copies but not their streams).

#: Each closed form: makespan and peak memory per device as the page shows them, where ``m`` must lie, and the
#: costs it needs (``t_f``, ``t_b``, ``t_w``: one middle stage's; ``t_b`` the whole backward without ``W``).
FORMS: dict[str, dict[str, str]] = {
    "gpipe": {"makespan": "(m + p − 1)(t_f + t_b)", "memory": "m full activations"},
    "1f1b": {"makespan": "(m + p − 1)(t_f + t_b)", "memory": "min(m, p − d) on device d"},
    "interleaved-1f1b": {"makespan": "(m·v + p − 1)(t_f + t_b)", "range": "m a multiple of p (v > 1)",
                         "memory": "min(m·v, (v − 1)N + 2·min(p − 1 − d, N) + 1) stages' worth, N = min(m, p)"},
    "looped-bfs": {"makespan": "((v − 1)·max(m, p) + m + p − 1)(t_f + t_b)", "memory": "m full activations"},
    "zb-h1": {"makespan": "m(t_f + t_b + t_w) + (p − 1)(t_f + t_b − t_w)", "range": "m ≥ p",
              "costs": "t_f = t_b = t_w", "memory": "min(m, p) full activations"},
    "zb-h2": {"makespan": "m(t_f + t_b + t_w) + (p − 1)t_f", "range": "m ≥ p", "costs": "t_f = t_b = t_w",
              "memory": "min(m, 2p − 1) full activations"},
    "zb-v": {"makespan": "2m(t_f + t_b + t_w) + (p − 1)t_f", "range": "m ≥ 2p − 1", "costs": "t_f = t_b = t_w",
             "memory": "min(m, p) full activations"},
}
#: Why a simulated number may leave its closed form (the page shows those a run breaks, where they differ).
REASONS = {"copy": "copies take time (the form counts them free)",
           "ends": "the first and last stages cost more (the form takes equal stages)",
           "comm": "tasks spend time communicating (the form counts none)",
           "checkpoint": "checkpointing recomputes forwards and keeps less (the form does not checkpoint)",
           "range": "m is outside the form's range", "costs": "the stage times are not the form's"}


def shape(name: str, p: int, v: int, m: int, checkpoint: str) -> Schedule | str:
    """The schedule ``name`` builds for this shape (``p * v`` stages on ``p`` devices), or why not: the
    generator's (or its layout's) refusal, or the grid's bound. A searched name builds the schedule whose
    placement and memory it searches under (Note [searched]), with checkpoint ``"never"`` only."""
    if p * v > MAX_STAGES:
        return (f"the explorer simulated up to {MAX_STAGES} stages, not p * v = {p * v}; the simulator takes any: "
                f"gpipe-sim simulate --schedule {name} --devices {p} --stages {p * v} --chunks {m}")
    if name in SEARCHED:
        if checkpoint != "never":
            return "the search schedules without checkpointing: pick checkpoint never"
        if v > SEARCH_MAX_V:
            return (f"the explorer searched up to {SEARCH_MAX_V} stages per device, not {v}; the search takes any: "
                    f"gpipe-sim search --devices {p} --stages {p * v} --chunks {m}")
        made = shape(SEARCHED[name], p, v, m, "never")
        return made if not isinstance(made, str) else f"searched on the placement of {SEARCHED[name]}: {made}"
    try:
        return SCHEDULES[name](m, p * v, checkpoint, devices=p).validate()  # type: ignore[arg-type]
    except ValueError as refused:
        return str(refused)


def stage_times(n: int, v: int, split: bool, backward: float, weight: float, ends: float,
                **_: float) -> list[tuple[float, float, float]]:
    """Each stage's forward, ``B`` and ``W`` in forwards (Note [units]); without a split ``B`` is the whole
    backward and ``W`` is 0. Other times (a copy) are not per stage."""
    b = backward / v
    middle = (1.0 / v, b * (1 - weight) if split else b, b * weight if split else 0.0)
    return [tuple(x * (ends if s in (0, n - 1) else 1.0) for x in middle) for s in range(n)]  # type: ignore[misc]


def run(schedule: Schedule, v: int, **times: float) -> Timeline:
    """The simulator's timeline of ``schedule`` (built with ``v`` stages per device) at ``times``, one value per
    :data:`TIMES` axis (Note [units])."""
    stages = tuple(StageCost(forward=f, backward=b, weight=w, saved_bytes=SAVED // v, checkpoint_bytes=INPUT,
                             communication=times.get("comm", 0.0) / v)
                   for f, b, w in stage_times(schedule.n, v, schedule.splits_weight_gradient, **times))
    return simulate(schedule, CostModel(stages, copy_seconds=times["copy"]), config=SimConfig())


def searched(reference: Schedule, v: int, **times: float) -> tuple[SearchResult, float]:
    """The search on ``reference``'s placement under its peak memory (Note [searched]) at ``times``, and that
    limit (micro-batches of a device's share)."""
    forward, backward, weight = zip(*stage_times(reference.n, v, True, **times), strict=True)
    costs = StageCosts(forward, backward, weight, copy=times["copy"])
    limit = max(peak_memory(reference, costs))
    return search(reference.m, reference.placement, costs, limit, solver="greedy"), limit


def form(name: str, p: int, v: int, m: int, t_f: float, t_b: float, t_w: float) -> tuple[float, list[int]] | None:
    """The closed form of :data:`FORMS` for schedule ``name``: makespan in forwards and each device's peak in
    memory units (Note [units]); ``None`` for a schedule without one."""
    unit, work = SAVED // v, t_f + t_b + t_w
    if name in ("gpipe", "1f1b") or (name == "interleaved-1f1b" and v == 1):
        held = [m if name == "gpipe" else min(m, p - d) for d in range(p)]
        return (m + p - 1) * work, [h * unit for h in held]
    if name == "interleaved-1f1b":
        rounds = min(m, p)
        return (m * v + p - 1) * work, [min(m * v, (v - 1) * rounds + 2 * min(p - 1 - d, rounds) + 1) * unit
                                         for d in range(p)]
    if name == "looped-bfs":
        return ((v - 1) * max(m, p) + m + p - 1) * work, [m * v * unit] * p
    if name == "zb-h1":
        return m * work + (p - 1) * (t_f + t_b - t_w), [min(m, p) * unit] * p
    if name == "zb-h2":
        return m * work + (p - 1) * t_f, [min(m, 2 * p - 1) * unit] * p
    if name == "zb-v":
        return 2 * m * work + (p - 1) * t_f, [min(m, p) * v * unit] * p
    return None


def broken(name: str, p: int, v: int, m: int, checkpoint: str, t_f: float, t_b: float, t_w: float,
           **times: float) -> list[str]:
    """The assumptions of ``name``'s closed form that this setting breaks (keys of :data:`REASONS`); none: the
    form is exact here, which the tests check on every such run."""
    out = [k for k, off in (("copy", times["copy"] > 0), ("ends", times["ends"] != 1), ("comm", times["comm"] > 0),
                            ("checkpoint", checkpoint != "never")) if off]
    in_range = {"interleaved-1f1b": v == 1 or m % p == 0, "zb-h1": m >= p, "zb-h2": m >= p, "zb-v": m >= 2 * p - 1}
    if not in_range.get(name, True):
        out.append("range")
    if "costs" in FORMS.get(name, {}) and not t_f == t_b == t_w:
        out.append("costs")
    return out


def _tick(x: float) -> int:
    """``x`` forwards in ticks, checked whole (Note [units])."""
    if abs(x * TICKS - round(x * TICKS)) > 1e-6:
        raise ValueError(f"a time is not a whole number of 1/{TICKS} forwards: choose grid times that are")
    return round(x * TICKS)


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
        elif s.stream == COPY:  # a task's all-to-all (its communication) is in its compute span already
            arrived[s.device][s.task] = (s.start - t0, s.end - t0)
    if [len(a) for a in arrived] != [len(c) for c in copies]:
        raise ValueError("the copies differ between runs of one order; a pack stores one copy order per order")
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
        if s.stream == COPY:
            arrived[s.device].append(s.task)
    return [sorted(a, key=str) for a in arrived]


def _settings(name: str, split: bool, checkpoint: str) -> Iterator[dict[str, float]]:
    """The :data:`TIMES` settings a shape of ``name`` runs at (Note [grid])."""
    for values in itertools.product(*(SEARCH_TIMES.get(k, vs) if name in SEARCHED else vs for k, vs in TIMES.items())):
        times = dict(zip(TIMES, values, strict=True))
        ends = times["ends"] == TIMES["ends"][0] or (checkpoint == "never" and times["backward"] == ENDS_BACKWARD)
        comm = times["comm"] == TIMES["comm"][0] or (checkpoint == "never" and all(
            times[k] == x or (k == "weight" and not split) for k, x in COMM_AT.items()))
        if ends and comm and (split or times["weight"] == TIMES["weight"][0]):
            yield times


def _closed(name: str, at: tuple[Any, ...], made: Schedule, times: dict[str, float]) -> dict[str, Any]:
    """A run's closed form, in the run's units, and the assumptions it breaks: ``{}`` for a schedule without one."""
    p, v, m, checkpoint = at
    t_f, t_b, t_w = stage_times(made.n, v, made.splits_weight_gradient, **{**times, "ends": 1.0})[0]  # a middle one
    got = form(name, p, v, m, t_f, t_b, t_w)
    if got is None:
        return {}
    makespan, peaks = got
    work = m * v * (t_f + t_b + t_w)
    return {"f": {"t": _tick(makespan), "b": round(1 - work / makespan, 4), "k": peaks},
            "x": broken(name, p, v, m, checkpoint, t_f, t_b, t_w, **times)}


def pack(name: str) -> dict[str, Any]:
    """Every setting of :data:`SHAPE` and :data:`TIMES` that schedule ``name`` takes, simulated.

    Returns ``{"shapes": {"p|v|m|checkpoint": refusal or shape}, "runs": {run key: run}}`` (Note [run keys]): a
    shape holds its stage count, whether ``W`` is split from ``B``, and its orders, each device's tasks (their
    text form, in order) and the copies it receives: one order for a registered schedule, one per distinct
    searched schedule; a searched shape holds its memory limit in full activations too. A run is
    :func:`_encode`'s, with ``o`` its order's index (searched), ``l`` the search's lower bound in ticks and ``h``
    its method, and
    ``f`` the closed form (makespan ticks, bubble, peaks) with ``x`` the assumptions it breaks (:func:`broken`).
    """
    shapes: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    for at in itertools.product(*SHAPE.values()):
        made = shape(name, *at)
        key = "|".join(map(str, at))
        if isinstance(made, str):
            shapes[key] = made
            continue
        split = made.splits_weight_gradient or name in SEARCHED
        orders: list[dict[str, Any]] = []
        copies: list[list[list[Task]] | None] = []
        limit = None
        text = [" ".join(map(str, ts)) for ts in made.tasks]
        for times in _settings(name, split, at[3]):
            schedule, tasks, extra = made, text, {}
            if name in SEARCHED:
                found, limit = searched(made, at[1], **times)
                schedule, extra = found.schedule, {"l": _tick(found.lower_bound), "h": found.method}
                tasks = [" ".join(map(str, ts)) for ts in schedule.tasks]
            o = next((i for i, order in enumerate(orders) if order["tasks"] == tasks), len(orders))
            if o == len(orders):
                orders.append({"tasks": tasks, "copies": []})
                copies.append(None)
            tl = run(schedule, at[1], **times)
            if copies[o] is None and times["copy"] > 0:
                copies[o] = _copies_of(tl)
                orders[o]["copies"] = [" ".join(map(str, c)) for c in copies[o] or []]
            encoded = _encode(tl, copies[o] if times["copy"] > 0 else [[]] * at[0])  # type: ignore[arg-type]
            if o:
                encoded["o"] = o
            values = [str(x) if split or k != "weight" else "-" for k, x in times.items()]
            runs["|".join([key, *values])] = {**encoded, **extra, **_closed(name, at, made, times)}
        shapes[key] = {"stages": made.n, "split": split, "orders": orders}
        if limit is not None:
            shapes[key]["limit"] = round(limit, 4)
    return {"shapes": shapes, "runs": runs}


def index() -> dict[str, Any]:
    """What the page needs before any pack: the axes and key orders (Note [run keys]), labels, first values, the
    units, and each schedule's lines, closed forms, the reason a run is missing from its grid, and pack file."""
    axes = {"schedule": NAMES, **SHAPE, **TIMES}
    at = ", ".join(f"{LABELS[k]} {x:g}" for k, x in COMM_AT.items())
    ends = (f"the explorer ran first and last stages above {TIMES['ends'][0]:g} with checkpoint never only, and "
            f"communication above 0 with checkpoint never and {at} only (build time); gpipe-sim simulate takes any "
            "per-stage times and --communication-time")
    kinds = {name: (kind.description, kind.constraints, ends) for name, kind in SCHEDULES.items()}
    for name, under in SEARCHED.items():
        at = ", ".join(f"{LABELS[k]} {vs[0]:g}" for k, vs in SEARCH_TIMES.items())
        kinds[name] = (f"The search's schedule (greedy heuristic) for these stage times on the placement of {under}, "
                       f"within the most memory {under} holds at this shape",
                       f"checkpoint never, up to {SEARCH_MAX_V} stages per device, {under}'s placement",
                       f"the explorer searched at {at} only (build time); gpipe-sim search takes any")
    return {"axes": {k: [str(x) for x in values] for k, values in axes.items()},
            "shape": list(SHAPE), "costs": list(TIMES), "split": "weight", "labels": LABELS, "start": START,
            "ticks": TICKS, "saved": SAVED, "input": INPUT, "reasons": REASONS,
            "schedules": {name: {"description": description, "constraints": constraints, "unsimulated": missing,
                                 "layout": name in SEARCHED or SCHEDULES[name].place is not None,
                                 "searched": name in SEARCHED, "form": FORMS.get(name),
                                 "pack": f"explorer-{name}.js"}
                          for name, (description, constraints, missing) in kinds.items()}}


def write(out: Path, stamp: str) -> list[Path]:
    """Write ``explorer-data.js`` (the :func:`index`) and one ``explorer-NAME.js`` per schedule (its :func:`pack`,
    gzipped JSON in base64, which the page inflates with the browser's ``DecompressionStream``) into ``out``,
    unless they are all there for the same ``stamp`` (of the sources); returns the paths."""
    head = f"// stamp {stamp}\n"
    paths = [out / "explorer-data.js"] + [out / f"explorer-{name}.js" for name in NAMES]
    if all(p.exists() and p.read_text(encoding="utf-8").startswith(head) for p in paths):
        return paths
    out.mkdir(parents=True, exist_ok=True)
    for name, path in zip(NAMES, paths[1:], strict=True):
        raw = json.dumps(pack(name), separators=(",", ":")).encode()
        text = base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode()
        path.write_text(f"{head}(window.EXPLORER_PACKS = window.EXPLORER_PACKS || {{}})[{json.dumps(name)}] = "
                        f'"{text}";\n', encoding="utf-8")
    paths[0].write_text(head + "window.EXPLORER = " + json.dumps(index(), separators=(",", ":")) + ";\n",
                        encoding="utf-8")  # last: an index with this stamp means every pack is written
    return paths
