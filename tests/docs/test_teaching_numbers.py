"""The numbers of the pages past GPipe (docs/teaching_numbers.py) agree with the closed forms those pages teach."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.test_figures import _load  # the docs' own modules, loaded by file as the site's hook loads them


@pytest.mark.parametrize("h", [768, 5120, 12288])
@pytest.mark.parametrize("ridge", [139.0, 153.0, 295.0])
def test_the_fewest_tokens_reach_the_ridge_exactly(h: int, ridge: float) -> None:
    tn = _load("teaching_numbers")
    t = tn.min_tokens(h, ridge)
    assert 4 * t * h / (5 * t + 4 * h) == pytest.approx(ridge, rel=1e-12)  # the GEMM's intensity at T tokens
    assert tn.min_tokens(100, 90.0) == float("inf")  # 4h <= 5R: a GEMM this narrow never gets there


def test_memory_peaks_are_the_schedules_closed_forms() -> None:
    common, tn = _load("figures.common"), _load("teaching_numbers")
    rows = {(name, policy): (span, peaks) for name, policy, span, peaks in tn.memory_rows(common.simulate)}
    m, p, a = tn.MEMORY_M, tn.MEMORY_P, tn.MEMORY_A
    assert rows[("gpipe", "never")][1] == [m * a] * p
    assert rows[("1f1b", "never")][1] == [(p - d) * a for d in range(p)]
    assert rows[("gpipe", "never")][0] == pytest.approx((m + p - 1) * 3e-3)
    # except_last on 1F1B's first device: the last micro-batch whole, one recomputed whole, the waiting inputs
    assert rows[("1f1b", "except_last")][1][0] == 2 * a + (p - 1) * a // 8


def test_the_balancing_table_follows_the_general_formula() -> None:
    common, tn = _load("figures.common"), _load("teaching_numbers")
    out = tn._balancing(common.simulate, common.md_table)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out["balance_table"].splitlines()[2:]]
    assert len(rows) == 2 and all(r[4] == r[5] for r in rows), rows  # simulated makespan == formula
    assert float(rows[1][3].split()[0]) < float(rows[0][3].split()[0])  # the block partition lowers the bottleneck



def test_beyond_1f1b_states_the_simulator_s_numbers() -> None:
    """Every number the page's text and exercises state (docs/concepts/beyond-1f1b.md) is the simulator's."""
    common, tn = _load("figures.common"), _load("teaching_numbers")
    page = (Path(__file__).resolve().parents[2] / "docs" / "concepts" / "beyond-1f1b.md").read_text()
    numbers = tn.beyond_numbers(common.simulate)
    missing = {k: v for k, v in numbers.items() if v not in page}
    assert not missing, f"the page does not state these numbers: {missing}"


def test_beyond_1f1b_numbers_are_the_closed_forms() -> None:
    """1F1B (m + p - 1)(t_f + t_b + t_w), ZB-H1 m(...) + (p - 1)(t_f + t_b - t_w) and their idle times; DualPipe-V's
    pairs per device; one stage-micro-batch above ZB-V; the search at ZB-V's step under 1F1B's memory."""
    common, tn = _load("figures.common"), _load("teaching_numbers")
    n = tn.beyond_numbers(common.simulate)
    for p in (4, 8):
        m = 2 * p
        assert n[f"1f1b p{p}"] == f"{(m + p - 1) * 3} ms" and n[f"1f1b idle p{p}"] == f"{(p - 1) * 3} ms"
        assert n[f"zb-h1 p{p}"] == f"{3 * m + p - 1} ms" and n[f"zb-h1 idle p{p}"] == f"{p - 1} ms"
    m, p = 8, 4
    assert n["pairs per device"] == ", ".join(str(2 * (m - 2 * p + d + 1) + (p - d - 1) - (d == p - 1))
                                             for d in range(p))
    t, x = 0.5, tn.EXPENSIVE * 1e3  # ms per stage task
    assert n["zb-v expensive"] == f"{2 * m * (3 * t + 2 * x) + (p - 1) * (t + x):.1f} ms"
    assert n["device 0 busy zb-v"] == f"{2 * m * (3 * t + 2 * x):.3g} ms"
    assert n["dualpipe-v peak"] == f"{(2 * p + 1) / 2:.3g} A" and n["searched p4"] == n["zb-v p4"] == "25.5 ms"
    for name, rounds in (("round=8 peak", 8), ("round=4 peak", 4)):  # device 0: (v - 1)N + 2 min(p - 1, N) + 1, v = 2
        assert n[name] == f"{(rounds + 2 * min(p - 1, rounds) + 1) / 2:.3g} A"


def test_dualpipe_v_is_ahead_only_with_communication() -> None:
    common, tn = _load("figures.common"), _load("teaching_numbers")
    for x, zbv, dpv in tn.communication_runs(common.simulate):
        assert (dpv.makespan == zbv.makespan) if x == 0 else (dpv.makespan < zbv.makespan - 1e-12)
