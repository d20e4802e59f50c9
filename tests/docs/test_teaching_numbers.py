"""The numbers of the pages past GPipe (docs/teaching_numbers.py) agree with the closed forms those pages teach."""

from __future__ import annotations

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
    mf, tn = _load("make_figures"), _load("teaching_numbers")
    rows = {(name, policy): (span, peaks) for name, policy, span, peaks in tn.memory_rows(mf.simulate)}
    m, p, a = tn.MEMORY_M, tn.MEMORY_P, tn.MEMORY_A
    assert rows[("gpipe", "never")][1] == [m * a] * p
    assert rows[("1f1b", "never")][1] == [(p - d) * a for d in range(p)]
    assert rows[("gpipe", "never")][0] == pytest.approx((m + p - 1) * 3e-3)
    # except_last on 1F1B's first device: the last micro-batch whole, one recomputed whole, the waiting inputs
    assert rows[("1f1b", "except_last")][1][0] == 2 * a + (p - 1) * a // 8


def test_the_balancing_table_follows_the_general_formula() -> None:
    mf, tn = _load("make_figures"), _load("teaching_numbers")
    out = tn._balancing(mf.simulate, mf._table)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out["balance_table"].splitlines()[2:]]
    assert len(rows) == 2 and all(r[4] == r[5] for r in rows), rows  # simulated makespan == formula
    assert float(rows[1][3].split()[0]) < float(rows[0][3].split()[0])  # the block partition lowers the bottleneck

