"""The step-spread benchmark runs end to end on its quick setting and writes the rows its docs page renders."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.mark.slow
def test_step_spread_quick(run_benchmark: Callable[..., Any]) -> None:
    doc = run_benchmark("investigations.step_spread", "--quick").doc
    assert {"command", "date", "machine", "note", "rows"} <= set(doc)
    kinds = {(r["model"], r["step"], r["collector"]) for r in doc["rows"]}
    assert len(kinds) == len(doc["rows"]) == 10  # the loop, then each model's plain step and pipeline, gc on and off
    assert all(r["median_ms"] > 0 and 0 <= r["p90_p10"] <= r["spread"] for r in doc["rows"])
