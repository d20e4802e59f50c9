"""The random-draw cost benchmark runs end to end in one round and writes the JSON its docs page renders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_rng_cost_one_round(tmp_path: Path) -> None:
    out = tmp_path / "rng_cost.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "rng_cost.py"), "--rounds", "1", "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    assert {"command", "machine", "note", "rows"} <= set(doc)
    assert {(r["model"], r["checkpoint"]) for r in doc["rows"]} == {
        (m, c) for m in ("mlp", "dropout") for c in ("always", "except_last", "never")}
    assert all(r["none_ms"] > 0 and r["default_over_none"] > 0 and r["seeded_over_none"] > 0 for r in doc["rows"])
