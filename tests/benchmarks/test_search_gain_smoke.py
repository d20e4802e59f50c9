"""``benchmarks.search_gain`` runs end to end (``--quick``): a search per backend, both schedules on threads and on
two processes, a JSON of the expected shape; no timing is asserted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gpipe.schedule import parse_schedule


@pytest.mark.slow
def test_search_gain_quick(run_benchmark: Callable[..., Any]) -> None:
    doc, out, stdout = run_benchmark("search_gain", "--quick", timeout=600)
    assert doc["command"].endswith("-m benchmarks.search_gain --quick --out " + str(out))
    assert {"date", "machine", "threads", "workload", "search", "rows", "gains", "goals"} <= set(doc)
    assert doc["threads"]["intra_op_threads_per_worker"] == 1
    assert doc["workload"]["placement"] == [0, 1, 0, 1] and doc["workload"]["balance"] == [2, 1, 1, 2]
    assert set(doc["search"]) == set(doc["gains"]) == {"threads", "processes"}
    for backend, found in doc["search"].items():
        assert found["validated"], backend
        schedule = parse_schedule(found["schedule"])  # the text form reads back, validated
        assert (schedule.m, schedule.n, schedule.placement) == (doc["workload"]["chunks"], 4, (0, 1, 0, 1))
        assert found["best_named"] in found["named"] and isinstance(found["named"][found["best_named"]], float)
        assert all(p <= limit * (1 + 1e-9) for p, limit in zip(found["peak_memory_bytes"], found["memory_limit_bytes"],
                                                                 strict=True))
        assert len(found["forward_ms"]) == len(found["backward_ms"]) == len(found["weight_ms"]) == 4
    assert doc["search"]["processes"]["link"] is not None and doc["search"]["threads"]["link"] is None
    rows = doc["rows"]
    assert [(r["backend"], r["schedule"] == "searched") for r in rows] == [
        ("threads", True), ("threads", False), ("processes", True), ("processes", False)]
    for row in rows:
        assert len(row["rounds"]) == 1 and len(row["rounds"][0]["step_ms"]) == 3
        assert {"predicted_ms", "measured_ms", "error"} <= set(row)
    assert {"predicted", "measured", "measured_per_round"} <= set(doc["gains"]["threads"])
    assert {"fidelity_met", "met", "gain_threads", "gain_processes"} <= set(doc["goals"])
    assert "goal: mean |error|" in stdout
