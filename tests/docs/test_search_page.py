"""The numbers docs/how-to/search.md quotes, from the search itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpipe.schedule.search import StageCosts, search

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "how-to" / "search.md").read_text()


def test_the_heavy_ends_example() -> None:
    costs = StageCosts((2, 1, 1, 2), (4, 2, 2, 4), (2, 1, 1, 2))
    found = search(8, range(4), costs, 5, time_limit=5)
    named = found.named
    assert (found.makespan, found.lower_bound, named["zb-h1"], named["1f1b"], named["interleaved-1f1b"]) == \
        (68, 68, 70, 80, 80)
    assert "needs 7 micro-batches on device 0" in str(named["zb-h2"])
    assert "needs 8 micro-batches on device 0" in str(named["gpipe"]) and "8 micro-batches" in str(named["looped-bfs"])
    for text in ("| searched | 68 |", "| ZB-H1 | 70 | +2.9% |", "| 1F1B, interleaved 1F1B | 80 | +17.6% |"):
        assert text in PAGE
    under_1f1b = search(8, range(4), costs, 4, time_limit=10)
    assert under_1f1b.makespan == 70 and under_1f1b.optimal and under_1f1b.lower_bound == 68


@pytest.mark.parametrize(("backward", "limit", "searched", "zb_h1", "one_f_one_b"), [(1, 4, 27, 27, 33),
                                                                                      (2, 6, 36, 38, 44)])
def test_equal_stages(backward: int, limit: int, searched: float, zb_h1: float, one_f_one_b: float) -> None:
    found = search(8, range(4), StageCosts((1,) * 4, (backward,) * 4, (1,) * 4), limit, time_limit=5)
    assert (found.makespan, found.named["zb-h1"], found.named["1f1b"]) == (searched, zb_h1, one_f_one_b)
    assert f"{searched:g}" in PAGE and f"{zb_h1:g}" in PAGE
