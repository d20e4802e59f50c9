"""The executor speed benchmark runs end to end on a tiny model and writes the JSON its docs page renders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_executor_speed_quick(tmp_path: Path) -> None:
    gpipe = pytest.importorskip("gpipe")
    if not hasattr(gpipe, "GPipe"):
        pytest.skip("gpipe.GPipe is not there yet")
    out = tmp_path / "executor_speed.json"
    # No torchgpipe (it may need the network to install) and no second processes.
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.executor_speed", "--quick", "--skip-torchgpipe", "--skip-pipelining",
         "--batch", "16", "--chunks", "2", "--layers", "2", "--width", "32", "--repeats", "3", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    for key in ("command", "machine", "workload", "rows", "simulator", "goals"):
        assert key in doc
    assert doc["machine"]["threads_per_worker"] == 1
    assert doc["machine"]["cpus"] >= 1
    names = [row["configuration"] for row in doc["rows"]]
    for mode in ("never", "except_last", "always"):
        assert f"gpipe {mode}" in names and f"gpipe {mode}, record" in names and f"gpipe {mode}, step" in names
        assert next(r for r in doc["rows"] if r["configuration"] == f"gpipe {mode}")["vs_step"] > 0
    assert "plain" in names and "plain (2 threads)" in names
    assert not any(name.startswith(("torchgpipe", "pipelining")) for name in names)
    for row in doc["rows"]:
        assert row["median_ms"] > 0 and row["vs_plain"] > 0
    for mode in ("never", "except_last", "always"):
        entry = doc["simulator"]["modes"][mode]
        assert entry["predicted_ms"] > 0 and entry["measured_ms"] > 0
    assert doc["simulator"]["bound_fraction_of_plain"] == pytest.approx((2 + 2 - 1) / (2 * 2))
    assert {"faster_than_plain", "vs_prediction", "record_overhead", "entry_points"} <= set(doc["goals"])
