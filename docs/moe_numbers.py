"""The formulas, numbers, figure and table of the page "Mixture of experts in a pipeline"
(docs/concepts/mixture-of-experts.md).

Each closed form of the page beside the planner's own answer: DeepSeek-V3's total and activated parameters from its
preset (:func:`parameters`), the routed experts a rank holds and the ranks that share them (:func:`fold`, against
:func:`~sim.planning.parallel.experts.expert_data_group`), one all-to-all's message by formula (:func:`message`)
against the counter's :data:`~sim.planning.counting.counts.ALL_TO_ALL` marker (:func:`counted_messages`), its
seconds in two hops (:func:`two_hops`, against :meth:`~sim.planning.parallel.experts.ExpertParallel.seconds`), and
the simulator's timeline of one overlapped forward/backward pair (:func:`pair_runs`) against ``2·max(c, x)``.
The planner's DeepSeek-V3 rows are ``benchmarks/results/deepseek_v3.json``'s, read at every build
(:func:`deepseek_rows`). ``docs/figures/moe.py`` registers :func:`draw_pair` and the table;
tests/docs/test_moe_page.py checks each form and finds :func:`page_numbers` in the page.

The layout is DeepSeek-V3's pre-training (DeepSeek-AI, 2024, arXiv 2412.19437, section 3.2): 2,048 H800s, eight a
node (the catalog's ``hgx-h800``), pipeline 16, expert parallelism 64 over 8 nodes, data parallelism 128 with ZeRO-1,
no tensor parallelism, 4,096 tokens a sequence.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["DEEPSEEK_COLUMNS", "EP", "PAIR", "RESULTS", "config", "counted_messages", "deepseek_provenance",
           "deepseek_rows", "deepseek_summary", "draw_pair", "exchange_seconds", "expert_parameters", "fold",
           "in_turn", "message", "page_numbers", "pair_closed_form", "pair_runs", "parameters", "two_hops"]

ROOT = Path(__file__).resolve().parents[1]
#: The planner's DeepSeek-V3 rows, written by ``python -m benchmarks.deepseek_v3``.
RESULTS = ROOT / "benchmarks" / "results" / "deepseek_v3.json"
#: DeepSeek-V3's layout (arXiv 2412.19437, section 3.2): EP 64 over 8 nodes, 128 data-parallel replicas a stage, no
#: tensor parallelism, on the catalog's HGX H800.
EP: dict[str, Any] = {"degree": 64, "replicas": 128, "tensor": 1, "system": "hgx-h800", "gpus": 2048, "pipeline": 16}
#: The pair's teaching costs, in seconds: a forward and a backward each compute ``c`` and communicate ``x``, once
#: below the compute and once above it (DeepSeek-V3 puts its all-to-all near 1:1 with the compute, section 3.2.1).
PAIR: dict[str, Any] = {"c": 1e-3, "x": (0.6e-3, 1.5e-3)}


def config() -> Any:
    """DeepSeek-V3's preset (:data:`sim.planning.counting.models.deepseek.CONFIGS` ``["v3"]``)."""
    from sim.planning.counting.models.deepseek import CONFIGS

    return CONFIGS["v3"]


def parameters() -> dict[str, int]:
    """DeepSeek-V3's parameters as the report names them, without its multi-token-prediction module: all of them,
    those one token's forward reads (``activated``), and those less the token embedding (a lookup of one row, which
    DeepSeek's own count leaves out)."""
    from dataclasses import replace

    main = replace(config(), mtp_layers=0)
    return {"total": main.parameters, "activated": main.activated_parameters,
            "activated_without_embedding": main.activated_parameters - main.vocab_size * main.d_model,
            "mtp": config().mtp_parameters}


def expert_parameters(cfg: Any) -> int:
    """Parameters of the routed experts of a model: ``L_moe·E·3·h·F_e`` (a SwiGLU expert's three matrices)."""
    return (cfg.n_layer - cfg.dense_layers) * cfg.experts * 3 * cfg.d_model * cfg.expert_width


def fold(experts: int, expert_parallel: int, tensor: int, replicas: int) -> tuple[int, int]:
    """Routed experts a rank holds, ``E/ep``, and the ranks holding the same ones, ``t·d/ep`` (one context-parallel
    rank, no expert tensor parallelism): the stage's data-parallel GPUs regrouped as ``ep × edp``."""
    return experts // expert_parallel, tensor * replicas // expert_parallel


def message(tokens: float, per_token: int, hidden: int, itemsize: float) -> float:
    """One rank's message in one all-to-all of a MoE layer: ``T·k·h·e`` bytes (``T`` tokens routed to ``k`` experts
    each, a hidden vector of ``h`` elements of ``e`` bytes per copy)."""
    return tokens * per_token * hidden * itemsize


@lru_cache(maxsize=1)
def counted_messages() -> tuple[float, ...]:
    """The bytes of every all-to-all the counter records in DeepSeek-V3's first MoE layer at EP 64, one sequence a
    micro-batch: the forward's dispatch and combine, then the backward's two, as its
    :data:`~sim.planning.counting.counts.ALL_TO_ALL` markers hold them."""
    import torch

    from sim.planning.counting.counts import ALL_TO_ALL
    from sim.planning.counting.models import get_model

    profile = get_model("deepseek:v3").expert_parallel(EP["degree"]).count(torch.bfloat16)
    layer = profile.layers[1 + config().dense_layers]  # the embedding, the dense blocks, then the first MoE block
    out: list[float] = []
    for table in (layer.forward, layer.backward):
        mine = table.collectives_or_default() == ALL_TO_ALL
        out += [float(fixed + per_sample) for fixed, per_sample in table.bytes[mine]]
    return tuple(out)


def _cluster() -> tuple[Any, Any]:
    """The catalog's HGX H800 as a :class:`~sim.planning.parallel.cluster.Cluster`, and the system."""
    from sim.planning.hardware.catalog import get_link
    from sim.planning.hardware.systems import get_system
    from sim.planning.parallel.cluster import Cluster

    system = get_system(EP["system"])
    return Cluster(get_link(system.link), system.gpus_per_node, get_link(system.network), system.network_ports), system


def exchange_seconds(nbytes: float, toward_experts: bool, fp8: bool = True) -> float:
    """The planner's seconds of one DeepSeek-V3 all-to-all whose BF16 message is ``nbytes``
    (:class:`~sim.planning.parallel.experts.ExpertParallel` on the HGX H800, node-limited, FP8 toward the experts)."""
    from sim.planning.parallel.experts import ExpertParallel, Routing

    cfg, (cluster, _) = config(), _cluster()
    group = ExpertParallel.on(cluster, EP["degree"], EP["tensor"],
                              Routing(cfg.experts, cfg.experts_per_token, cfg.node_limit), fp8_dispatch=fp8)
    return group.seconds(nbytes, toward_experts)


def two_hops(nbytes: float, inside: int, nodes: int, per_token: int, node_limit: int, nvlink: float,
             network: float, latency: tuple[float, float]) -> float:
    """DeepSeek-V3's all-to-all in two hops, as the page writes it: each token crosses the network once per target
    node, ``min(M, n, k)`` of the ``k`` copies, ``(n − 1)/n`` of them to other nodes, at ``network`` bytes/s (one
    GPU's share of its node's ports), while NVLink spreads ``(g − 1)/g`` inside each node at ``nvlink``; the slower
    hop sets the time. ``latency``: (network, NVLink)."""
    across = min(node_limit, nodes, per_token) * (nodes - 1) / (nodes * per_token) * nbytes / network + latency[0]
    within = (inside - 1) / inside * nbytes / nvlink + latency[1]
    return max(across, within)


def pair_closed_form(c: float, x: float) -> float:
    """Seconds an overlapped forward and backward take together, each ``c`` compute and ``x`` all-to-all:
    ``2·max(c, x)`` (Note [communication] in :mod:`sim.core.cost`)."""
    return 2 * max(c, x)


def in_turn(c: float, x: float) -> float:
    """Seconds the same two tasks take one after the other: ``2·(c + x)``."""
    return 2 * (c + x)


@lru_cache(maxsize=8)
def pair_runs(c: float, x: float) -> dict[str, list[Any]]:
    """The simulator's spans of one forward/backward pair, one device, ``c`` compute and ``x`` all-to-all per task:
    ``"in turn"`` (``SimConfig(overlap_pairs=False)``) and ``"paired"``, each the two tasks' compute spans and their
    all-to-all spans, from the pair's start.

    The schedule is DualPipe-V on one device (two stages in a V, three micro-batches), whose first pair is a forward
    of micro-batch 1 beside the backward of micro-batch 0; every task's weight gradient costs ``c/2``.
    """
    from dataclasses import replace

    from gpipe.schedule import dualpipe_v
    from sim.core.config import SimConfig
    from sim.core.cost import CostModel, StageCost
    from sim.core.engine import simulate

    schedule = dualpipe_v(3, 2)
    pair = set(schedule.pairs[0])
    cost = CostModel((StageCost(c, c, weight=c / 2, communication=x),) * 2, copy_seconds=0.0)
    out: dict[str, list[Any]] = {}
    for name, overlap in (("in turn", False), ("paired", True)):
        spans = [s for s in simulate(schedule, cost, SimConfig(overlap_pairs=overlap)).spans if s.task in pair]
        start = min(s.start for s in spans)
        out[name] = [replace(s, start=s.start - start, end=s.end - start) for s in spans]
    return out


def _results(path: Path | None = None) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((path or RESULTS).read_text(encoding="utf-8"))
    return data


_NAMES = {"dualpipe": "DualPipe", "dualpipe-v": "DualPipe-V", "1f1b": "1F1B"}


#: The columns of :func:`deepseek_rows`.
DEEPSEEK_COLUMNS = ["schedule", "micro-batches", "GiB per GPU", "tokens/s per GPU, published / predicted",
                    "all-to-all s a step", "exposed s", "hidden"]


def deepseek_rows(path: Path | None = None) -> list[list[str]]:
    """The planner's DeepSeek-V3 rows from ``benchmarks/results/deepseek_v3.json`` as the page shows them
    (:data:`DEEPSEEK_COLUMNS`): each schedule's best fitting row, its throughput against the published one, its
    all-to-all seconds a step on the busiest device and the part of them left exposed."""
    data = _results(path)
    published = data["published_tokens_per_second_per_gpu"]
    rows = []
    for r in data["rows"]:
        name = _NAMES.get(r["schedule"], r["schedule"])
        if not r["fits"]:
            rows.append([name, "does not fit", "", "", "", "", ""])
            continue
        hidden = 1 - r["all_to_all_exposed_seconds"] / r["all_to_all_seconds"] if r["all_to_all_seconds"] else 0.0
        rows.append([name, f"{r['chunks']}, recompute `{r['checkpoint']}`", f"{r['memory_gib']:.1f}",
                     f"{published:,.0f} / {r['predicted_tokens_per_second_per_gpu']:,.0f} ({r['error']:+.1%})",
                     f"{r['all_to_all_seconds']:.2f}", f"{r['all_to_all_exposed_seconds']:.2f}", f"{hidden:.0%}"])
    return rows


def deepseek_provenance(path: Path | None = None) -> str:
    """The command and date that wrote the results."""
    data = _results(path)
    return f"`{data.get('command', '').strip()}`, {data.get('date', 'undated')}"


def deepseek_summary(path: Path | None = None) -> str:
    """One sentence from the results: the ranking by throughput and how many seconds a step DualPipe's pairs save
    against 1F1B's exposed all-to-all."""
    data = _results(path)
    fitting = sorted((r for r in data["rows"] if r["fits"]), key=lambda r: -r["predicted_tokens_per_second_per_gpu"])
    if not fitting:
        return "No schedule fits this layout."
    order = " > ".join(_NAMES.get(r["schedule"], r["schedule"]) for r in fitting)
    by = {r["schedule"]: r for r in fitting}
    if "dualpipe" not in by or "1f1b" not in by:
        return f"The planner ranks them {order}."
    saved = by["1f1b"]["all_to_all_exposed_seconds"] - by["dualpipe"]["all_to_all_exposed_seconds"]
    faster = by["1f1b"]["step_seconds"] - by["dualpipe"]["step_seconds"]
    return (f"The planner ranks them {order}. DualPipe's pairs leave {saved:.2f} s fewer of the all-to-all exposed "
            f"than 1F1B; its step is {faster:.2f} s shorter.")


def page_numbers() -> dict[str, str]:
    """The numbers the page's text states, as it writes them (tests/docs/test_moe_page.py finds each)."""
    from sim.planning.counting.models import get_model
    from sim.planning.parallel.experts import FP8_DISPATCH

    cfg, (cluster, system) = config(), _cluster()
    n = parameters()
    per_rank, edp = fold(cfg.experts, EP["degree"], EP["tensor"], EP["replicas"])
    one = message(cfg.seq_len, cfg.experts_per_token, cfg.d_model, 2)
    nic = cluster.nic
    assert nic is not None
    dispatch, combine = exchange_seconds(one, True), exchange_seconds(one, False)
    moe = cfg.n_layer - cfg.dense_layers
    mixtral = get_model("mixtral:8x7b").config
    assert mixtral is not None
    mix_experts = expert_parameters(mixtral)
    limit, nodes = cfg.node_limit, EP["degree"] // system.gpus_per_node
    c, (below, above) = PAIR["c"], PAIR["x"]
    return {
        "total": f"{n['total'] / 1e9:.1f}B parameters", "activated": f"{n['activated'] / 1e9:.1f}B",
        "no embedding": f"{n['activated_without_embedding'] / 1e9:.1f}B without the token embedding",
        "mtp": f"{n['mtp'] / 1e9:.1f}B", "share": f"{n['activated'] / n['total']:.1%}",
        "experts": f"{cfg.experts} routed experts", "top k": f"top {cfg.experts_per_token}",
        "shared": f"{cfg.shared_experts} shared expert", "width": f"width {cfg.expert_ffn:,}",
        "layers": f"{moe} of its {cfg.n_layer} blocks", "limit": f"at most {cfg.node_limit} nodes",
        "per rank": f"{per_rank} routed experts", "edp": f"over {edp} GPUs",
        "groups": f"{EP['replicas'] // EP['degree']} expert-parallel groups of {EP['degree']}",
        "nodes": f"{EP['degree'] // system.gpus_per_node} nodes",
        "message": f"{one / 2**20:,.0f} MiB", "fp8": f"{one * FP8_DISPATCH / 2**20:,.0f} MiB",
        "fp8 ratio": f"{FP8_DISPATCH:.3f}", "layer bytes": f"{4 * one / 2**30:.2f} GiB",
        "ports": f"node's {system.network_ports} InfiniBand ports", "nic": f"{nic.bandwidth / 1e9:.0f} GB/s",
        "nvlink": f"{cluster.link.bandwidth / 1e9:.0f} GB/s",
        "dispatch": f"{dispatch * 1e3:.2f} ms", "combine": f"{combine * 1e3:.2f} ms",
        "layer seconds": f"{2 * (dispatch + combine) * 1e3:.1f} ms",
        "pair": f"{pair_closed_form(c, below) * 1e3:.1f} ms", "pair turn": f"{in_turn(c, below) * 1e3:.1f} ms",
        "pair above": f"{pair_closed_form(c, above) * 1e3:.1f} ms",
        "pair above turn": f"{in_turn(c, above) * 1e3:.1f} ms",
        "routed": f"{expert_parameters(cfg) / 1e9:.1f}B of them",
        # exercise 1: Mixtral 8x7B
        "mixtral": f"{mixtral.parameters / 1e9:.1f}B",
        "mixtral routing": f"each token to {mixtral.experts_per_token} of {mixtral.experts} experts",
        "mixtral activated": f"{mixtral.activated_parameters / 1e9:.1f}B",
        "mixtral experts": f"{mix_experts / 1e9:.1f}B",
        "mixtral rest": f"{(mixtral.parameters - mix_experts) / 1e9:.1f}B",
        "mixtral read": f"{mix_experts * mixtral.experts_per_token / mixtral.experts / 1e9:.1f}B",
        # exercise 2: two sequences a micro-batch; exercise 3: the share of a message that crosses the network
        "two sequences": f"{2 * one / 2**20:,.0f} MiB",
        "limited share": f"{limit * (nodes - 1) / (nodes * cfg.experts_per_token):.0%}",
        "flat share": f"{(nodes - 1) / nodes:.0%}",
    }


# --8<-- [start:draw_pair]
def draw_pair(path: Path, save: Callable[[Any, Path], None]) -> None:
    """One forward and one backward on one device, each computing ``c`` and sending ``x`` in all-to-alls: run in
    turn (above) and as DualPipe's overlapped pair (below), for ``x`` below and above ``c``; the simulator's spans."""
    import matplotlib.pyplot as plt

    from gpipe.schedule.plot import COLOURS
    from gpipe.schedule.timeline import COLLECTIVE, COMPUTE

    c = PAIR["c"]
    fig, axes = plt.subplots(1, len(PAIR["x"]), figsize=(12, 3.6), sharey=True)
    lanes = {("in turn", "F"): 3, ("in turn", "B"): 2, ("paired", "F"): 1, ("paired", "B"): 0}
    for ax, x in zip(axes, PAIR["x"], strict=True):
        for how, spans in pair_runs(c, x).items():
            for s in spans:
                y, ms = lanes[(how, s.task.op.value)], (s.start * 1e3, (s.end - s.start) * 1e3)
                if s.stream == COMPUTE:
                    ax.broken_barh([ms], (y - 0.35, 0.7), facecolors=COLOURS[s.task.op.value])
                    ax.text(ms[0] + 0.03, y, str(s.task), va="center", fontsize=8, color="white")
                elif s.stream == COLLECTIVE:
                    ax.broken_barh([ms], (y - 0.35, 0.7), facecolors="none", edgecolors="black", hatch="////")
        for seconds, label, style in ((pair_closed_form(c, x), "2·max(c, x)", "-"), (in_turn(c, x), "2·(c + x)", ":")):
            ax.axvline(seconds * 1e3, color="black", lw=1, ls=style)
            ax.text(seconds * 1e3, 3.55, f" {label} = {seconds * 1e3:g} ms", fontsize=8)
        ax.set_yticks(list(lanes.values()), [f"{how}: {op}" for how, op in lanes])
        ax.set_ylim(-0.6, 4.0)
        ax.set_xlim(0, in_turn(c, x) * 1e3 * 1.35)  # room for the labels of the lines
        ax.set_xlabel("ms from the pair's start.   Hatched: the task's all-to-all")
        ax.set_title(f"c = {c * 1e3:g} ms compute, x = {x * 1e3:g} ms all-to-all per task", fontsize=10)
    fig.tight_layout()
    save(fig, path)
# --8<-- [end:draw_pair]
