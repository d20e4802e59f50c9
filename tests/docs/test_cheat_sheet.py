"""The cheat-sheet's formulas (docs/cheat-sheet.md), read from the page and evaluated as written, against the
simulator, the planner's ZeRO accounting, its count of a transformer layer, its context-parallel traffic and its FP8
rows.

A formula written with ``·`` is Python once ``·`` is ``*`` and ``−`` is ``-``: each test takes the formula of its
row from the page, so a wrong formula on the page fails here, not only a wrong number in the code.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from gpipe.schedule import SCHEDULES
from sim.core.cost import CostModel, StageCost
from sim.core.engine import simulate
from tests.docs.test_figures import _load  # the docs' own modules, loaded by file as the site's hook loads them

PAGE = Path(__file__).resolve().parents[2] / "docs" / "cheat-sheet.md"
_NAMES = str.maketrans({"·": "*", "−": "-", "Ψ": "P"})


def _formula(quantity: str) -> Callable[..., float]:
    """The first formula in backticks of the row whose first cell starts with ``quantity``, as a function of its
    names (``Ψ`` is ``P``)."""
    rows = [line for line in PAGE.read_text(encoding="utf-8").splitlines() if line.startswith(f"| {quantity}")]
    assert len(rows) == 1, f"{len(rows)} rows of the cheat-sheet start with {quantity!r}"
    text = re.findall(r"`([^`]+)`", rows[0].split(" | ")[1])[0]
    code = compile(text.translate(_NAMES), quantity, "eval")

    def evaluate(**names: float) -> float:
        return float(eval(code, {"__builtins__": {}, "max": max, "min": min}, names))  # noqa: S307 (the page's)

    return evaluate


def _run(name: str, m: int, p: int, t_f: float, t_b: float, t_w: float = 0.0, v: int = 1, steps: int = 1) -> float:
    """The simulated makespan of ``steps`` steps of ``name`` (no barrier between them), equal stages, free copies;
    a schedule that does not split the backward runs ``t_b + t_w`` as its ``B``."""
    schedule = SCHEDULES[name](m, v * p, "never", devices=p)
    split = schedule.splits_weight_gradient
    stage = StageCost(forward=t_f, backward=t_b if split else t_b + t_w, weight=t_w if split else 0.0)
    if steps > 1:
        schedule = _load("teaching_numbers").consecutive_steps(schedule, steps)
    return simulate(schedule, CostModel((stage,) * schedule.n)).makespan


@pytest.mark.parametrize(("m", "p"), [(8, 4), (16, 8), (4, 4)])
def test_the_time_formulas_are_the_simulator_s(m: int, p: int) -> None:
    f, b = 1.0, 2.0  # seconds: integers keep the simulator's sums exact
    assert _run("gpipe", m, p, f, b) == pytest.approx(_formula("GPipe step, equal stages")(m=m, n=p, t_f=f, t_b=b))
    for v in (2, 4):
        ideal = m * v * (f + b)
        bubble = (_run("interleaved-1f1b", m, p, f, b, v=v) - ideal) / ideal
        assert bubble == pytest.approx(_formula("interleaved 1F1B bubble")(p=p, v=v, m=m))
        assert _run("looped-bfs", m, p, f, b, v=v) == pytest.approx(
            _formula("looped BFS step")(v=v, m=m, p=p, t_f=f, t_b=b))
    t = 1.0
    assert _run("zb-h1", m, p, t, t, t) == pytest.approx(
        _formula("ZB-H1 step")(m=m, p=p, t_f=t, t_b=t, t_w=t))
    for t_b in (1.0, 1.5, 2.0) if m >= 2 * p - 1 else (1.0,):  # t_f = t_w = 1, t_w <= t_b <= 2 t_w
        assert _run("zb-h2", m, p, t, t_b, t) == pytest.approx(
            _formula("ZB-H2 step")(m=m, p=p, t_f=t, t_b=t_b, t_w=t))
    for steps in (1, 2, 3) if m >= 2 * p - 1 else ():
        assert _run("zb-h2", m, p, t, t, t, steps=steps) == pytest.approx(
            _formula("ZB-H2, `K` steps")(K=steps, m=m, p=p, t_f=t, t_b=t, t_w=t))
    if m >= 2 * p - 1:
        assert _run("zb-v", m, p, t, t, t, v=2) == pytest.approx(
            _formula("ZB-V step")(m=m, p=p, t_f=t, t_b=t, t_w=t))


@pytest.mark.parametrize(("c", "x"), [(0.5, 0.0), (0.5, 0.25), (0.5, 0.5), (0.5, 1.5), (1.0, 0.5)])
def test_an_overlapped_pair_takes_twice_the_larger_of_compute_and_communication(c: float, x: float) -> None:
    from sim.core.sharing import phased_pair_ends, task_phases

    forward, backward = task_phases(c, x, communicates_first=False), task_phases(c, x, communicates_first=True)
    ends = phased_pair_ends(0.0, forward, backward)
    assert max(ends) == pytest.approx(_formula("DualPipe-V's overlapped pair")(c=c, x=x), abs=1e-12)


@pytest.mark.parametrize("replicas", [1, 2, 8])
def test_the_zero_stages_are_the_planner_s_accounting(replicas: int) -> None:
    """``sim.planning.parallel.zero.sharded_state`` on a stage of ``Ψ`` parameters in mixed precision with Adam (K =
    12)."""
    from sim.planning.hardware.catalog import get_device
    from sim.planning.parallel.zero import sharded_state
    from sim.planning.plan import default_training

    training = default_training(get_device("a100-80gb"))
    psi = 2**20 * 3 * 8  # divisible by every replica count: no padding of the shards
    stage = StageCost(1.0, 1.0, parameter_bytes=psi * training.weight_bytes, gradient_bytes=2 * psi,
                      optimizer_bytes=8 * psi)
    assert training.weight_bytes == 6  # the bf16 copy and the fp32 master: K = 4 + 8 = 12 with Adam's moments
    labels = {0: "ZeRO-0", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}
    for zero, label in labels.items():
        held = sharded_state(stage, psi, training, zero, replicas).total
        assert held == _formula(label)(P=psi, K=12, N=replicas), label


@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikantis_activations_are_the_planner_s_count(t: int) -> None:
    """One GPT-3 175B block's bytes kept for backward per sample (b = 1), counted by the planner on the meta device,
    less its two LayerNorms' fp32 statistics (16 bytes a token on the rank), which Korthikanti et al. leave out."""
    cn = _load("cluster_numbers")
    s, h, a, _ = cn._shape()
    shape = {"s": s, "b": 1, "h": h, "a": a, "t": t}
    if t == 1:
        _, counted = cn.saved_per_layer(1, False, selective=False)
        assert counted - 16 * s == _formula("saved for backward by a transformer layer")(**shape)
        return
    _, counted = cn.saved_per_layer(t, False, selective=False)
    assert counted - 16 * s == pytest.approx(_formula("... on one of `t` tensor-parallel ranks")(**shape), abs=1e-6)
    _, counted = cn.saved_per_layer(t, True, selective=False)
    assert counted - 16 * s / t == pytest.approx(_formula("... with sequence parallelism")(**shape), abs=1e-6)
    _, counted = cn.saved_per_layer(t, True, selective=True)
    assert counted - 16 * s / t == pytest.approx(_formula("... and selective recompute")(**shape), abs=1e-6)


def test_the_cheat_sheet_links_the_cluster_page() -> None:
    assert "(concepts/cluster.md)" in PAGE.read_text(encoding="utf-8")


@pytest.mark.parametrize(("buckets", "reduce", "backward"), [(4, 0.4, 2.0), (4, 0.8, 2.0), (8, 0.5, 2.0)])
def test_the_exposure_formulas_are_the_simulator_s(buckets: int, reduce: float, backward: float) -> None:
    """The bucketed all-reduce left after one stage's backward, and an FSDP forward with prefetch, simulated."""
    from gpipe.schedule import gpipe

    en = _load("exposure_numbers")
    tl = simulate(gpipe(1, 1, "never"), en.bucket_cost(1.0, backward, reduce, buckets))
    compute = max(s.end for s in tl.compute_spans(0))
    assert tl.makespan - compute == pytest.approx(
        _formula("bucketed all-reduce left")(k=buckets, r=reduce, t_b=backward))
    gather = reduce / 2
    tl = simulate(gpipe(1, 1, "never"), en.fsdp_cost(1.0, backward, gather, buckets))
    forward = next(s for s in tl.compute_spans(0) if s.task.op.value == "F")
    assert forward.end == pytest.approx(_formula("FSDP forward")(k=buckets, g=gather, t_f=1.0))


@pytest.mark.parametrize("link", ["nvlink3", "infiniband-hdr"])
def test_the_thresholds_are_the_exposure_page_s(link: str) -> None:
    """Each threshold as docs/exposure_numbers.py computes it for the page (checked against the simulator and the
    planner in test_exposed_communication.py), and the batch budget's replicas."""
    from sim.planning.hardware.catalog import get_device, get_link

    en, cp = _load("exposure_numbers"), _load("cp_numbers")
    p, w = get_device("a100-80gb").peak_flops["bf16"], get_link(link).bandwidth
    for t in (2, 8):
        assert _formula("tensor parallel: smallest hidden size")(t=t, P=p, W=w) == pytest.approx(
            en.tp_min_hidden(t, p, w))
    for d in (2, 16):
        assert _formula("data parallel: fewest tokens")(d=d, P=p, W=w) == pytest.approx(en.dp_min_tokens(d, p, w))
    assert _formula("pipeline: smallest layers per stage")(P=p, W=w) == pytest.approx(en.pipeline_min_width(p, w))
    assert _formula("context-parallel ring: fewest tokens")(K=8, a=128, e=2, P=p, W=w) == pytest.approx(
        cp.ring_min_tokens(8, 128, 2, p, w))
    m, d = en.budget(1536, 1, 8, 0.1)
    assert int(_formula("replicas a global batch")(B=1536, b=1, m=m)) == d
    steps = _formula("steps to a given loss")
    assert steps(S_min=1.0, B_noise=1.0, B=1.0) / steps(S_min=1.0, B_noise=1.0, B=2.0) == pytest.approx(
        en.steps_ratio(1.0, 1.0))


@pytest.mark.parametrize("c", [2, 4, 16])
def test_the_context_parallel_formulas_are_the_planner_s(c: int) -> None:
    """The keys and values the count's attention reads, ``traffic_bytes``, and the all-gather's seconds on a ring
    inside one node (``ContextParallel.seconds``)."""
    import numpy as np

    from sim.planning.hardware.catalog import get_link
    from sim.planning.parallel.context_parallel import ContextParallel, kv_bytes, traffic_bytes

    cp = _load("cp_numbers")
    s, t = 8192, cp.CP["tensor"]
    kv = _formula("context-parallel keys and values")(s=s, b=1, K=cp.LLAMA["kv_heads"], t=t, d=cp.LLAMA["d"], e=2)
    assert kv == kv_bytes(cp._count(s).layers[1], 2)
    assert _formula("context-parallel traffic")(c=c, kv=kv) == pytest.approx(traffic_bytes(kv, c)[0])
    link = get_link("nvlink4")
    forward, backward = ContextParallel(c, "all-gather", link).seconds(np.array([kv]), np.zeros(1), np.zeros(1))
    gather = _formula("context-parallel all-gather")(c=c, kv=kv, W=link.bandwidth, **{"α": link.latency})
    assert forward[0] == pytest.approx(gather) and backward[0] == pytest.approx(2 * gather)


def test_the_fp8_formulas_are_the_planner_s() -> None:
    """Amdahl's law over the planner's parts of GPT 1.3B's step gives the planner's speedup, under the bound; FP8's
    model state is the planner's policy."""
    from sim.planning.counting.training import training_policy

    fp8 = _load("fp8_numbers")
    x = fp8.terms()
    speedup = fp8.plan_row("bf16-adam").step_seconds / fp8.plan_row("fp8-adam").step_seconds
    assert _formula("FP8 speedup:")(**x) == pytest.approx(speedup, rel=1e-9)
    assert speedup < _formula("FP8 speedup bound")(f=x["f"])
    psi = 1000
    assert _formula("model state, FP8")(P=psi) == training_policy("fp8-adam").model_state_bytes_per_parameter * psi


def test_the_moe_formulas_are_the_planner_s() -> None:
    """The all-to-all's message against ``all_to_all_bytes`` and the counter's markers (DeepSeek-V3 at EP 64), and
    the activated parameters against the presets' count."""
    from dataclasses import replace

    from sim.planning.counting.models import get_model
    from sim.planning.parallel.experts import all_to_all_bytes

    moe = _load("moe_numbers")
    cfg = moe.config()
    message = _formula("expert-parallel all-to-all")(T=cfg.seq_len, k=cfg.experts_per_token, h=cfg.d_model, e=2)
    assert message == all_to_all_bytes(cfg.seq_len, cfg.experts_per_token, cfg.d_model, 2)
    assert moe.counted_messages() == (message,) * 4
    for name in ("deepseek:v3", "mixtral:8x7b"):
        spec = get_model(name).config
        assert spec is not None
        c = replace(spec, mtp_layers=0)
        activated = _formula("MoE activated parameters")(N=c.parameters, L_moe=c.n_layer - c.dense_layers,
                                                          E=c.experts, k=c.experts_per_token, h=c.d_model,
                                                          F_e=c.expert_width)
        assert activated == c.activated_parameters, name


@pytest.mark.parametrize("limit", [1, 4, 8])
def test_the_two_hops_are_the_planner_s(limit: int) -> None:
    """DeepSeek-V3's node-limited all-to-all on the HGX H800 (EP 64 over 8 nodes), ``ExpertParallel.seconds``."""
    from sim.planning.parallel.experts import ExpertParallel, Routing

    moe = _load("moe_numbers")
    cluster, _ = moe._cluster()
    nic, link = cluster.nic, cluster.link
    group = ExpertParallel.on(cluster, 64, 1, Routing(256, 8, limit))
    nbytes = 2.0**28
    formula = _formula("the same in DeepSeek-V3's two hops")(
        M=limit, n=group.nodes, k=8, g=group.inside, bytes=nbytes, W_net=nic.bandwidth, W_nvl=link.bandwidth,
        α_net=nic.latency, α_nvl=link.latency)
    assert group.seconds(nbytes, False) == pytest.approx(formula)


@pytest.mark.parametrize(("t_f", "t_b", "t_w"), [(1.0, 1.0, 0.5), (1.5, 1.0, 0.5), (2.0, 2.0, 1.0)])
@pytest.mark.parametrize("p", [4, 8])
def test_dualpipe_s_bubble_is_table_2_s_with_pairs_in_turn(t_f: float, t_b: float, t_w: float, p: int) -> None:
    """The costs at which the report's count holds (docs/concepts/beyond-1f1b.md says where it does not)."""
    from gpipe.schedule import dualpipe
    from sim.core.config import SimConfig

    tl = simulate(dualpipe(2 * p, 2 * p), CostModel((StageCost(t_f, t_b, weight=t_w),) * (2 * p), copy_seconds=0.0),
                  SimConfig(overlap_pairs=False))
    bubble = _formula("DualPipe's bubble")(p=p, t_f=t_f, t_b=t_b, t_w=t_w)
    assert [tl.makespan - tl.busy(d) for d in range(p)] == pytest.approx([bubble] * p)
