"""The inequalities, numbers and figure of the page "When communication is exposed"
(docs/concepts/exposed-communication.md).

Each parallelism's collective is set against the compute that could hide it, in the JAX scaling book's way: a
closed form here, the simulator's or the planner's answer beside it. ``docs/figures/exposed_communication.py``
registers :func:`fragments` and :func:`draw_buckets`; tests/docs/test_exposed_communication.py checks every closed
form against the simulator and the planner and finds :func:`page_numbers` in the page.

The worked numbers use the catalog's A100 80GB (312 TFLOP/s bf16 peak), NVLink 3 inside a node (300 GB/s) and
InfiniBand HDR across nodes (25 GB/s per GPU), and GPT-3 175B's shapes (Brown et al., 2020): what the cluster page
plans.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpipe.schedule import gpipe
from sim.core.collectives import Gather, StageCollectives, Unit
from sim.core.cost import CostModel, StageCost

__all__ = ["BUCKET_BYTES", "BUDGET", "DP", "bucket_cost", "bucket_exposed", "budget", "dp_min_tokens",
           "draw_buckets", "fragments", "fsdp_cost", "fsdp_forward", "page_numbers", "pipeline_min_width",
           "steps_ratio", "tp_min_hidden"]

MiB = 2**20
Table = Callable[[list[str], list[list[str]]], str]

#: DistributedDataParallel's default bucket, ``bucket_cap_mb=25`` (PyTorch's DDP documentation).
BUCKET_BYTES = 25 * MiB
#: The data-parallel example: 16 replicas over HDR, one stage's gradients in 8 buckets, a replica's tokens per step
#: on either side of the threshold (8 and 2 samples of GPT-3's 2,048 tokens).
DP: dict[str, Any] = {"replicas": 16, "buckets": 8, "tokens": (16384, 4096), "link": "infiniband-hdr",
                      "device": "a100-80gb"}
#: The batch budget: GPT-3 175B's batch of 3.2M tokens, 1,536 samples of 2,048 (Brown et al., 2020, table 2.1),
#: one sample per micro-batch, 8 stages, a bubble of at most 10%.
BUDGET: dict[str, Any] = {"batch": 1536, "microbatch": 1, "stages": 8, "bubble": 0.1}


def tp_min_hidden(t: int, flops: float, bandwidth: float) -> float:
    """Smallest hidden size whose GEMMs outlast a layer's tensor-parallel collectives on ``t`` ranks.

    A layer's forward computes ``24 b s h² / t`` FLOPs per rank and sends ``4 · (t − 1)/t · 2 b s h`` bytes (two
    all-gathers, two reduce-scatters); the second over ``bandwidth`` is at most the first over ``flops`` when
    ``h ≥ (t − 1) · flops / (3 · bandwidth)``.
    """
    return (t - 1) * flops / (3 * bandwidth)


def dp_min_tokens(d: int, flops: float, bandwidth: float) -> float:
    """Fewest tokens a replica's backward must process to hide its gradients' all-reduce over ``d`` replicas.

    ``N`` parameters: the backward computes ``4 N T`` FLOPs; a ring all-reduce of the bf16 gradient sends
    ``2 (d − 1)/d · 2 N`` bytes. Hidden when ``T ≥ (d − 1)/d · flops / bandwidth``. FSDP's prefetch gives the same
    threshold: an all-gather sends half the bytes against a forward of half the FLOPs.
    """
    return (d - 1) / d * flops / bandwidth


def pipeline_min_width(flops: float, bandwidth: float) -> float:
    """Smallest ``layers per stage × h`` for which a stage's forward of one micro-batch outlasts its send.

    The send is ``2 b s h`` bytes, the forward ``24 b s h² · layers`` FLOPs: ``layers · h ≥ flops / (12 · bandwidth)``.
    """
    return flops / (12 * bandwidth)


def bucket_exposed(buckets: int, reduce: float, backward: float) -> float:
    """Seconds of ``buckets`` all-reduces of ``reduce`` seconds each left after a ``backward`` that computes the
    buckets one after the other, each issued as its share is computed and run one at a time.

    Hidden but the last while each fits in a bucket's backward (``reduce ≤ backward / buckets``); beyond that they
    queue, and the queue ends ``buckets · reduce`` after the first bucket's share.
    """
    return max(reduce, buckets * reduce - (buckets - 1) * backward / buckets)


def fsdp_forward(units: int, gather: float, forward: float) -> float:
    """Seconds of a forward of ``units`` FSDP units, each gathered while the previous one computes: the first
    gather is exposed, the others hide while ``gather ≤ forward / units``."""
    return gather + max(forward, (units - 1) * gather + forward / units)


def bucket_cost(forward: float, backward: float, reduce: float, buckets: int) -> CostModel:
    """One stage computing ``buckets`` equal buckets, each all-reduced for ``reduce`` seconds as DDP does."""
    units = tuple(Unit(1 / buckets, reduce=reduce, reduce_bytes=BUCKET_BYTES) for _ in range(buckets))
    return CostModel((StageCost(forward, backward, collectives=StageCollectives(units)),))


def fsdp_cost(forward: float, backward: float, gather: float, units: int) -> CostModel:
    """One stage of ``units`` FSDP units, each all-gathered for ``gather`` seconds before every forward."""
    shards = tuple(Unit(1 / units, gather=gather, gather_bytes=BUCKET_BYTES) for _ in range(units))
    return CostModel((StageCost(forward, backward, collectives=StageCollectives(shards, gather=Gather.EACH_TASK)),))


def steps_ratio(batch: float, noise: float) -> float:
    """How many times fewer steps doubling ``batch`` takes, McCandlish et al. (2018): ``S = S_min (1 + B_noise/B)``."""
    return (1 + noise / batch) / (1 + noise / (2 * batch))


def budget(batch: int, microbatch: int, stages: int, bubble: float) -> tuple[int, int]:
    """(fewest micro-batches whose bubble ``(p − 1)/(m + p − 1)`` is at most ``bubble``, most replicas that
    ``m = B/(b · d)`` then allows)."""
    m = math.ceil((stages - 1) * (1 - bubble) / bubble - 1e-9)
    return m, batch // (microbatch * m)


def _dp_example() -> dict[str, Any]:
    """The data-parallel example's seconds: one bucket's all-reduce, and a bucket's backward at each token count."""
    from sim.core.rings import allreduce_seconds
    from sim.planning.hardware.catalog import get_device, get_link

    device, link = get_device(DP["device"]), get_link(DP["link"])
    flops = device.peak_flops["bf16"]
    parameters = BUCKET_BYTES / 2  # bf16 gradients
    return {"reduce": allreduce_seconds(BUCKET_BYTES, DP["replicas"], link), "flops": flops, "link": link,
            "backward": {t: 4 * parameters * t / flops for t in DP["tokens"]}}  # one bucket's share


def dp_runs(simulate: Callable[..., Any]) -> list[tuple[int, Any, float]]:
    """(tokens, timeline, exposed seconds) of one replica's step at each of ``DP["tokens"]``: 8 buckets' backward
    with their all-reduces on the collective stream."""
    ex, k = _dp_example(), DP["buckets"]
    out = []
    for tokens, bucket in ex["backward"].items():
        tl = simulate(gpipe(1, 1, "never"), bucket_cost(k * bucket / 2, k * bucket, ex["reduce"], k))
        compute = max(s.end for s in tl.compute_spans(0))
        out.append((tokens, tl, tl.makespan - compute))
    return out


def fragments(simulate: Callable[..., Any], table: Table) -> dict[str, str]:
    """The page's table of thresholds: each parallelism's inequality on the A100 inside a node and across nodes."""
    from sim.planning.hardware.catalog import get_device, get_link

    flops = get_device(DP["device"]).peak_flops["bf16"]
    rows = []
    for name in ("nvlink3", "infiniband-hdr"):
        w = get_link(name).bandwidth
        rows.append([f"`{name}` ({w / 1e9:.0f} GB/s)", f"{tp_min_hidden(8, flops, w):,.0f}",
                     f"{dp_min_tokens(DP['replicas'], flops, w):,.0f}", f"{pipeline_min_width(flops, w):,.0f}"])
    return {"exposure_thresholds": table(
        ["link", "TP, t = 8: smallest h", "DP, d = 16: fewest tokens per replica", "PP: smallest layers × h"],
        rows)}


def page_numbers(simulate: Callable[..., Any]) -> dict[str, str]:
    """The numbers the page's text states, as it writes them (tests/docs/test_exposed_communication.py finds each)."""
    from sim.planning.hardware.catalog import get_device, get_link

    flops = get_device(DP["device"]).peak_flops["bf16"]
    nvlink, hdr = get_link("nvlink3").bandwidth, get_link("infiniband-hdr").bandwidth
    ex, runs = _dp_example(), dp_runs(simulate)
    m, d = budget(**BUDGET)
    m16, d16 = budget(**{**BUDGET, "stages": 16})
    h100, nvlink4 = get_device("h100-sxm"), get_link("nvlink4").bandwidth
    send = 2 * 2048 * 12288  # one sample's boundary activation in bf16, GPT-3 175B
    stage = 12 * 24 * 2048 * 12288**2 / flops  # its forward through 12 layers at peak
    return {
        "tp nvlink": f"{tp_min_hidden(8, flops, nvlink):,.0f} on NVLink 3",
        "tp hdr": f"{tp_min_hidden(8, flops, hdr):,.0f} on HDR",
        "dp ratio": f"{flops / hdr:,.0f} tokens", "dp d16": f"{dp_min_tokens(16, flops, hdr):,.0f} tokens",
        "bucket reduce": f"{ex['reduce'] * 1e3:.2f} ms",
        "bucket backward": " and ".join(f"{ex['backward'][t] * 1e3:.2f} ms" for t in DP["tokens"]),
        "dp exposed": " and ".join(f"{e * 1e3:.2f} ms" for _, _, e in runs),
        "pp width": f"{pipeline_min_width(flops, hdr):,.0f}",
        "pp send": f"{send / hdr * 1e3:.2f} ms", "pp stage": f"{stage * 1e3:.0f} ms",
        "budget m": f"`m ≥ {m}`", "budget d": f"`d ≤ {d}`",
        "mccandlish": f"{steps_ratio(1, 1):.2f} times fewer steps",
        # the exercises: an H100 node at t = 8; one 2,048-token micro-batch's backward; a pipeline of 16
        "h100": f"`h ≥ (t − 1) · P / (3 W) = 7 × {h100.peak_flops['bf16'] / 1e12:.1f} TFLOP/s / "
                f"(3 × {nvlink4 / 1e9:.0f} GB/s) ≈ {tp_min_hidden(8, h100.peak_flops['bf16'], nvlink4):,.0f}`",
        "one sample": f"about {ex['reduce'] / (4 * BUCKET_BYTES / 2 * 2048 / flops):.1f} times its share",
        "budget p16": f"`m ≥ 15 × 0.9 / 0.1 = {m16}`, so `d ≤ 1536 / {m16}`, that is {d16} replicas",
    }


# --8<-- [start:draw_buckets]
def draw_buckets(path: Path, simulate: Callable[..., Any], save: Callable[[Any, Path], None]) -> None:
    """One replica's step at 16,384 and at 4,096 tokens: the same 8 buckets' all-reduces (collective stream), hidden
    by a long backward, queued after a short one."""
    from gpipe.schedule.plot import plot_side_by_side

    runs = dp_runs(simulate)
    titles = [f"{tokens:,} tokens per replica: {exposed * 1e3:.2f} ms of all-reduce exposed"
              for tokens, _, exposed in runs]
    save(plot_side_by_side([tl for _, tl, _ in runs], titles=titles, labels=False), path)
# --8<-- [end:draw_buckets]
