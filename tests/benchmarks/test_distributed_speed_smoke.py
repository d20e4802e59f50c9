"""``benchmarks.distributed_speed`` runs end to end on a tiny model: ours and torch's on two gloo processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_distributed_speed_quick(tmp_path: Path) -> None:
    out = tmp_path / "distributed_speed.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.distributed_speed", "--schedules", "1f1b,interleaved-1f1b",
         "--batch", "8", "--chunks", "2", "--layers", "4", "--width", "16", "--repeats", "2", "--quick",
         "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    assert doc["workload"]["processes"] == 2 and doc["workload"]["repeats"] == 2
    rows = {row["schedule"]: row for row in doc["rows"]}
    assert set(rows) == {"1f1b", "interleaved-1f1b"}
    assert rows["interleaved-1f1b"]["placement"] == [0, 1, 0, 1] and rows["1f1b"]["placement"] == [0, 1]
    for row in rows.values():
        assert row["distributed_ms"] > 0 and row["pipelining_ms"] > 0 and row["threaded_ms"] > 0
        # each round's floor is at most that round's recorded step (Note [a floor for any executor]), so their medians
        assert 0 < row["floor_ms"] <= row["recorded_ms"]
    assert "goal: DistributedGPipe's step <= 0.9x" in done.stdout


def test_a_schedule_torch_lacks_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Refused by the parser, before any work: in this process, a fresh interpreter would only import torch again."""
    from benchmarks import distributed_speed

    with pytest.raises(SystemExit) as exited:
        distributed_speed.main(["--schedules", "nope"])
    assert exited.value.code == 2 and "nope" in capsys.readouterr().err
