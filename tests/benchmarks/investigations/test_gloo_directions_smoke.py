"""``benchmarks.investigations.gloo_directions`` runs end to end: posts timed with one group and with a group per
direction."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.mark.slow
def test_gloo_directions_quick(run_benchmark: Callable[..., Any]) -> None:
    doc = run_benchmark("investigations.gloo_directions", "--kb", "4", "--blocks", "1", "--rounds", "5",
                        timeout=300).doc
    rows = {row["way"]: row for row in doc["rows"]}
    assert set(rows) == {"one", "two", "four"}
    for row in rows.values():  # two ranks, a receive and a send a round, 5 rounds in the one timed block
        assert row["posts"] == 20 and 0 < row["median_ms"] <= row["max_ms"] and 0 <= row["over_1ms"] <= 1


def test_bad_sizes_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.investigations.gloo_directions import main

    with pytest.raises(SystemExit) as exited:
        main(["--kb", "0"])
    assert exited.value.code == 2 and "--kb" in capsys.readouterr().err
