"""The numbers and the figure of the page "Pipeline parallelism in a cluster" (docs/concepts/cluster.md).

Everything here is the planner's (:mod:`sim.planning`): GPT-3 175B counted on ``meta`` for each tensor-parallel degree,
priced on the hardware catalog's A100 and links, swept by :func:`sim.planning.plan.plan`. ``docs/figures/cluster.py``
registers :func:`draw_tensor_parallel` and :func:`fragments` with the site's figures; tests/docs/test_cluster_page.py
checks the numbers against the page's closed forms and finds :func:`page_numbers` in the page.

Note [a ring at its slowest hop]: the planner keeps a tensor-parallel group inside a node, so ``t = 16`` on nodes of
eight is priced as a group whose every collective runs on the network. That is the ring's own model: each of its
steps moves ``1/t`` of the message over every hop at once, so a ring that crosses the network once runs at the
network's speed, whatever NVLink does on its other hops.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["DEGREES", "SWEEP", "ZERO", "clear_caches", "counts", "draw_tensor_parallel", "fragments",
           "layer_traffic", "page_numbers", "saved_per_layer", "tensor_sweep", "zero_plan"]

MiB, GiB = 2**20, 2**30
Table = Callable[[list[str], list[list[str]]], str]

#: Tensor-parallel degrees the page sweeps (GPT-3 175B's 96 heads divide by each).
DEGREES = (1, 2, 4, 8, 16)
#: The sweep of the figure: 64 A100s as t tensor-parallel ranks x 64/t stages, no data parallelism, one sample per
#: micro-batch, 1F1B; recompute of whole layers or of the attention core, sequence parallelism off and on. The math
#: attention, every operator its own kernel: Korthikanti et al.'s model, whose closed forms the page checks.
SWEEP: dict[str, Any] = {"model": "gpt:175b,kernels=eager,attention=math", "device": "a100-80gb", "gpus": 64,
                         "batch": 512, "link": "nvlink3", "network": "infiniband-hdr", "gpus_per_node": 8,
                         "checkpoints": ("layers", "selective")}
#: The ZeRO table: the same model on 1,024 A100s as t = 8 x 8 stages x 16 replicas, batch 1536, 96 micro-batches.
ZERO: dict[str, Any] = {"gpus": 1024, "batch": 1536, "t": 8, "stages": 8, "replicas": 16, "chunks": 96}


@functools.cache
def counts() -> dict[tuple[int, bool], Any]:
    """One rank's shard of GPT-3 175B counted in bf16 for every degree of :data:`DEGREES`, sequence parallel or not
    (about three seconds)."""
    import torch

    from sim.planning.counting.models import get_model

    model = get_model(SWEEP["model"])
    return {(t, sp): model.tensor_parallel(t, sequence_parallel=sp).count(torch.bfloat16)
            for t in DEGREES for sp in (False, True) if t > 1 or not sp}


def _shape() -> tuple[int, int, int, int]:
    """GPT-3 175B's sequence length, hidden size, heads and layers."""
    from sim.planning.counting.models.gpt import gpt_config

    c = gpt_config("175b")
    return c.seq_len, c.d_model, c.n_head, c.n_layer


def saved_per_layer(t: int, sequence_parallel: bool, selective: bool) -> tuple[float, int]:
    """Bytes one block keeps for backward per sample on one of ``t`` ranks: Korthikanti et al.'s closed form, and the
    planner's count (which adds the two LayerNorms' fp32 mean and 1/std, 16 bytes a token on this rank)."""
    s, h, a, _ = _shape()
    core = 0.0 if selective else 5 * a * s / h  # the attention core's share, which selective recompute drops
    formula = s * h / t * (34 + core) if sequence_parallel else s * h * (10 + 24 / t + core / t)
    profile = counts()[(t, sequence_parallel)]
    counted = profile.at(1)[1].saved_bytes
    if selective:
        counted -= profile.attention_core.saved_bytes
    return formula, counted


def layer_traffic(t: int, link: str) -> tuple[float, float, float]:
    """One block's forward at one sample per micro-batch, ``t`` ranks with sequence parallelism: (seconds of its
    compute, seconds of its collectives on ``link``, bytes each rank sends in them)."""
    from sim.planning.costs.from_flops import FlopCosts
    from sim.planning.hardware.catalog import get_device, get_link

    s, h, _, _ = _shape()
    costs = FlopCosts(counts()[(t, True)], get_device(SWEEP["device"]), "bf16-adam", tensor_link=get_link(link))
    whole, collectives = costs.layer_seconds(1)[0][1], costs.collective_seconds(1)[0][1]
    return whole - collectives, collectives, 4 * (t - 1) / t * 2 * s * h  # two reduce-scatters, two all-gathers


@functools.cache
def tensor_sweep() -> dict[str, dict[int, list[Any]]]:
    """The figure's rows by series and degree: ``inside`` (NVLink 3 in nodes of eight, InfiniBand HDR between them;
    ``t = 16`` crosses the network, Note [a ring at its slowest hop]) and ``across`` (every collective on HDR)."""
    from sim.planning.plan import PlanRequest, plan

    ex = SWEEP

    def run(link: str, gpus_per_node: int, degrees: tuple[int, ...]) -> dict[int, list[Any]]:
        result = plan(PlanRequest(profile={k: c for k, c in counts().items() if k[0] in degrees}, batch=ex["batch"],
                                  device=ex["device"], gpus=[ex["gpus"]], link=link, network=ex["network"],
                                  gpus_per_node=gpus_per_node, tensor_parallel=degrees, sequence_parallel=[False, True],
                                  stages=[ex["gpus"] // t for t in degrees], replicas=[1], chunks=[ex["batch"]],
                                  checkpoints=ex["checkpoints"], schedules=["1f1b"],
                                  tokens_per_sample=_shape()[0]), workers=1)
        return {t: [r for r in result.rows if r.tensor_parallel == t] for t in degrees}

    across = run(ex["network"], max(DEGREES), DEGREES)
    inside = run(ex["link"], ex["gpus_per_node"], tuple(t for t in DEGREES if t <= ex["gpus_per_node"]))
    return {"inside": {**inside, **{t: rows for t, rows in across.items() if t not in inside}}, "across": across}


def _best(rows: list[Any]) -> Any:
    return min((r for r in rows if r.fits), key=lambda r: r.step_seconds)


def _row(rows: list[Any], checkpoint: str, sequence_parallel: bool) -> Any:
    return next(r for r in rows if r.checkpoint == checkpoint and r.sequence_parallel == sequence_parallel)


@functools.cache
def zero_plan() -> Any:
    """The planner's rows of :data:`ZERO`, one per ZeRO stage (selective recompute, sequence parallel, 1F1B)."""
    from sim.planning.plan import PlanRequest, plan

    z = ZERO
    return plan(PlanRequest(profile={(z["t"], True): counts()[(z["t"], True)]}, batch=z["batch"],
                            device=SWEEP["device"], gpus=[z["gpus"]], link=SWEEP["link"], network=SWEEP["network"],
                            tensor_parallel=[z["t"]], sequence_parallel=[True], stages=[z["stages"]],
                            replicas=[z["replicas"]], chunks=[z["chunks"]], checkpoints=["selective"],
                            schedules=["1f1b"], zero=[0, 1, 2, 3], tokens_per_sample=_shape()[0]), workers=1)


def _zero_sent(row: Any, parameters: float) -> float:
    """Bytes the first device sends per step in its data-parallel group's collectives (sim.planning.parallel.zero)."""
    from sim.planning.parallel.zero import sent_per_step

    return sent_per_step(2 * parameters, 2 * parameters, row.zero, row.replicas, row.chunks)  # bf16


def fragments(table: Table) -> dict[str, str]:
    """The page's tables, for its ``<!-- generated: NAME -->`` markers."""
    from sim.planning.hardware.catalog import get_link

    links = [get_link(name) for name in ("nvlink3", "nvlink4", "infiniband-hdr", "infiniband-ndr")]
    out = {"cluster_links": table(["link", "GB/s per direction", "latency", "what it is"], [
        [f"`{k.name}`", f"{k.bandwidth / 1e9:.0f}", f"{k.latency * 1e6:.0f} us", k.description] for k in links])}
    rows = []
    for t in DEGREES:
        cells = [str(t)]
        for sp, selective in ((False, False), (True, False), (True, True)):
            if sp and t == 1:
                cells.append("(as without)")
                continue
            formula, counted = saved_per_layer(t, sp, selective)
            cells.append(f"{formula / MiB:.1f} / {counted / MiB:.1f}")
        rows.append(cells)
    out["cluster_memory_per_layer"] = table(
        ["t", "tensor parallel: `sbh(10 + 24/t + 5as/(ht))`", "and sequence parallel: `sbh/t · (34 + 5as/h)`",
         "and selective recompute: `34 sbh/t`"], rows)
    rows = []
    for t in DEGREES[1:]:
        compute, nvlink, sent = layer_traffic(t, "nvlink3")
        _, hdr, _ = layer_traffic(t, "infiniband-hdr")
        rows.append([str(t), f"{sent / MiB:.0f} MiB", f"{compute * 1e3:.2f} ms", f"{nvlink * 1e3:.2f} ms",
                     f"{hdr * 1e3:.2f} ms", f"{hdr / compute:.1f}x"])
    out["cluster_layer_traffic"] = table(
        ["t", "sent per rank", "compute", "collectives on NVLink 3", "on InfiniBand HDR", "HDR / compute"], rows)
    sweep, body = tensor_sweep(), []
    for t in DEGREES:
        cells = [str(t), str(SWEEP["gpus"] // t)]
        for checkpoint in SWEEP["checkpoints"]:
            for sp in (False, True):
                cells.append(f"{_row(sweep['inside'][t], checkpoint, sp).peak_memory_bytes / GiB:.1f}"
                             if t > 1 or not sp else "")
        for series in ("inside", "across"):
            best = _best(sweep[series][t])
            cells.append(f"{best.step_seconds:.1f} s ({best.checkpoint}{', sp' if best.sequence_parallel else ''}; "
                         f"{best.bound})")
        body.append(cells)
    out["cluster_sweep_table"] = table(
        ["t", "stages", "GiB/GPU layers", "layers, sp", "selective", "selective, sp", "fastest step, NVLink inside",
         "fastest step, all on HDR"], body)
    result = zero_plan()
    plain = next(r for r in result.rows if r.zero == 0)
    parameters = plain.memory_parts[0].gradients / 2  # bf16 gradients: the first device's parameters
    out["cluster_zero_table"] = table(
        ["ZeRO", "model state, GiB/GPU", "peak, GiB/GPU", "data-parallel bytes sent per GPU and step", "step",
         "all-reduce exposed"],
        [[str(r.zero), f"{r.model_state_bytes[0] / GiB:.1f}", f"{r.peak_memory_bytes / GiB:.1f}",
          f"{_zero_sent(r, parameters) / GiB:,.0f} GiB", f"{r.step_seconds:.1f} s",
          f"{r.allreduce_exposed_seconds:.2f} s"] for r in sorted(result.rows, key=lambda r: r.zero)])
    return out


def page_numbers() -> dict[str, str]:
    """The numbers the page's text states, as it writes them (tests/docs/test_cluster_page.py finds each)."""
    from sim.planning.counting.models.gpt import gpt_config
    from sim.planning.hardware.catalog import get_link

    s, h, a, layers = _shape()
    sweep = tensor_sweep()
    inside = {t: _best(sweep["inside"][t]) for t in DEGREES}
    across = {t: _best(sweep["across"][t]) for t in DEGREES}
    fastest = min(inside.values(), key=lambda r: r.step_seconds)
    compute8, nvlink8, sent8 = layer_traffic(8, "nvlink3")
    _, hdr8, _ = layer_traffic(8, "infiniband-hdr")
    zero = {r.zero: r for r in zero_plan().rows}
    parameters = zero[0].memory_parts[0].gradients / 2
    state = 16 * gpt_config("175b").parameters / SWEEP["gpus"]  # bf16 with Adam, over t x p GPUs
    boundary, stage = 2 * s * h / 8, layers // 8 * sent8  # at t = 8, sequence parallel: 8 stages of 12 layers
    four = _row(sweep["inside"][4], "selective", True)
    kept_on = [t for t in DEGREES[1:] if across[t].sequence_parallel]  # on HDR: where memory needs it
    return {
        "core": f"{5 * a * s / h:.0f} of the {34 + 5 * a * s / h:.0f}",
        "t4 state": f"{state / GiB:.1f} GiB", "t4 planner": f"{four.peak_memory_bytes / GiB:.1f} GiB",
        "t4 estimate": f"{(state + layers * 34 * s * h / 4) / GiB:.1f} GiB",
        "link ratio": f"{get_link('nvlink3').bandwidth / get_link('infiniband-hdr').bandwidth:.0f} times",
        "t8 compute": f"{compute8 * 1e3:.2f} ms", "t8 nvlink": f"{nvlink8 * 1e3:.2f} ms",
        "t8 hdr": f"{hdr8 * 1e3:.2f} ms", "boundary t8": f"{boundary / MiB:.0f} MiB",
        "stage collectives t8": f"{stage / MiB:,.0f} MiB", "boundary ratio": f"{stage / boundary:.0f} times",
        "t1 selective": f"{_row(sweep['inside'][1], 'selective', False).peak_memory_bytes / GiB:.1f} GiB",
        "t1": f"{inside[1].step_seconds:.1f} s", "fastest t": f"t = {fastest.tensor_parallel}",
        "fastest step": f"{fastest.step_seconds:.1f} s", "t8 inside": f"{inside[8].step_seconds:.1f} s",
        "t16": f"{inside[16].step_seconds:.1f} s", "t8 across": f"{across[8].step_seconds:.1f} s",
        "t4 across": f"{across[4].step_seconds:.1f} s",
        "zero0 state": f"{zero[0].model_state_bytes[0] / GiB:.1f} GiB",
        "zero1 state": f"{zero[1].model_state_bytes[0] / GiB:.1f} GiB",
        "zero1 saved": f"{(zero[0].model_state_bytes[0] - zero[1].model_state_bytes[0]) / GiB:.1f} GiB",
        "zero1 step": f"{zero[1].step_seconds:.1f} s", "zero3 step": f"{zero[3].step_seconds:.1f} s",
        "zero0 sent": f"{_zero_sent(zero[0], parameters) / GiB:,.0f} GiB",
        "zero3 sent": f"{_zero_sent(zero[3], parameters) / GiB:,.0f} GiB",
        "sp on hdr": "at every degree but " + ", ".join(f"`t = {t}`" for t in kept_on),
        "zero3 chunks": f"With {zero[3].chunks} micro-batches,", "zero3 repeats": f"repeat {zero[3].chunks} times",
    }


# --8<-- [start:draw_tensor_parallel]
def draw_tensor_parallel(path: Path, save: Callable[[Any, Path], None]) -> None:
    """Step time of the fastest configuration that fits (left) and memory per GPU (right) against ``t``."""
    import matplotlib.pyplot as plt

    sweep = tensor_sweep()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for series, label, colour in (("inside", "NVLink 3 inside a node of 8 (t = 16 crosses nodes)", "#4c72b0"),
                                  ("across", "every collective on InfiniBand HDR", "#c44e52")):
        best = [_best(sweep[series][t]) for t in DEGREES]
        left.plot(DEGREES, [r.step_seconds for r in best], "o-", color=colour, label=label)
        for t, r in zip(DEGREES, best, strict=True):
            if series == "inside" or t not in (DEGREES[0], DEGREES[-1]):  # the two series share both ends
                left.annotate(r.checkpoint + (", sp" if r.sequence_parallel else ""), (t, r.step_seconds),
                              xytext=(4, -12 if series == "inside" else 5), textcoords="offset points", fontsize=7,
                              color=colour)
    left.set_ylabel("step (s), batch 512")
    left.set_title("Step of the fastest configuration that fits", fontsize=10)
    for checkpoint, sp, style in (("layers", False, "s--"), ("layers", True, "s-"), ("selective", False, "o--"),
                                  ("selective", True, "o-")):
        rows = [_row(sweep["inside"][t], checkpoint, sp and t > 1) for t in DEGREES]
        right.plot(DEGREES, [r.peak_memory_bytes / GiB for r in rows], style,
                   label=checkpoint + (", sequence parallel" if sp else ""))
    limit = _device_memory() / GiB
    right.axhline(limit, color="k", linestyle=":", linewidth=1)
    right.text(DEGREES[-1], limit, f"A100 80GB: {limit:.1f} GiB", ha="right", va="bottom", fontsize=8)
    right.set_ylabel("peak memory per GPU (GiB)")
    right.set_title("Memory of the first GPU", fontsize=10)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(DEGREES, [str(t) for t in DEGREES])
        ax.set_xlabel("tensor parallel t (stages = 64 / t)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("GPT-3 175B on 64 A100s, one sample per micro-batch, 1F1B: the planner's sweep", fontsize=10)
    fig.tight_layout()
    save(fig, path)
# --8<-- [end:draw_tensor_parallel]


def _device_memory() -> int:
    from sim.planning.hardware.catalog import get_device

    return get_device(SWEEP["device"]).memory_bytes


def clear_caches() -> None:
    """Forget the counts and sweeps (a long-lived process, ``mkdocs serve``, must not keep an old answer)."""
    for cached in (counts, tensor_sweep, zero_plan):
        cached.cache_clear()
