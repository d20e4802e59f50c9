"""The schedule axis of the speed benchmark runs end to end on a tiny model, torch's schedules included."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpipe.schedule import SCHEDULES

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_schedule_speed_quick(tmp_path: Path) -> None:
    out = tmp_path / "schedule_speed.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.executor_speed", "--schedules", "all", "--quick",
         "--batch", "8", "--chunks", "2", "--layers", "4", "--width", "16", "--repeats", "2", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    assert doc["machine"]["threads_per_worker"] == 1 and doc["workload"]["chunks"] == 2
    rows = {row["schedule"]: row for row in doc["rows"]}
    refused = [note for note in doc["notes"] if "not run" in note]
    assert set(rows) | {note.split(":")[0] for note in refused} == set(SCHEDULES)
    assert {"gpipe", "1f1b"} <= set(rows)
    unpaired = {note.split(":")[0] for note in doc["notes"] if "pipelining has no schedule of this order" in note}
    assert {"gpipe", "1f1b", "zb-h1"} <= set(rows) - unpaired  # torch has these orders (Note [schedule pairs])
    for name, row in rows.items():
        assert row["gpipe_ms"] > 0 and row["gpipe_vs_plain"] > 0 and row["devices"] == 2
        if name not in unpaired:
            assert row["pipelining_ms"] > 0 and row["gpipe_vs_pipelining"] > 0
    assert "gpipe" in done.stdout and "wrote" in done.stdout


def test_bad_schedule_names_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused by the parser, before any work: in this process, a fresh interpreter would only import torch again."""
    from benchmarks import schedule_speed

    with pytest.raises(SystemExit) as exited:
        schedule_speed.main(["--schedules", "nope", "--json", str(tmp_path / "x.json")])
    assert exited.value.code == 2 and "unknown schedule 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
