"""The cheat-sheet's formulas (docs/cheat-sheet.md), read from the page and evaluated as written, against the
simulator, the planner's ZeRO accounting and its count of a transformer layer.

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
