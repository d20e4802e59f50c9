"""The figure and table of "Plan capacity" (docs/how-to/plan.md): the planner's answer for a 13B GPT."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from figures import figure, forget, markdown
from figures.common import md_table, save

#: The what-if example of the planning page: a model that needs a pipeline (it does not fit on one GPU).
PLAN_EXAMPLE = {"model": "gpt:13b", "device": "a100-80gb", "batch": 512, "gpus": (8, 16), "link": "nvlink"}


@functools.cache
def plan_example() -> Any:
    """The planner's answer for :data:`PLAN_EXAMPLE` (counted and swept once per process: a few seconds)."""
    from sim.planning.counting.flops import count_layers
    from sim.planning.counting.models import get_model
    from sim.planning.hardware.catalog import get_device
    from sim.planning.plan import PlanRequest, default_training, plan

    ex = PLAN_EXAMPLE
    device = get_device(str(ex["device"]))
    training = default_training(device)
    model = get_model(str(ex["model"]))
    profile = count_layers(model.module("meta"), model.sample(2, "meta"), dtype=training.torch_dtype)
    return plan(PlanRequest(profile=profile, device=device, link=str(ex["link"]), training=training,
                            batch=int(ex["batch"]), gpus=list(ex["gpus"]),  # type: ignore[call-overload]
                            model_name=model.name))


forget(plan_example.cache_clear)


# --8<-- [start:plan_memory]
@figure("plan_memory.png")
def plan_memory(path: Path) -> None:
    from sim.planning.plan_plot import plot_memory

    result = plan_example()
    save(plot_memory(result, result.best), path)
# --8<-- [end:plan_memory]


@markdown
def plan_fragments() -> dict[str, str]:
    result = plan_example()
    rows = sorted((r for r in result.rows if r.fits), key=lambda r: -r.throughput)[:8]
    table = md_table(["GPUs", "pp x dp", "chunks", "checkpoint", "schedule", "samples/s", "bubble", "GiB/dev"],
                     [[str(r.gpus), f"{r.stages} x {r.replicas}", str(r.chunks), r.checkpoint, r.schedule,
                       f"{r.throughput:.2f}", f"{r.bubble_fraction:.1%}", f"{r.peak_memory_bytes / 2**30:.1f}"]
                      for r in rows])
    fits = len([r for r in result.rows if r.fits])
    head = (f"{result.model}, batch {result.batch}, on {result.device} over {result.link}, training "
            f"{result.training}: {len(result.rows)} configurations simulated, {fits} fit in memory; the fastest:")
    return {"plan_table": head + "\n\n" + table, "plan_reading": plan_reading(result)}


def plan_reading(result: Any) -> str:
    """The numbers the page reads off the table and the memory figure, computed from the same plan.

    Raises:
        RuntimeError: the fastest row recomputes; the page explains one that keeps every activation.
    """
    best = result.best
    if best.checkpoint != "never":
        raise RuntimeError(f"docs/how-to/plan.md explains a fastest row that checkpoints `never`; the planner now "
                           f"picks `{best.checkpoint}`: rewrite the page's reading of the 13B plan")
    fewest = min(r.gpus for r in result.rows)
    depths = sorted({r.stages for r in result.rows if r.gpus == fewest})
    shallowest = min(r.stages for r in result.rows if r.gpus == fewest and r.fits)
    layout = (best.gpus, best.stages, best.schedule, best.virtual)
    same = [r for r in result.rows if (r.gpus, r.stages, r.schedule, r.virtual) == layout]
    smallest = min((r for r in same if r.fits and r.checkpoint == best.checkpoint), key=lambda r: r.chunks)
    recompute = {r.checkpoint: r.throughput for r in same if r.chunks == best.chunks and r.fits}
    slower = ", ".join(f"`{c}` {recompute[c]:.2f}" for c in ("except_last", "always") if c in recompute)
    return (f"On {fewest} GPUs it tries {', '.join(map(str, depths[:-1]))} and {depths[-1]} stages, and "
            f"{shallowest} is the shallowest that fits. The fastest row keeps every activation (`never`); the same "
            f"configuration runs at {best.throughput:.2f} samples/s, against {slower} with a recompute. In the "
            f"figure it fits only from {smallest.chunks} chunks on, {smallest.microbatch} samples per micro-batch.")
