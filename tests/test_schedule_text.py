"""The project's text form of a schedule (:mod:`gpipe.schedule.text`): the picture it prints, an exact round trip of
every registered schedule and policy (overlapped pairs too), a hand-edited file, and each bad input named by line."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from gpipe.schedule import (
    CHECKPOINT_MODES,
    SCHEDULES,
    Checkpoint,
    Schedule,
    ScheduleError,
    dualpipe_v,
    one_f_one_b,
    parse_schedule,
    parse_tasks,
    read_schedule,
    schedule_text,
    write_schedule,
)
from gpipe.schedule.text import MAX_TEXT_BYTES

# (m, n, p): micro-batches, stages, devices; p < n only for a schedule that registers a layout
SHAPES = [(1, 1, 1), (3, 2, 2), (5, 4, 4), (4, 4, 2), (8, 6, 3), (6, 4, 1), (8, 4, 2)]

ONE_F_ONE_B = """\
# gpipe-sim schedule
name: 1f1b
microbatches: 4
stages: 2
checkpoint: never
placement: 0 1
device 0: F0@0 F1@0 B0@0 F2@0 B1@0 F3@0 B2@0 B3@0
device 1: F0@1 B0@1 F1@1 B1@1 F2@1 B2@1 F3@1 B3@1
"""


def test_one_f_one_b_prints_as_its_picture() -> None:
    assert schedule_text(one_f_one_b(4, 2)) == ONE_F_ONE_B
    assert parse_schedule(ONE_F_ONE_B) == one_f_one_b(4, 2)


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
@pytest.mark.parametrize("name", list(SCHEDULES))
def test_every_registered_schedule_survives_an_exact_round_trip(name: str, checkpoint: Checkpoint) -> None:
    kind, tried = SCHEDULES[name], 0
    for m, n, p in SHAPES:
        if kind.place is None and p != n:
            continue
        try:
            original = kind(m, n, checkpoint, devices=p)
        except ValueError:  # a shape this schedule does not take (its constraints say which)
            continue
        tried += 1
        back = parse_schedule(schedule_text(original))
        assert back == original  # every field: name, shape, policy, placement, lists, pairs
        assert back.tasks == original.tasks and back.pairs == original.pairs
    assert tried, f"no shape of {SHAPES} builds {name!r}"


def test_overlapped_pairs_are_written_and_read_back() -> None:
    schedule = dualpipe_v(8, 4, "always")
    text = schedule_text(schedule)
    pairs = [line for line in text.splitlines() if line.startswith("pairs: ")]
    assert pairs == ["pairs: " + " ".join(f"{a}+{b}" for a, b in schedule.pairs)]
    assert parse_schedule(text).pairs == schedule.pairs
    assert "pairs:" not in schedule_text(one_f_one_b(4, 2))


def test_a_hand_edited_file_reads_as_written(tmp_path: Path) -> None:
    """Comments, blank lines, keys in another order, Windows line ends, no name; device 0's list reordered
    validly (its F1@0 after B0@0): the file's own order, not 1F1B's."""
    text = ("\r\n# gpipe-sim schedule\r\n# my edit: device 0 runs B0@0 before F1@0\r\n\r\nstages: 2\r\n"
            "microbatches: 4\r\nplacement: 0 1\r\ncheckpoint: never\r\n"
            "device 1: F0@1 B0@1 F1@1 B1@1 F2@1 B2@1 F3@1 B3@1\r\n"
            "device 0: F0@0 B0@0 F1@0 F2@0 B1@0 F3@0 B2@0 B3@0\r\n")
    path = tmp_path / "edited.txt"
    path.write_bytes(text.encode())
    schedule = read_schedule(path)
    assert schedule.name == "custom" and (schedule.m, schedule.n, schedule.placement) == (4, 2, (0, 1))
    assert schedule.tasks[0] == parse_tasks("F0@0 B0@0 F1@0 F2@0 B1@0 F3@0 B2@0 B3@0")
    assert schedule != one_f_one_b(4, 2) and schedule.tasks[1] == one_f_one_b(4, 2).tasks[1]


def test_write_refuses_an_existing_file_unless_told(tmp_path: Path) -> None:
    path = tmp_path / "s.txt"
    path.write_text("my own notes\n")
    with pytest.raises(FileExistsError):
        write_schedule(one_f_one_b(4, 2), path)
    assert path.read_text() == "my own notes\n"
    assert write_schedule(one_f_one_b(4, 2), path, overwrite=True) == path
    assert path.read_text() == ONE_F_ONE_B and read_schedule(path) == one_f_one_b(4, 2)


def test_nothing_invalid_is_written(tmp_path: Path) -> None:
    deadlock = Schedule(2, 2, "never", (0, 1), (parse_tasks("F0@0 F1@0 B1@0 B0@0"), parse_tasks("B0@1 F0@1 F1@1 B1@1")))
    with pytest.raises(ScheduleError, match="deadlocks"):
        write_schedule(deadlock, tmp_path / "x.txt")
    for name in ("two\nlines", " spaced", ""):
        with pytest.raises(ValueError, match="cannot be written as text"):
            schedule_text(dataclasses.replace(one_f_one_b(2, 2), name=name))
    assert not list(tmp_path.iterdir())


def _with(old: str, new: str) -> str:
    assert old in ONE_F_ONE_B
    return ONE_F_ONE_B.replace(old, new)


@pytest.mark.parametrize(("text", "message"), [
    ("", "an empty text"),
    ("0F0,0F1\n", "line 1: not a schedule in gpipe-sim's text form"),
    (_with("stages: 2\n", "stages: 2\nspeed: 3\n"), "line 5: unknown key 'speed'"),
    (_with("stages: 2\n", "stages: 2\nstages: 2\n"), "line 5: 'stages' again (first on line 4)"),
    (_with("checkpoint: never\n", ""), "no 'checkpoint:' line"),
    (_with("stages: 2", "stages two"), "line 4: expected 'key: value'"),
    (_with("stages: 2", "stages: -2"), "line 4: the stage count is a positive integer"),
    (_with("microbatches: 4", "microbatches: " + "9" * 101), "line 3: the micro-batch count is a positive integer"),
    (_with("microbatches: 4", "microbatches: 99999999999999999999"),
     "line 3: 99999999999999999999 micro-batches on 2 stages need a forward and a backward of each of "
     "199999999999999999998 (micro-batch, stage) pairs, but the device lines list 16 tasks"),
    (_with("checkpoint: never", "checkpoint: sometimes"), "line 5: checkpoint 'sometimes'; use one of"),
    (_with("placement: 0 1", "placement: 0 1 1"), "line 6: the placement names 3 devices, one per stage, but line 4"),
    (_with("placement: 0 1", "placement: 0 7"), "line 6: stage 1 is placed on device 7, but the devices are 0..1"),
    (_with("device 1:", "device 2:"), "line 8: device 2, but no line for device 1"),
    (_with("device 1:", "device 0:"), "line 8: device 0 again (first on line 7)"),
    (_with("F3@0", "X3@0"), "line 7: not a task: 'X3@0'"),
    (_with("F3@0", "F" + "3" * 300 + "@0"), "line 7: 'F33333"),
    (ONE_F_ONE_B + "pairs: F3@0\n", "line 9: 'F3@0' is not a pair"),
    (ONE_F_ONE_B + "pairs: F1@0+F2@0\n", "overlapped pair F1@0+F2@0: F2@0 must come right after F1@0"),
    (_with("F0@1 B0@1", "B0@1 F0@1"), "schedule '1f1b' deadlocks at step 2: waiting cycle B0@1 -> B0@1"),
    (_with(" B3@1", ""), "has the wrong tasks: missing B3@1"),
])
def test_bad_text_is_named_by_its_line(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_schedule(text)


def test_read_refuses_a_file_too_large_or_not_text(tmp_path: Path) -> None:
    large = tmp_path / "large.txt"
    with open(large, "wb") as f:
        f.write(ONE_F_ONE_B.encode())
        f.write(b"#" * MAX_TEXT_BYTES)
    with pytest.raises(ValueError, match="larger than 16 MiB"):
        read_schedule(large)
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"# gpipe-sim schedule\n\xff\xfe")
    with pytest.raises(ValueError, match="not UTF-8 text"):
        read_schedule(binary)
    with pytest.raises(OSError):
        read_schedule(tmp_path / "absent.txt")
