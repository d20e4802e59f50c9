"""The formulas, numbers and figure of the page "Context parallelism" (docs/concepts/context-parallelism.md).

Each closed form of the page beside the planner's own answer: the chunks a rank keeps
(:func:`chunks`), the keys and values one tensor-parallel rank's attention reads (:func:`kv_formula`, against the
count's :func:`~sim.planning.parallel.context_parallel.kv_bytes`), the ring's exposure inequality
(:func:`ring_min_tokens`, against :meth:`~sim.planning.parallel.context_parallel.ContextParallel.seconds`), and
Llama 3 405B's 128K row planned by the command the page shows (:data:`COMMAND`). ``docs/figures/context_parallelism.py``
registers :func:`draw_ring`; tests/docs/test_context_parallel_page.py checks each form and finds :func:`page_numbers`
in the page.

The shapes are Llama 3 405B's (Dubey et al., 2024, table 3: 126 layers, hidden 16,384, 128 heads, 8 key/value heads,
FFN 53,248), on one of 8 tensor-parallel ranks with sequence parallelism, and the layout of its table 4 (TP 8 in a
DGX H100 node, so a context-parallel group of 16 spans 16 nodes on InfiniBand NDR).
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["COMMAND", "CP", "LLAMA", "SEQUENCES", "allgather_forward", "attention_rate", "causal_work", "chunks",
           "draw_ring", "kv_formula", "layer_costs", "llama_row", "page_numbers", "palm_tflops", "ring_min_tokens",
           "ring_step"]

#: Llama 3 405B's shape (Dubey et al., 2024, table 3); ``d`` is the head width, hidden / heads.
LLAMA: dict[str, int] = {"layers": 126, "hidden": 16384, "heads": 128, "kv_heads": 8, "ffn": 53248,
                         "vocab": 128256, "d": 128}
#: Llama 3's 128K row (Dubey et al., 2024, table 4): TP 8, CP 16, PP 16, DP 8 on 16,384 H100s, 380 TFLOP/s per GPU.
CP: dict[str, Any] = {"tensor": 8, "degree": 16, "sequence": 131072, "published": 380, "gpus": 16384,
                      "device": "h100-sxm", "link": "nvlink4", "network": "infiniband-ndr", "gpus_per_node": 8}
#: The planner's command for the 128K row, as the page shows it: the layout pinned as published, the micro-batch
#: (one or two sequences) and the stages per device of interleaved 1F1B left to the planner (benchmarks/llama3.py
#: plans the same row through the API).
COMMAND = ["plan", "--model", "llama:layers=126,hidden=16384,heads=128,kv-heads=8,ffn=53248,seq=131072,vocab=128256",
           "--batch", "128", "--gpus", "16384", "--hardware", "h100-sxm", "--link", "nvlink",
           "--network", "infiniband-ndr", "--tensor-parallel", "8", "--sequence-parallel", "on", "--stages", "16",
           "--replicas", "8", "--zero", "2", "--checkpoint", "never", "--schedule", "interleaved-1f1b",
           "--virtual", "1,2,4,8", "--chunks", "8,16", "--context-parallel", "16", "--cp-comm", "all-gather",
           "--training", "bf16-adam"]
#: Sequence lengths of the figure: 256 to 8,192 tokens per rank at CP 16.
SEQUENCES = (4096, 8192, 16384, 32768, 65536, 131072)


def chunks(c: int) -> list[tuple[int, int]]:
    """The two of ``2c`` chunks each of ``c`` ranks keeps: rank ``i`` the ``i``-th and the ``(2c − 1 − i)``-th."""
    return [(i, 2 * c - 1 - i) for i in range(c)]


def causal_work(c: int, balanced: bool = True) -> list[int]:
    """Each rank's causal attention work, in units of half a chunk's queries against one chunk of keys.

    Under the causal mask the queries of chunk ``j`` (of ``n`` equal chunks) see ``j`` whole chunks of keys and
    half of their own: ``2j + 1`` units. ``balanced``: the ``2c`` chunks of :func:`chunks`; else ``c`` contiguous
    chunks, one a rank.
    """
    if balanced:
        return [(2 * i + 1) + (2 * j + 1) for i, j in chunks(c)]
    return [2 * i + 1 for i in range(c)]


def kv_formula(s: int, b: int, kv_heads: int, t: int, d: int, e: int) -> int:
    """Bytes of a layer's keys and values for ``b`` sequences of ``s`` tokens on one of ``t`` tensor-parallel ranks:
    ``2·s·b·(K/t)·d·e`` (K and V; ``K`` key/value heads of width ``d``, ``e`` bytes an element)."""
    return 2 * s * b * kv_heads // t * d * e


def ring_min_tokens(kv_heads: int, heads: int, e: int, flops: float, bandwidth: float) -> float:
    """Fewest tokens per rank, ``s / c``, whose attention on one block outlasts the ring's send of the next.

    A step sends ``kv / c = 2·(s/c)·(K/t)·d·e`` bytes while the rank's queries attend to one block of keys,
    ``2·(s/c)²·(a/t)·d`` FLOPs under the causal mask on balanced chunks. Without the step's latency the send is
    shorter when ``s / c ≥ (K / a)·e·P / W``: grouped-query attention's ``K / a`` lowers the bar by its ratio.
    """
    return kv_heads / heads * e * flops / bandwidth


def ring_step(kv: float, c: int, bandwidth: float, latency: float) -> float:
    """Seconds of one forward ring step: a block of ``kv / c`` bytes over the link, plus its latency."""
    return kv / c / bandwidth + latency


def allgather_forward(kv: float, c: int, bandwidth: float, latency: float) -> float:
    """Seconds of the all-gather variant's forward on a flat ring: K and V gathered apart (Note [keys and values
    apart] in :mod:`sim.planning.parallel.context_parallel`), ``(c − 1)/c · kv / W + 2·(c − 1)·α``."""
    return (c - 1) / c * kv / bandwidth + 2 * (c - 1) * latency


@lru_cache(maxsize=16)
def _count(seq: int) -> Any:
    """One Llama 3 405B layer (between the embedding and the head) at ``seq`` tokens on one of ``CP["tensor"]``
    ranks with sequence parallelism: a layer's counts do not depend on the depth."""
    import torch

    from sim.planning.counting.models import get_model

    spec = (f"llama:layers=1,hidden={LLAMA['hidden']},heads={LLAMA['heads']},kv-heads={LLAMA['kv_heads']},"
            f"ffn={LLAMA['ffn']},seq={seq},vocab={LLAMA['vocab']}")
    return get_model(spec).tensor_parallel(CP["tensor"], sequence_parallel=True).count(torch.bfloat16)


# Note [attention apart]: the planner prices a layer's FlashAttention inside the layer's seconds and gives no seconds
# per kernel, but the ring's inequality needs the attention alone. So it is the layer less the same layer with those
# kernels' FLOPs and bytes zeroed (:func:`_zero_attention`), each less its key/value traffic (a zeroed kernel reads
# no keys and values), plus the launches a zeroed kernel still pays. The tests check it against the count's FLOPs.
def _zero_attention(profile: Any) -> Any:
    """``profile`` with its FlashAttention kernels' FLOPs and bytes set to 0 (each still a kernel)."""
    from dataclasses import replace

    from sim.planning.parallel.context_parallel import attention_kernels

    def zeroed(table: Any) -> Any:
        keep = ~attention_kernels(table)[:, None]
        return replace(table, flops=table.flops * keep, bytes=table.bytes * keep)

    return replace(profile, layers=tuple(replace(x, forward=zeroed(x.forward), backward=zeroed(x.backward),
                                                 input_backward=None) for x in profile.layers))


@lru_cache(maxsize=32)
def layer_costs(seq: int, c: int, comm: str = "ring") -> dict[str, float]:
    """One 405B layer on one rank of context parallel ``c`` at ``seq`` tokens, one sequence a micro-batch, from the
    planner: its keys and values (``kv``, bytes), its attention's forward and backward seconds (Note [attention
    apart]), the seconds its key/value traffic adds forward and backward, and the forward's whole seconds."""
    from sim.planning.costs.from_flops import FlopCosts
    from sim.planning.hardware.catalog import get_device, get_link
    from sim.planning.parallel.cluster import Cluster
    from sim.planning.parallel.context_parallel import (
        ContextParallel,
        attention_kernels,
        kv_bytes,
        split_sequence,
    )

    device = get_device(CP["device"])
    cluster = Cluster(get_link(CP["link"]), CP["gpus_per_node"], get_link(CP["network"]))
    profile = split_sequence(_count(seq), c)

    def costs(p: Any, how: str) -> Any:
        return FlopCosts(p, device, "bf16-adam", tensor_link=cluster.link,
                         context=ContextParallel.on(cluster, CP["tensor"], c, how))

    k = 1  # the decoder layer, between the embedding and the head
    full, bare = costs(profile, comm), costs(_zero_attention(profile), comm)
    assert device.roofline is not None
    launches = [attention_kernels(getattr(profile.layers[k], p)).sum() * device.roofline.kernel_seconds
                for p in ("forward", "backward")]
    attention = [float(a[k] - x[k] - (z[k] - y[k]) + n)
                 for a, x, z, y, n in zip(full.layer_seconds(1), full.context_seconds(1), bare.layer_seconds(1),
                                          bare.context_seconds(1), launches, strict=True)]
    added = [float(x[k]) for x in full.context_seconds(1)]
    return {"kv": kv_bytes(_count(seq).layers[k], 2), "attention_forward": attention[0],
            "attention_backward": attention[1], "exposed_forward": added[0], "exposed_backward": added[1],
            "forward": float(full.layer_seconds(1)[0][k])}


def attention_rate(seq: int, c: int) -> float:
    """FLOP/s the planner's FlashAttention forward reaches on one rank: its counted FLOPs over its seconds."""
    from sim.planning.parallel.context_parallel import attention_kernels, split_sequence

    table = split_sequence(_count(seq), c).layers[1].forward
    flops = float(table.flops[attention_kernels(table)].sum())  # fixed and per sample, one sample
    return flops / layer_costs(seq, c)["attention_forward"]


@lru_cache(maxsize=1)
def llama_row() -> dict[str, Any]:
    """The best row of ``gpipe-sim`` :data:`COMMAND` ``--json``: the planner's own answer for the 128K row."""
    from sim.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main([*COMMAND, "--json", "--no-progress"])
    if status != 0:
        raise ValueError(f"gpipe-sim {' '.join(COMMAND)} exited {status}")
    best: dict[str, Any] = json.loads(out.getvalue())["best"]
    return best


def palm_tflops(tokens_per_second: float, seq: int, gpus: int) -> float:
    """TFLOP/s per GPU as Llama 3 counts them: PaLM's ``6·N + 12·L·H·Q·T`` model FLOPs per token
    (:func:`benchmarks.llama3.palm_flops_per_token`)."""
    from benchmarks.llama3 import palm_flops_per_token

    return tokens_per_second * palm_flops_per_token(seq) / gpus / 1e12


def page_numbers(row: bool = True) -> dict[str, str]:
    """The numbers the page's text states, as it writes them (tests/docs/test_context_parallel_page.py finds each);
    ``row``: with the 128K row, which plans the whole model (seconds)."""
    from sim.planning.hardware.catalog import get_link

    c, s, t = CP["degree"], CP["sequence"], CP["tensor"]
    nic = get_link(CP["network"])
    kv = kv_formula(s, 1, LLAMA["kv_heads"], t, LLAMA["d"], 2)
    at = {comm: layer_costs(s, c, comm) for comm in ("ring", "all-gather")}
    short = layer_costs(8192, c)
    rate = attention_rate(s, c)
    unbalanced = causal_work(c, balanced=False)
    out = {
        "kv": f"{kv / 2**20:.0f} MiB", "traffic": f"{(c - 1) / c * kv / 2**20:.0f} MiB",
        "imbalance": f"{max(unbalanced) / (sum(unbalanced) / c):.2f} times",
        "rate": f"{rate / 1e12:.0f} TFLOP/s",
        "ring min": f"{ring_min_tokens(LLAMA['kv_heads'], LLAMA['heads'], 2, rate, nic.bandwidth):,.0f} tokens",
        "mha min": f"{ring_min_tokens(1, 1, 2, rate, nic.bandwidth):,.0f} tokens",  # K = a
        "step": f"{ring_step(kv, c, nic.bandwidth, nic.latency) * 1e6:.0f} µs",
        "block": f"{at['ring']['attention_forward'] / c * 1e6:.0f} µs",
        "attention": f"{at['ring']['attention_forward'] * 1e3:.1f} ms",
        "gather": f"{at['all-gather']['exposed_forward'] * 1e3:.2f} ms",
        "gather share": f"{at['all-gather']['exposed_forward'] / at['all-gather']['forward']:.1%}",
        "short": f"{short['exposed_forward'] * 1e6:.0f} µs",
        "gqa": f"one key/value head per {LLAMA['heads'] // LLAMA['kv_heads']} query heads",
        "queries": f"each {LLAMA['heads'] // LLAMA['kv_heads']} times smaller than the queries",
        "port": f"sends {nic.bandwidth / 1e9:.0f} GB/s", "latency": f"each step pays {nic.latency * 1e6:.0f} µs",
        "backward": f"computes {at['ring']['attention_backward'] / at['ring']['attention_forward']:.1f} times",
        # exercise 1: 32K tokens over 16 ranks, and over 2
        "exercise": f"It has {32768 // c:,} tokens per rank", "fewer": f"(`c = 2` gives {32768 // 2:,} per rank)",
    }
    if row:
        best = llama_row()
        tflops = palm_tflops(best["tokens_per_second"], s, CP["gpus"])
        out["row"] = f"{tflops:.1f} TFLOP/s"
        out["row step"] = f"{best['step_seconds']:.2f} s"
        out["above"] = f"{tflops / CP['published'] - 1:.0%} above the published {CP['published']}"
    return out


# --8<-- [start:draw_ring]
def draw_ring(path: Path, save: Callable[[Any, Path], None]) -> None:
    """Llama 3 405B at CP 16 on InfiniBand NDR, one layer forward on one rank: a ring step's send against the
    attention on one block (left), and the seconds the key/value traffic adds to the layer (right), against tokens
    per rank."""
    import matplotlib.pyplot as plt

    from sim.planning.hardware.catalog import get_link

    c, nic = CP["degree"], get_link(CP["network"])
    per_rank = [s // c for s in SEQUENCES]
    ring = [layer_costs(s, c, "ring") for s in SEQUENCES]
    gather = [layer_costs(s, c, "all-gather") for s in SEQUENCES]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(per_rank, [ring_step(r["kv"], c, nic.bandwidth, nic.latency) * 1e6 for r in ring], "o-",
              label="send one K/V block: kv/(c·W) + α")
    left.plot(per_rank, [r["attention_forward"] / c * 1e6 for r in ring], "s-", label="attend to one block: A/c")
    left.set(title="One ring step, forward", ylabel="µs")
    right.plot(per_rank, [r["exposed_forward"] * 1e3 for r in ring], "o-", label="ring (hidden behind attention)")
    right.plot(per_rank, [g["exposed_forward"] * 1e3 for g in gather], "s-", label="all-gather (exposed)")
    right.set(title="K/V seconds the layer's forward waits", ylabel="ms")
    left.set_yscale("log")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(per_rank, [f"{n:,}" for n in per_rank])
        ax.minorticks_off()
        ax.set_xlabel("tokens per rank, s / c")
        ax.legend()
    fig.tight_layout()
    save(fig, path)
# --8<-- [end:draw_ring]
