"""The formulas, numbers and figure of the page "FP8 training" (docs/concepts/fp8.md).

Amdahl's law over the part of the step FP8 speeds up, with each term taken from the planner: one H100 trains GPT
1.3B under ``bf16-adam`` and under ``fp8-adam``; :func:`step_parts` splits each row's step into the linear products
FP8 runs, the casts that feed them, and the rest, and :func:`amdahl` puts them back together.
``docs/figures/fp8.py`` registers :func:`draw_parts`; tests/docs/test_fp8_page.py checks that the parts add up to
the planner's rows and finds :func:`page_numbers` in the page.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["POLICIES", "ROW", "amdahl", "amdahl_bound", "draw_parts", "page_numbers", "plan_row", "rate_ratio",
           "step_parts", "terms"]

#: The example: GPT 1.3B (Brown et al., 2020's XL shape) on one H100 SXM, 8 micro-batches of one 2,048-token
#: sample, 1F1B on one stage (every micro-batch's forward and backward one after the other), no recompute.
ROW: dict[str, Any] = {"model": "gpt:1.3b", "device": "h100-sxm", "batch": 8, "chunks": 8, "tokens": 2048}
POLICIES = ("bf16-adam", "fp8-adam")


def amdahl(f: float, r: float, c: float) -> float:
    """Speedup of a step that spends ``f`` of its time in work made ``r`` times faster and then ``c`` of its old
    time more in new work (the casts): ``1 / ((1 − f) + f/r + c)``."""
    return 1 / ((1 - f) + f / r + c)


def amdahl_bound(f: float, r: float) -> float:
    """The most such a speedup can be: the new work free, ``1 / ((1 − f) + f/r)``."""
    return amdahl(f, r, 0.0)


def rate_ratio(device: str) -> float:
    """How many times a large FP8 product outruns a BF16 one on the catalog's roofline: each dtype's dense peak
    times the fraction of it a large GEMM reaches."""
    from sim.planning.hardware.catalog import get_device

    spec = get_device(device)
    assert spec.roofline is not None
    fp8, bf16 = (spec.peak_flops[k] * spec.roofline.matmul[k] for k in ("fp8", "bf16"))
    return fp8 / bf16


@lru_cache(maxsize=1)
def _profile() -> Any:
    import torch

    from sim.planning.counting.models import get_model

    return get_model(ROW["model"]).count(torch.bfloat16)


# Note [parts of a step]: the planner prices every kernel inside a layer's seconds and gives no seconds per kernel.
# So the products are the step less the same step with their FLOPs and bytes zeroed (each still a launch, which FP8
# does not shorten), and the casts are FP8's step with its products at BF16's rate less BF16's step. Each part is
# the planner's own pricing; the tests check that they add up to its rows.
def _without_products(profile: Any) -> Any:
    """``profile`` with the FLOPs and bytes of the linear products of its inner layers set to 0 (each still a
    kernel): what FP8 training runs in FP8 (Note [fp8 training] in :mod:`sim.planning.counting.fp8`) taken out."""

    def zeroed(table: Any) -> Any:
        if table is None:
            return None
        keep = ~table.linear_or_default()[:, None]
        return replace(table, flops=table.flops * keep, bytes=table.bytes * keep)

    last = len(profile.layers) - 1
    return replace(profile, layers=tuple(
        x if k in (0, last) else replace(x, forward=zeroed(x.forward), backward=zeroed(x.backward),
                                         input_backward=zeroed(x.input_backward))
        for k, x in enumerate(profile.layers)))


def _step(profile: Any, training: Any) -> float:
    """One device's step of :data:`ROW` priced by the planner's costs: every micro-batch's forward and backward,
    then the optimizer step (the planner's row of one stage, checked in tests/docs/test_fp8_page.py)."""
    from sim.planning.costs.from_flops import FlopCosts
    from sim.planning.hardware.catalog import get_device

    costs = FlopCosts(profile, get_device(ROW["device"]), training)
    forward, backward = costs.layer_seconds(ROW["batch"] // ROW["chunks"])
    return float(ROW["chunks"] * (forward.sum() + backward.sum()) + sum(costs.update_seconds([len(profile)])))


@lru_cache(maxsize=1)
def step_parts() -> dict[str, dict[str, float]]:
    """Seconds of each policy's step of :data:`ROW`, in three parts: ``products`` (the linear products FP8 runs),
    ``casts`` (the cast kernels before them and the weights' casts in the optimizer step) and ``rest``.

    Note [parts of a step] says how each is taken from the planner.
    """
    from sim.planning.counting.training import training_policy

    profile, bare = _profile(), _without_products(_profile())
    bf16, fp8 = (training_policy(p) for p in POLICIES)
    casts_only = replace(fp8, compute=bf16.compute)  # FP8's kernels, its products at BF16's rate
    casts = _step(profile, casts_only) - _step(profile, bf16)
    out = {}
    for name, policy in zip(POLICIES, (bf16, fp8), strict=True):
        whole, without = _step(profile, policy), _step(bare, policy)
        new = casts if policy is fp8 else 0.0
        out[name] = {"products": whole - without, "casts": new, "rest": without - new}
    return out


@lru_cache(maxsize=2)
def plan_row(training: str) -> Any:
    """The planner's row of :data:`ROW` under ``training``."""
    from sim.planning.plan import PlanRequest, plan

    request = PlanRequest(profile=_profile(), batch=ROW["batch"], device=ROW["device"], gpus=[1], link="nvlink",
                          training=training, stages=[1], tensor_parallel=[1], chunks=[ROW["chunks"]],
                          schedules=["1f1b"], checkpoints=["never"], tokens_per_sample=ROW["tokens"],
                          model_name=ROW["model"])
    best = plan(request, workers=1).best
    assert best is not None, "GPT 1.3B fits an H100"
    return best


def terms() -> dict[str, float]:
    """Amdahl's ``f``, ``r`` and ``c`` of the FP8 step against the BF16 one, from :func:`step_parts`."""
    bf16, fp8 = (step_parts()[p] for p in POLICIES)
    step = sum(bf16.values())
    return {"f": bf16["products"] / step, "r": bf16["products"] / fp8["products"], "c": fp8["casts"] / step}


def page_numbers() -> dict[str, str]:
    """The numbers the page's text states, as it writes them (tests/docs/test_fp8_page.py finds each)."""
    from sim.planning.hardware.catalog import get_device

    bf16, fp8 = (plan_row(p) for p in POLICIES)
    x = terms()
    parameters = sum(x.parameters for x in _profile().layers)
    device = get_device(ROW["device"])
    assert device.roofline is not None
    peak, matmul = device.peak_flops, device.roofline.matmul
    return {
        "f": f"`f` = {x['f']:.1%}", "r": f"`r` = {x['r']:.2f}", "c": f"`c` = {x['c']:.1%}",
        "ratio": f"{rate_ratio(ROW['device']):.2f} times", "estimate": f"{amdahl(**x):.3f}",
        "bound 2": f"{amdahl_bound(x['f'], 2):.2f}",
        "bound r": f"{amdahl_bound(x['f'], rate_ratio(ROW['device'])):.2f}",
        "planner": f"{bf16.step_seconds / fp8.step_seconds:.3f} times",
        "steps": f"{bf16.step_seconds * 1e3:.1f} ms and {fp8.step_seconds * 1e3:.1f} ms",
        "memory": f"{bf16.peak_memory_bytes / 2**30:.1f} GiB to {fp8.peak_memory_bytes / 2**30:.1f} GiB",
        "parameters": f"{parameters / 1e9:.2f} billion parameters",
        "mfu": f"from {bf16.mfu:.1%} to {fp8.mfu:.1%}",
        "peaks": f"{peak['fp8'] / 1e12:,.0f} against {peak['bf16'] / 1e12:,.1f} dense TFLOP/s",
        "fractions": f"reaches {matmul['bf16']:.1%} of its peak and an FP8 one {matmul['fp8']:.1%} of its own",
        # exercise 1: f = 0.8 at the datasheet's ratio and at the roofline's
        "exercise": f"`1 / (0.2 + 0.4)`, {amdahl_bound(0.8, 2):.2f} times",
        "exercise r": f"`1 / (0.2 + 0.8/{rate_ratio(ROW['device']):.2f})`, "
                      f"{amdahl_bound(0.8, rate_ratio(ROW['device'])):.2f} times",
    }


# --8<-- [start:draw_parts]
def draw_parts(path: Path, save: Callable[[Any, Path], None]) -> None:
    """GPT 1.3B's step on one H100 under BF16 and FP8, split by the planner into the linear products, the casts
    that feed them, and everything else."""
    import matplotlib.pyplot as plt

    parts = step_parts()
    fig, ax = plt.subplots(figsize=(9, 3.2))
    colours = {"products": "tab:blue", "casts": "tab:red", "rest": "tab:gray"}
    labels = {"products": "linear products (FP8 under fp8-adam)", "casts": "casts to FP8", "rest": "everything else"}
    for y, policy in enumerate(POLICIES):
        left = 0.0
        for part in ("products", "casts", "rest"):
            width = parts[policy][part] * 1e3
            ax.barh(y, width, left=left, color=colours[part], label=labels[part] if y == 0 else None)
            left += width
        ax.text(left + 3, y, f"{left:.0f} ms", va="center")
    ax.set_yticks(range(len(POLICIES)), POLICIES)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.12 * sum(parts[POLICIES[0]].values()) * 1e3)
    ax.set(xlabel="one step (ms)", title="GPT 1.3B on one H100, 8 micro-batches of 2,048 tokens")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3, fontsize=8)
    fig.tight_layout()
    save(fig, path)
# --8<-- [end:draw_parts]
