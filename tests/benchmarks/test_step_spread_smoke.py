"""The step-spread benchmark runs end to end on its quick setting and writes the rows its docs page renders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_step_spread_quick(tmp_path: Path) -> None:
    out = tmp_path / "step_spread.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "step_spread.py"), "--quick", "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    assert {"command", "date", "machine", "note", "rows"} <= set(doc)
    kinds = {(r["model"], r["step"], r["collector"]) for r in doc["rows"]}
    assert len(kinds) == len(doc["rows"]) == 10  # the loop, then each model's plain step and pipeline, gc on and off
    assert all(r["median_ms"] > 0 and 0 <= r["p90_p10"] <= r["spread"] for r in doc["rows"])
