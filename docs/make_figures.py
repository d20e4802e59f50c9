"""The site's figures and tables of simulated numbers, drawn by the project's own simulator.

Every PNG under ``docs/img/generated/`` comes from one function here, registered with :func:`figure`;
every ``<!-- generated: NAME -->`` marker in a page is replaced by the markdown that :func:`fragments`
returns under ``NAME``. The MkDocs hook (``docs/hooks/figures.py``) calls both; so can you::

    .venv/bin/python docs/make_figures.py            # draw every figure into docs/img/generated/
    .venv/bin/python docs/make_figures.py --force    # even if nothing changed
    .venv/bin/python docs/make_figures.py --readme   # redraw the README's picture (committed)

:func:`build` skips the drawing when the figures are there and no source they depend on (``gpipe/``,
``sim/``, this file) changed since they were drawn, so ``mkdocs serve`` does not redraw in a loop.

The README's picture is the exception: GitHub shows the README without building the site, so that PNG is
committed (``docs/img/demo_timeline.png``) and redrawn on purpose with ``--readme`` (:func:`readme_figure`). It
is what ``gpipe-sim demo`` draws: the demo's predicted and measured timelines, one above the other.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpipe.schedule.plot import plot_side_by_side, plot_timeline  # noqa: E402
from gpipe.schedule import Checkpoint, Schedule, gpipe, one_f_one_b  # noqa: E402
from gpipe.schedule.timeline import Timeline  # noqa: E402
from sim.core.cost import CostModel  # noqa: E402

__all__ = ["FIGURES", "README_FIGURE", "build", "figure", "fragments", "main", "readme_figure"]

log = logging.getLogger(__name__)

OUT = ROOT / "docs" / "img" / "generated"
MiB = 2**20
DPI = 100

#: name of the PNG -> the function that draws it into a path.
FIGURES: dict[str, Callable[[Path], None]] = {}


def figure(name: str) -> Callable[[Callable[[Path], None]], Callable[[Path], None]]:
    """Register a function ``draw(path)`` as the maker of ``docs/img/generated/<name>``."""

    def register(draw: Callable[[Path], None]) -> Callable[[Path], None]:
        if name in FIGURES:
            raise ValueError(f"two figures named {name!r}")
        FIGURES[name] = draw
        return draw

    return register


# -- the simulator, in the few shapes the pages use ---------------------------------------------------


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


def bubble_formula(m: int, n: int) -> float:
    """GPipe's bubble fraction with equal stages and free copies: ``(n - 1) / (m + n - 1)``."""
    return (n - 1) / (m + n - 1)


#: The teaching example of the checkpointing and 1F1B pages: per micro-batch and stage.
TEACH = {"forward": 1e-3, "backward": 2e-3, "saved_bytes": 64 * MiB, "checkpoint_bytes": 8 * MiB}


def teach_cost(n: int = 4, **overrides: Any) -> CostModel:
    kw: dict[str, Any] = {**TEACH, **overrides}
    return CostModel.uniform(n, kw.pop("forward"), kw.pop("backward"), **kw)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _table(header: list[str], rows: list[list[str]]) -> str:
    align = [" :--- "] + [" ---: "] * (len(header) - 1)  # labels left, numbers right
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _save(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=DPI)
    plt.close(fig)


# -- figures ---------------------------------------------------------------------------------------------


@figure("home_gantt.png")
def _home(path: Path) -> None:
    tl = simulate(gpipe(8, 4, "never"), per_microbatch(4, 8))
    _save(plot_timeline(tl, title=f"GPipe, n=4, m=8: makespan {_ms(tl.makespan)}, "
                                  f"bubble {tl.bubble_fraction():.0%}"), path)


@figure("mp_vs_pp.png")
def _mp_vs_pp(path: Path) -> None:
    tls = [simulate(gpipe(m, 4, "never"), per_microbatch(4, m)) for m in (1, 8)]
    titles = [f"{label}: makespan {_ms(t.makespan)}, each device busy {1 - t.bubble_fraction():.0%}"
              for label, t in zip(("model parallelism, m=1", "pipeline, m=8"), tls, strict=True)]
    _save(plot_side_by_side(tls, titles=titles), path)


BUBBLE_MS = (1, 2, 4, 8)


@figure("bubble_gantt.png")
def _bubble_gantt(path: Path) -> None:
    tls = [simulate(gpipe(m, 4, "never"), per_microbatch(4, m)) for m in BUBBLE_MS]
    titles = [f"m={m}: makespan {_ms(t.makespan)}, bubble {t.bubble_fraction():.1%} "
              f"(formula {bubble_formula(m, 4):.1%})" for m, t in zip(BUBBLE_MS, tls, strict=True)]
    _save(plot_side_by_side(tls, titles=titles, labels=False), path)


@figure("bubble_vs_m.png")
def _bubble_vs_m(path: Path) -> None:
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
    _save(fig, path)


POLICIES: tuple[Checkpoint, ...] = ("never", "except_last", "always")


def _memory_curve(tl: Timeline, device: int) -> tuple[list[float], list[float]]:
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


@figure("checkpoint_memory.png")
def _checkpoint_memory(path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    for policy, colour in zip(POLICIES, ("#dd8452", "#4c72b0", "#55a868"), strict=True):
        tl = simulate(gpipe(8, 4, policy), teach_cost())
        xs, ys = _memory_curve(tl, 0)
        ax.step(xs, ys, where="post", color=colour, lw=1.6,
                label=f"checkpoint={policy}: peak {tl.peak_memory(0) / MiB:.0f} MiB, step {_ms(tl.makespan)}")
    ax.set_xlabel("ms")
    ax.set_ylabel("MiB saved for backward (device 0)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Memory against time on device 0: GPipe, n=4, m=8", fontsize=10)
    fig.tight_layout()
    _save(fig, path)


@figure("checkpoint_gantt.png")
def _checkpoint_gantt(path: Path) -> None:
    tl = simulate(gpipe(8, 4, "except_last"), teach_cost())
    _save(plot_timeline(tl, title=f"GPipe, n=4, m=8, checkpoint=except_last: makespan {_ms(tl.makespan)}"), path)


COPY = 0.5e-3  # seconds per copy in the copy-stream figures


@figure("copy_streams.png")
def _copy_streams(path: Path) -> None:
    cost = teach_cost(copy_seconds=COPY)
    tls = [simulate(gpipe(8, 4, "never"), cost, copy_streams=s) for s in (True, False)]
    titles = [f"{label}: makespan {_ms(t.makespan)}" for label, t in
              zip(("copies on copy streams", "copies on the compute stream"), tls, strict=True)]
    _save(plot_side_by_side(tls, titles=titles), path)


#: Activation bytes per micro-batch in the link comparison.
LINK_BYTES = 16 * MiB
LINK_NAMES = ("nvlink2", "pcie5-x16", "pcie4-x16", "pcie3-x16", "ethernet-100g")


@figure("copy_latency.png")
def _copy_latency(path: Path) -> None:
    import matplotlib.pyplot as plt

    from sim.planning.hardware import get_link

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
    _save(fig, path)


@figure("fork_join.png")
def _fork_join(path: Path) -> None:
    tls = [simulate(gpipe(8, 4, "never"), teach_cost(), enforce_backward_order=e) for e in (False, True)]
    titles = [f"{label}: makespan {_ms(t.makespan)}" for label, t in
              zip(("backward order not enforced (no fork/join)", "fork/join: backward order enforced"), tls,
                  strict=True)]
    _save(plot_side_by_side(tls, titles=titles), path)


@figure("skip_portals.png")
def _skip_portals(path: Path) -> None:
    from sim.planning.ablation_counted import counted_unet

    unet = counted_unet()
    sched = gpipe(unet.chunks, unet.devices, unet.checkpoint)
    tls = [simulate(sched, unet.cost(portals=p), link=unet.link) for p in (False, True)]
    titles = [f"{label}: makespan {_ms(t.makespan)}" for label, t in
              zip(("skips through every stage (no portals)", "portals: skips sent directly"), tls, strict=True)]
    _save(plot_side_by_side(tls, titles=titles, labels=False), path)


@figure("onefoneb.png")
def _onefoneb(path: Path) -> None:
    import matplotlib.pyplot as plt

    cost = teach_cost()
    tls = {"GPipe": simulate(gpipe(8, 4, "never"), cost), "1F1B": simulate(one_f_one_b(8, 4, "never"), cost)}
    fig, axes = plt.subplots(2, 2, figsize=(12, 6), sharex=True, gridspec_kw={"height_ratios": [1.2, 1]})
    for col, (name, tl) in enumerate(tls.items()):
        plot_timeline(tl, ax=axes[0, col], title=f"{name}: makespan {_ms(tl.makespan)}")
        for d in range(tl.num_devices):
            xs, ys = _memory_curve(tl, d)
            axes[1, col].step([x / 1e3 for x in xs], ys, where="post", lw=1.4, label=f"dev {d}")
        axes[1, col].set_xlabel("seconds")
        axes[1, col].set_ylabel("MiB saved for backward")
        axes[1, col].grid(alpha=0.3)
        axes[1, col].legend(fontsize=7, ncol=4)
    fig.tight_layout()
    _save(fig, path)


#: The "Beyond 1F1B" page: every registered schedule on the same four devices and eight micro-batches. A device's
#: share of the model costs 1 ms forward, 1 ms input gradient and 1 ms weight gradient per micro-batch, and keeps
#: 64 MiB per micro-batch for backward; a schedule with v stages per device gives each stage 1/v of that.
BEYOND_P, BEYOND_M, BEYOND_V = 4, 8, 2


def beyond_schedules() -> list[tuple[str, Schedule, Timeline]]:
    """Each registered schedule that takes (p=4, m=8) with its simulated timeline, in registration order."""
    from gpipe.schedule import SCHEDULES

    cost = _sibling("teaching_numbers").beyond_cost  # the page's costs, one source for its figures and numbers
    out = []
    for name, kind in SCHEDULES.items():
        v = 1 if kind.place is None else BEYOND_V
        try:
            schedule = kind(BEYOND_M, BEYOND_P * v, "never", devices=BEYOND_P).validate()
        except ValueError:
            continue
        out.append((name, schedule, simulate(schedule, cost(schedule))))
    return out


@figure("beyond_1f1b.png")
def _beyond_1f1b(path: Path) -> None:
    runs = beyond_schedules()
    titles = [f"{name}: {s.n} stages on {s.num_devices} devices, makespan {_ms(tl.makespan)}" for name, s, tl in runs]
    _save(plot_side_by_side([tl for _, _, tl in runs], titles=titles, labels=False), path)


def _communication_marks(ax: Any, tl: Timeline, schedule: Schedule, cost: CostModel) -> None:
    """Over a Gantt row per device: each pair's forward in the upper half of its row and its backward in the lower,
    and every phase a task spends on the network hatched (Note [communication] in :mod:`sim.core.cost`)."""
    from gpipe.schedule.plot import COLOURS
    from sim.core.sharing import TALKING, phased_pair_ends, task_phases

    spans = {s.task: s for s in tl.compute_spans()}

    def phases(task: Any) -> Any:
        stage, op = cost.stages[task.stage], task.op.value
        compute = {"F": stage.forward, "B": stage.backward, "R": stage.recompute_seconds, "W": stage.weight}[op]
        return task_phases(compute, 0.0 if op == "W" else stage.communication, op == "B")

    def bar(start: float, end: float, y: float, height: float, **style: Any) -> None:
        ax.broken_barh([(start - tl.start, end - start)], (y, height), **style)

    partner = {**dict(schedule.pairs), **{b: a for a, b in schedule.pairs}}
    upper = {a for a, _ in schedule.pairs}
    for a, b in schedule.pairs:
        sa, sb = spans[a], spans[b]
        bar(sa.start, max(sa.end, sb.end), sa.device - 0.4, 0.8, facecolors="white", linewidth=0)
        for task, top in ((a, -0.4), (b, 0.0)):
            bar(spans[task].start, spans[task].end, sa.device + top, 0.4, facecolors=COLOURS[task.op.value],
                edgecolors="white", linewidth=0.5)
    for task, s in spans.items():  # a pair's phases end as sim.core.sharing computes them, one at a time
        mine, other = phases(task), phases(partner[task]) if task in partner else None
        y, height = (s.device - 0.4, 0.8) if other is None else (s.device - (0.4 if task in upper else 0.0), 0.4)
        begin = s.start
        for k, (use, seconds) in enumerate(mine):
            end = begin + seconds if other is None else phased_pair_ends(s.start, mine[:k + 1], other)[0]
            if use == TALKING:
                bar(begin, end, y, height, facecolors="none", edgecolors="white", hatch="////", linewidth=0)
            begin = end


@figure("dualpipe_communication.png")
def _dualpipe_communication(path: Path) -> None:
    from gpipe.schedule import SCHEDULES

    tn = _sibling("teaching_numbers")
    runs = {x: (zbv, dpv) for x, zbv, dpv in tn.communication_runs(simulate)}
    panels = []
    for x in (0.0, tn.EXPENSIVE):
        for name, tl in zip(("zb-v", "dualpipe-v"), runs[x], strict=True):
            panels.append((name, x, tl))
    fig = plot_side_by_side([tl for _, _, tl in panels], labels=False, titles=[
        f"{name}, communication {x * 1e3:g} ms per F and B: makespan {_ms(tl.makespan)}" for name, x, tl in panels])
    for ax, (name, x, tl) in zip(fig.axes, panels, strict=False):
        schedule = SCHEDULES[name](BEYOND_M, 2 * BEYOND_P, "never", devices=BEYOND_P)
        _communication_marks(ax, tl, schedule, tn.beyond_cost(schedule, x))
    fig.axes[len(panels) - 1].set_xlabel("seconds.   Hatched: a task waiting on the network; an overlapped pair: its "
                                         "forward above, its backward below")
    _save(fig, path)


@figure("bubble_memory.png")
def _bubble_memory(path: Path) -> None:
    import matplotlib.pyplot as plt

    tn = _sibling("teaching_numbers")
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for ax, p in zip(axes, (4, 8), strict=True):
        points: dict[tuple[float, float], list[str]] = {}
        for name, _, tl in tn.frontier(simulate, p):
            points.setdefault((tn.peak_a(tl), tl.bubble_fraction()), []).append(name)
        for k, ((memory, bubble), names) in enumerate(sorted(points.items())):
            searched = "searched" in names
            ax.plot(memory, bubble, "o", ms=11 if searched else 6, mfc="none" if searched else "#4c72b0",
                    color="#4c72b0")
            ax.annotate(", ".join(names), (memory, bubble), xytext=(6, 7 if k % 2 else -11),
                        textcoords="offset points", fontsize=7)
        ax.set_ylim(0, max(bubble for _, bubble in points) * 1.12)
        ax.axvline(p, color="grey", lw=0.8, ls="--")
        ax.text(p, 0.005, f" 1F1B's memory, {p} A", fontsize=8, color="grey")
        ax.set_xlabel("peak activations on the fullest device (A: one micro-batch of a device's share)")
        ax.set_ylabel("bubble fraction")
        ax.set_xlim(0, 2 * p + 3)
        ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda y, _: f"{y:.0%}"))
        ax.grid(alpha=0.3)
        ax.set_title(f"p = {p}, m = {2 * p}, equal stages, free copies", fontsize=10)
    fig.tight_layout()
    _save(fig, path)


def _beyond_fragments() -> dict[str, str]:
    rows = []
    for name, schedule, tl in beyond_schedules():
        rows.append([f"`{name}`", str(schedule.n), _ms(tl.makespan), f"{tl.bubble_fraction():.1%}"]
                    + [f"{tl.peak_memory(d) / MiB:.0f}" for d in range(BEYOND_P)])
    table = _table(["schedule", "stages", "makespan", "bubble"] + [f"peak MiB, dev {d}" for d in range(BEYOND_P)],
                   rows)
    return {"beyond_table": table}


@figure("overheads.png")
def _overheads(path: Path) -> None:
    from sim.calibration.host import Overheads, with_overheads

    ideal = teach_cost(n=2)
    real = with_overheads(ideal, Overheads(task=0.2e-3, handoff=0.3e-3, contention=0.5))
    tls = [simulate(gpipe(4, 2, "never"), c) for c in (ideal, real)]
    titles = [f"ideal: makespan {_ms(tls[0].makespan)}",
              f"task overhead 0.2 ms, hand-off 0.3 ms, contention 0.5: makespan {_ms(tls[1].makespan)}"]
    _save(plot_side_by_side(tls, titles=titles), path)


@figure("deferred_bn.png")
def _deferred_bn(path: Path) -> None:
    """Running mean of one channel over training steps: plain batch norm fed micro-batches, deferred batch norm,
    and the un-pipelined model (batch norm on the whole mini-batch). Real layers, no executor needed."""
    import matplotlib.pyplot as plt
    import torch
    from torch import nn

    from gpipe.batchnorm import DeferredBatchNorm

    steps, batch, chunks = 30, 32, 8
    generator = torch.Generator().manual_seed(0)
    data = [1.0 + 2.0 * torch.randn(batch, 1, generator=generator) for _ in range(steps)]  # mean 1, std 2
    whole, plain, deferred = nn.BatchNorm1d(1), nn.BatchNorm1d(1), DeferredBatchNorm(1, chunks=chunks)
    curves: dict[str, list[float]] = {"whole": [0.0], "plain": [0.0], "deferred": [0.0]}
    with torch.no_grad():
        for x in data:
            whole(x)
            for piece in x.chunk(chunks):
                plain(piece)
                deferred(piece)
            for name, layer in (("whole", whole), ("plain", plain), ("deferred", deferred)):
                assert layer.running_mean is not None
                curves[name].append(float(layer.running_mean[0]))
    fig, ax = plt.subplots(figsize=(8, 3.6))
    xs = range(steps + 1)
    ax.plot(xs, curves["whole"], color="#4c72b0", lw=2.5, alpha=0.5, label="un-pipelined: BatchNorm on the mini-batch")
    ax.plot(xs, curves["deferred"], "o", color="#4c72b0", ms=3.5,
            label=f"pipelined, DeferredBatchNorm (chunks={chunks}): one update per step")
    ax.plot(xs, curves["plain"], color="#dd8452", lw=1.4,
            label=f"pipelined, plain BatchNorm: {chunks} updates per step")
    ax.axhline(1.0, color="grey", lw=0.6, ls=":")
    ax.set_xlabel("training step")
    ax.set_ylabel("running_mean (true mean 1)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    gap = max(abs(a - b) for a, b in zip(curves["whole"], curves["deferred"], strict=True))
    ax.set_title(f"Running mean, momentum 0.1, mini-batch {batch}: deferred vs un-pipelined differ by at most "
                 f"{gap:.0e}", fontsize=10)
    fig.tight_layout()
    _save(fig, path)


#: The what-if example of the planning page: a model that needs a pipeline (it does not fit on one GPU).
PLAN_EXAMPLE = {"model": "gpt:13b", "device": "a100-80gb", "batch": 512, "gpus": (8, 16), "link": "nvlink"}


@functools.cache
def _plan_example() -> Any:
    """The planner's answer for :data:`PLAN_EXAMPLE` (counted and swept once per process: a few seconds)."""
    from sim.planning.flops import count_layers
    from sim.planning.hardware import get_device
    from sim.planning.models import get_model
    from sim.planning.plan import default_training, plan

    ex = PLAN_EXAMPLE
    device = get_device(str(ex["device"]))
    training = default_training(device)
    model = get_model(str(ex["model"]))
    profile = count_layers(model.module("meta"), model.sample(2, "meta"), dtype=training.torch_dtype)
    return plan(profile, int(ex["batch"]), device, list(ex["gpus"]), str(ex["link"]),  # type: ignore[call-overload]
                training=training, model_name=model.name)


@figure("plan_memory.png")
def _plan_memory(path: Path) -> None:
    from sim.planning.plan_plot import plot_memory

    result = _plan_example()
    _save(plot_memory(result, result.best), path)


def _plan_fragments() -> dict[str, str]:
    result = _plan_example()
    rows = sorted((r for r in result.rows if r.fits), key=lambda r: -r.throughput)[:8]
    table = _table(["GPUs", "pp x dp", "chunks", "checkpoint", "schedule", "samples/s", "bubble", "GiB/dev"],
                   [[str(r.gpus), f"{r.stages} x {r.replicas}", str(r.chunks), r.checkpoint, r.schedule,
                     f"{r.throughput:.2f}", f"{r.bubble_fraction:.1%}", f"{r.peak_memory_bytes / 2**30:.1f}"]
                    for r in rows])
    fits = len([r for r in result.rows if r.fits])
    head = (f"{result.model}, batch {result.batch}, on {result.device} over {result.link}, training "
            f"{result.training}: {len(result.rows)} configurations simulated, {fits} fit in memory; the fastest:")
    return {"plan_table": head + "\n\n" + table}


#: The sweep of "Plan a large model": a Llama-3-70B-class decoder at 8k context on 64 H100s in nodes of eight,
#: every tensor-parallel degree with sequence parallelism off and on, ZeRO 0, 1 and 3, recompute per layer or of
#: the attention core alone (1,234 configurations, a few seconds).
LARGE_PLAN: dict[str, Any] = {
    "model": "llama:layers=80,hidden=8192,heads=64,kv-heads=8,ffn=28672,seq=8192,vocab=128256",
    "device": "h100-sxm", "batch": 256, "gpus": 64, "link": "nvlink4", "network": "infiniband-ndr",
    "tensor_parallel": (1, 2, 4, 8), "zero": (0, 1, 3), "checkpoints": ("layers", "selective")}


@figure("plan_large_model.png")
def _plan_large_model(path: Path) -> None:
    """Tokens/s against peak memory per device of every configuration of :data:`LARGE_PLAN` that fits, coloured by
    ZeRO stage, shaped by tensor-parallel degree, the device's memory a line."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from sim.planning.hardware import get_device
    from sim.planning.models import get_model
    from sim.planning.plan import default_training, plan

    ex = LARGE_PLAN
    device = get_device(ex["device"])
    dtype = default_training(device).torch_dtype  # bf16 with Adam
    model = get_model(ex["model"])
    counts = {(t, sp): model.tensor_parallel(t, sequence_parallel=sp).count(dtype)
              for t in ex["tensor_parallel"] for sp in (False, True) if t > 1 or not sp}
    result = plan(counts, ex["batch"], device, [ex["gpus"]], ex["link"], network=ex["network"],
                  tensor_parallel=ex["tensor_parallel"], zero=ex["zero"], checkpoints=ex["checkpoints"],
                  sequence_parallel=[False, True], schedules=["1f1b"],
                  tokens_per_sample=int(model.sample(1, "meta").shape[1]), model_name=model.name)
    fits = [r for r in result.rows if r.fits]

    def ktokens(r: Any) -> float:  # thousand tokens/s (every row of a decoder has them)
        return (r.tokens_per_second or 0.0) / 1e3

    colours = {0: "#4c72b0", 1: "#dd8452", 3: "#55a868"}
    markers = {1: "o", 2: "s", 4: "^", 8: "D"}
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for zero, colour in colours.items():
        for t, marker in markers.items():
            rows = [r for r in fits if r.zero == zero and r.tensor_parallel == t]
            ax.scatter([r.peak_memory_bytes / 2**30 for r in rows], [ktokens(r) for r in rows],
                       color=colour, marker=marker, s=22, alpha=0.75, linewidths=0)
    frontier, fastest = [], 0.0  # the most tokens/s within each memory budget
    for r in sorted(fits, key=lambda r: r.peak_memory_bytes):
        if ktokens(r) > fastest:
            fastest = ktokens(r)
            frontier.append((r.peak_memory_bytes / 2**30, fastest))
    if frontier:
        xs, ys = zip(*frontier, strict=True)
        ax.step(xs, ys, where="post", color="0.5", linewidth=1, zorder=0)
    memory = result.device_memory_bytes / 2**30
    ax.axvline(memory, color="k", linestyle="--", linewidth=1)
    ax.text(memory, ax.get_ylim()[0], f" {device.name}: {memory:.1f} GiB", rotation=90, va="bottom", ha="right",
            fontsize=8)
    best = result.best
    if best is not None:
        ax.annotate(f"best: t={best.tensor_parallel}, {best.stages} stage x {best.replicas}, ZeRO-{best.zero}, "
                    f"{best.checkpoint}", (best.peak_memory_bytes / 2**30, ktokens(best)),
                    xytext=(-6, 5), textcoords="offset points", ha="right", va="bottom", fontsize=8)
        ax.set_ylim(top=ktokens(best) * 1.05)
    handles = [Line2D([], [], color=c, marker="o", linestyle="", label=f"ZeRO-{z}") for z, c in colours.items()]
    handles += [Line2D([], [], color="0.4", marker=m, linestyle="", label=f"tensor parallel {t}")
                for t, m in markers.items()]
    ax.legend(handles=handles, fontsize=8, loc="lower left", ncol=2)
    ax.set_xlabel("peak memory per device (GiB)")
    ax.set_ylabel("thousand tokens/s (64 GPUs)")
    ax.set_title(f"Llama-3-70B-class, 8k context, batch {result.batch} on {ex['gpus']} H100s: the {len(fits)} of "
                 f"{len(result.rows)} configurations that fit", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    _save(fig, path)


@figure("cluster_tensor_parallel.png")
def _cluster_tensor_parallel(path: Path) -> None:
    _sibling("cluster_numbers").draw_tensor_parallel(path, _save)  # the planner's sweep: docs/cluster_numbers.py


@figure("ablation.png")
def _ablation(path: Path) -> None:
    import matplotlib.pyplot as plt

    from sim.planning.ablation import run
    from sim.planning.ablation_counted import counted_unet

    rows = run(counted_unet())
    labels = [r.step for r in rows]
    xs = range(len(rows))
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    w = 0.38
    a.bar([x - w / 2 for x in xs], [r.throughput for r in rows], w, color="#4c72b0", label="simulated")
    a.bar([x + w / 2 for x in xs], [r.published_throughput for r in rows], w, color="#bbbbbb", label="published")
    a.set_ylabel("samples / s")
    a.set_title("Throughput", fontsize=10)
    b.bar([x - w / 2 for x in xs], [100 * r.utilisation for r in rows], w, color="#4c72b0", label="simulated")
    b.bar([x + w / 2 for x in xs], [100 * r.published_utilisation for r in rows], w, color="#bbbbbb",
          label="published")
    b.set_ylabel("utilisation (%)")
    b.set_ylim(0, 100)
    b.set_title("Mean device utilisation", fontsize=10)
    for ax in (a, b):
        ax.set_xticks(list(xs), labels, fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("torchgpipe's U-Net (5, 64) ablation on 4 P40s, chunks 8: counted and simulated beside published",
                 fontsize=10)
    fig.tight_layout()
    _save(fig, path)


# -- markdown fragments ---------------------------------------------------------------------------------


def fragments(cache: Path | None = None) -> dict[str, str]:
    """Markdown for each ``<!-- generated: NAME -->`` marker: simulated numbers, schedule grids, benchmarks.

    Args:
        cache: a folder (the figures' folder) where the simulated fragments are kept with the stamp of the
            sources they came from; they are recomputed only when a source changed. Benchmark results are
            read anew every time.
    """
    import json

    out: dict[str, str] | None = None
    cache_file = cache / ".fragments.json" if cache is not None else None
    stamp = _stamp()
    if cache_file is not None and cache_file.exists():
        saved = json.loads(cache_file.read_text())
        if saved.get("stamp") == stamp:
            out = dict(saved["fragments"])
    if out is None:
        out = simulated_fragments()
        if cache_file is not None:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            cache_file.write_text(json.dumps({"stamp": stamp, "fragments": out}))
    out.update(benchmark_fragments())
    return out


def grids_side_by_side(schedules: dict[str, Schedule]) -> str:
    """The schedules' unit-step grids (:meth:`Schedule.grid`) beside one another, each headed by its name, its
    step count and the most micro-batches device 0 holds for backward at once."""
    columns = []
    for name, schedule in schedules.items():
        lines = schedule.grid().splitlines()
        held = peak = 0
        for task in schedule.tasks[0]:
            held += {"F": 1, "B": -1}.get(task.op.value, 0)
            peak = max(peak, held)
        columns.append([f"{name}: {len(lines) - 1} steps, dev0 holds {peak}"] + lines)
    widths = [max(len(line) for line in col) for col in columns]
    rows = max(len(col) for col in columns)
    lines = ["     ".join((col[r] if r < len(col) else "").ljust(w) for col, w in zip(columns, widths, strict=True))
             for r in range(rows)]
    return "\n".join(line.rstrip() for line in lines)


def simulated_fragments() -> dict[str, str]:
    """The fragments computed by the simulator and the planner (see :func:`fragments`)."""
    out: dict[str, str] = {
        "grid_m4_n3": gpipe(4, 3, "never").grid(),
        "grid_1f1b_m4_n3": one_f_one_b(4, 3).grid(),
        "grids_gpipe_1f1b_m3_n2": grids_side_by_side(
            {"GPipe": gpipe(3, 2, "never"), "1F1B": one_f_one_b(3, 2, "never")}),
    }

    rows = []
    for m in (1, 8):
        tl = simulate(gpipe(m, 4, "never"), per_microbatch(4, m))
        rows.append([str(m), _ms(tl.makespan), f"{tl.bubble_fraction():.1%}", f"{1 - tl.bubble_fraction():.1%}"])
    out["mp_vs_pp_table"] = _table(["m", "makespan", "bubble", "busy per device"], rows)

    rows = []
    for m in BUBBLE_MS + (16, 32):
        tl = simulate(gpipe(m, 4, "never"), per_microbatch(4, m))
        closed = (m + 3) * (4e-3 + 8e-3) / m
        rows.append([str(m), _ms(tl.makespan), _ms(closed), f"{tl.bubble_fraction():.1%}",
                     f"{bubble_formula(m, 4):.1%}"])
    out["bubble_table"] = _table(
        ["m", "simulated makespan", "(m+n-1)(t_f+t_b)", "simulated bubble", "(n-1)/(m+n-1)"], rows)

    rows = []
    for policy in POLICIES:
        tl = simulate(gpipe(8, 4, policy), teach_cost())
        recompute = sum(s.duration for s in tl.compute_spans() if s.task.op.value == "R")
        rows.append([f"`{policy}`", _ms(tl.makespan), f"{tl.peak_memory(0) / MiB:.0f} MiB",
                     f"{max(tl.peak_memory(d) for d in range(tl.num_devices)) / MiB:.0f} MiB",
                     _ms(recompute)])
    out["checkpoint_table"] = _table(
        ["checkpoint", "makespan", "peak, device 0", "peak, any device", "recompute, all devices"], rows)

    cost = teach_cost(copy_seconds=COPY)
    free = simulate(gpipe(8, 4, "never"), teach_cost())
    rows = [["no copy cost", _ms(free.makespan), f"{free.bubble_fraction():.1%}"]]
    for streams in (True, False):
        tl = simulate(gpipe(8, 4, "never"), cost, copy_streams=streams)
        rows.append(["copy streams" if streams else "compute stream", _ms(tl.makespan), f"{tl.bubble_fraction():.1%}"])
    out["copy_streams_table"] = _table(["copies", "makespan", "bubble"], rows)

    rows = []
    cost = teach_cost()
    for name, sched in (("GPipe", gpipe(8, 4, "never")), ("1F1B", one_f_one_b(8, 4, "never"))):
        tl = simulate(sched, cost)
        rows.append([name, _ms(tl.makespan), f"{tl.bubble_fraction():.1%}"]
                    + [f"{tl.peak_memory(d) / MiB:.0f}" for d in range(tl.num_devices)])
    out["onefoneb_table"] = _table(["schedule", "makespan", "bubble"] + [f"peak MiB, dev {d}" for d in range(4)],
                                   rows)

    rows = []
    for copy in (0.0, COPY):
        for enforce in (False, True):
            tl = simulate(gpipe(8, 4, "never"), teach_cost(copy_seconds=copy), enforce_backward_order=enforce)
            rows.append([_ms(copy), "fork/join" if enforce else "not enforced", _ms(tl.makespan),
                         f"{tl.bubble_fraction():.1%}"])
    out["fork_join_table"] = _table(["copy time", "backward order", "makespan", "bubble"], rows)

    out.update(_ablation_fragments())
    out.update(_plan_fragments())
    out.update(_beyond_fragments())
    out.update(_sibling("teaching_numbers").fragments(simulate, _table, _plan_example()))
    out.update(_sibling("cluster_numbers").fragments(_table))
    return out


def _sibling(name: str) -> Any:
    """``docs/<name>.py``, a module beside this one (the docs are not a package)."""
    import importlib

    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module(name)


BENCHMARKS = ("sim_speed", "executor_speed", "executor_speed_large", "executor_speed_wide", "schedule_speed",
              "split_cost", "distributed_speed", "gloo_directions", "rng_cost",
              "fidelity", "fidelity_quick", "fidelity_schedules", "fidelity_processes", "switch_interval",
              "pair_probes", "gpu_check", "fidelity_cuda", "published", "unet_memory", "cpu_check", "plan_speed")


def benchmark_fragments(results: Path | None = None) -> dict[str, str]:
    """``bench_NAME`` for each benchmark: its JSON results as tables, or how to produce them."""
    folder = results if results is not None else ROOT / "benchmarks" / "results"
    out = {}
    for name in BENCHMARKS:
        path = folder / f"{name}.json"
        if path.exists():
            out[f"bench_{name}"] = render_result(path)
        else:
            out[f"bench_{name}"] = (f"*No results yet.* Run `.venv/bin/python benchmarks/{name}.py` to produce "
                                    f"`benchmarks/results/{name}.json`; the next site build renders it here.")
    return out


def render_result(path: Path) -> str:
    """A benchmark's JSON as markdown: its command and machine, then a table of its rows.

    Understood shapes: an object with ``rows`` (a list of objects) and optional ``command``,
    ``machine`` (a string or an object) and ``note``; or a bare list of objects. Columns that hold lists
    or objects (raw samples, such as each step's makespan) stay in the JSON and out of the table.
    Anything else is shown as JSON.
    """
    import json

    data = json.loads(path.read_text())
    parts: list[str] = []
    rows = data if isinstance(data, list) else data.get("rows") if isinstance(data, dict) else None
    if isinstance(data, dict):
        if "command" in data:
            parts.append(f"Command: `{data['command'].strip()}`" + (f" ({data['date']})" if "date" in data else ""))
        machine = data.get("machine")
        if isinstance(machine, dict):
            parts.append("Machine: " + ", ".join(f"{k} {v}" for k, v in machine.items()))
        elif machine:
            parts.append(f"Machine: {machine}")
        if data.get("note"):
            parts.append(str(data["note"]))
    if isinstance(rows, list) and rows and all(isinstance(r, dict) for r in rows):
        header = [k for k in dict.fromkeys(k for r in rows for k in r)
                  if not any(isinstance(r.get(k), (list, dict)) for r in rows)]
        parts.append(_table(header, [[_cell(r.get(k, "")) for k in header] for r in rows]))
    else:
        parts.append("```json\n" + json.dumps(data, indent=1)[:4000] + "\n```")
    return "\n\n".join(parts)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")


def _ablation_fragments() -> dict[str, str]:
    from sim.planning.ablation import STEPS, portal_slack, run, simulate_step
    from sim.planning.ablation_counted import ONE_P40, counted_unet, one_device_throughput

    unet = counted_unet()
    rows = run(unet)

    def verdict(error: float) -> str:
        return "within 10%" if abs(error) <= 0.10 else "**misses**"

    table = _table(
        ["step", "simulated samples/s", "published samples/s", "error", "simulated utilisation",
         "published utilisation", "error"],
        [[r.step, f"{r.throughput:.1f}", f"{r.published_throughput:.3f}",
          f"{r.throughput_error:+.1%} ({verdict(r.throughput_error)})", f"{r.utilisation:.0%}",
          f"{r.published_utilisation:.0%}", f"{r.utilisation_error:+.1%} ({verdict(r.utilisation_error)})"]
         for r in rows])
    by = {r.step: r for r in rows}
    skip = _table(["skip connections", "makespan", "samples/s", "utilisation"],
                  [[label, _ms(by[step].makespan), f"{by[step].throughput:.1f}", f"{by[step].utilisation:.0%}"]
                   for label, step in (("through every stage", "+ streams"), ("portals", "+ portals"))])
    batch, published = ONE_P40
    one = one_device_throughput(batch)
    factor = one / published
    fast = run(unet.scaled_compute(factor))
    evidence = (f"torchgpipe's U-Net speed benchmark trains the same U-Net (5, 64) on **one** P40, batch {batch}, "
                f"no pipeline: {published:.1f} samples/s published, {one:.1f} counted (the same counts and roofline, "
                f"{one / published - 1:+.0%}). No pipeline, copy or schedule is involved there: the counted kernels "
                f"take {1 / factor:.2f}x as long as the P40's. With every compute second times {factor:.3f} "
                f"(that one-GPU ratio; a diagnostic, not the prediction):\n\n" + _table(
                    ["step", "samples/s", "published", "error", "utilisation", "published", "error"],
                    [[r.step, f"{r.throughput:.1f}", f"{r.published_throughput:.3f}", f"{r.throughput_error:+.1%}",
                      f"{r.utilisation:.0%}", f"{r.published_utilisation:.0%}", f"{r.utilisation_error:+.1%}"]
                     for r in fast]))
    from sim.core.copies import ON_COMPUTE

    on_compute = [sum(s.duration for s in simulate_step(step, unet).spans if s.label == ON_COMPUTE) for step in STEPS]
    busy = _table(["step", "published: utilisation x 4 GPUs x step", "simulated: kernels (catalog P40)",
                   f"kernels x {factor:.3f}", "simulated copies on the compute streams"],
                  [[r.step, f"{4 * r.published_utilisation * unet.batch / r.published_throughput:.2f} s",
                    f"{4 * r.utilisation * r.step_seconds:.2f} s", f"{4 * f.utilisation * f.step_seconds:.2f} s",
                    f"{c:.2f} s"] for r, f, c in zip(rows, fast, on_compute, strict=True)])
    tl = simulate_step(STEPS[-1], unet)
    memory = sum(tl.peak_memory(d) for d in range(unet.devices)) / 2**30
    notes = (f"The long skips' own portal copies (stage 0 to 3, 1 to 3) end at least "
             f"{_ms(portal_slack(tl, unet))} before the forward that waits for them (Note [portal copies]). "
             f"The simulated peak of saved activations is {memory:.1f} GiB over the four devices in every step.")
    return {"ablation_table": table, "skip_table": skip, "unet_setup": unet.describe(),
            "ablation_evidence": evidence, "ablation_busy": busy, "ablation_notes": notes}


# -- the README's picture --------------------------------------------------------------------------------

#: Committed, unlike the figures above: the README (on GitHub, on PyPI) shows it without a site build.
README_FIGURE = ROOT / "docs" / "img" / "demo_timeline.png"


def readme_figure(path: Path = README_FIGURE, *, measure: bool = True) -> str:
    """Draw the README's picture into ``path``; return what it shows (``"measured"`` or ``"simulated"``).

    With ``measure`` and the executor present, it runs what ``gpipe-sim demo`` runs
    (:func:`sim.calibration.experiment.run` on :func:`sim.calibration.experiment.demo_model`) and keeps the demo's own
    picture, predicted above measured. Otherwise it draws the simulator's timeline of the same schedule alone, from a
    teaching cost model.
    """
    import shutil
    import tempfile

    import matplotlib

    matplotlib.use("Agg")
    path.parent.mkdir(parents=True, exist_ok=True)
    if measure:
        try:
            from gpipe import GPipe  # noqa: F401 (only: is the executor there?)
            from sim.calibration.experiment import Setup, demo_model, run
            from sim.calibration.outcome import write_outputs
        except ImportError:
            log.warning("the executor or sim.calibration.experiment is missing: drawing a simulated timeline only")
        else:
            model, batch = demo_model(0)
            outcome = run(model, batch, Setup(), description="demo")
            with tempfile.TemporaryDirectory() as tmp:
                files = write_outputs(outcome, tmp)
                shutil.copyfile(files["plot"], path)
            return "measured"
    tl = simulate(gpipe(4, 2, "except_last"), teach_cost(n=2))
    _save(plot_timeline(tl, title=f"simulated: GPipe, n=2, m=4, checkpoint=except_last: makespan {_ms(tl.makespan)}"),
          path)
    return "simulated"


# -- building --------------------------------------------------------------------------------------------


def _stamp() -> str:
    """A hash of every source the figures depend on."""
    import matplotlib

    h = hashlib.sha256(matplotlib.__version__.encode())
    for folder in ("gpipe", "sim"):
        for p in sorted((ROOT / folder).rglob("*.py")):
            h.update(str(p.relative_to(ROOT)).encode())
            h.update(p.read_bytes())
    for source in ("make_figures.py", "teaching_numbers.py", "cluster_numbers.py", "explorer.py"):
        h.update((Path(__file__).resolve().parent / source).read_bytes())
    return h.hexdigest()


def build(out: Path = OUT, *, force: bool = False, only: list[str] | None = None) -> list[Path]:
    """Draw the figures into ``out``; return the paths drawn (empty when they were up to date).

    Args:
        out: the folder for the PNGs (created if missing).
        force: draw even if the stamp says nothing changed.
        only: draw just these figure names (for tests); the stamp is then left alone.
    """
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    stamp_file = out / ".stamp"
    stamp = _stamp()
    names = list(FIGURES) if only is None else list(only)
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise KeyError(f"no figure named {', '.join(unknown)}; have {', '.join(FIGURES)}")
    if (only is None and not force and stamp_file.exists() and stamp_file.read_text() == stamp
            and all((out / n).exists() for n in names)):
        return []
    _plan_example.cache_clear()  # a long-lived process (mkdocs serve) must not keep an old answer
    _sibling("cluster_numbers").clear_caches()
    drawn = []
    for name in names:
        FIGURES[name](out / name)
        drawn.append(out / name)
    if only is None:
        stamp_file.write_text(stamp)
    return drawn


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="draw even if nothing changed")
    parser.add_argument("--out", type=Path, default=OUT, help=f"folder for the PNGs (default {OUT})")
    parser.add_argument("--readme", action="store_true",
                        help=f"redraw only the README's picture, {README_FIGURE.relative_to(ROOT)}, from the demo")
    args = parser.parse_args(argv)
    if args.readme:
        shows = readme_figure()
        print(f"drew {README_FIGURE.relative_to(ROOT)} ({shows})")
        return 0
    drawn = build(args.out, force=args.force)
    print(f"drew {len(drawn)} figures into {args.out}" if drawn else "figures up to date")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
