"""``gpipe-sim simulate --import-schedule`` and ``--export-schedule``: torch.distributed.pipelining's CSV in and out."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gpipe.schedule import gpipe, one_f_one_b, to_pipelining
from gpipe.schedule.pipelining import MAX_CSV_BYTES
from sim.cli import main

COSTS = ["--forward-time", "1", "--backward-time", "2"]


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["simulate", *args, *COSTS, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def fails(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["simulate", *args, *COSTS]) == 2
    return capsys.readouterr().err


def test_a_torch_gpipe_csv_simulates_to_the_closed_form(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Their GPipe for 4 ranks and 8 micro-batches as their _dump_csv writes it (backwards in micro-batch order,
    REDUCE_GRAD last): ``(m + n - 1)(f + b)``, whatever --stages and --chunks say."""
    path = tmp_path / "torch-gpipe.csv"
    rows = [[f"{r}F{i}" for i in range(8)] + [f"{r}B{i}" for i in range(8)] + [f"{r}REDUCE_GRAD"] for r in range(4)]
    path.write_text("".join(",".join(row) + "\r\n" for row in rows))
    doc = run_json(capsys, "--import-schedule", str(path), "--stages", "2", "--chunks", "3",
                   "--out", str(tmp_path / "out"))
    assert (doc["schedule"], doc["m"], doc["n"], doc["checkpoint"]) == ("torch-gpipe", 8, 4, "never")
    assert doc["makespan"] == (8 + 4 - 1) * 3.0
    recomputed = run_json(capsys, "--import-schedule", str(path), "--checkpoint", "always",
                          "--out", str(tmp_path / "out2"))
    assert recomputed["checkpoint"] == "always" and recomputed["makespan"] == (8 + 4 - 1) * 3.0 + 8 * 1.0


def test_export_then_import_is_the_same_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "1f1b.csv"
    first = run_json(capsys, "--schedule", "1f1b", "--stages", "3", "--chunks", "5", "--checkpoint", "never",
                     "--export-schedule", str(path), "--out", str(tmp_path / "a"))
    assert first["files"]["schedule"] == str(path)
    assert path.read_text().splitlines() == [",".join(row) for row in to_pipelining(one_f_one_b(5, 3)).values()]
    second = run_json(capsys, "--import-schedule", str(path), "--out", str(tmp_path / "b"))
    assert (second["m"], second["n"], second["makespan"]) == (5, 3, first["makespan"])
    assert second["devices"] == first["devices"]


def test_an_existing_export_file_is_kept_unless_forced(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text("my own notes\n")
    err = fails(capsys, "--export-schedule", str(path), "--out", str(tmp_path / "a"))
    assert f"--export-schedule {path} exists; choose another name, or add --force to replace it" in err
    assert path.read_text() == "my own notes\n" and not (tmp_path / "a").exists()  # refused before any work
    assert main(["simulate", "--stages", "2", "--chunks", "2", "--checkpoint", "except_last", *COSTS,
                 "--export-schedule", str(path), "--out", str(tmp_path / "b"), "--force"]) == 0
    assert path.read_text().splitlines() == [",".join(row) for row in to_pipelining(gpipe(2, 2)).values()]


@pytest.mark.parametrize(("make", "message"), [
    (lambda d: ["--import-schedule", str(d / "missing.csv")], "--import-schedule {d}/missing.csv: no such file"),
    (lambda d: ["--import-schedule", str(d / "bad.csv")],
     "--import-schedule {d}/bad.csv: rank 1: action '1X0': type X has no counterpart here"),
    (lambda d: ["--import-schedule", str(d / "stuck.csv")], "deadlocks"),
    (lambda d: ["--export-schedule", str(d / "no" / "s.csv")], "--export-schedule {d}/no/s.csv: folder {d}/no does"),
    (lambda d: ["--export-schedule", str(d)], "--export-schedule {d} is a folder"),
])
def test_bad_files_are_named(make: Callable[[Path], list[str]], message: str, capsys: pytest.CaptureFixture[str],
                             tmp_path: Path) -> None:
    (tmp_path / "bad.csv").write_text("0F0,0B0\n1F0,1X0\n")
    (tmp_path / "stuck.csv").write_text("0F0,0B0\n1B0,1F0\n")
    err = fails(capsys, *make(tmp_path), "--out", str(tmp_path / "out"))
    assert message.format(d=tmp_path) in err
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("text", "message"), [
    ("0F99999999999999999999,0B0\n1F0,1B0\n",
     "no action runs the forward '0F0': every stage runs one forward of each micro-batch 0..99999999999999999999, "
     "as rank 0's action '0F99999999999999999999' names the largest"),
    ("0F100000000,0B0\n1F0,1B0\n", "no action runs the forward '0F0'"),
    ("0F0,0B0\n1000000000000F0,1000000000000B0\n", "no rank runs stage 1 of stages 0..1000000000000"),
    ("0F" + "9" * 5000 + "\n", "rank 0: action '0F" + "9" * 35 + "...': an index of more than 100 digits"),
])
def test_an_index_beyond_what_the_file_holds_is_refused_before_any_task(
        text: str, message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Note [indices before tasks] in gpipe.schedule.pipelining: once, every task up to the largest index was
    built before the file was checked (0F99999999999999999999 ran for minutes, 0F100000000 took 2.7 GB)."""
    (tmp_path / "h.csv").write_text(text)
    err = fails(capsys, "--import-schedule", str(tmp_path / "h.csv"), "--out", str(tmp_path / "out"))
    assert err.startswith(f"gpipe-sim simulate: error: --import-schedule {tmp_path}/h.csv: ") and message in err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.timeout(20)
def test_a_file_over_the_size_limit_or_not_text_is_refused_in_one_line(capsys: pytest.CaptureFixture[str],
                                                                       tmp_path: Path) -> None:
    big = tmp_path / "big.csv"
    with big.open("w") as f:  # valid actions, one byte past the limit
        f.write("0F0," * (MAX_CSV_BYTES // 4) + "\n")
    err = fails(capsys, "--import-schedule", str(big), "--out", str(tmp_path / "out"))
    assert "the file is larger than 8 MiB, the most a schedule CSV may be" in err
    assert len(err.strip().splitlines()) == 1
    (tmp_path / "binary.csv").write_bytes(b"0F0,\xff\xfe\n")
    err = fails(capsys, "--import-schedule", str(tmp_path / "binary.csv"), "--out", str(tmp_path / "out"))
    assert "not UTF-8 text (byte 4 cannot be read)" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "long.csv").write_text("0F0," + "x" * 200_000 + "\n")  # past the csv module's field limit
    err = fails(capsys, "--import-schedule", str(tmp_path / "long.csv"), "--out", str(tmp_path / "out"))
    assert "line 1: not CSV: field larger than field limit" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
