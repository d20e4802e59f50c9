"""``gpipe-sim search``: the searched schedule beside the named ones, its files read back as the same schedule, and
bad input refused in one line naming the flag before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpipe.schedule import read_pipelining_csv, read_schedule
from sim.cli import main

BASE = ["search", "--stages", "4", "--chunks", "8", "--time-limit", "2"]


def test_searched_schedule_its_files_and_the_named_ones(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "s"
    assert main([*BASE, "--forward-time", "2,1,1,2", "--backward-time", "2,1,1,2", "--weight-time", "2,1,1,2",
                 "--memory-limit", "4", "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads((out / "search.json").read_text())
    assert doc["lower_bound"] <= doc["makespan"] == pytest.approx(doc["simulated_makespan"])  # free copies
    fitting = [v for v in doc["named"].values() if not isinstance(v, str)]
    assert fitting and doc["makespan"] <= min(fitting) + 1e-9
    assert "needs 8 micro-batches on device 0, limit 4" in doc["named"]["gpipe"]  # why GPipe does not fit
    assert max(doc["peak_memory"]) <= 4 and max(doc["simulated_peak_memory"]) <= 4 + 1e-9
    schedule = read_schedule(out / "schedule.txt")
    assert schedule.name == "searched" and schedule.m == 8 and schedule.n == 4
    assert read_pipelining_csv(out / "schedule.csv", name="searched").tasks == schedule.tasks
    assert (out / "timeline.png").stat().st_size > 0


def test_the_table_and_a_placement_of_two_stages_per_device(capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path) -> None:
    assert main([*BASE, "--devices", "2", "--placement", "v", "--out", str(tmp_path / "v")]) == 0
    text = capsys.readouterr().out
    assert "on 2 devices" in text and "zb-v" in text and "lower bound" in text
    assert read_schedule(tmp_path / "v" / "schedule.txt").placement == (0, 1, 1, 0)


def test_a_limit_in_bytes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main([*BASE, "--activation-bytes", "100,50,50,100", "--memory-bytes", "400,200,200,400", "--out",
                 str(tmp_path / "b"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["memory_unit"] == "bytes" and doc["peak_memory"][0] <= 400
    assert doc["simulated_peak_memory"] == pytest.approx(doc["peak_memory"])


@pytest.mark.parametrize(("args", "message"), [
    (["--forward-time", "1,2"], "--forward-time takes one value or 4 (one per stage), got 2"),
    (["--backward-time", "-1"], "--backward-time must be a finite number of seconds >= 0"),
    (["--weight-time", ""], "--weight-time takes one number or 4 separated by commas"),
    (["--forward-time", "0,1,1,1", "--backward-time", "0,1,1,1", "--weight-time", "0"],
     "all 0 for stage 0: a stage must cost something"),
    (["--memory-limit", "0.5"], "--memory-limit: no schedule meets the memory limit"),
    (["--memory-limit", "4,4"], "--memory-limit takes one value or 4 (one per device), got 2"),
    (["--memory-limit", "4", "--activation-bytes", "1"], "not both"),
    (["--activation-bytes", "1"], "--activation-bytes and --memory-bytes go together"),
    (["--devices", "5"], "--devices 5 is out of range: it takes integers from 1 to 4"),
    (["--devices", "2", "--placement", "0,1,2,1"], "must name a device from 0 to 1 for each of the 4 stages"),
    (["--devices", "3", "--placement", "v"], "--placement v puts two stages on each device"),
    (["--copy-time", "nan"], "--copy-time must be a finite number"),
    (["--time-limit", "0"], "--time-limit must be a finite number of seconds > 0"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(args: list[str], message: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main([*BASE, *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpipe-sim search: error: ") and message in err[0], err
    assert not out.exists()
