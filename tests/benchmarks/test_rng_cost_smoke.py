"""The random-draw cost benchmark runs end to end in one round and writes the JSON its docs page renders."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.mark.slow
def test_rng_cost_one_round(run_benchmark: Callable[..., Any]) -> None:
    doc = run_benchmark("rng_cost", "--rounds", "1").doc
    assert {"command", "machine", "note", "rows"} <= set(doc)
    assert {(r["model"], r["checkpoint"]) for r in doc["rows"]} == {
        (m, c) for m in ("mlp", "dropout") for c in ("always", "except_last", "never")}
    assert all(r["none_ms"] > 0 and r["default_over_none"] > 0 and r["seeded_over_none"] > 0 for r in doc["rows"])
