"""The figure of "Plan a large model" (docs/how-to/plan-large-model.md): every configuration of a 70B sweep."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from figures import figure
from figures.common import save

# --8<-- [start:plan_large_model]
#: The sweep of "Plan a large model": a Llama-3-70B-class decoder at 8k context on 64 H100s in nodes of eight,
#: every tensor-parallel degree with sequence parallelism off and on, ZeRO 0, 1 and 3, recompute per layer or of
#: the attention core alone (1,234 configurations, a few seconds).
LARGE_PLAN: dict[str, Any] = {
    "model": "llama:layers=80,hidden=8192,heads=64,kv-heads=8,ffn=28672,seq=8192,vocab=128256,kernels=eager,"
             "attention=math",  # the math attention, for selective recompute
    "device": "h100-sxm", "batch": 256, "gpus": 64, "link": "nvlink4", "network": "infiniband-ndr",
    "tensor_parallel": (1, 2, 4, 8), "zero": (0, 1, 3), "checkpoints": ("layers", "selective")}


@figure("plan_large_model.png")
def plan_large_model(path: Path) -> None:
    """Tokens/s against peak memory per device of every configuration of :data:`LARGE_PLAN` that fits, coloured by
    ZeRO stage, shaped by tensor-parallel degree, the device's memory a line."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from sim.planning.counting.models import get_model
    from sim.planning.hardware.catalog import get_device
    from sim.planning.plan import PlanRequest, default_training, plan

    ex = LARGE_PLAN
    device = get_device(ex["device"])
    dtype = default_training(device).torch_dtype  # bf16 with Adam
    model = get_model(ex["model"])
    counts = {(t, sp): model.tensor_parallel(t, sequence_parallel=sp).count(dtype)
              for t in ex["tensor_parallel"] for sp in (False, True) if t > 1 or not sp}
    result = plan(PlanRequest(profile=counts, batch=ex["batch"], device=device, gpus=[ex["gpus"]], link=ex["link"],
                              network=ex["network"], tensor_parallel=ex["tensor_parallel"], zero=ex["zero"],
                              checkpoints=ex["checkpoints"], sequence_parallel=[False, True], schedules=["1f1b"],
                              tokens_per_sample=int(model.sample(1, "meta").shape[1]), model_name=model.name))
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
    save(fig, path)
# --8<-- [end:plan_large_model]
