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
    from sim.planning.flops import count_layers
    from sim.planning.hardware import get_device
    from sim.planning.models import get_model
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
    return {"plan_table": head + "\n\n" + table}
