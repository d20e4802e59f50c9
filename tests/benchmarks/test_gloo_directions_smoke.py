"""benchmarks/gloo_directions.py runs end to end: posts timed with one group and with a group per direction."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gloo_directions_quick(tmp_path: Path) -> None:
    out = tmp_path / "gloo_directions.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gloo_directions.py"), "--kb", "4", "--blocks",
                           "1", "--rounds", "5", "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    rows = {row["way"]: row for row in doc["rows"]}
    assert set(rows) == {"one", "two", "four"}
    for row in rows.values():  # two ranks, a receive and a send a round, 5 rounds in the one timed block
        assert row["posts"] == 20 and 0 < row["median_ms"] <= row["max_ms"] and 0 <= row["over_1ms"] <= 1


def test_bad_sizes_are_refused() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gloo_directions.py"), "--kb", "0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--kb" in done.stderr
