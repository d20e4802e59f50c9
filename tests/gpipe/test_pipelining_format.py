"""torch.distributed.pipelining's per-rank action lists and CSV, both ways (:mod:`gpipe.schedule.pipelining`):
every registered schedule survives a round trip, the words are theirs, bad input is named."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpipe.schedule import (
    CHECKPOINT_MODES,
    SCHEDULES,
    Checkpoint,
    Op,
    Schedule,
    ScheduleError,
    Task,
    from_pipelining,
    gpipe,
    one_f_one_b,
    parse_schedule,
    parse_tasks,
    read_pipelining_csv,
    read_schedule,
    schedule_text,
    to_pipelining,
    write_pipelining_csv,
)

# (m, n, p): micro-batches, stages, devices; p < n only for a schedule that registers a layout
SHAPES = [(1, 1, 1), (3, 2, 2), (5, 4, 4), (4, 4, 2), (8, 6, 3), (6, 4, 1)]

# split: every backward split off its W, two stages on one device, the Ws late on device 0
SPLIT = Schedule(2, 2, "never", (0, 0), (parse_tasks("F0@0 F0@1 F1@0 F1@1 B0@1 B0@0 B1@1 W0@1 B1@0 W0@0 W1@1 W1@0"),),
                 name="split")


def _without_recompute(schedule: Schedule) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(str(t) for t in ts if t.op is not Op.R) for ts in schedule.tasks)


def _shapes(name: str) -> list[tuple[int, int, int]]:
    kind = SCHEDULES[name]
    return [(m, n, p) for m, n, p in SHAPES if kind.place is not None or p == n]


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
@pytest.mark.parametrize("name", [name for name, kind in SCHEDULES.items() if kind.copies == 1])  # the others refuse
def test_every_registered_schedule_survives_a_round_trip(name: str, checkpoint: Checkpoint) -> None:
    kind, tried = SCHEDULES[name], 0
    for m, n, p in _shapes(name):
        try:
            original = kind(m, n, checkpoint, devices=p)
        except ValueError:  # a shape this schedule does not take (its constraints say which)
            continue
        tried += 1
        back = from_pipelining(to_pipelining(original), checkpoint)
        assert (back.m, back.n, back.placement, back.checkpoint) == (m, n, original.placement, checkpoint)
        assert _without_recompute(back) == _without_recompute(original)
        for ts in back.tasks:  # each R right before its B
            assert all(ts[k + 1] == type(t)(Op.B, t.microbatch, t.stage) for k, t in enumerate(ts) if t.op is Op.R)
    assert tried, f"no shape of {SHAPES} builds {name!r}"


@pytest.mark.parametrize("checkpoint", CHECKPOINT_MODES)
def test_gpipe_and_1f1b_come_back_exactly_recompute_included(checkpoint: Checkpoint) -> None:
    """Where the generator puts each R right before its B (1F1B merging two stages on a device need not)."""
    for original in (gpipe(5, 3, checkpoint, placement=[0, 1, 0]), one_f_one_b(5, 3, checkpoint)):
        assert from_pipelining(to_pipelining(original), checkpoint).tasks == original.tasks


def test_the_words_are_theirs() -> None:
    """F, B (full backward) and no R; n=2, m=2, except_last: the R of micro-batch 0 is dropped."""
    assert to_pipelining(gpipe(2, 2, "except_last")) == {
        0: ["0F0", "0F1", "0B1", "0B0"],
        1: ["1F0", "1F1", "1B1", "1B0"],
    }
    assert to_pipelining(SPLIT) == {0: "0F0 1F0 0F1 1F1 1I0 0I0 1I1 1W0 0I1 0W0 1W1 0W1".split()}
    assert from_pipelining(to_pipelining(SPLIT), name="split") == SPLIT


def test_idle_steps_communication_and_overlap_are_read() -> None:
    """Their lowered form: idle steps, sends and receives, REDUCE_GRAD; an OVERLAP_F_B runs F then B."""
    actions = {
        0: ["0F0", "0SEND_F0", None, "", "0RECV_B0", "(0F1;0B0)OVERLAP_F_B", "0SEND_F1", "0RECV_B1", "0B1",
            "0REDUCE_GRAD"],
        1: ["1RECV_F0", "1F0", "1B0", "1SEND_B0", "1RECV_F1", "1F1", "1B1", "1SEND_B1", "1UNSHARD", "1RESHARD"],
    }
    schedule = from_pipelining(actions, "never", name="lowered")
    assert schedule.tasks == (parse_tasks("F0@0 F1@0 B0@0 B1@0"), parse_tasks("F0@1 B0@1 F1@1 B1@1"))
    assert (schedule.m, schedule.n, schedule.placement, schedule.name) == (2, 2, (0, 1), "lowered")


def test_a_full_backward_among_split_ones_is_its_input_then_its_weight_gradient() -> None:
    """Note [full backward among split ones]: ``1B0`` among I and W runs as B then W, and exports as I, W."""
    actions = [["0F0", "0F1", "0I0", "0W0", "0B1"], ["1F0", "1B0", "1F1", "1I1", "1W1"]]
    schedule = from_pipelining(actions)
    assert schedule.tasks == (parse_tasks("F0@0 F1@0 B0@0 W0@0 B1@0 W1@0"),
                              parse_tasks("F0@1 B0@1 W0@1 F1@1 B1@1 W1@1"))
    assert to_pipelining(schedule)[1] == ["1F0", "1I0", "1W0", "1F1", "1I1", "1W1"]


def test_the_caller_s_policy_places_recomputes_and_the_placement_follows_the_ranks() -> None:
    schedule = from_pipelining([["0F0", "0F1", "2F0", "2F1", "2B1", "2B0", "0B1", "0B0"],
                                ["1F0", "1F1", "1B1", "1B0"]], "except_last")
    assert schedule.placement == (0, 1, 0)
    assert schedule.tasks[0] == parse_tasks("F0@0 F1@0 F0@2 F1@2 B1@2 R0@2 B0@2 B1@0 R0@0 B0@0")


@pytest.mark.parametrize(("actions", "message"), [
    ([["0F0", "0X0"]], "rank 0: action '0X0': type X has no counterpart here"),
    ([["0F0", "0F"]], "rank 0: action '0F' names no micro-batch"),
    ([["0F0", "F0"]], "rank 0: not an action: 'F0'"),
    ([["0F0", "(0B0;0SEND_F0)OVERLAP_F_B"]], "an OVERLAP_F_B holds compute actions"),
    ([["(0F0;0B0)OVERLAP_X"]], "sub-actions come with OVERLAP_F_B only, not OVERLAP_X"),
    ([["0F0", "0B0"], ["0F1", "0B1"]], "stage 0 runs on ranks 0 and 1"),
    ([["0F0", "0B0"], [None, "1SEND_F0"]], "rank 1 runs no compute action"),
    ([["0F0", "2F0"]], "no rank runs stage 1 of stages 0..2"),
    ({0: ["0F0", "0B0"], 2: ["1F0", "1B0"]}, r"ranks must be 0..1, got \[0, 2\]"),
    ([], "no ranks"),
    (["0F0 0B0"], "rank 0: expected a list of actions"),
])
def test_what_cannot_be_read_is_named(actions: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        from_pipelining(actions)  # type: ignore[arg-type]


def test_a_micro_batch_outside_the_given_count_is_named() -> None:
    actions = [["0F1", "0F2", "0B1", "0B2"]]
    with pytest.raises(ValueError, match=r"rank 0: action '0F2' is outside m=2 micro-batches \(0..1\)"):
        from_pipelining(actions, m=2)
    with pytest.raises(ValueError, match="no action runs the forward '0F0': every stage runs one forward of each "
                                         r"micro-batch 0..2, as rank 0's action '0F2' names the largest"):
        from_pipelining(actions)  # m=3 from the actions: 0 is missing


def test_invalid_actions_are_a_schedule_error_with_the_grid() -> None:
    with pytest.raises(ScheduleError, match="deadlocks"):
        from_pipelining([["0F0", "0B0"], ["1B0", "1F0"]])
    with pytest.raises(ValueError, match="unknown checkpoint mode 'sometimes'"):
        from_pipelining([["0F0", "0B0"]], "sometimes")  # type: ignore[arg-type]


def test_csv_round_trip_and_no_file_is_overwritten_unasked(tmp_path: Path) -> None:
    path = tmp_path / "gpipe.csv"
    original = gpipe(4, 3, "never")
    assert write_pipelining_csv(original, path) == path
    assert path.read_text().splitlines()[0] == "0F0,0F1,0F2,0F3,0B3,0B2,0B1,0B0"
    back = read_pipelining_csv(path)
    assert (back.tasks, back.placement, back.name) == (original.tasks, original.placement, "gpipe")
    assert read_pipelining_csv(path, "always", name="x").tasks == gpipe(4, 3, "always").tasks
    before = path.read_bytes()
    with pytest.raises(FileExistsError):
        write_pipelining_csv(one_f_one_b(4, 3), path)
    assert path.read_bytes() == before
    write_pipelining_csv(one_f_one_b(4, 3), path, overwrite=True)
    assert read_pipelining_csv(path).tasks == one_f_one_b(4, 3, "never").tasks


def test_a_csv_with_idle_cells_reads(tmp_path: Path) -> None:
    path = tmp_path / "idle.csv"
    path.write_text("0F0,,0B0\n,1F0,1B0\n")
    assert read_pipelining_csv(path).tasks == gpipe(1, 2, "never").tasks


def test_a_byte_order_mark_and_blank_lines_at_the_end_are_read_as_the_text_form_reads_them(tmp_path: Path) -> None:
    """Note [blank lines]: once, a BOM was 'not an action' and a blank last line 'rank 2 runs no compute action'."""
    plain = "0F0,0F1,0B1,0B0\n1F0,1F1,1B1,1B0\n"
    for name, data in [("bom.csv", b"\xef\xbb\xbf" + plain.encode()), ("blank.csv", (plain + "\n\n  \n").encode()),
                       ("crlf.csv", plain.replace("\n", "\r\n").encode() + b"\r\n")]:
        (tmp_path / name).write_bytes(data)
        assert read_pipelining_csv(tmp_path / name).tasks == gpipe(2, 2, "never").tasks, name
    (tmp_path / "middle.csv").write_text("0F0,0B0\n\n1F0,1B0\n")  # a blank row in the middle is a rank: refused
    with pytest.raises(ValueError, match="rank 1 runs no compute action"):
        read_pipelining_csv(tmp_path / "middle.csv")
    (tmp_path / "bad.csv").write_bytes(b"\xef\xbb\xbf0F0,\xff\n")
    with pytest.raises(ValueError, match=r"byte 7 cannot be read"):  # counted in the file, the mark included
        read_pipelining_csv(tmp_path / "bad.csv")


@pytest.mark.timeout(20)  # a FIFO once waited for a writer forever
def test_a_folder_a_fifo_or_a_device_is_named_as_what_it_is(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    for path, what in [(tmp_path, "is a folder, not a file"), (fifo, r"is a FIFO \(named pipe\), not a regular file"),
                       (Path("/dev/zero"), "is a character device, not a regular file")]:
        with pytest.raises(ValueError, match=what):
            read_pipelining_csv(path)
        with pytest.raises(ValueError, match=what):
            read_schedule(path)


# Arabic-Indic three, superscript three, full-width three, mathematical bold three
@pytest.mark.parametrize("digit", ["\u0663", "\u00b3", "\uff13", "\U0001d7d1"])
def test_indices_are_ascii_digits_in_both_text_forms(digit: str) -> None:
    """``0F٣`` once read as ``0F3``, and ``F٣@0`` as ``F3@0``: Python's ``\\d`` and ``int()`` take any script's
    digits (INDEX in gpipe.schedule.task, the one rule)."""
    with pytest.raises(ValueError, match="not an action"):
        from_pipelining([[f"0F{digit}", "0F0", "0B0"]])
    with pytest.raises(ValueError, match="not an action"):
        from_pipelining([[f"{digit}F0", "0F0", "0B0"]])
    with pytest.raises(ValueError, match="not a task"):
        Task.parse(f"F{digit}@0")
    with pytest.raises(ValueError, match="not a task"):
        parse_tasks(f"F0@{digit}")
    text = schedule_text(gpipe(1, 1, "never")).replace("F0@0", f"F{digit}@0")
    with pytest.raises(ValueError, match="line 7: not a task"):
        parse_schedule(text)
    with pytest.raises(ValueError, match="the micro-batch count is a positive integer"):
        parse_schedule(schedule_text(gpipe(1, 1, "never")).replace("microbatches: 1", f"microbatches: {digit}"))
